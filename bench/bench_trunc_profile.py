"""Issue 52's truncated E-step measurement: 60,000 x 256 synthetic (600 planted classes), K = 600,
finite weights, ``candidates=8`` against ``candidates=0`` (the exact E-step), the same start: median
seconds per iteration (iterations 2..8), bound, NMI, load; ``prof C [ITERS]``: a cProfile of the fit
with ``candidates=C`` on one thread (the in-process engine with threads=1, so the chunk kernels run
in the profiled thread).

Run: ``flock /work/wt/bench.lock python bench/bench_trunc_profile.py [time | prof 8 6]``
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PATH = "bench/out/planted-60000x256-600.zarr"


def run(c: int, iters: int = 8, prof: cProfile.Profile | None = None, threads: int | None = None,
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
    m.fit(PATH, callback=lambda info: stamps.append(time.perf_counter()))
    if prof is not None:
        prof.disable()
    return statistics.median(np.diff(stamps)[1:]), m


def main() -> None:
    from pipeline.ingest import ingest
    from pipeline.store.features import FeatureStore
    from vbcore.data.metrics import nmi

    if not os.path.exists(PATH):
        ingest("synthetic", PATH, chunk_rows=8192, rows=60000, dim=256, classes=600, seed=0)
    store = FeatureStore.open(PATH)
    y, X = store.read_labels(), store.read()
    if len(sys.argv) < 2 or sys.argv[1] == "time":
        for c, br in ((0, None), (8, None), (8, 256), (8, 1024), (0, None), (8, None)):
            s, m = run(c, br=br)
            print(f"candidates={c} block_rows={br}: {s:.3f} s/iter  bound {m.lower_bound_:.6g}  "
                  f"NMI {nmi(y, m.predict(X)):.4f}  load {os.getloadavg()[0]:.2f}", flush=True)
        return
    p = cProfile.Profile()
    run(int(sys.argv[2]), iters=int(sys.argv[3]) if len(sys.argv) > 3 else 6, prof=p, threads=1)
    st = pstats.Stats(p)
    st.sort_stats("tottime").print_stats(25)
    st.print_callers("argsort")


if __name__ == "__main__":
    main()
