"""Model selection on a wide store within one whitened space (issue 51; pipeline/fit/select.py
``wide_space``): each candidate fitted to the screen's subsample in the space, then chosen models fitted
to all rows cold, warm-started from their screen fit (one projection of all rows for both), or
over-relaxed (``accelerate``).

    python bench/bench_select_wide.py STORE [--labels y.npy] [--pca 64] \\
        [--screen full:sklearn full:empirical diag:empirical] \\
        [--full full:empirical:cold full:empirical:acc full:empirical:warm full:empirical:warmacc]

Prints one JSON line per fit: the bound per row of the projected rows, clusters, NMI (labels: the
store's own, or ``--labels``), iterations, seconds and the load average. ``vbcluster fit STORE --run-dir
R --select auto`` is the command end to end; this shows the parts (docs/decisions.md, "Wide stores").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _fit(spec, source, projection, warm=None):
    from pipeline.engine.engines import LocalEngine
    from pipeline.fit.driver import run_fit

    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_fit(spec, source, LocalEngine(), random_state=0, projection=projection, warm=warm)
    return out, time.perf_counter() - t


def _row(out, rows, labels, seconds, **what) -> dict:
    from bench_select_rank import _predict
    from sklearn.metrics import normalized_mutual_info_score as nmi

    from pipeline.fit.driver import n_effective

    return {**what, "bound": out.terms.total / len(rows), "clusters": n_effective(out.post, out.prior),
            "nmi": float(nmi(labels, _predict(out, rows))), "iterations": out.n_iter,
            "converged": out.converged, "seconds": round(seconds, 1), "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    import zarr

    import pipeline.fit.select as select
    from pipeline.engine.engines import LocalEngine
    from pipeline.fit.projection import projection_pass
    from pipeline.fit.setup import open_source
    from pipeline.fit.spec import FitSpec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--labels", default=None)
    ap.add_argument("--pca", type=int, default=64)
    ap.add_argument("--screen", nargs="*", default=["full:sklearn", "full:empirical", "diag:empirical"])
    ap.add_argument("--full", nargs="*", default=["full:empirical:cold", "full:empirical:acc"])
    args = ap.parse_args(argv)
    y = np.load(args.labels) if args.labels else np.asarray(zarr.open(args.store)["labels"][:])
    src = open_source(args.store, 8192)
    proj = projection_pass(LocalEngine(), src, args.pca, True)  # all rows' projection: one space
    chunks = select.screen_chunks(src, 0)
    slices = src.chunk_slices()
    rows = np.concatenate([src.load(i) for i in chunks])
    labels = np.concatenate([y[slices[i].start:slices[i].stop] for i in chunks])
    sub = open_source(rows, 8192)
    screened = {}
    for item in args.screen:
        cov, priors = item.split(":")
        spec = FitSpec(covariance=cov, priors=priors, pca=args.pca, whiten=True, seed=0,
                       max_iter=select.SCREEN_MAX_ITER).resolved()
        out, sec = _fit(spec, sub, proj)
        screened[(cov, priors)] = out
        print(json.dumps(_row(out, rows, labels, sec, stage="screen", model=item)), flush=True)
    everything = np.concatenate([src.load(i) for i in range(len(slices))])
    for item in args.full:
        cov, priors, mode = item.split(":")
        opts = {"accelerate": True} if mode.endswith("acc") else {}
        spec = FitSpec(covariance=cov, priors=priors, pca=args.pca, whiten=True, seed=0,
                       learner_options=opts).resolved()
        warm = screened[(cov, priors)].post if mode.startswith("warm") else None
        out, sec = _fit(spec, src, proj, warm)
        print(json.dumps(_row(out, everything, y, sec, stage="all rows", model=item)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
