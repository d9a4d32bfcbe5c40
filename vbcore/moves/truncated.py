"""Merge and delete moves with the truncated E-step (Hughes & Sudderth 2013; Forster & Lücke 2018).

The truncated q(z_n) lives on a candidate set ``K_n`` of ``C'`` clusters
(:mod:`vbcore.kernels.truncated`), and
its exact ELBO is the same function of the statistics as the full one (:func:`vbcore.moves.exact.total_elbo`).

**Merge** of a and b: ``r'_na = r_na + r_nb``; only rows having a or b among their candidates change,
and the merged q is again a truncated q (on ``K_n`` with b replaced by a). Its statistics are the pairwise
sum of those of a and b, as without truncation; the entropy change ``h_ab = sum_n s ln s - r_a ln r_a -
r_b ln r_b`` (``s = r_na + r_nb``) is non-zero only on rows having both a and b as candidates, and is
gathered from each row's ``C' (C' - 1) / 2`` candidate pairs (:func:`candidate_pair_entropy`).

**Delete** of a set of clusters: each row's weights are re-normalised over its candidates that are kept
(``r'_nk = r_nk / sum_{j in K_n kept} r_nj``). Only rows with a deleted candidate change; their
contribution to the statistics is replaced (raw moments of the change, added to the regular statistics
per touched cluster), so the pass does not redo the statistics of the other rows. A row whose
candidates are all deleted has no truncated q under the proposal: it is counted (``orphans``) and the
proposal is then not kept.

Both are computed on the chunk's float64 weights at the end of its truncated pass, through the hook
of :class:`vbcore.kernels.truncated.TruncParams` (:class:`TruncMoveRequest`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vbcore.kernels.estep import BLOCK_ROWS, Chunk, array_namespace, to_numpy
from vbcore.model.stats import SuffStats


def _xlogx(r: np.ndarray) -> np.ndarray:
    return r * np.log(np.where(r > 0, r, 1.0))


def candidate_pair_entropy(idx: np.ndarray, resp: np.ndarray, pairs: np.ndarray, k: int,
                           w: np.ndarray | None = None) -> np.ndarray:
    """``h_ab`` of each pair (a < b) under a truncated q: summed over the rows having both as candidates.

    Parameters
    ----------
    idx : int array of shape (n, C')
        Candidate clusters per row (distinct within a row).
    resp : float64 array of shape (n, C')
        Their weights.
    pairs : int array of shape (P, 2)
    k : int
        Number of clusters.
    w : float64 array of shape (n,), optional
        The rows' weights (None: 1).

    Returns
    -------
    float64 array of shape (P,)
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    out = np.zeros(pairs.shape[0])
    if pairs.shape[0] == 0 or idx.shape[1] < 2:
        return out
    keys = pairs[:, 0] * np.int64(k) + pairs[:, 1]
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    c = idx.shape[1]
    ids = idx.astype(np.int64)
    for i in range(c):
        for j in range(i + 1, c):
            lo, hi = np.minimum(ids[:, i], ids[:, j]), np.maximum(ids[:, i], ids[:, j])
            key = lo * k + hi
            pos = np.minimum(np.searchsorted(sorted_keys, key), sorted_keys.size - 1)
            hit = sorted_keys[pos] == key
            if not hit.any():
                continue
            ra, rb = resp[hit, i], resp[hit, j]
            h = _xlogx(ra + rb) - _xlogx(ra) - _xlogx(rb)
            h = h if w is None else h * w[hit]
            out[order] += np.bincount(pos[hit], weights=h, minlength=sorted_keys.size)
    return out


def _delta_moments(chunk: Chunk, rows: np.ndarray, idx: np.ndarray, delta: np.ndarray,
                   k: int) -> tuple[np.ndarray, np.ndarray]:
    """``sum_n delta_nk x_n`` (K, D) and ``sum_n delta_nk x_n x_n^T`` (K, D, D; its diagonal (K, D) for
    the diagonal families) over ``rows`` (their candidates ``idx`` and weight changes ``delta``), in
    float64: a sparse (K x m) @ (m x D) product per block of rows (``C'`` non-zeros per row, so
    O(m C' D) whatever K), and for 'full' one (D x m_k) @ (m_k x D) product per touched cluster."""
    from scipy.sparse import csr_matrix

    d = chunk.x.shape[1]
    diag = chunk.is_diagonal
    first = np.zeros((k, d))
    second = np.zeros((k, d) if diag else (k, d, d))
    xp = array_namespace(chunk.x)
    for i in range(0, rows.size, BLOCK_ROWS):
        sl = slice(i, min(i + BLOCK_ROWS, rows.size))
        x = np.asarray(to_numpy(xp.take(chunk.x, xp.asarray(rows[sl]), axis=0)), dtype=np.float64)
        m, c = idx[sl].shape
        w = csr_matrix((delta[sl].ravel(), (idx[sl].ravel(), np.repeat(np.arange(m), c))), shape=(k, m))
        first += w @ x
        if diag:
            second += w @ (x * x)
            continue
        wc = w.tocsr()
        for comp in np.flatnonzero(np.diff(wc.indptr)):  # full: one product per touched cluster
            cols = wc.indices[wc.indptr[comp]:wc.indptr[comp + 1]]
            vals = wc.data[wc.indptr[comp]:wc.indptr[comp + 1]]
            second[comp] += (x[cols] * vals[:, None]).T @ x[cols]
    return first, second


def delete_statistics(chunk: Chunk, idx: np.ndarray, resp: np.ndarray, rlogr: np.ndarray, stats: SuffStats,
                      kept: np.ndarray, w: np.ndarray | None = None) -> tuple[SuffStats, np.ndarray, int]:
    """Statistics of the delete proposal's truncated q (all K clusters, the deleted ones empty), its
    weights (n, C') and the number of rows left without a kept candidate.

    Parameters
    ----------
    chunk : Chunk
    idx, resp : arrays of shape (n, C')
        The chunk's candidates and float64 weights after its truncated pass.
    rlogr : float64 array of shape (n,)
        ``sum_k r_nk ln r_nk`` per row.
    stats : SuffStats
        The chunk's regular statistics (of ``resp``).
    kept : bool array of shape (K,)
        Clusters the proposal keeps.
    w : float64 array of shape (n,), optional
        The rows' weights (None: 1); ``resp`` and ``rlogr`` are unweighted, ``stats`` weighted.
    """
    k = stats.nk.shape[0]
    alive = kept[idx]
    rows = np.flatnonzero(~alive.all(axis=1))
    mass = np.sum(np.where(alive[rows], resp[rows], 0.0), axis=1)
    orphans = int(np.sum((mass <= 0) if w is None else (mass <= 0) & (w[rows] > 0)))  # weight 0: no row
    new = resp.copy()
    safe = np.where(mass > 0, mass, 1.0)
    new[rows] = np.where(alive[rows], resp[rows] / safe[:, None], 0.0)
    if rows.size == 0:
        return stats, new, orphans
    delta = new[rows] - resp[rows]
    wr = np.ones(rows.size) if w is None else w[rows]
    if w is not None:
        delta = delta * wr[:, None]
    cand = idx[rows]
    dnk = np.bincount(cand.ravel(), weights=delta.ravel(), minlength=k)
    first, second = _delta_moments(chunk, rows, cand, delta, k)
    touched = np.unique(cand)
    nk, mean, scatter = stats.nk.copy(), stats.mean.copy(), stats.scatter.copy()
    t = touched
    n1 = np.where(kept[t], np.maximum(stats.nk[t] + dnk[t], 0.0), 0.0)
    s1 = stats.nk[t][:, None] * stats.mean[t] + first[t]
    m1 = s1 / np.where(n1 > 0, n1, 1.0)[:, None]
    if chunk.is_diagonal:
        raw = stats.scatter[t] + stats.nk[t][:, None] * stats.mean[t] ** 2 + second[t]
        sc = np.maximum(raw - n1[:, None] * m1 * m1, 0.0)
    else:
        m0 = stats.mean[t]
        raw = stats.scatter[t] + stats.nk[t][:, None, None] * m0[:, :, None] * m0[:, None, :]
        sc = raw + second[t] - n1[:, None, None] * m1[:, :, None] * m1[:, None, :]
        sc = 0.5 * (sc + sc.transpose(0, 2, 1))
    empty = n1 <= 0
    m1[empty], sc[empty] = 0.0, 0.0
    nk[t], mean[t], scatter[t] = n1, m1, sc
    if w is None:
        sum_rlogr = stats.sum_rlogr - float(np.sum(rlogr[rows])) + float(np.sum(_xlogx(new[rows])))
    else:
        sum_rlogr = (stats.sum_rlogr - float(np.sum(wr * rlogr[rows]))
                     + float(np.sum(wr[:, None] * _xlogx(new[rows]))))
    alt = SuffStats(nk=nk, mean=mean, scatter=scatter, sum_rlogr=sum_rlogr, n_rows=stats.n_rows,
                    shift=stats.shift, weight=stats.weight)
    return alt, new, orphans


@dataclass(frozen=True)
class TruncMoveResult:
    """Per chunk (then reduced in chunk order): the merge pairs' ``h``, the delete proposal's
    statistics (in the indexing of its kept clusters) with its pairs' ``h``, and its orphan rows."""

    h: np.ndarray
    alt: SuffStats | None
    alt_h: np.ndarray
    orphans: int

    def merge(self, other: TruncMoveResult) -> TruncMoveResult:
        alt = None if self.alt is None or other.alt is None else self.alt.merge(other.alt)
        return TruncMoveResult(self.h + other.h, alt, self.alt_h + other.alt_h, self.orphans + other.orphans)


@dataclass(frozen=True)
class TruncMoveRequest:
    """The move quantities a truncated pass gathers (the hook of
    :class:`vbcore.kernels.truncated.TruncParams`):
    ``h`` of ``pairs``; with ``keep`` (clusters kept by a delete proposal, sorted), the proposal's
    statistics and the ``h`` of ``keep_pairs`` (indices into ``keep``)."""

    pairs: np.ndarray  # (P, 2)
    keep: np.ndarray | None  # (K',)
    keep_pairs: np.ndarray  # (P', 2)

    def __call__(self, chunk: Chunk, idx: np.ndarray, resp: np.ndarray, rlogr: np.ndarray,
                 stats: SuffStats) -> TruncMoveResult:
        k = stats.nk.shape[0]
        w = None if chunk.w is None else np.asarray(to_numpy(chunk.w), dtype=np.float64)
        h = candidate_pair_entropy(idx, resp, self.pairs, k, w)
        if self.keep is None:
            return TruncMoveResult(h, None, np.zeros(self.keep_pairs.shape[0]), 0)
        kept = np.zeros(k, dtype=bool)
        kept[self.keep] = True
        alt, new, orphans = delete_statistics(chunk, idx, resp, rlogr, stats, kept, w)
        alt_h = candidate_pair_entropy(idx, new, self.keep[self.keep_pairs], k, w)
        return TruncMoveResult(h, alt.take(self.keep), alt_h, orphans)
