"""Merge and delete moves on the exact ELBO (Hughes & Sudderth 2013, memoized VB).

Coordinate ascent keeps a class split over several components, or a few stray rows in a small one,
because no single update leaves such a local optimum. A *move* proposes another q(Z) and keeps it
only when the exact ELBO of :func:`vbcore.model.elbo.elbo_terms` rises.

**Merge** of components a and b: ``r'_na = r_na + r_nb``, b removed. Its statistics are the exact
pairwise sum of those of a and b (Chan et al.), so the M-step, the data and prior terms and the
weight terms of the merged model follow from the summed statistics alone. The only per-row quantity
is the change of the assignment entropy, ``h_ab = sum_n s ln s - r_a ln r_a - r_b ln r_b`` with
``s = r_na + r_nb``, gathered for a list of proposed pairs in the E-step pass itself
(:func:`vbcore.moves.estep_pass.move_kernel`), as bnpy gathers its merge-pair entropies. Since ``h_ab >= 0``
the change without it is an upper bound of the exact change: pairs are proposed by that bound
(cheap, from the last iteration's statistics) and evaluated exactly with ``h_ab``.

**Delete** of a set of small components: their rows' responsibilities are re-normalised over the
other components (``r'_nk = r_nk / (1 - r_nc)``, which is the E-step with the deleted columns left
out); the statistics of that q(Z) are gathered in the same pass, next to the regular ones
(:func:`vbcore.moves.estep_pass.delete_proposal`).

The ELBO is split as ``sum_k C_k + W(N) - sum_nk r ln r`` with ``C_k`` the data and component-prior
terms of component k (:func:`component_terms`) and ``W`` the weight terms (:func:`weight_terms`);
for the DP the sticks are re-derived after removing a component, in the remaining order (the merged
component takes the earlier of the two positions).

Hard-assignment (MAP) learners: :mod:`vbcore.moves.hard`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import betaln, digamma, gammaln

from vbcore.model.elbo import elbo_terms, kl_gamma, kl_wishart, quad_precision, trace_scatter
from vbcore.model.mstep import m_step
from vbcore.model.posterior import LOG_2PI, Posterior
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats
from vbcore.moves.tied import apply_pooled_merges, tied_merge_gain


# ---- the ELBO split by component ---------------------------------------------------------------------
def component_terms(stats: SuffStats, post: Posterior, prior: Prior) -> np.ndarray:
    """``C_k = E[ln p(X | Z, mu_k, Lambda_k)]_k - KL(q(mu_k, Lambda_k) || p(mu_k, Lambda_k))``, shape (K,).

    ``sum_k C_k = log_likelihood - kl_components`` of :func:`vbcore.model.elbo.elbo_terms`.
    """
    nk, d = stats.nk, post.n_features
    beta, beta0 = post.mean_precision, prior.mean_precision
    e_log_det = post.expected_log_det_precision()
    diff = stats.mean - (post.means - stats.shift)
    log_lik = 0.5 * nk * (e_log_det - d / beta - d * LOG_2PI) - 0.5 * (
        trace_scatter(post, stats.scatter) + nk * quad_precision(post, diff))
    kl_mean = 0.5 * d * (beta0 / beta - 1.0 + np.log(beta / beta0)) + 0.5 * beta0 * quad_precision(
        post, post.means - prior.mean)
    ct = post.covariance_type
    nu, nu0 = post.degrees_of_freedom, prior.degrees_of_freedom
    if ct == "fixed":
        kl_prec = np.zeros_like(nk)
    elif ct == "full":
        assert nu is not None and prior.covariance is not None
        log_det_prec = 2.0 * np.log(np.diagonal(post.precisions_cholesky, axis1=1, axis2=2)).sum(1)
        kl_prec = kl_wishart(nu, post.covariances, nu0, np.asarray(prior.covariance), log_det_prec, e_log_det)
    elif ct == "diag":
        assert nu is not None and prior.covariance is not None
        a, b = 0.5 * nu[:, None], 0.5 * nu[:, None] * post.covariances
        kl_prec = kl_gamma(a, b, 0.5 * nu0, 0.5 * np.asarray(prior.covariance)[None, :]).sum(1)
    else:
        assert nu is not None and prior.covariance is not None
        s0 = float(np.asarray(prior.covariance))
        kl_prec = kl_gamma(0.5 * nu * d, 0.5 * nu * d * post.covariances, 0.5 * nu0 * d, 0.5 * d * s0)
    return log_lik - kl_mean - kl_prec


def weight_terms(nk: np.ndarray, prior: Prior) -> np.ndarray:
    """``W = sum_k N_k E[ln pi_k] - KL(q(pi) || p(pi))`` at the optimal q(pi) of the counts.

    Parameters
    ----------
    nk : array of shape (K,) or (P, K)
        Counts, one configuration per row.

    Returns
    -------
    float array of shape () or (P,)
    """
    n = np.atleast_2d(np.asarray(nk, dtype=np.float64))
    alpha0 = prior.weight_concentration
    if prior.weight_type == "dirichlet_distribution":
        k = n.shape[1]
        wc = alpha0 + n
        total = wc.sum(1, keepdims=True)
        e_log_pi = digamma(wc) - digamma(total)
        kl = (gammaln(total[:, 0]) - gammaln(wc).sum(1) - gammaln(alpha0 * k) + k * gammaln(alpha0)
              + ((wc - alpha0) * e_log_pi).sum(1))
    else:  # sticks Beta(1 + N_k, alpha0 + N_{>k}) in the given order (vbcore.model.mstep.weight_posterior)
        tail = np.concatenate((np.cumsum(n[:, ::-1], axis=1)[:, -2::-1], np.zeros((n.shape[0], 1))), axis=1)
        a, b = 1.0 + n, alpha0 + tail
        dab = digamma(a + b)
        log_v, log_1mv = digamma(a) - dab, digamma(b) - dab
        before = np.concatenate((np.zeros((n.shape[0], 1)), np.cumsum(log_1mv[:, :-1], axis=1)), axis=1)
        e_log_pi = log_v + before
        kl = np.sum(betaln(1.0, alpha0) - betaln(a, b) + (a - 1.0) * log_v + (b - alpha0) * log_1mv, axis=1)
    out = np.sum(n * e_log_pi, axis=1) - kl
    return out if np.ndim(nk) == 2 else out[0]


def total_elbo(stats: SuffStats, prior: Prior, reg_covar: float) -> float:
    """The exact ELBO of q(Z) summarised by ``stats`` and its M-step, from the split terms ('tied',
    whose terms do not split by component: :func:`vbcore.model.elbo.elbo_terms`)."""
    post = m_step(stats, prior, reg_covar)
    if stats.pooled:
        return elbo_terms(stats, post, prior).total
    return float(component_terms(stats, post, prior).sum() + weight_terms(stats.nk, prior) - stats.sum_rlogr)


# ---- merges from statistics -----------------------------------------------------------------------
#: pairs per block of merged M-steps (:func:`_local_gain`)
PAIR_BLOCK = 1024


def take_components(stats: SuffStats, idx: np.ndarray) -> SuffStats:
    """The statistics of components ``idx`` (repeats allowed), without ``sum r ln r`` (not for a
    pooled scatter)."""
    return SuffStats(nk=stats.nk[idx], mean=stats.mean[idx], scatter=stats.scatter[idx],
                     sum_rlogr=0.0, n_rows=stats.n_rows,
                     shift=stats.shift, weight=stats.weight)


def removes_components(prior: Prior) -> bool:
    """Whether a merged (deleted) component leaves the model (DP: the truncation shrinks, as DP
    pruning does) or stays as an empty component (finite Dirichlet: K is part of the model; 'tied':
    its shared ``q(Lambda)`` has ``nu = nu0 + N / K``, so K stays, as VB EM never prunes it)."""
    return prior.weight_type == "dirichlet_process" and prior.covariance_type != "tied"


def merged_nk(nk: np.ndarray, pairs: np.ndarray, remove: bool = True) -> np.ndarray:
    """Counts after merging each pair (a, b), a < b, alone, merged at a: shape (P, K - 1), or
    (P, K) with b left empty when ``remove`` is false."""
    p, k = pairs.shape[0], nk.shape[0]
    rows = np.tile(nk, (p, 1))
    ar = np.arange(p)
    rows[ar, pairs[:, 0]] += nk[pairs[:, 1]]
    if not remove:
        rows[ar, pairs[:, 1]] = 0.0
        return rows
    keep = np.ones((p, k), dtype=bool)
    keep[ar, pairs[:, 1]] = False
    return rows[keep].reshape(p, k - 1)


def merge_gain_bound(stats: SuffStats, pairs: np.ndarray, prior: Prior, reg_covar: float) -> np.ndarray:
    """ELBO change of merging each pair alone, without the entropy change ``-h_ab <= 0``: an upper
    bound of the exact change, from statistics alone. ``pairs`` (P, 2) int with a < b; shape (P,)."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if pairs.shape[0] == 0:
        return np.zeros(0)
    remove = removes_components(prior)
    merged = merged_nk(stats.nk, pairs, remove)
    if stats.pooled:
        return tied_merge_gain(stats, pairs, prior, reg_covar) + weight_terms(merged, prior) - weight_terms(
            stats.nk, prior)
    return _local_gain(stats, pairs, prior, reg_covar) + weight_terms(merged, prior) - weight_terms(
        stats.nk, prior)


def _local_gain(stats: SuffStats, pairs: np.ndarray, prior: Prior, reg_covar: float) -> np.ndarray:
    """``C(a + b) - C(a) - C(b)`` per pair: one M-step of the K components and one of the P merged
    (in blocks of ``PAIR_BLOCK`` pairs, so a round's memory stays O(PAIR_BLOCK D) for large P)."""
    c = component_terms(stats, m_step(stats, prior, reg_covar), prior)
    out = np.empty(pairs.shape[0])
    for i in range(0, pairs.shape[0], PAIR_BLOCK):
        p = pairs[i:i + PAIR_BLOCK]
        both = take_components(stats, p[:, 0]).merge(take_components(stats, p[:, 1]))
        merged = component_terms(both, m_step(both, prior, reg_covar), prior)
        out[i:i + PAIR_BLOCK] = merged - c[p[:, 0]] - c[p[:, 1]]
    return out


def apply_merges(stats: SuffStats, pairs: np.ndarray, h: np.ndarray, remove: bool = True) -> SuffStats:
    """Statistics after merging the disjoint ``pairs`` (a < b; b into a, b removed, or left empty
    when ``remove`` is false); ``h`` their entropy changes (added to ``sum r ln r``)."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if pairs.shape[0] == 0:
        return stats
    if stats.pooled:
        return apply_pooled_merges(stats, pairs, h, remove)
    both = take_components(stats, pairs[:, 0]).merge(take_components(stats, pairs[:, 1]))
    nk, mean, scatter = stats.nk.copy(), stats.mean.copy(), stats.scatter.copy()
    nk[pairs[:, 0]], mean[pairs[:, 0]], scatter[pairs[:, 0]] = both.nk, both.mean, both.scatter
    keep = np.ones(nk.shape[0], dtype=bool)
    if remove:
        keep[pairs[:, 1]] = False
    else:
        nk[pairs[:, 1]], mean[pairs[:, 1]], scatter[pairs[:, 1]] = 0.0, 0.0, 0.0
    return SuffStats(nk=nk[keep], mean=mean[keep], scatter=scatter[keep],
                     sum_rlogr=stats.sum_rlogr + float(np.sum(h)), n_rows=stats.n_rows,
                     shift=stats.shift, weight=stats.weight)


def select_merges(stats: SuffStats, pairs: np.ndarray, h: np.ndarray, prior: Prior,
                  reg_covar: float, limit: int | None = None) -> tuple[np.ndarray, float]:
    """A set of disjoint merges whose exact total ELBO change is positive, chosen greedily.

    Each pair's exact change alone is ``bound - h``; the set is chosen by :func:`greedy_disjoint` on
    the exact change of the whole set (additive data, prior and entropy terms over disjoint pairs; the
    weight terms of the combined counts), among the ``limit`` pairs of largest change alone (all when
    None). Hard (one-hot) assignments have ``h = 0`` and ``sum r ln r = 0``: the change is then that
    of the exact ELBO of the labels at their optimal q(theta) (:mod:`vbcore.moves.hard`).

    Returns
    -------
    accepted : int array of shape (M, 2)
    gain : float
        The exact ELBO change of the accepted set (0 when none is).
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if pairs.shape[0] == 0:
        return pairs, 0.0
    if stats.pooled:  # 'tied': the exact total of a set from its merged statistics
        base = total_elbo(stats, prior, reg_covar)
        remove = removes_components(prior)

        def pooled_total(trial: list[int]) -> float:
            return total_elbo(apply_merges(stats, pairs[trial], h[trial], remove), prior, reg_covar) - base

        return greedy_disjoint(pairs, merge_gain_bound(stats, pairs, prior, reg_covar) - h, stats.nk.shape[0],
                               pooled_total)
    local = _local_gain(stats, pairs, prior, reg_covar) - h
    w_now = float(weight_terms(stats.nk, prior))
    remove = removes_components(prior)
    alone = local + weight_terms(merged_nk(stats.nk, pairs, remove), prior) - w_now

    def total(trial: list[int]) -> float:
        sel = pairs[trial]
        nk = stats.nk.copy()
        nk[sel[:, 0]] += nk[sel[:, 1]]
        if remove:
            nk = np.delete(nk, sel[:, 1])
        else:
            nk[sel[:, 1]] = 0.0
        return float(local[trial].sum() + weight_terms(nk, prior) - w_now)

    return greedy_disjoint(pairs, alone, stats.nk.shape[0], total, limit)


def greedy_disjoint(pairs: np.ndarray, alone: np.ndarray, k: int, total: Callable[[list[int]], float],
                    limit: int | None = None) -> tuple[np.ndarray, float]:
    """Disjoint pairs with a positive exact total change ``total(indices)``, taken by their change
    alone ``alone`` (descending, ties by pair order, at most ``limit`` tried): first all disjoint pairs
    with a positive change at once (one evaluation); if their total is not positive, one pair at a
    time, each kept only when the total rises. Returns (pairs (M, 2), total)."""
    order = [int(i) for i in np.lexsort((np.arange(pairs.shape[0]), -alone))[:limit] if alone[i] > 0]
    used = np.zeros(k, dtype=bool)
    first: list[int] = []
    for i in order:
        a, b = pairs[i]
        if not (used[a] or used[b]):
            first.append(i)
            used[a] = used[b] = True
    if not first:
        return pairs[:0], 0.0
    gain = total(first)
    if gain > 0:
        return pairs[np.sort(np.asarray(first, dtype=np.int64))], gain
    used[:] = False
    chosen: list[int] = []
    gain = 0.0
    for i in order:
        a, b = pairs[i]
        if used[a] or used[b]:
            continue
        value = total([*chosen, i])
        if value > gain:
            chosen, gain = [*chosen, i], value
            used[a] = used[b] = True
    return pairs[np.sort(np.asarray(chosen, dtype=np.int64))], gain


def propose_pairs(stats: SuffStats, post: Posterior, prior: Prior, reg_covar: float,
                  neighbours: int, max_pairs: int) -> np.ndarray:
    """Candidate pairs (a < b) for the next move pass, by the upper bound of :func:`merge_gain_bound`.

    Each component is paired with its ``neighbours`` nearest components (squared distance of the means
    under the averaged diagonal precisions, one K x K GEMM); the pairs whose bound is positive are
    kept, at most ``max_pairs`` of them, best first (ties: pair order). Shape (P, 2)."""
    k = stats.nk.shape[0]
    if k < 2 or neighbours < 1 or max_pairs < 1:
        return np.zeros((0, 2), dtype=np.int64)
    m = post.means
    if post.covariance_type == "full":
        p = 1.0 / np.diagonal(post.covariances, axis1=1, axis2=2)
    elif post.covariance_type == "tied":
        p = np.broadcast_to(1.0 / np.diagonal(post.covariances), m.shape)
    else:
        p = post.precision_diagonal()
    s = np.sum(p * m * m, axis=1)
    q = p @ (m * m).T
    c = (p * m) @ m.T
    dist = 0.5 * (s[:, None] + q + q.T + s[None, :] - 2.0 * c - 2.0 * c.T)
    np.fill_diagonal(dist, np.inf)
    near = np.argsort(dist, axis=1, kind="stable")[:, : min(neighbours, k - 1)]
    a = np.repeat(np.arange(k), near.shape[1])
    b = near.ravel()
    pairs = np.unique(np.stack((np.minimum(a, b), np.maximum(a, b)), axis=1), axis=0)
    bound = merge_gain_bound(stats, pairs, prior, reg_covar)
    good = np.flatnonzero(bound > 0)
    good = good[np.lexsort((good, -bound[good]))][:max_pairs]
    return pairs[good]


def delete_candidates(nk: np.ndarray, share: float, limit: int, floor: float = 0.0) -> np.ndarray:
    """The (at most ``limit``) smallest components holding less than ``share`` of the mean count of
    the components and at least ``floor`` rows, ascending by index; never all of them. (``floor``:
    components emptied by earlier moves but kept, as 'tied' keeps them, have nothing to move.)"""
    k = nk.shape[0]
    small = np.flatnonzero((nk < share * nk.sum() / max(k, 1)) & (nk >= floor))
    small = small[np.argsort(nk[small], kind="stable")][: min(limit, k - 1)]
    return np.sort(small)


def expand_stats(stats: SuffStats, keep: np.ndarray, k: int) -> SuffStats:
    """Statistics of the components ``keep`` placed back among ``k`` (the others empty)."""
    nk = np.zeros(k)
    mean = np.zeros((k, *stats.mean.shape[1:]))
    nk[keep], mean[keep] = stats.nk, stats.mean
    if stats.pooled:
        scatter = stats.scatter
    else:
        scatter = np.zeros((k, *stats.scatter.shape[1:]))
        scatter[keep] = stats.scatter
    return SuffStats(nk=nk, mean=mean, scatter=scatter, sum_rlogr=stats.sum_rlogr, n_rows=stats.n_rows,
                     shift=stats.shift, weight=stats.weight, pooled=stats.pooled)


def reindex_pairs(pairs: np.ndarray, keep: np.ndarray, k: int) -> np.ndarray:
    """``pairs`` in the indexing of the kept components ``keep`` (pairs touching others dropped)."""
    pos = np.full(k, -1, dtype=np.int64)
    pos[keep] = np.arange(keep.shape[0])
    mapped = pos[np.asarray(pairs, dtype=np.int64).reshape(-1, 2)]
    return mapped[(mapped >= 0).all(axis=1)]
