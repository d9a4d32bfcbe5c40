"""The ``real`` study (pipeline/studies/real.py) with its options: Fashion-MNIST EfficientNet-Lite0
features, every learner at K = 50 and 100 (raw, and after pca=64 / 128 where the projection stage is
installed), scikit-learn's BayesianGaussianMixture and KMeans on the same rows.

    python bench/bench_real.py --out bench/out [--split t10k] [--rows 20000] [--only vbem sklearn-bgm]

Writes OUT/real/README.md (table, targets), results.csv, fits.jsonl and nmi_time.png; the features
are extracted once into OUT/real/features/ and reused. The full run takes hours on 2 cores
(scikit-learn's BGM is about 6 minutes per fit on all 70,000 rows).
"""

from __future__ import annotations

import argparse

from pipeline.studies import one_blas_thread
from pipeline.studies.real import run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--rows", type=int, default=None, help="a seeded subsample of the 70,000 rows")
    ap.add_argument("--only", nargs="*", default=None, help="learners / sklearn-bgm / sklearn-kmeans")
    ap.add_argument("--max-iter", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--resume", action="store_true", help="keep OUT/real/fits.jsonl's fits, run the rest")
    ap.add_argument("--features", nargs="*", default=["raw", "pca64", "pca128"],
                    help="feature sets: raw, pca64, pca128")
    ap.add_argument("--split", default="all", choices=["all", "t10k", "train"],
                    help="extract only the test (10,000) or training (60,000) images")
    ap.add_argument("--defaults", default="pipeline", choices=["pipeline", "estimator"],
                    help="vbcluster fits with the command line's settings or VBMixture's scikit-learn ones")
    a = ap.parse_args()
    with one_blas_thread():
        pcas = tuple(None if f == "raw" else int(f[3:]) for f in a.features)
        folder = run(a.out, quick=a.quick, seed=a.seed, rows=a.rows, only=a.only, max_iter=a.max_iter,
                     split=a.split, resume=a.resume, pcas=pcas, defaults=a.defaults)
    print(f"wrote {folder}/README.md")


if __name__ == "__main__":
    main()
