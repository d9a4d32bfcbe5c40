"""Merges for the hard-assignment (MAP) learners on their bound ``ln p(x, z, mu, v)``
(Lim & Jiang 2024, eqs. 22-29, all constants kept).

A one-hot q(z) has no entropy term, so the change of the bound from merging two clusters is exact
from hard statistics alone, with both configurations at their MM point: means
``(lambda0 m0 + n_k xbar_k) / (lambda0 + n_k)``, sticks the MAP of the counts in descending order.
"""

from __future__ import annotations

import numpy as np

from vbcore.moves import greedy_disjoint, merged_nk, take_components
from vbcore.priors import Prior
from vbcore.sga_stats import STICK_EPS, log_stick_weights
from vbcore.stats import SuffStats


def hard_component_bound(nk: np.ndarray, mean: np.ndarray, scatter: np.ndarray, prior: Prior,
                         sigma2: float, shift: np.ndarray) -> np.ndarray:
    """Per cluster: ``ln p(x_k | mu_k) + ln p(mu_k)`` at the MAP mean ``mu_k`` of its hard statistics
    (eqs. 23-24 with all constants), shape (K,)."""
    d = mean.shape[1]
    lam0 = prior.mean_precision
    m0 = prior.mean - shift
    mu = (lam0 * m0[None, :] + nk[:, None] * mean) / (lam0 + nk)[:, None]
    sq = scatter.sum(1) + nk * ((mean - mu) ** 2).sum(1)
    log_lik = -0.5 * nk * d * np.log(2 * np.pi * sigma2) - 0.5 * sq / sigma2
    log_mu = -0.5 * d * np.log(2 * np.pi * sigma2 / lam0) - 0.5 * lam0 * ((mu - m0) ** 2).sum(1) / sigma2
    return log_lik + log_mu


def hard_stick_bound(nk: np.ndarray, a0: float) -> np.ndarray:
    """``ln p(z | v) + ln p(v)`` (eqs. 25-26) at the MM sticks of the counts ordered by descending
    count (the order the MM update uses); ``nk`` (K,) or one configuration per row (P, K)."""
    rows = np.atleast_2d(np.asarray(nk, dtype=np.float64))
    n = -np.sort(-rows, axis=1)
    tail = n.sum(1, keepdims=True) - np.cumsum(n, axis=1)  # sum_{j>k} n_j (as mm_sticks)
    denom = np.maximum(n + tail + a0 - 1.0, n)
    v = np.clip(np.where(denom > 0, n / np.where(denom > 0, denom, 1.0), 0.0), 0.0, 1.0 - STICK_EPS)
    vc = np.clip(v, STICK_EPS, 1.0 - STICK_EPS)
    log_1mv = np.log1p(-vc)
    before = np.concatenate((np.zeros((n.shape[0], 1)), np.cumsum(log_1mv[:, :-1], axis=1)), axis=1)
    log_w = np.log(vc) + before
    out = np.sum(n * log_w, axis=1) + np.sum(np.log(a0) + (a0 - 1.0) * log_1mv, axis=1)
    return out if np.ndim(nk) == 2 else out[0]


def stick_merge_change(nk: np.ndarray, pairs: np.ndarray, a0: float) -> np.ndarray:
    """Change of :func:`hard_stick_bound` when each pair merges alone, shape (P,).

    For ``a0 > 1`` the MM sticks telescope: ``1 - v_k = (T_{k+1} + c) / (T_k + c)`` with
    ``T_k = sum_{j>=k} n_j`` and ``c = a0 - 1``, so ``pi_k = n_k / (N + c)`` in any order and the bound
    is ``sum_k n_k ln n_k - N ln(N + c) + K ln a0 + c (ln c - ln(N + c))``: a merge changes it by
    ``s ln s - n_a ln n_a - n_b ln n_b - ln a0`` (``s = n_a + n_b``), additive over disjoint pairs.
    Otherwise (``a0 <= 1``, where sticks are clipped) the bound of every merged configuration."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if a0 <= 1.0:
        return hard_stick_bound(merged_nk(nk, pairs), a0) - hard_stick_bound(nk, a0)
    na, nb = nk[pairs[:, 0]], nk[pairs[:, 1]]

    def xlogx(v: np.ndarray) -> np.ndarray:
        return v * np.log(np.where(v > 0, v, 1.0))

    return xlogx(na + nb) - xlogx(na) - xlogx(nb) - np.log(a0)


def _component_change(stats: SuffStats, pairs: np.ndarray, prior: Prior, sigma2: float) -> np.ndarray:
    both = take_components(stats, pairs[:, 0]).merge(take_components(stats, pairs[:, 1]))
    c = hard_component_bound(stats.nk, stats.mean, stats.scatter, prior, sigma2, stats.shift)
    return hard_component_bound(both.nk, both.mean, both.scatter, prior, sigma2, stats.shift) - (
        c[pairs[:, 0]] + c[pairs[:, 1]])


def hard_merge_gain(stats: SuffStats, pairs: np.ndarray, prior: Prior, sigma2: float,
                    a0: float) -> np.ndarray:
    """Change of the MAP bound ``ln p(x, z, mu, v)`` (at the MM point) when each pair of clusters of
    the hard statistics ``stats`` merges alone; exact (a one-hot q(z) has no entropy). Shape (P,)."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if pairs.shape[0] == 0:
        return np.zeros(0)
    return _component_change(stats, pairs, prior, sigma2) + stick_merge_change(stats.nk, pairs, a0)


def select_hard_merges(stats: SuffStats, pairs: np.ndarray, prior: Prior, sigma2: float,
                       a0: float, limit: int | None = None) -> tuple[np.ndarray, float]:
    """A set of disjoint merges of hard clusters whose exact change of the MAP bound (at the MM point)
    is positive, chosen greedily as :func:`select_merges` does among the ``limit`` best pairs.
    Returns (pairs (M, 2), gain)."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if pairs.shape[0] == 0:
        return pairs, 0.0
    local = _component_change(stats, pairs, prior, sigma2)
    alone = local + stick_merge_change(stats.nk, pairs, a0)
    now = hard_stick_bound(stats.nk, a0)

    def total(trial: list[int]) -> float:
        if a0 > 1.0:  # additive over disjoint pairs (stick_merge_change)
            return float(alone[trial].sum())
        sel = pairs[trial]
        nk = stats.nk.copy()
        nk[sel[:, 0]] += nk[sel[:, 1]]
        return float(local[trial].sum() + hard_stick_bound(np.delete(nk, sel[:, 1]), a0) - now)

    return greedy_disjoint(pairs, alone, stats.nk.shape[0], total, limit)


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
