"""Clustering metrics against reference labels: NMI, ACC (Hungarian matching), ARI.

NumPy/SciPy only (vbcore's rule); tested against scikit-learn's implementations.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import comb


def contingency(labels_true: np.ndarray, labels_pred: np.ndarray) -> np.ndarray:
    """Counts ``C[i, j]`` of rows with true class i and predicted cluster j (dense)."""
    t = np.asarray(labels_true).ravel()
    p = np.asarray(labels_pred).ravel()
    if t.shape != p.shape:
        raise ValueError(f"labels have different lengths: {t.shape[0]} and {p.shape[0]}")
    _, ti = np.unique(t, return_inverse=True)
    _, pi = np.unique(p, return_inverse=True)
    c = np.zeros((ti.max() + 1, pi.max() + 1), dtype=np.int64)
    np.add.at(c, (ti, pi), 1)
    return c


def _entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def nmi(labels_true: np.ndarray, labels_pred: np.ndarray) -> float:
    """Normalised mutual information, arithmetic-mean normalisation (scikit-learn's default)."""
    c = contingency(labels_true, labels_pred).astype(np.float64)
    n = c.sum()
    ht, hp = _entropy(c.sum(1)), _entropy(c.sum(0))
    if ht == 0 and hp == 0:
        return 1.0
    nz = c > 0
    outer = np.outer(c.sum(1), c.sum(0))
    mi = float((c[nz] / n * (np.log(c[nz] * n) - np.log(outer[nz]))).sum())
    denom = 0.5 * (ht + hp)
    return max(mi, 0.0) / denom if denom > 0 else 0.0


def acc(labels_true: np.ndarray, labels_pred: np.ndarray) -> float:
    """Clustering accuracy: the best one-to-one matching of clusters to classes (Hungarian)."""
    c = contingency(labels_true, labels_pred)
    rows, cols = linear_sum_assignment(-c)
    return float(c[rows, cols].sum() / c.sum())


def ari(labels_true: np.ndarray, labels_pred: np.ndarray) -> float:
    """Adjusted Rand index."""
    c = contingency(labels_true, labels_pred)
    n = c.sum()
    sum_ij = comb(c, 2).sum()
    sum_a, sum_b = comb(c.sum(1), 2).sum(), comb(c.sum(0), 2).sum()
    expected = sum_a * sum_b / comb(n, 2) if n > 1 else 0.0
    maximum = 0.5 * (sum_a + sum_b)
    if maximum == expected:
        return 1.0
    return float((sum_ij - expected) / (maximum - expected))
