"""The projection pass (``--pca``) against VB EM iterations on the same store, in one run.

Issue 25's target: on the 108,754 x 4096 synthetic store, the pass that computes the projection
(read every chunk, its mean and centred D x D scatter, the merges, the eigendecomposition) costs at
most 1.5 VB EM iterations there. Both are measured here on the same engine, one after the other:

* ``projection``: :func:`pipeline.projection.projection_pass`, streamed as in a fit;
* ``vbem``: the seconds of each iteration of a VB EM fit of the raw store (K components, diag,
  DP weights, rows from ``random_from_data``), with the exact E-step (``candidates=0``) and with
  the default truncated one; ``--persist never`` streams the store in every pass as the
  projection pass does (out of core), ``always`` keeps the prepared chunks in memory.

Run ``python bench/bench_projection.py --store /work/scratch/sun.zarr`` (``make bench`` runs it when
the store exists). Prints one JSON object; the ratios are what count on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def vbem_iterations(store: str, k: int, iters: int, persist: str,
                    candidates: int | None) -> tuple[list[float], list[float]]:
    """Wall seconds of each VB EM iteration (the callback's ``seconds``: the iteration alone) and
    this process's CPU seconds between the callbacks (the first from the end of the setup)."""
    from sklearn.exceptions import ConvergenceWarning

    from pipeline import VBMixture

    seconds: list[float] = []
    cpu: list[float] = []
    marks: list[float] = []

    def note(info: dict[str, object]) -> None:
        now = time.process_time()
        cpu.append(now - marks[-1] if marks else float("nan"))
        marks.append(now)
        seconds.append(float(info["seconds"]))  # type: ignore[arg-type]

    opts = None if candidates is None else {"candidates": candidates}
    model = VBMixture(k, covariance_type="diag", init_params="random_from_data", max_iter=iters, tol=0.0,
                      random_state=0, persist=persist, learner_options=opts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(store, callback=note)
    return seconds, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="/work/scratch/sun.zarr")
    ap.add_argument("--pca", type=int, default=128)
    ap.add_argument("-k", "--components", type=int, default=1000)
    ap.add_argument("--iters", type=int, default=3, help="iterations per fit (>= 2)")
    ap.add_argument("--persist", default="never", choices=("never", "always"))
    ap.add_argument("--skip-truncated", action="store_true")
    args = ap.parse_args()

    from pipeline.engine import LocalEngine
    from pipeline.projection import projection_pass
    from pipeline.sources import StoreSource

    src = StoreSource(args.store)
    out: dict[str, object] = {"store": args.store, "shape": [src.n_rows, src.n_features], "pca": args.pca,
                              "k": args.components, "persist": args.persist, "load_before": _load()}
    t, c = time.perf_counter(), time.process_time()
    proj = projection_pass(LocalEngine(), src, args.pca, False)
    out["projection_s"] = round(time.perf_counter() - t, 2)
    out["projection_cpu_s"] = round(time.process_time() - c, 2)
    out["explained_variance"] = round(float(proj.variances.sum()), 4)
    out["load_after_projection"] = _load()
    runs = {"exact": 0} if args.skip_truncated else {"exact": 0, "truncated": None}
    for name, cand in runs.items():
        secs, cpu = vbem_iterations(args.store, args.components, args.iters, args.persist, cand)
        # iterations after the first: the CPU seconds between two callbacks are one iteration's
        # (and the truncated E-step's first iteration scores every cluster)
        typical, typical_cpu = statistics.median(secs[1:]), statistics.median(cpu[1:])
        out[f"vbem_{name}_iteration_s"] = [round(s, 2) for s in secs]
        out[f"vbem_{name}_iteration_cpu_s"] = [round(s, 2) for s in cpu[1:]]
        out[f"projection_over_{name}_iteration"] = round(float(out["projection_s"]) / typical, 3)
        out[f"projection_over_{name}_iteration_cpu"] = round(float(out["projection_cpu_s"]) / typical_cpu, 3)
        out[f"load_after_{name}"] = _load()
        print(json.dumps(out), flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
