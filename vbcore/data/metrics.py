"""Clustering metrics against reference labels: NMI, ACC (Hungarian matching), ARI.

NumPy/SciPy only (vbcore's rule); tested against scikit-learn's implementations. Each takes the rows'
``sample_weight`` (a row of weight w counts as w rows: integer weights give the metrics of the rows
repeated, 0 those of the row dropped), as the fits do.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import comb


def contingency(labels_true: np.ndarray, labels_pred: np.ndarray,
                sample_weight: np.ndarray | None = None) -> np.ndarray:
    """Counts ``C[i, j]`` of rows with true class i and predicted cluster j (dense): int64, or the
    rows' summed weights (float64; classes and clusters only of rows of positive weight)."""
    t = np.asarray(labels_true).ravel()
    p = np.asarray(labels_pred).ravel()
    if t.shape != p.shape:
        raise ValueError(f"labels have different lengths: {t.shape[0]} and {p.shape[0]}")
    w = None
    if sample_weight is not None:
        w = np.asarray(sample_weight, dtype=np.float64).ravel()
        if w.shape != t.shape:
            raise ValueError(f"{w.shape[0]} weights for {t.shape[0]} labels")
        t, p, w = t[w > 0], p[w > 0], w[w > 0]
    _, ti = np.unique(t, return_inverse=True)
    _, pi = np.unique(p, return_inverse=True)
    shape = (ti.max(initial=-1) + 1, pi.max(initial=-1) + 1)
    c = np.zeros(shape, dtype=np.int64 if w is None else np.float64)
    np.add.at(c, (ti, pi), 1 if w is None else w)
    return c


def _entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def nmi(labels_true: np.ndarray, labels_pred: np.ndarray, sample_weight: np.ndarray | None = None) -> float:
    """Normalised mutual information, arithmetic-mean normalisation (scikit-learn's default)."""
    c = contingency(labels_true, labels_pred, sample_weight).astype(np.float64)
    n = c.sum()
    ht, hp = _entropy(c.sum(1)), _entropy(c.sum(0))
    if ht == 0 and hp == 0:
        return 1.0
    nz = c > 0
    outer = np.outer(c.sum(1), c.sum(0))
    mi = float((c[nz] / n * (np.log(c[nz] * n) - np.log(outer[nz]))).sum())
    denom = 0.5 * (ht + hp)
    return max(mi, 0.0) / denom if denom > 0 else 0.0


def acc(labels_true: np.ndarray, labels_pred: np.ndarray, sample_weight: np.ndarray | None = None) -> float:
    """Clustering accuracy: the best one-to-one matching of clusters to classes (Hungarian)."""
    c = contingency(labels_true, labels_pred, sample_weight)
    rows, cols = linear_sum_assignment(-c)
    return float(c[rows, cols].sum() / c.sum())


def ari(labels_true: np.ndarray, labels_pred: np.ndarray, sample_weight: np.ndarray | None = None) -> float:
    """Adjusted Rand index (weighted rows: the pair counts ``w (w - 1) / 2`` of the summed weights)."""
    c = contingency(labels_true, labels_pred, sample_weight)
    n = c.sum()
    sum_ij = comb(c, 2).sum()
    sum_a, sum_b = comb(c.sum(1), 2).sum(), comb(c.sum(0), 2).sum()
    expected = sum_a * sum_b / comb(n, 2) if n > 1 else 0.0
    maximum = 0.5 * (sum_a + sum_b)
    if maximum == expected:
        return 1.0
    return float((sum_ij - expected) / (maximum - expected))
