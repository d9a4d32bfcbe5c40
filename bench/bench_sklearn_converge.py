"""VB EM to convergence against scikit-learn's BayesianGaussianMixture on the same rows and settings
(issue 25's second target: >= 10x faster, clusters within 20%).

Both estimators get the same float32 rows in memory and the same arguments: ``n_components`` (50),
``covariance_type='diag'``, ``weight_concentration_prior_type='dirichlet_process'``, ``max_iter=300``,
``random_state=0`` and scikit-learn's other defaults (``VBMixture``'s defaults are scikit-learn's
model and start). They run one after the other in this process, so the ratio of their wall times is
measured in one run; the load average is printed with it. Clusters: components holding at least one
row's worth of responsibility (``n_effective_``; for scikit-learn ``weights_ * n >= 1``).

    python bench/bench_sklearn_converge.py --out bench/out  # the study's Fashion-MNIST features
    python bench/bench_sklearn_converge.py --features X.npy --labels y.npy

The default rows are the real study's (``vbcluster study real``): Fashion-MNIST's 70,000 images
through EfficientNet-Lite0, extracted once into OUT/real/features and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np


def rows(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    if args.features:
        return np.load(args.features).astype(np.float32, copy=False), np.load(args.labels)
    from pipeline.studies.real import features

    X, y, _ = features(Path(args.out) / "real", quick=False)
    return X, y


def timed(est, X: np.ndarray) -> float:
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a ConvergenceWarning is reported through converged_
        est.fit(X)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--features", default=None, help="an (n, D) .npy of features instead of the study's")
    ap.add_argument("--labels", default=None, help="their labels (.npy), with --features")
    ap.add_argument("--components", type=int, default=50)
    ap.add_argument("--max-iter", type=int, default=300)
    args = ap.parse_args()
    from sklearn.metrics import normalized_mutual_info_score as nmi
    from sklearn.mixture import BayesianGaussianMixture

    from pipeline import VBMixture

    X, y = rows(args)
    kw = dict(n_components=args.components, covariance_type="diag", max_iter=args.max_iter,
              weight_concentration_prior_type="dirichlet_process", random_state=0)
    load = [round(v, 2) for v in os.getloadavg()]
    ours, theirs = VBMixture(**kw), BayesianGaussianMixture(**kw)
    t_ours = timed(ours, X)
    t_theirs = timed(theirs, X)
    found = int((theirs.weights_ * X.shape[0] >= 1).sum())
    out = {
        "rows": list(X.shape), "settings": dict(kw),
        "vbcluster": {"seconds": round(t_ours, 1), "iterations": ours.n_iter_, "converged": ours.converged_,
                      "clusters": ours.n_effective_, "nmi": round(nmi(y, ours.predict(X)), 4)},
        "scikit-learn": {"seconds": round(t_theirs, 1), "iterations": theirs.n_iter_,
                         "converged": theirs.converged_, "clusters": found,
                         "nmi": round(nmi(y, theirs.predict(X)), 4)},
        "speedup to convergence": round(t_theirs / t_ours, 2),
        "speedup per iteration": round((t_theirs / theirs.n_iter_) / (t_ours / ours.n_iter_), 2),
        "clusters vs scikit-learn": f"{100 * (ours.n_effective_ - found) / max(found, 1):+.0f}%",
        "load average": [load, [round(v, 2) for v in os.getloadavg()]],
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
