"""The MAP assignment (Lim & Jiang 2024 eq. 19) searched over candidate clusters (issue 15).

The hard-assignment learners (MM, SGA, SGA+M, SGA+F) assign each row to ``argmax_k x.w_k + c_k``
(:class:`vbcore.kernels.sga_stats.MapParams`). With candidates, a row searches only ``S_n``: its stored
``C'`` best clusters of its last visit, the neighbour lists of the best of them and ``n_random``
random clusters (Forster & Lücke 2018; Hirschberger et al. 2022), grouped into blocks as in the
truncated E-step (:mod:`vbcore.kernels.truncated`): one ``(m x D) @ (D x |S|)`` GEMM per block. A row
without stored candidates (never visited, or all of them pruned) first scores the pivots: all K
clusters by default, so its label is exact and its candidates and neighbour scores are read off
those scores (no search); or ``P`` clusters drawn from the fit's seed, whose best ``C'`` it keeps
and then searches as above (``1 + extra_steps`` times: a descent along the neighbour lists). A
minibatch's chunk results are combined once on the driver (:meth:`MapSearchResult.combine`).

Guarantees: the label is the exact MAP label whenever that label lies in ``S_n``; the previous label
is always in ``S_n`` (when it survived pruning), so a batch pass never lowers ``ln p(x, z, mu, v)``
below the value the previous labels have under the new point (MM stays monotone). With pivots fewer
than K nothing bounds how far a never-visited row is from its exact label (measured in
docs/benchmarks.md: 35-53% exact at K = 1000).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vbcore.kernels.estep import BLOCK_ROWS, Chunk, array_namespace, to_numpy
from vbcore.kernels.neighbours import rank_neighbours
from vbcore.kernels.sga_stats import HardStats, label_sums
from vbcore.kernels.truncated import (
    RANDOM_TAG,
    CandidateState,
    NeighbourScores,
    cluster_order,
    row_blocks,
    search_set,
    top_columns,
)


@dataclass(frozen=True)
class MapSearchParams:
    """What a chunk needs for one candidate MAP pass (sent once per pass).

    Attributes
    ----------
    weights : ndarray of shape (K, D), the data's dtype
        ``(m_k - shift) / sigma^2`` as rows (a block's search set is a row gather).
    const : ndarray of shape (K,)
        ``ln pi_k - |m_k - shift|^2 / (2 sigma^2)``.
    neighbours : ndarray of shape (K, G) int32, -1 padded
    rank : ndarray of shape (K,)
        :func:`vbcore.kernels.truncated.cluster_order` of ``neighbours``.
    pivots : ndarray of shape (P,)
        Clusters scored for rows without candidates.
    rows : dict
        Chunk start -> positions (sorted) in that chunk to assign; None: every row of every chunk.
    remap : ndarray of shape (K_previous,), or None
        Old -> new cluster numbers of the stored candidates (-1: pruned).
    """

    weights: np.ndarray
    const: np.ndarray
    neighbours: np.ndarray
    rank: np.ndarray
    candidates: int
    n_random: int
    seed: int | None
    iteration: int
    pivots: np.ndarray
    rows: dict[int, np.ndarray] | None = None
    remap: np.ndarray | None = None
    extra_steps: int = 1
    min_rows: int = 64

    @property
    def n_components(self) -> int:
        return int(self.const.shape[0])

    @property
    def every_pivot(self) -> bool:
        """The pivots are every cluster, in order: a fresh row's label is its exact argmax."""
        k = self.n_components
        return self.pivots.size == k and bool(np.array_equal(self.pivots, np.arange(k)))


def map_search_params(weights: np.ndarray, const: np.ndarray, neighbours: np.ndarray, candidates: int,
                      n_random: int, seed: int | None, iteration: int, pivots: np.ndarray,
                      rows: dict[int, np.ndarray] | None = None, remap: np.ndarray | None = None,
                      extra_steps: int = 1, min_rows: int = 64) -> MapSearchParams:
    """Bundle (see :class:`MapSearchParams`); ``weights`` (D, K) as in :class:`MapParams`."""
    nb = np.asarray(neighbours, dtype=np.int32)
    k = int(const.shape[0])
    return MapSearchParams(np.ascontiguousarray(weights.T), np.asarray(const, dtype=np.float64), nb,
                           cluster_order(nb), min(int(candidates), k), int(n_random), seed, int(iteration),
                           np.asarray(pivots, dtype=np.int64), rows, remap, int(extra_steps), int(min_rows))


@dataclass(frozen=True)
class MapSearchResult:
    """Hard statistics of the assigned rows, neighbour scores and the number of scores evaluated."""

    hard: HardStats
    scores: NeighbourScores
    evaluations: int

    def merge(self, other: MapSearchResult) -> MapSearchResult:
        return MapSearchResult(self.hard.merge(other.hard), self.scores.merge(other.scores),
                               self.evaluations + other.evaluations)

    @staticmethod
    def combine(parts: list[MapSearchResult]) -> MapSearchResult:
        """The results of a minibatch's chunks summed in list order at once (:meth:`HardStats.combine`,
        :meth:`NeighbourScores.combine`): a tree of pairwise merges would rewrite the growing unions
        of clusters and pairs at every level (sga-f, 30 iterations: 1,608 row-add calls instead of 888)."""
        return MapSearchResult(HardStats.combine([p.hard for p in parts]),
                               NeighbourScores.combine([p.scores for p in parts]),
                               sum(p.evaluations for p in parts))


def _scores_of(x: object, search: np.ndarray, params: MapSearchParams) -> np.ndarray:
    """``x.w_s + c_s`` of some rows for the clusters ``search``, float64 (m, |S|)."""
    xp = array_namespace(x)
    ws = xp.asarray(params.weights[search])
    return to_numpy(x @ xp.matrix_transpose(ws)) + params.const[search][None, :]


def _stored(state: CandidateState, n: int, params: MapSearchParams) -> np.ndarray:
    """The chunk's stored candidates in current cluster numbers, valid first (-1: none)."""
    c = params.candidates
    if state.idx is None:
        return np.full((n, c), -1, dtype=np.int32)
    prev = state.idx
    if params.remap is not None:
        prev = np.where(prev >= 0, params.remap[np.maximum(prev, 0)], -1).astype(np.int32)
        prev = np.take_along_axis(prev, np.argsort(prev < 0, axis=1, kind="stable"), axis=1)
    if prev.shape[1] != c:  # the number of candidates changed between runs: keep the best ones
        pad = np.full((n, max(0, c - prev.shape[1])), -1, dtype=np.int32)
        prev = np.concatenate((prev[:, :c], pad), axis=1)
    return prev


def _pivot_candidates(x: object, params: MapSearchParams, rng: np.random.Generator,
                      acc: list[np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """The best C' pivots of each row and their scores (one GEMM per BLOCK_ROWS rows; the pivots'
    weights gathered once, not at all when they are every cluster: a K x D gather per call cost more
    than its GEMM). With ``acc`` (the pivots are every cluster) the rows' neighbour scores are read
    off the same scores (:func:`_row_pairs`) instead of a second, searched GEMM."""
    xp = array_namespace(x)
    piv = params.pivots
    wt = xp.matrix_transpose(xp.asarray(params.weights if params.every_pivot else params.weights[piv]))
    const = params.const[piv][None, :]
    n = int(x.shape[0])  # type: ignore[attr-defined]
    out = np.empty((n, params.candidates), dtype=np.int32)
    val = np.empty((n, params.candidates))
    for i in range(0, n, BLOCK_ROWS):
        s = to_numpy(x[i : i + BLOCK_ROWS] @ wt) + const  # type: ignore[index]
        top = top_columns(s, params.candidates)
        out[i : i + BLOCK_ROWS], val[i : i + BLOCK_ROWS] = piv[top], np.take_along_axis(s, top, axis=1)
        if acc is not None:
            _row_pairs(s, piv[top], params, rng, acc)
    return out, val


def _row_pairs(scores: np.ndarray, cand: np.ndarray, params: MapSearchParams, rng: np.random.Generator,
               acc: list[np.ndarray]) -> None:
    """Neighbour-score triples (as :func:`_search` appends) of rows scored against every cluster:
    for each row, the pairs (best, s) for s in its own search set (its C' best, the neighbour list
    of its best, ``n_random`` random clusters), ``score_s - max``, one row each."""
    m, k = scores.shape
    best = cand[:, 0]
    sets = np.sort(np.concatenate((cand, params.neighbours[best],
                                   rng.integers(0, k, size=(m, params.n_random))), axis=1), axis=1)
    ok = sets >= 0
    ok[:, 1:] &= sets[:, 1:] != sets[:, :-1]
    r = np.nonzero(ok)[0]
    s = sets[ok]
    top = np.max(scores, axis=1)
    acc += [best[r].astype(np.int64) * k + s, scores[r, s] - top[r], np.ones(r.size, np.int64)]


def _search(x: object, prev: np.ndarray, params: MapSearchParams, rng: np.random.Generator,
            acc: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """One search over the rows' blocks: new candidates (m, C') int32, their scores (m, C') and the
    number of scores evaluated; neighbour-score triples are appended to ``acc``."""
    xp = array_namespace(x)
    k, c = params.n_components, params.candidates
    key = params.rank[prev[:, 0]]
    order = np.argsort(key, kind="stable")
    idx = np.empty_like(prev)
    val = np.empty(prev.shape)
    evaluations = 0
    for first, stop, sub in row_blocks(key[order], k, params.min_rows):
        rows = order[first:stop]
        bests = prev[rows[sub], 0]
        search = search_set(prev[rows], bests, params.neighbours, c, params.n_random, "best", rng)
        s = _scores_of(xp.take(x, xp.asarray(rows), axis=0), search, params)
        evaluations += s.size
        top = top_columns(s, c)
        idx[rows], val[rows] = search[top], np.take_along_axis(s, top, axis=1)
        mx = np.max(s, axis=1, keepdims=True)
        acc.append((bests[:, None] * np.int64(k) + search[None, :]).ravel())
        acc.append(np.add.reduceat(s - mx, sub, axis=0).ravel())
        acc.append(np.repeat(np.diff(np.append(sub, rows.size)), search.size).astype(np.int64))
    return idx, val, evaluations


def map_search_kernel(chunk: Chunk, state: CandidateState,
                      params: MapSearchParams) -> tuple[CandidateState, MapSearchResult]:
    """MAP labels of the chunk's rows named in ``params.rows`` (all when None), searched over their
    candidates, and the hard statistics of those rows.

    Returns
    -------
    (CandidateState, MapSearchResult)
        The chunk's candidates (rows not assigned keep theirs; ``resp`` holds the softmax of the
        scores over the C' candidates) and the pass's result.
    """
    n, k = chunk.n_rows, params.n_components
    if params.rows is None:
        sel = np.arange(n)
    else:
        sel = np.asarray(params.rows.get(state.start, np.zeros(0, np.int64)), dtype=np.int64)
    stored = _stored(state, n, params)
    resp = (np.zeros(stored.shape, dtype=np.float32) if state.resp is None or state.resp.shape != stored.shape
            else state.resp.copy())
    x = to_numpy(chunk.x[sel]) if array_namespace(chunk.x) is not np else chunk.x[sel]
    x = np.asarray(x, dtype=chunk.x.dtype)
    prev = stored[sel]
    fresh = np.flatnonzero(prev[:, 0] < 0)
    every = params.every_pivot  # fresh rows get their exact labels from the pivots: no search
    rng = np.random.default_rng(np.random.SeedSequence(
        params.seed, spawn_key=(RANDOM_TAG, params.iteration, state.start, 1)))
    acc: list[np.ndarray] = []
    idx, val = prev.copy(), np.empty(prev.shape)
    evaluations = fresh.size * params.pivots.size
    if fresh.size:
        rows = x if fresh.size == sel.size else x[fresh]
        idx[fresh], val[fresh] = _pivot_candidates(rows, params, rng, acc if every else None)
    todo = np.flatnonzero(prev[:, 0] >= 0) if every else np.arange(sel.size)
    if todo.size:
        part = x if todo.size == sel.size else x[todo]
        idx[todo], val[todo], ev = _search(part, idx[todo], params, rng, acc)
        evaluations += ev
    steps = params.extra_steps if fresh.size and params.pivots.size < k else 0
    for _ in range(steps):  # descent for the rows from the pivots (none when the pivots are all K)
        idx[fresh], val[fresh], ev = _search(x[fresh], idx[fresh], params, rng, acc)
        evaluations += ev
    stored[sel] = idx
    e = np.exp(val - val[:, :1])
    resp[sel] = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    w = None if chunk.w is None else np.asarray(to_numpy(chunk.w[sel]), dtype=chunk.x.dtype)
    hard = label_sums(x, None, idx[:, 0].astype(np.int64), k, chunk.shift, w=w)
    scores = NeighbourScores.combine([NeighbourScores(*t) for t in zip(acc[0::3], acc[1::3], acc[2::3],
                                                                       strict=True)])
    return CandidateState(state.start, stored, resp), MapSearchResult(hard, scores, evaluations)


def map_initial_neighbours(weights: np.ndarray, const: np.ndarray, shifted_means: np.ndarray,
                           n_neighbours: int) -> np.ndarray:
    """First neighbour lists of the MAP search: ``G_j`` is ``j`` and the ``G - 1`` clusters whose
    score ``m_j.w_k + c_k`` of mean ``m_j`` is largest (one (K x D) @ (D x K) GEMM, O(K^2 D)).

    Parameters
    ----------
    weights : ndarray of shape (D, K)
    const : ndarray of shape (K,)
    shifted_means : ndarray of shape (K, D)
    n_neighbours : int

    Returns
    -------
    ndarray of shape (K, G) int32, -1 padded when K < G
    """
    means = np.asarray(shifted_means, dtype=np.float64)
    return rank_neighbours(means @ np.asarray(weights, dtype=np.float64) + const[None, :], n_neighbours)
