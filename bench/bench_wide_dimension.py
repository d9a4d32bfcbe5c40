"""How many principal components of a wide store's normalised rows carry structure above the noise
(issue 51; the measurement behind ``pipeline.fit.wide.WIDE_DEFAULT``'s space, docs/decisions.md).

    python bench/bench_wide_dimension.py STORE [STORE ...] [--normalize power-l2] [--cap 512]

For each store: the rows of the fit's screening subsample (``pipeline.fit.select.screen_rows``, seed
0), normalised as the wide default does, their covariance's eigenvalues (float64), and two estimates
of the number P of components above the noise:

* **Marchenko-Pastur**: the eigenvalues above the edge ``sigma^2 (1 + sqrt(D / n))^2`` of white noise
  of variance ``sigma^2``, with ``sigma^2`` the mean of the eigenvalues below the edge (iterated to a
  fixed point from the mean of all);
* **Minka 2000** ("Automatic choice of dimensionality for PCA"): the P of the highest Laplace
  approximation to the probabilistic PCA evidence (the estimator of scikit-learn's
  ``PCA(n_components='mle')``), searched up to ``--cap``.

Prints one JSON line per store: n, D, P by each estimate, the variance share of the leading 64, 128
and 256 components, and the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy.special import gammaln

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def mp_dimension(eigenvalues: np.ndarray, n_rows: int, max_rounds: int = 100) -> tuple[int, float]:
    """The number of ``eigenvalues`` (of a D x D sample covariance of ``n_rows`` rows) above the
    Marchenko-Pastur edge of white noise whose variance is the mean of the eigenvalues below the edge;
    and that variance."""
    lam = np.sort(np.asarray(eigenvalues, dtype=np.float64))[::-1]
    d = lam.shape[0]
    edge_factor = (1.0 + np.sqrt(d / float(n_rows))) ** 2
    k = 0
    sigma2 = float(lam.mean())
    for _ in range(max_rounds):
        sigma2 = float(lam[k:].mean()) if k < d else 0.0
        k_next = int(np.sum(lam > sigma2 * edge_factor))
        if k_next == k:
            break
        k = k_next
    return k, sigma2


def minka_evidence(eigenvalues: np.ndarray, n_rows: int, cap: int) -> np.ndarray:
    """The log evidence of probabilistic PCA of rank 1..min(cap, D - 1) by Minka's (2000) Laplace
    approximation, for the eigenvalues of a sample covariance of ``n_rows`` rows (the formula of
    scikit-learn's ``PCA(n_components='mle')``, vectorised over the pairs)."""
    lam = np.sort(np.asarray(eigenvalues, dtype=np.float64))[::-1]
    d = lam.shape[0]
    n = float(n_rows)
    out = np.full(min(cap, d - 1), -np.inf)
    for k in range(1, out.shape[0] + 1):
        if lam[k - 1] < 1e-15:
            break
        i = np.arange(1, k + 1)
        pu = -k * np.log(2.0) + np.sum(gammaln((d - i + 1) / 2.0) - np.log(np.pi) * (d - i + 1) / 2.0)
        pl = -np.sum(np.log(lam[:k])) * n / 2.0
        v = max(1e-15, float(lam[k:].sum()) / (d - k))
        pv = -np.log(v) * n * (d - k) / 2.0
        m = d * k - k * (k + 1.0) / 2.0
        pp = np.log(2.0 * np.pi) * (m + k) / 2.0
        held = lam.copy()
        held[k:] = v
        upper = np.arange(d)[None, :] > np.arange(k)[:, None]  # the pairs i < k, j > i
        pairs = (lam[:k, None] - lam[None, :]) * (1.0 / held[None, :] - 1.0 / held[:k, None])
        pa = np.sum(np.log(pairs[upper])) + upper.sum() * np.log(n)
        out[k - 1] = pu + pl + pv + pp - pa / 2.0 - k * np.log(n) / 2.0
    return out


def minka_dimension(eigenvalues: np.ndarray, n_rows: int, cap: int) -> int:
    """The rank of the highest :func:`minka_evidence` (1..min(cap, D - 1))."""
    return int(np.argmax(minka_evidence(eigenvalues, n_rows, cap))) + 1


def measure(store: str, normalize: str, cap: int) -> dict:
    from pipeline.engine.sources import StoreSource
    from pipeline.fit import select
    from vbcore.data.normalize import normalize_chunk

    t = time.perf_counter()
    rows = normalize_chunk(select.screen_rows(StoreSource(store), 0), normalize).astype(np.float64)
    n, d = rows.shape
    centred = rows - rows.mean(0)
    lam = np.clip(np.linalg.eigvalsh(centred.T @ centred / (n - 1))[::-1], 0.0, None)
    mp, sigma2 = mp_dimension(lam, n)
    share = np.cumsum(lam) / lam.sum()
    return {"store": store, "rows": n, "dim": d, "normalize": normalize, "mp_dimension": mp,
            "mp_noise_variance": sigma2, "minka_dimension": minka_dimension(lam, n, cap), "cap": cap,
            "variance_share": {str(p): round(float(share[p - 1]), 3) for p in (64, 128, 256) if p <= d},
            "seconds": round(time.perf_counter() - t, 1), "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", nargs="+")
    ap.add_argument("--normalize", default="power-l2", choices=["none", "l2", "power-l2"])
    ap.add_argument("--cap", type=int, default=512)
    args = ap.parse_args(argv)
    for store in args.stores:
        print(json.dumps(measure(store, args.normalize, args.cap)), flush=True)


if __name__ == "__main__":
    main()
