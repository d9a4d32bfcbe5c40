"""Merges for the hard-assignment (MAP) learners, judged on the exact ELBO of all rows.

A one-hot q(z) has no entropy term, so the exact ELBO of a labelling at its optimal q(theta) (for the
fixed-variance DP mixture: ``q(mu_k) = N((lambda0 m0 + n_k xbar_k)/(lambda0 + n_k), sigma^2/(lambda0 +
n_k) I)`` and ``q(v_k) = Beta(1 + n_k, a0 + n_{>k})``) follows from the hard statistics alone, and so
does its change when two clusters merge (:func:`vbcore.moves.exact.select_merges` with no entropy change).
The statistics are those of **all** rows (one full pass): a minibatch estimate reads a cluster it
missed as free to give up, and the MAP bound ``ln p(x, z, mu, v)`` at the point has no Occam term
for the means (``q(mu_k)``'s KL grows like ``D/2 ln n_k``), so it keeps split classes
(docs/algorithms.md, "Model selection in the DP point learners").
"""

from __future__ import annotations

import numpy as np

from vbcore.kernels.sga_stats import STICK_EPS, log_stick_weights
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats
from vbcore.moves.exact import select_merges


def select_hard_merges(stats: SuffStats, pairs: np.ndarray, prior: Prior,
                       limit: int | None = None) -> tuple[np.ndarray, float]:
    """Disjoint merges of hard clusters (``stats``: one-hot statistics of all rows, in the learner's
    order) whose exact ELBO change is positive, chosen greedily among the ``limit`` pairs of largest
    change alone. Returns (pairs (M, 2), a < b, b merged into a; the exact ELBO change of the set)."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return select_merges(stats, pairs, np.zeros(pairs.shape[0]), prior, 0.0, limit)


def nearest_pairs(means: np.ndarray, neighbours: int) -> np.ndarray:
    """Each row of ``means`` (K, D) paired with its ``neighbours`` nearest (Euclidean), as unique
    pairs a < b, shape (P, 2)."""
    k = means.shape[0]
    if k < 2 or neighbours < 1:
        return np.zeros((0, 2), dtype=np.int64)
    sq = np.einsum("kd,kd->k", means, means)
    dist = sq[:, None] + sq[None, :] - 2.0 * means @ means.T
    np.fill_diagonal(dist, np.inf)
    near = np.argsort(dist, axis=1, kind="stable")[:, : min(neighbours, k - 1)]
    a = np.repeat(np.arange(k), near.shape[1])
    b = near.ravel()
    return np.unique(np.stack((np.minimum(a, b), np.maximum(a, b)), axis=1), axis=0)


def merge_points(means: np.ndarray, sticks: np.ndarray, counts: np.ndarray,
                 pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Point estimates after merging the disjoint ``pairs`` (b into a, b removed): the count-weighted
    mean, the summed mixture weight ``pi_a + pi_b`` (sticks re-derived in the remaining order) and
    the summed count. Returns (means, sticks, counts, kept indices)."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    means, counts = means.copy(), np.asarray(counts, dtype=np.float64).copy()
    pi = np.exp(log_stick_weights(sticks))
    a, b = pairs[:, 0], pairs[:, 1]
    tot = counts[a] + counts[b]
    wa = np.where(tot > 0, counts[a] / np.where(tot > 0, tot, 1.0), 1.0)
    means[a] = wa[:, None] * means[a] + (1.0 - wa)[:, None] * means[b]
    counts[a], pi[a] = tot, pi[a] + pi[b]
    keep = np.setdiff1d(np.arange(means.shape[0]), b)
    pi = pi[keep]
    left = 1.0 - np.concatenate(([0.0], np.cumsum(pi)[:-1]))
    new_sticks = np.clip(pi / np.maximum(left, STICK_EPS), STICK_EPS, 1.0 - STICK_EPS)
    return means[keep], new_sticks, counts[keep], keep
