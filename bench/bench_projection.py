"""The projection pass (``--pca``) against VB EM iterations at K components on the same store, in one run.

Issue 25's target: on the 108,754 x 4096 synthetic store, the pass that computes the projection
(read every chunk, its mean and centred D x D scatter, the merges, the eigendecomposition) costs at
most 1.5 VB EM iterations there. Both are measured here on the same engine (in-process, its default
threads), one after the other:

* ``projection``: :func:`pipeline.fit.projection.projection_pass` as a fit runs it, for each solver of
  ``--solvers``: ``exact`` (streamed, ``N D^2`` flops: a SYRK per block of rows) and ``randomized``
  (three passes of ``N x D x (P + 32)`` GEMMs, the chunks kept in memory for them where they fit:
  the engine's ``persist='auto'``), timed before and after the fits (the ratios take the mean of
  both); for the randomized solver also the variance its components capture against the exact
  ones' (``captured_over_exact``);
* ``syrk_floor``: the exact pass's SYRKs alone at this core's rate, measured on one block of
  4,096 rows on one thread (what no exact one-pass scatter can go below on this machine);
* ``vbem``: each iteration of a VB EM fit of the raw store (diag, DP weights) that still has all K
  components: started from ``k-means++-projected`` (seeds among the rows, not collapsing ones) with
  pruning off (``prune_below=0``), checked from the iterations' ``n_components``; with the exact
  E-step (``candidates=0``) and with the default, truncated one. ``--persist never`` (the default)
  streams the store in every pass as the projection pass does (out of core); ``always`` keeps the
  prepared chunks in memory (then an iteration reads nothing from disk).

An iteration's CPU seconds are this process's between two callbacks (its whole work, driver
included); iteration 1 is left out (the truncated E-step's first one scores every cluster).
``--parts`` also times the pass's parts (reads, moments, merges, eigh) one chunk at a time on one
thread. Run ``python bench/bench_projection.py --store /work/scratch/sun.zarr --parts`` (``make
bench`` runs it on its synthetic store). Prints one JSON object; on a shared machine the ratios are
what count.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
import warnings


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _usage() -> tuple[float, float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime


def vbem_iterations(store: str, k: int, iters: int, persist: str,
                    candidates: int | None) -> dict[str, list[float]]:
    """Wall seconds of each VB EM iteration (the callback's ``seconds``: the iteration alone), this
    process's CPU seconds between the callbacks (the first: NaN) and each iteration's components."""
    from sklearn.exceptions import ConvergenceWarning

    from pipeline import VBMixture

    seconds: list[float] = []
    cpu: list[float] = []
    components: list[float] = []
    marks: list[float] = []

    def note(info: dict[str, object]) -> None:
        if "iteration" not in info:
            return
        now = time.process_time()
        cpu.append(now - marks[-1] if marks else float("nan"))
        marks.append(now)
        seconds.append(float(info["seconds"]))  # type: ignore[arg-type]
        components.append(float(info["n_components"]))  # type: ignore[arg-type]

    opts: dict[str, object] = {"prune_below": 0.0}  # K stays K: no component is dropped
    if candidates is not None:
        opts["candidates"] = candidates
    model = VBMixture(k, covariance_type="diag", init_params="k-means++-projected", max_iter=iters,
                      tol=0.0, random_state=0, persist=persist, learner_options=opts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(store, callback=note)
    return {"seconds": seconds, "cpu": cpu, "components": components}


def pass_parts(store: str, pca: int) -> dict[str, list[float]]:
    """The pass's parts, one chunk at a time on one thread: [user, sys] CPU seconds of the chunks'
    reads (decode and checksum), their moments (centring and SYRKs), the merges, the eigh (float32
    rows: the float32 solver and its float64 Rayleigh-Ritz step), and for comparison the float64
    eigh of the same covariance."""
    import numpy as np

    from pipeline.engine.blas import one_blas_thread
    from pipeline.engine.engines import tree_reduce
    from pipeline.engine.sources import StoreSource
    from vbcore.kernels.projection import fit_projection, row_moments

    src = StoreSource(store)
    parts = {"read": [0.0, 0.0], "moments": [0.0, 0.0], "merges": [0.0, 0.0], "eigh": [0.0, 0.0],
             "eigh_float64": [0.0, 0.0]}

    def timed(name: str, f: object) -> object:
        _, u, s = _usage()
        out = f()  # type: ignore[operator]
        _, u2, s2 = _usage()
        parts[name][0] += u2 - u
        parts[name][1] += s2 - s
        return out

    with one_blas_thread():
        shift = np.asarray(src.load(0)[0], dtype=np.float64)
        res = []
        for i in range(len(src.chunk_slices())):
            x = timed("read", lambda i=i: src.load(i))
            res.append(timed("moments", lambda x=x: row_moments(x, shift)))
            del x
        moments = timed("merges", lambda: tree_reduce(res, lambda a, b: a.merge_owned(b)))
        eps = float(np.finfo(np.dtype(src.dtype)).eps)  # the solver the pass uses for these rows
        timed("eigh", lambda: fit_projection(moments, pca, False, eps=eps))  # type: ignore[arg-type]
        # the float64 solver on the same covariance (what float32 rows took before issue 30's stop)
        timed("eigh_float64", lambda: fit_projection(moments, pca, False))  # type: ignore[arg-type]
    return {k: [round(v, 2) for v in u_s] for k, u_s in parts.items()}


def syrk_floor(n: int, d: int) -> float:
    """CPU seconds of the exact pass's SYRKs at this core's rate: ``block.T @ block`` on one float32
    block of 4,096 rows on one thread (the best of three), times ``n / 4096``."""
    import numpy as np

    from pipeline.engine.blas import one_blas_thread

    block = np.random.default_rng(0).standard_normal((4096, d), dtype=np.float32)
    product = np.empty((d, d), dtype=np.float32)
    best = float("inf")
    with one_blas_thread():
        for _ in range(3):
            t = time.process_time()
            np.matmul(block.T, block, out=product)
            best = min(best, time.process_time() - t)
    return best * n / 4096


def captured_over_exact(src: object, randomized: object) -> float:
    """The variance the randomized components capture over the exact components' (the optimum):
    ``tr(U^T C U) / sum(lambda_1..P)`` on the exact covariance (one more exact pass, not timed)."""
    import numpy as np

    from pipeline.engine.engines import LocalEngine
    from pipeline.fit.projection import data_moments

    moments = data_moments(LocalEngine(), src)
    cov = moments.covariance()
    u = randomized.components  # type: ignore[attr-defined]
    p = u.shape[1]
    best = np.linalg.eigvalsh(cov)[::-1][:p].sum()
    return float(np.einsum("ij,ij->", u, cov @ u) / best)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="/work/scratch/sun.zarr")
    ap.add_argument("--pca", type=int, default=128)
    ap.add_argument("-k", "--components", type=int, default=1000)
    ap.add_argument("--iters", type=int, default=3, help="iterations per fit (>= 2)")
    ap.add_argument("--persist", default="never", choices=("never", "always"))
    ap.add_argument("--skip-truncated", action="store_true")
    ap.add_argument("--solvers", nargs="+", default=["exact", "randomized"], choices=("exact", "randomized"))
    ap.add_argument("--parts", action="store_true",
                    help="also time the pass's parts, one chunk at a time on one thread")
    args = ap.parse_args()
    if args.iters < 2:
        ap.error("--iters must be at least 2 (the first iteration is not timed)")

    from pipeline.engine.blas import blas_libraries
    from pipeline.engine.engines import LocalEngine
    from pipeline.engine.sources import StoreSource
    from pipeline.fit.projection import projection_pass

    src = StoreSource(args.store)
    n, d = src.n_rows, src.n_features
    out: dict[str, object] = {"store": args.store, "shape": [n, d], "pca": args.pca, "k": args.components,
                              "persist": args.persist, "threads": LocalEngine().threads,
                              "load_before": _load()}

    def timed_pass(tag: str, solver: str) -> tuple[float, float]:
        t0, u0, s0 = _usage()
        proj = projection_pass(LocalEngine(persist="auto"), src, args.pca, False, solver, 0)
        t1, u1, s1 = _usage()
        wall, cpu = t1 - t0, (u1 - u0) + (s1 - s0)
        out[f"projection_{solver}_{tag}"] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                                             "user_s": round(u1 - u0, 2), "sys_s": round(s1 - s0, 2),
                                             "explained_variance": round(float(proj.variances.sum()), 4),
                                             "load_after": _load()}
        found[solver] = proj
        return wall, cpu

    found: dict[str, object] = {}
    passes = {solver: [timed_pass("before", solver)] for solver in args.solvers}  # again after the fits
    out["blas"] = blas_libraries()
    out["syrk_floor_cpu_s"] = round(syrk_floor(n, d), 2)
    if "randomized" in found:
        out["captured_over_exact"] = round(captured_over_exact(src, found["randomized"]), 5)
    if args.parts:
        out["projection_parts_user_sys_s"] = pass_parts(args.store, args.pca)
        out["load_after_parts"] = _load()
    runs = {"exact": 0} if args.skip_truncated else {"exact": 0, "truncated": None}
    typical: dict[str, tuple[float, float]] = {}
    for name, cand in runs.items():
        it = vbem_iterations(args.store, args.components, args.iters, args.persist, cand)
        typical[name] = statistics.median(it["seconds"][1:]), statistics.median(it["cpu"][1:])
        out[f"vbem_{name}_iteration_s"] = [round(s, 2) for s in it["seconds"]]
        out[f"vbem_{name}_iteration_cpu_s"] = [round(s, 2) for s in it["cpu"][1:]]
        out[f"vbem_{name}_components"] = [int(c) for c in it["components"]]
        if min(it["components"][1:]) < args.components:
            out[f"vbem_{name}_warning"] = "components were dropped: the iterations are not at K"
        out[f"load_after_{name}"] = _load()
        print(json.dumps(out), flush=True)
    for solver in args.solvers:
        passes[solver].append(timed_pass("after", solver))
        wall, cpu = (statistics.mean(p[i] for p in passes[solver]) for i in (0, 1))
        for name, (it_wall, it_cpu) in typical.items():  # the two passes' mean over the median iteration
            out[f"projection_{solver}_over_{name}_iteration"] = round(wall / it_wall, 3)
            out[f"projection_{solver}_over_{name}_iteration_cpu"] = round(cpu / it_cpu, 3)
    for name, (_, it_cpu) in typical.items():
        out[f"syrk_floor_over_{name}_iteration_cpu"] = round(out["syrk_floor_cpu_s"] / it_cpu, 3)  # type: ignore[operator]
    print(json.dumps(out, indent=1))

if __name__ == "__main__":
    main()
