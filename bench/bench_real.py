"""The ``real`` study (pipeline/studies/real.py) with its options: Fashion-MNIST EfficientNet-Lite0
features, every learner at K = 50 and 100 (raw, after pca=64 / 128, and power + L2 rows with 64
whitened components), scikit-learn's BayesianGaussianMixture and KMeans on the same rows.

    python bench/bench_real.py --out bench/out [--split t10k] [--rows 20000] [--only vbem sklearn-bgm]

Writes OUT/real/README.md (table, targets), results.csv, fits.jsonl and nmi_time.png; the features
are extracted once into OUT/real/features/ and reused. The full run takes hours on 2 cores
(scikit-learn's BGM is about 6 minutes per fit on all 70,000 rows).
"""

from __future__ import annotations

import argparse

from pipeline.studies import one_blas_thread
from pipeline.studies.real import FEATURES, feature_set, run
from vbcore.errors import ConfigError


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--rows", type=int, default=None, help="a seeded subsample of the 70,000 rows")
    ap.add_argument("--only", nargs="*", default=None, help="learners / sklearn-bgm / sklearn-kmeans")
    ap.add_argument("--max-iter", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--resume", action="store_true", help="keep OUT/real/fits.jsonl's fits, run the rest")
    ap.add_argument("--features", nargs="*", default=list(FEATURES),
                    help="feature sets: raw or pcaP (pcaPw: whitened), optionally after l2- or power-l2- "
                         f"(default: {' '.join(FEATURES)})")
    ap.add_argument("--split", default="all", choices=["all", "t10k", "train"],
                    help="extract only the test (10,000) or training (60,000) images")
    ap.add_argument("--defaults", default="pipeline", choices=["pipeline", "estimator"],
                    help="vbcluster fits with the command line's settings or VBMixture's scikit-learn ones")
    a = ap.parse_args()
    for tag in a.features:
        try:
            feature_set(tag)
        except ConfigError as exc:
            ap.error(str(exc))
    with one_blas_thread():
        folder = run(a.out, quick=a.quick, seed=a.seed, rows=a.rows, only=a.only, max_iter=a.max_iter,
                     split=a.split, resume=a.resume, feature_sets=tuple(a.features), defaults=a.defaults)
    print(f"wrote {folder}/README.md")


if __name__ == "__main__":
    main()
