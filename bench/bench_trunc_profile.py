"""Issue 52's truncated E-step measurement: 60,000 x 256 synthetic (600 planted classes), K = 600,
finite weights, ``candidates=8`` against ``candidates=0`` (the exact E-step), the same start.

* ``time`` (default): the two fits alternated ``--repeats`` times in one run, in process on the
  default threads: median seconds per iteration (iterations 2..8), bound, NMI, load, and the ratio
  exact / truncated of each pair;
* ``kernel``: the chunk kernels alone on one thread, from the candidate sets a truncated fit holds at
  iteration ``--at`` (5): the exact kernel against the truncated one over the same chunks (best of
  ``--repeats``), and where the truncated kernel's time goes
  (:data:`vbcore.kernels.truncated_blocks.SECTIONS`);
* ``prof C [ITERS]``: a cProfile of the fit with ``candidates=C`` on one thread.

Run: ``flock /work/wt/bench.lock python bench/bench_trunc_profile.py [time | kernel | prof 8 6]
[--store PATH] [--block-rows B] [--repeats R]``
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PATH = "bench/out/planted-60000x256-600.zarr"


def run(path: str, c: int, iters: int = 8, prof: cProfile.Profile | None = None, threads: int | None = None,
        br: int | None = None):  # type: ignore[no-untyped-def]
    from pipeline import VBMixture
    from pipeline.engine.engines import LocalEngine

    stamps: list[float] = []
    m = VBMixture(600, covariance_type="diag", weight_concentration_prior_type="dirichlet_distribution",
                  max_iter=iters, tol=0, random_state=0, grow=False,
                  engine=LocalEngine(threads=threads) if threads else "local",
                  learner_options={"candidates": c, "moves": "none", **({"block_rows": br} if br else {})})
    if prof is not None:
        prof.enable()
    m.fit(path, callback=lambda info: stamps.append(time.perf_counter()))
    if prof is not None:
        prof.disable()
    return statistics.median(np.diff(stamps)[1:]), m


def timed(args: argparse.Namespace, y: np.ndarray, X: np.ndarray) -> None:
    from vbcore.data.metrics import nmi

    ratios = []
    for rep in range(args.repeats):
        pair = []
        for c in (0, 8):
            s, m = run(args.store, c, br=args.block_rows if c else None)
            pair.append(s)
            print(f"[{rep + 1}] candidates={c}: {s:.3f} s/iter  bound {m.lower_bound_:.6g}  "
                  f"NMI {nmi(y, m.predict(X)):.4f}  load {os.getloadavg()[0]:.2f}", flush=True)
        ratios.append(pair[0] / pair[1])
        print(f"[{rep + 1}] exact / truncated: {ratios[-1]:.2f}x", flush=True)
    print(f"median ratio {statistics.median(ratios):.2f}x over {len(ratios)} pairs")


def kernel(args: argparse.Namespace) -> None:
    """Kernel-only times (one BLAS thread) from the chunks' state at iteration ``--at``."""
    from dataclasses import replace

    from threadpoolctl import threadpool_limits

    import pipeline.fit.learners.truncated as learner
    import vbcore.kernels.truncated_blocks as blocks
    from vbcore.kernels.estep import vbem_kernel

    held = []
    plain = learner.truncated_kernel

    def keep(chunk, state, params):  # type: ignore[no-untyped-def]
        if params.iteration == args.at:
            held.append((chunk, state, params if args.block_rows is None else
                         replace(params, min_rows=args.block_rows)))
        return plain(chunk, state, params)

    learner.truncated_kernel = keep  # the bench's hook: nothing else runs in this process
    try:
        run(args.store, 8, iters=args.at, threads=1)
    finally:
        learner.truncated_kernel = plain
    times: dict[str, list[float]] = {"exact": [], "truncated": []}
    sections: dict[str, float] = {}
    with threadpool_limits(1, user_api="blas"):
        for _ in range(args.repeats):
            for name in times:
                blocks.SECTIONS = {}
                t0 = time.perf_counter()
                for chunk, state, params in held:
                    _ = vbem_kernel(chunk, params.estep) if name == "exact" else plain(chunk, state, params)
                times[name].append(time.perf_counter() - t0)
                if name == "truncated" and times[name][-1] == min(times[name]):
                    sections = blocks.SECTIONS
    blocks.SECTIONS = None
    ex, tr = min(times["exact"]), min(times["truncated"])
    print(f"{len(held)} chunks, one thread, best of {args.repeats}: exact {ex:.3f} s, truncated {tr:.3f} s: "
          f"{ex / tr:.2f}x  (load {os.getloadavg()[0]:.2f})")
    for name, sec in sections.items():
        print(f"  {name:28s} {sec * 1e3:7.1f} ms  {sec / tr:5.1%}")
    rest = tr - sum(sections.values())
    print(f"  {'rest (sort, bookkeeping)':28s} {rest * 1e3:7.1f} ms  {rest / tr:5.1%}")


def main() -> None:
    from pipeline.ingest import ingest
    from pipeline.store.features import FeatureStore

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", nargs="?", default="time", choices=("time", "kernel", "prof"))
    ap.add_argument("rest", nargs="*", type=int, help="prof: candidates and iterations (8 6)")
    ap.add_argument("--store", default=PATH)
    ap.add_argument("--block-rows", type=int, default=None, help="the truncated fit's block_rows")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--at", type=int, default=5, help="kernel: the iteration whose chunk states are timed")
    args = ap.parse_args()
    if not os.path.exists(args.store):
        ingest("synthetic", args.store, chunk_rows=8192, rows=60000, dim=256, classes=600, seed=0)
    if args.mode == "kernel":
        kernel(args)
        return
    if args.mode == "time":
        store = FeatureStore.open(args.store)
        timed(args, store.read_labels(), store.read())
        return
    c, iters = (list(args.rest) + [8, 6][len(args.rest):])[:2]
    p = cProfile.Profile()
    run(args.store, c, iters=iters, prof=p, threads=1, br=args.block_rows)
    st = pstats.Stats(p)
    st.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
