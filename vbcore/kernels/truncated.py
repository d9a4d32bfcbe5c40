"""The truncated VB E-step: q(z_n) on a few candidate clusters per row (Forster & Lücke 2018).

Each row keeps a candidate set ``K_n`` of ``C'`` clusters. One pass searches ``S_n``: ``K_n``, the
neighbour lists ``G_c`` (``c`` first) of its best cluster (``search='best'``) or of all of ``K_n``
(``'all'``), and random clusters from the fit's seed (Hirschberger et al. 2022). The new ``K_n`` is
the top ``C'`` of ``S_n`` by ``ln rho_nk`` (Kuusela et al. 2009 eq. 36) with ``q(z_n = k) = rho_nk /
sum_{j in K_n} rho_nj`` there and zero elsewhere; the statistics (eqs. 30-32) have ``C'`` non-zeros
per row: raw float64 sums (:class:`DiagSums`, diagonal families) or a :class:`~vbcore.model.stats.SuffStats`
('full'; 'tied' with the pooled scatter), ``sum r ln r`` over the restricted q. The driver side
(neighbour lists, pivots, relabelling) is :mod:`vbcore.kernels.neighbours`.

Mean-field VB on the same model with a smaller family for q(Z): the exact ELBO is a true lower
bound, and since ``S_n`` contains the previous ``K_n`` (worth ``ln sum_{k in K_n} rho_nk``), it
never decreases. GEMM shape: rows sorted by the rank of their best cluster (:func:`cluster_order`)
form blocks; each block is one GEMM against the union of its rows' search spaces and one for its
statistics: for the diagonal families blocks of ``min_rows`` rows, all of a chunk's in two batched
GEMMs (:mod:`vbcore.kernels.truncated_blocks`), else groups joined to >= ``min_rows`` rows, one
block at a time. No N x K array; float32 data: float32 GEMMs, float64 sums. Each pass also returns,
per (best cluster c, searched s), the sum of ``ln rho_ns - max_j ln rho_nj`` and its count, from
which :func:`update_neighbours` makes ``G_c``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vbcore.kernels.estep import (
    BLOCK_ROWS,
    Chunk,
    EStepParams,
    add_rows,
    array_namespace,
    pooled_stats,
    to_numpy,
)
from vbcore.kernels.neighbours import (  # noqa: F401  (re-exported: the driver side of the search)
    compose_remaps,
    initial_neighbours,
    pivot_clusters,
    relabel_neighbours,
    update_neighbours,
)
from vbcore.kernels.truncated_blocks import diag_pass, top_columns  # noqa: F401  (top_columns re-exported)
from vbcore.model.stats import SuffStats, diag_stats

#: spawn-key tag of the random search clusters (kept apart from the other draws of a fit)
RANDOM_TAG = 15


@dataclass(frozen=True)
class CandidateState:
    """The candidate sets of one chunk's rows.

    Attributes
    ----------
    start : int
        Global index of the chunk's first row (keys the chunk's random draws).
    idx : ndarray of shape (n_rows, C') int32, or None
        Candidate clusters, best first; -1 marks no candidate. None: not yet chosen.
    resp : ndarray of shape (n_rows, C') float32, or None
        ``q(z_n = idx)``.
    """

    start: int
    idx: np.ndarray | None = None
    resp: np.ndarray | None = None


@dataclass(frozen=True)
class TruncParams:
    """What a chunk needs for one truncated E-step (sent once per pass).

    ``estep`` holds the fold of the posterior (:func:`vbcore.kernels.estep.estep_params`); ``wt`` its
    diagonal-family weights as (K, 2D) rows, so a group's search set is a row gather.
    ``remap`` (K_previous,) maps the clusters of the stored candidates to the current ones (-1:
    dropped); ``pivots`` are searched when a chunk has no candidates yet.
    """

    estep: EStepParams
    wt: np.ndarray | None  # (K, 2D) diagonal families
    neighbours: np.ndarray  # (K, G) int32, -1 padded
    candidates: int
    n_random: int
    seed: int | None
    iteration: int
    pivots: np.ndarray  # (P,) int
    remap: np.ndarray | None = None
    search: str = "best"
    min_rows: int = 64
    rank: np.ndarray | None = None  # (K,) :func:`cluster_order` of ``neighbours``
    hook: Any = None  # extra per-chunk results: hook(chunk, idx, resp, rlogr, stats) -> has .merge

    @property
    def n_components(self) -> int:
        return int(self.estep.const.shape[0])


@dataclass(frozen=True)
class NeighbourScores:
    """Sums of ``ln rho_ns - max_j ln rho_nj`` over the rows whose best cluster is ``c``, per pair
    ``key = c * K + s`` (sorted, unique), with the number of rows summed."""

    keys: np.ndarray  # int64
    sums: np.ndarray  # float64
    counts: np.ndarray  # int64

    def merge(self, other: NeighbourScores) -> NeighbourScores:
        return NeighbourScores.combine([self, other])

    @staticmethod
    def combine(parts: list[NeighbourScores]) -> NeighbourScores:
        """The scores of ``parts`` summed per key, in list order (none: no scores)."""
        if not parts:
            return NeighbourScores(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64))
        keys, inv = np.unique(np.concatenate([p.keys for p in parts]), return_inverse=True)
        sums = np.bincount(inv, weights=np.concatenate([p.sums for p in parts]), minlength=keys.size)
        counts = np.bincount(inv, weights=np.concatenate([p.counts for p in parts]), minlength=keys.size)
        return NeighbourScores(keys, sums, counts.astype(np.int64))


@dataclass(frozen=True)
class DiagSums:
    """Raw float64 sums of the diagonal families' statistics over some chunks (rows shifted by
    ``shift``): merged by plain adds (one pass over K x 2D), centred once by :meth:`to_stats`. The
    pairwise-centred merge of :class:`~vbcore.model.stats.SuffStats` cost ~0.2 s per chunk at K = 1000,
    D = 4096: more than the truncated E-step's GEMMs of the chunk."""

    nk: np.ndarray  # (K,)
    g: np.ndarray  # (K, 2D): [sum r x^2, sum r x]
    sum_rlogr: float
    n_rows: int
    shift: np.ndarray  # (D,)
    weight: float | None = None  # the rows' total weight (None: unweighted; SuffStats.weight)

    def merge(self, other: DiagSums) -> DiagSums:
        return self._merged(other, None)

    def merge_owned(self, other: DiagSums) -> DiagSums:
        """:meth:`merge` adding into ``self.g`` (the same bits, no new K x 2D array): only for sums
        nothing else holds (the local engine's reduction; 55 -> ~15 ms a merge at K = 1000, D = 4096)."""
        return self._merged(other, self.g)

    def _merged(self, other: DiagSums, out: np.ndarray | None) -> DiagSums:
        if not (self.shift is other.shift or np.array_equal(self.shift, other.shift)):
            raise ValueError("cannot merge statistics computed with different shifts")
        g = np.add(self.g, other.g, out=out)
        weight = None if self.weight is None and other.weight is None else (
            (self.n_rows if self.weight is None else self.weight)
            + (other.n_rows if other.weight is None else other.weight))
        return DiagSums(self.nk + other.nk, g, self.sum_rlogr + other.sum_rlogr, self.n_rows + other.n_rows,
                        self.shift, weight)

    def to_stats(self) -> SuffStats:
        """Centred statistics (:func:`vbcore.model.stats.diag_stats`)."""
        return diag_stats(self.nk, self.g, self.sum_rlogr, self.n_rows, self.shift, self.weight)


@dataclass(frozen=True)
class TruncResult:
    """What one truncated pass returns per chunk: statistics (raw :class:`DiagSums` for the diagonal
    families, :class:`~vbcore.model.stats.SuffStats` for 'full'), ``sum_n ln sum_{k in K_n} rho_nk``, the
    neighbour scores and the number of (row, cluster) log-responsibilities evaluated."""

    sums: SuffStats | DiagSums
    log_norm: float
    scores: NeighbourScores
    evaluations: int
    extra: Any = None  # what ``TruncParams.hook`` returned

    @property
    def stats(self) -> SuffStats:
        """The centred statistics (computed on each access)."""
        return self.sums.to_stats() if isinstance(self.sums, DiagSums) else self.sums

    def merge(self, other: TruncResult) -> TruncResult:
        return self._with(self.sums.merge(other.sums), other)  # type: ignore[arg-type]

    def merge_owned(self, other: TruncResult) -> TruncResult:
        """:meth:`merge`, adding into this result's sums where they allow it (the same bits)."""
        return self._with(getattr(self.sums, "merge_owned", self.sums.merge)(other.sums), other)  # type: ignore[arg-type]

    def _with(self, sums: SuffStats | DiagSums, other: TruncResult) -> TruncResult:
        return TruncResult(sums, self.log_norm + other.log_norm, self.scores.merge(other.scores),
                           self.evaluations + other.evaluations,
                           None if self.extra is None else self.extra.merge(other.extra))


def truncated_params(estep: EStepParams, neighbours: np.ndarray, candidates: int, n_random: int,
                     seed: int | None, iteration: int, pivots: np.ndarray, remap: np.ndarray | None = None,
                     search: str = "best", min_rows: int = 64, dtype: Any = np.float64) -> TruncParams:
    """Bundle the posterior's E-step fold with the search settings (see :class:`TruncParams`);
    ``dtype`` the data's (the diagonal weights are cast once here, not in every chunk)."""
    w = estep.weights
    wt = None if w is None or estep.covariance_type == "tied" else np.ascontiguousarray(w.T, dtype=dtype)
    k = int(estep.const.shape[0])
    nb = np.asarray(neighbours, dtype=np.int32)
    return TruncParams(estep, wt, nb, min(int(candidates), k), int(n_random), seed, int(iteration),
                       np.asarray(pivots, dtype=np.int64), remap, str(search), int(min_rows),
                       cluster_order(nb))


def _features(chunk: Chunk, rows: np.ndarray) -> object:
    """``[x*x, x]`` of the given rows (diagonal families), in the chunk's namespace and dtype."""
    xp = array_namespace(chunk.x)
    if chunk.feats is not None:
        return xp.take(chunk.feats, xp.asarray(rows), axis=0)
    xb = xp.take(chunk.x, xp.asarray(rows), axis=0)
    return xp.concat((xb * xb, xb), axis=1)


def _group_logits(chunk: Chunk, rows: np.ndarray, search: np.ndarray, params: TruncParams,
                  w: object, feats: object | None) -> np.ndarray:
    """``ln rho`` of ``rows`` for the clusters ``search`` (m, |S|), float64 on the host."""
    xp = array_namespace(chunk.x)
    est = params.estep
    const = est.const[search]
    if feats is not None:  # diagonal families: one (m x 2D) @ (2D x |S|) GEMM
        ws = xp.take(w, xp.asarray(search), axis=0)
        return to_numpy(feats @ xp.matrix_transpose(ws)) + const[None, :]
    x = xp.take(chunk.x, xp.asarray(rows), axis=0)
    dt = chunk.x.dtype
    if est.covariance_type == "tied":  # y = x U once, then one (m x D) @ (D x |S|) GEMM
        assert est.weights is not None and est.prec_chol is not None
        y = x @ xp.asarray(est.prec_chol, dtype=dt)
        ws = xp.asarray(est.weights[:, search], dtype=dt)
        half_sq = 0.5 * to_numpy(xp.sum(y * y, axis=1, dtype=xp.float64))
        return to_numpy(y @ ws) + const[None, :] - half_sq[:, None]
    assert est.means is not None and est.prec_chol is not None
    out = np.empty((rows.size, search.size))
    for j, s in enumerate(search):  # full: one (m x D) @ (D x D) GEMM per searched cluster
        u = xp.asarray(est.prec_chol[s], dtype=dt)
        y = x @ u - xp.asarray(est.means[s] @ est.prec_chol[s], dtype=dt)
        out[:, j] = to_numpy(xp.sum(y * y, axis=1))
    return const[None, :] - 0.5 * out


def search_set(prev: np.ndarray, bests: np.ndarray, neighbours: np.ndarray, candidates: int, n_random: int,
               search: str, rng: np.random.Generator) -> np.ndarray:
    """Sorted union of a block's candidates ``prev`` (m, C'), the neighbour lists (K, G) of its rows'
    best clusters (``search='best'``) or of all their candidates (``search='all'``), and ``n_random``
    random clusters (more when the union has fewer than C' clusters)."""
    k = neighbours.shape[0]
    cand = prev[prev >= 0]
    nb = neighbours[bests if search == "best" else cand].ravel()
    parts = [cand, nb[nb >= 0], rng.integers(0, k, size=n_random)]
    out = np.unique(np.concatenate(parts))
    while out.size < candidates:
        out = np.unique(np.concatenate((out, rng.integers(0, k, size=candidates))))
    return out


def row_blocks(skey: np.ndarray, k: int, min_rows: int) -> list[tuple[int, int, np.ndarray]]:
    """Row blocks of a chunk sorted by ``skey`` (the rank of each row's best cluster; ``k``: none):
    consecutive groups of one best cluster are joined until a block has ``min_rows`` rows. Returns
    (first, stop, starts of its groups relative to first)."""
    n = skey.size
    starts = np.concatenate(([0], np.flatnonzero(np.diff(skey)) + 1))
    out = []
    i = 0
    while i < starts.size:
        j = i + 1
        while j < starts.size and starts[j] - starts[i] < min_rows and skey[starts[j]] < k:
            j += 1
        stop = int(starts[j]) if j < starts.size else n
        if skey[starts[i]] == k:  # rows without a valid candidate: one block, searching everything
            stop, j = n, starts.size
        out.append((int(starts[i]), stop, starts[i:j] - starts[i]))
        i = j
    return out


def cluster_order(neighbours: np.ndarray) -> np.ndarray:
    """A rank per cluster along a greedy walk through the neighbour lists (each step to the first
    unvisited neighbour, else to the next unvisited cluster), so that clusters of adjacent ranks
    share most of their search space and joined groups stay small GEMMs. O(K G) on the driver."""
    k = neighbours.shape[0]
    visited = np.zeros(k, dtype=bool)
    order = []
    for first in range(k):
        cur = first
        while not visited[cur]:
            visited[cur] = True
            order.append(cur)
            nxt = [j for j in neighbours[cur] if j >= 0 and not visited[j]]
            if not nxt:
                break
            cur = int(nxt[0])
    rank = np.empty(k, dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(k)
    return rank


def _previous(chunk: Chunk, state: CandidateState, params: TruncParams, w: object) -> tuple[np.ndarray, int]:
    """The stored candidates in current cluster numbers, valid ones first (-1 padded); without
    stored candidates, the best C' of the pivots (one (n x 2D) @ (2D x P) GEMM). Also returns the
    number of log-responsibilities evaluated."""
    if state.idx is None:
        out = np.empty((chunk.n_rows, params.candidates), dtype=np.int32)
        for i in range(0, chunk.n_rows, BLOCK_ROWS):
            rows = np.arange(i, min(i + BLOCK_ROWS, chunk.n_rows))
            feats = chunk.features(i, int(rows[-1]) + 1) if params.wt is not None else None
            logits = _group_logits(chunk, rows, params.pivots, params, w, feats)
            out[rows] = params.pivots[top_columns(logits, params.candidates)]  # argsort's order, cheaper
        return out, chunk.n_rows * params.pivots.size
    prev = state.idx
    if params.remap is not None:
        prev = np.where(prev >= 0, params.remap[np.maximum(prev, 0)], -1).astype(np.int32)
        order = np.argsort(prev < 0, axis=1, kind="stable")  # valid entries first, in their order
        prev = np.take_along_axis(prev, order, axis=1)
    return prev, 0


def truncated_kernel(chunk: Chunk, state: CandidateState,
                     params: TruncParams) -> tuple[CandidateState, TruncResult]:
    """One truncated E-step over a chunk: new candidate sets and their statistics.

    Parameters
    ----------
    chunk : Chunk
    state : CandidateState
        The chunk's candidate sets from the previous pass (``idx`` None on the first).
    params : TruncParams

    Returns
    -------
    (CandidateState, TruncResult)
    """
    xp = array_namespace(chunk.x)
    diag = params.wt is not None
    w = xp.asarray(params.wt, dtype=chunk.x.dtype) if diag else None
    prev, evaluations = _previous(chunk, state, params, w)
    n, k, c = chunk.n_rows, params.n_components, params.candidates
    # rows without a valid candidate (all theirs were pruned) search every cluster
    best = prev[:, 0]
    rank = np.arange(k) if params.rank is None else params.rank
    key = np.where(best >= 0, rank[np.maximum(best, 0)], k)
    order = np.argsort(key, kind="stable")
    out = _Out(np.empty((n, c), dtype=np.int32), np.empty((n, c)), np.empty(n), np.empty(n))
    rng = np.random.default_rng(np.random.SeedSequence(
        params.seed, spawn_key=(RANDOM_TAG, params.iteration, state.start)))
    done = (_diag_blocks(chunk, key, order, prev, params, w, rng, out) if diag else
            _run_blocks(chunk, row_blocks(key[order], k, params.min_rows), order, prev, params, w, rng, out))
    g = done.g
    evaluations += done.evaluations
    idx, resp, log_norm, rlogr = out.idx, out.resp, out.log_norm, out.rlogr
    rw, lw, sw = resp, log_norm, rlogr  # weighted rows: every sum takes w_n r_nk (vbcore.kernels.estep.weigh)
    if chunk.w is not None:
        wn = np.asarray(to_numpy(chunk.w), dtype=np.float64)
        rw, lw, sw = resp * wn[:, None], log_norm * wn, rlogr * wn
    nk = np.bincount(idx.ravel(), weights=rw.ravel(), minlength=k)
    sum_rlogr = float(np.sum(sw))
    stats = (DiagSums(nk, g, sum_rlogr, chunk.n_rows, chunk.shift, chunk.weight) if g is not None
             else _full_stats(chunk, idx, rw, nk, sum_rlogr, params.estep.covariance_type == "tied"))
    scores = NeighbourScores.combine([NeighbourScores(*t) for t in zip(done.keys, done.sums, done.counts,
                                                                       strict=True)])
    extra = None if params.hook is None else params.hook(
        chunk, idx, resp, rlogr, stats.to_stats() if isinstance(stats, DiagSums) else stats)
    new_state = CandidateState(state.start, idx, resp.astype(np.float32))
    return new_state, TruncResult(stats, float(np.sum(lw)), scores, evaluations, extra)


@dataclass
class _Out:
    """The per-row results of a chunk, written block by block (blocks own disjoint rows)."""

    idx: np.ndarray
    resp: np.ndarray
    log_norm: np.ndarray
    rlogr: np.ndarray


@dataclass
class _Part:
    """What one part of a chunk's blocks sums: moments, neighbour scores, evaluations."""

    g: np.ndarray | None
    keys: list[np.ndarray]
    sums: list[np.ndarray]
    counts: list[np.ndarray]
    evaluations: int


def _diag_blocks(chunk: Chunk, key: np.ndarray, order: np.ndarray, prev: np.ndarray, params: TruncParams,
                 w: object, rng: np.random.Generator, out: _Out) -> _Part:
    """Diagonal families: rows with a best cluster in batched GEMMs (:func:`diag_pass`), the others
    (all their candidates pruned) in one block that searches every cluster."""
    k = params.n_components
    nv = int(np.count_nonzero(key < k))
    rows = order[:nv]
    if nv:
        bp = diag_pass(chunk, rows, prev[rows], prev[rows, 0], params, w, rng)
        out.idx[rows], out.resp[rows] = bp.idx, bp.resp
        out.log_norm[rows], out.rlogr[rows] = bp.log_norm, bp.rlogr
        part = _Part(bp.g, [bp.keys], [bp.sums], [bp.counts], bp.evaluations)
    else:
        part = _Part(np.zeros((k, 2 * chunk.x.shape[1])), [], [], [], 0)
    if nv < order.size:
        rest = _run_blocks(chunk, row_blocks(key[order[nv:]], k, params.min_rows), order[nv:], prev, params,
                           w, rng, out)
        part.g += rest.g  # type: ignore[operator]
        part.evaluations += rest.evaluations
    return part


def _run_blocks(chunk: Chunk, blocks: list[tuple[int, int, np.ndarray]], order: np.ndarray, prev: np.ndarray,
                params: TruncParams, w: object, rng: np.random.Generator, out: _Out) -> _Part:
    """Search, select and summarise the given blocks (see :func:`truncated_kernel`)."""
    xp = array_namespace(chunk.x)
    k, c = params.n_components, params.candidates
    diag = params.wt is not None
    part = _Part(np.zeros((k, 2 * chunk.x.shape[1])) if diag else None, [], [], [], 0)
    for first, stop, sub in blocks:
        rows = order[first:stop]
        bests = prev[rows[sub], 0]
        search = np.arange(k) if bests[0] < 0 else search_set(
            prev[rows], bests, params.neighbours, c, params.n_random, params.search, rng)
        feats = _features(chunk, rows) if diag else None
        logits = _group_logits(chunk, rows, search, params, w, feats)
        part.evaluations += logits.size
        top = top_columns(logits, c)
        sel = np.take_along_axis(logits, top, axis=1)
        mx = sel[:, :1]
        lse = mx[:, 0] + np.log(np.sum(np.exp(sel - mx), axis=1))
        r = np.exp(sel - lse[:, None])
        out.idx[rows], out.resp[rows] = search[top], r
        out.log_norm[rows] = lse
        out.rlogr[rows] = np.sum(r * (sel - lse[:, None]), axis=1)
        if bests[0] >= 0:
            part.keys.append((bests[:, None] * np.int64(k) + search[None, :]).ravel())
            part.sums.append(np.add.reduceat(logits - mx, sub, axis=0).ravel())
            sizes = np.diff(np.append(sub, rows.size))
            part.counts.append(np.repeat(sizes, search.size).astype(np.int64))
        if part.g is not None:
            rg = r if chunk.w is None else r * np.asarray(to_numpy(chunk.w[rows]), dtype=np.float64)[:, None]
            _add_group_moments(part.g, feats, search[top], rg, xp)
    return part


def _add_group_moments(g: np.ndarray, feats: Any, cand: np.ndarray, r: np.ndarray, xp: Any) -> None:
    """``g[u] += R_u^T [x*x, x]`` for the clusters ``u`` that hold a weight of the group: one
    (|u| x m) @ (m x 2D) GEMM in the data's dtype, accumulated in float64.

    Weights under the dtype's normal range add nothing representable to the sums, and subnormal
    operands slow the GEMM down 50x: they are left out, and so are the clusters that hold no other
    weight (in high dimension most rows put all their weight on one cluster, so ``u`` is a few of
    the group's best clusters, not the union of all the candidates: 2-5x fewer rows to add)."""
    dt = feats.dtype
    keep = r >= np.finfo(dt).tiny
    u, pos = np.unique(cand[keep], return_inverse=True)
    dense = np.zeros((u.size, cand.shape[0]))
    dense[pos, np.nonzero(keep)[0]] = r[keep]  # a row's candidates differ
    part = xp.asarray(dense, dtype=dt) @ feats
    part = part if xp is np else to_numpy(part)
    add_rows(g, u, part)


def _full_stats(chunk: Chunk, idx: np.ndarray, resp: np.ndarray, nk: np.ndarray,
                sum_rlogr: float, pooled: bool = False) -> SuffStats:
    """Means and exactly centred scatters, per cluster over the rows that have it as a candidate
    (two passes, as :func:`vbcore.kernels.estep.chunk_statistics`); ``pooled`` ('tied'): the per-cluster
    sums ``sum_n r_nk x_n`` and one ``sum_n w_n x_n x_n^T`` per block of rows, the pooled scatter
    by the exact kernel's formula (:func:`vbcore.kernels.estep.pooled_stats`; O(N C' D + N D^2))."""
    xp = array_namespace(chunk.x)
    dt = chunk.x.dtype
    k, d = nk.shape[0], chunk.x.shape[1]
    sums, mean = np.zeros((k, d)), np.zeros((k, d))  # sum_n r_nk x_n, and (full) the means
    scatter = np.zeros((0 if pooled else k, d, d))
    flat = idx.ravel()
    order = np.argsort(flat, kind="stable")
    comps = flat[order]
    rows_all = np.repeat(np.arange(idx.shape[0]), idx.shape[1])[order]
    r_all = resp.ravel()[order]
    cuts = np.flatnonzero(np.diff(comps)) + 1
    for start, rows, r in zip(np.concatenate(([0], cuts)), np.split(rows_all, cuts), np.split(r_all, cuts),
                              strict=True):
        j = int(comps[start])
        if not nk[j] > 0:
            continue
        x = xp.take(chunk.x, xp.asarray(rows), axis=0)
        rr = xp.asarray(r[:, None], dtype=dt)
        sums[j] = to_numpy(xp.sum(x * rr, axis=0, dtype=xp.float64))
        if pooled:
            continue
        mean[j] = sums[j] / nk[j]
        xc = x - xp.asarray(mean[j], dtype=dt)
        scatter[j] = to_numpy(xp.matrix_transpose(xc * rr) @ xc)
    if pooled:
        w = resp.sum(axis=1)
        xx = np.zeros((d, d))
        for i in range(0, chunk.n_rows, BLOCK_ROWS):
            xb = chunk.x[i : min(i + BLOCK_ROWS, chunk.n_rows), :]
            xx += to_numpy(xp.matrix_transpose(xb * xp.asarray(w[i : i + BLOCK_ROWS, None], dtype=dt)) @ xb)
        return pooled_stats(nk, sums, xx, sum_rlogr, chunk)
    scatter = 0.5 * (scatter + scatter.transpose(0, 2, 1))
    return SuffStats(nk=nk, mean=mean, scatter=scatter, sum_rlogr=sum_rlogr, n_rows=chunk.n_rows,
                     shift=chunk.shift, weight=chunk.weight)
