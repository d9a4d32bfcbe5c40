"""VB EM at scale (issue 52): seconds per iteration, CPU seconds and peak RSS on synthetic stores of
1M, 4M and 16M rows x 256, persisted and streamed, beside the GEMM floor of the same run.

The fit is the issue's: ``VBMixture(100, covariance_type="diag", max_iter=6, tol=0, persist=MODE,
init_params="k-means++-projected", prior_defaults="empirical", learner_options={"moves": "none",
"candidates": 0})`` on the in-process engine (2 threads, one BLAS thread each). Every fit runs in a
fresh process (its peak RSS is its own); seconds and CPU seconds per iteration are the medians of the
differences between the callbacks of iterations 2..6 (the setup pass and the first iteration left
out). The GEMM floor is ``8 N D K`` flops (the E-step's and the statistics' products of N x 2D x K)
at the rate of float32 GEMMs of the kernels' block shape (2,048 x 2D @ 2D x K) on every core at once,
one BLAS thread each, measured at the start of the run.

Run (heavy: under the machine's benchmark lock):
  flock /work/wt/bench.lock python bench/bench_scale.py --rows 1000000,4000000 [--workdir bench/out]
  [--modes persisted,streamed] [--codec lz4] [--iters 6] [--k 100] [--dim 256]
A store is generated once per size and codec (``WORKDIR/scale-<rows>-<dim>-<codec>.zarr``, kept);
``persisted`` is skipped where the prepared chunks (2x the float32 rows) would take more than half of
this machine's memory. ``--child`` is internal (one fit; prints one JSON line).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gemm_rate(dim: int, k: int, threads: int, seconds: float = 3.0) -> float:
    """float32 GEMM flop/s of (2048 x 2D) @ (2D x K) blocks, ``threads`` at once, one BLAS thread each."""
    from pipeline.engine.blas import one_blas_thread

    a = np.random.default_rng(0).random((2048, 2 * dim), dtype=np.float32)
    b = np.random.default_rng(1).random((2 * dim, k), dtype=np.float32)
    counts = [0] * threads

    def run(i: int) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            a @ b
            counts[i] += 1

    with one_blas_thread():
        a @ b  # warm
        ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.perf_counter() - t0
    return sum(counts) * 2.0 * 2048 * 2 * dim * k / wall


def child(store: str, mode: str, k: int, iters: int) -> None:
    from pipeline import VBMixture

    stamps: list[tuple[float, float]] = []

    def callback(info: dict) -> None:
        stamps.append((time.perf_counter(), time.process_time()))

    t0, c0 = time.perf_counter(), time.process_time()
    VBMixture(k, covariance_type="diag", max_iter=iters, tol=0, persist=mode, random_state=0,
              init_params="k-means++-projected", prior_defaults="empirical",
              learner_options={"moves": "none", "candidates": 0}).fit(store, callback=callback)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    dw = [b[0] - a[0] for a, b in zip(stamps, stamps[1:], strict=False)]
    dc = [b[1] - a[1] for a, b in zip(stamps, stamps[1:], strict=False)]
    print(json.dumps({"s_iter": statistics.median(dw), "cpu_iter": statistics.median(dc),
                      "iters": len(stamps),
                      "wall": wall, "cpu": cpu,
                      "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}))


def make(path: str, rows: int, dim: int, codec: str) -> None:
    from pipeline.ingest import ingest

    if os.path.exists(path):
        return
    t = time.perf_counter()
    ingest("synthetic", path, chunk_rows=8192, rows=rows, dim=dim, classes=100, seed=0, codec=codec)
    print(f"made {path} in {time.perf_counter() - t:.0f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1000000,4000000,16000000")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--modes", default="persisted,streamed")
    ap.add_argument("--codec", default="lz4")
    ap.add_argument("--workdir", default="bench/out")
    ap.add_argument("--child", nargs=2, metavar=("STORE", "MODE"))
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], a.k, a.iters)
        return
    from pipeline.engine.blas import default_threads
    from pipeline.engine.memory import memory_budget

    os.makedirs(a.workdir, exist_ok=True)
    threads = default_threads()
    rate = gemm_rate(a.dim, a.k, threads)
    print(f"load {os.getloadavg()[0]:.2f}; GEMM rate {rate / 1e9:.1f} GFLOP/s on {threads} threads "
          f"(one BLAS thread each); memory budget {memory_budget() / 1e9:.1f} GB", flush=True)
    print(f"{'rows':>10} {'mode':>9} {'s/iter':>7} {'CPU s/it':>8} {'floor s':>7} {'x floor':>7} "
          f"{'s/iter/Mrow':>11} {'peak GB':>7} {'load':>5}")
    rows_done: dict[int, dict[str, dict]] = {}
    for rows in [int(r) for r in a.rows.split(",")]:
        path = os.path.join(a.workdir, f"scale-{rows}-{a.dim}-{a.codec}.zarr")
        make(path, rows, a.dim, a.codec)
        floor = 8.0 * rows * a.dim * a.k / rate
        for mode in a.modes.split(","):
            mode_arg = {"persisted": "always", "streamed": "never"}[mode]
            if mode == "persisted" and 2 * 4 * rows * a.dim > 0.5 * memory_budget():
                print(f"{rows:>10} {mode:>9}  skipped: 2x the rows over half the memory budget")
                continue
            out = subprocess.run([sys.executable, __file__, "--child", path, mode_arg, "--k", str(a.k),
                                  "--iters", str(a.iters)], capture_output=True, text=True,
                                 env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
            if out.returncode != 0:
                print(f"{rows:>10} {mode:>9}  failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows_done.setdefault(rows, {})[mode] = r
            print(f"{rows:>10} {mode:>9} {r['s_iter']:7.2f} {r['cpu_iter']:8.2f} {floor:7.2f} "
                  f"{r['s_iter'] / floor:7.2f} {r['s_iter'] / rows * 1e6:11.3f} {r['peak_rss_gb']:7.2f} "
                  f"{os.getloadavg()[0]:5.2f}", flush=True)
    print("ratios (one run):")
    for rows, by in rows_done.items():
        if "persisted" in by and "streamed" in by:
            p, s = by["persisted"], by["streamed"]
            print(f"  {rows}: streamed / persisted {s['s_iter'] / p['s_iter']:.2f} wall, "
                  f"{s['cpu_iter'] / p['cpu_iter']:.2f} CPU")
    for mode in ("persisted", "streamed"):
        pts = [(r, by[mode]["s_iter"] / r) for r, by in rows_done.items() if mode in by]
        if len(pts) > 1:
            print(f"  {mode}: s/iter per row, largest over smallest N: {pts[-1][1] / pts[0][1]:.2f} "
                  f"({pts[0][0]} -> {pts[-1][0]} rows)")


if __name__ == "__main__":
    main()
