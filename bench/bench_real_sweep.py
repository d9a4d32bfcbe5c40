"""Every learner x every covariance type it takes, on real features (issue 25: "every learner and
covariance type works on real features"): a seeded subsample of a labelled feature store (the
``real`` study's Fashion-MNIST EfficientNet-Lite0 store), raw and after a 32-d PCA (scikit-learn's;
full and tied only there: D = 1280 Wishart fits are too slow for a sweep), K = 20, 15 iterations.

    python bench/bench_real_sweep.py STORE [--rows 3000] [--iterations 15] [--learners vbem ncg]

Prints one line per fit: ok with clusters found, NMI and wall time, or FAIL with the error.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np


def main() -> None:
    from sklearn.decomposition import PCA
    from sklearn.metrics import normalized_mutual_info_score as nmi

    from pipeline import VBMixture
    from pipeline.fit.learners import LEARNERS
    from pipeline.store.features import FeatureStore

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--iterations", type=int, default=15)
    ap.add_argument("--learners", nargs="*", default=None)
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    s = FeatureStore.open(a.store)
    X, y = np.asarray(s.read()), np.asarray(s.read_labels())
    idx = np.sort(np.random.default_rng(0).choice(len(X), min(a.rows, len(X)), replace=False))
    X, y = X[idx], y[idx]
    Z = PCA(32, random_state=0).fit_transform(X).astype(np.float32)
    for name, cls in LEARNERS.items():
        if a.learners and name not in a.learners:
            continue
        for ct in cls.covariance_types:
            for tag, data in (("raw", X), ("pca32", Z)):
                if tag == "raw" and ct in ("full", "tied"):
                    continue
                t = time.perf_counter()
                try:
                    m = VBMixture(20, covariance_type=ct, learner=name, max_iter=a.iterations,
                                  random_state=0).fit(data)
                    p = m.predict(data)
                    print(f"{name:8s} {ct:9s} {tag:6s} ok   K={len(np.unique(p)):3d} nmi={nmi(y, p):.3f} "
                          f"it={m.n_iter_} {time.perf_counter() - t:.1f}s", flush=True)
                except Exception as exc:  # noqa: BLE001 - the sweep reports every failure
                    print(f"{name:8s} {ct:9s} {tag:6s} FAIL {type(exc).__name__}: {str(exc)[:300]}",
                          flush=True)


if __name__ == "__main__":
    main()
