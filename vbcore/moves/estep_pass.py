"""The E-step pass of a move round (:mod:`vbcore.moves.exact`): per chunk, the regular statistics, the merge
pairs' entropy changes ``h_ab`` and the statistics of the delete proposal's q(Z).

Both extras are cheap where responsibilities are exactly 0, which :func:`vbcore.kernels.estep.normalise`
makes of every responsibility below the dtype's smallest normal number (on separated data, most of
them): ``h_ab`` has no term on a row unless both ``r_a`` and ``r_b`` are non-zero
(:func:`pair_entropy`), and the delete proposal leaves the kept responsibilities of a row as they
are unless its deleted ones sum to more than the dtype's rounding of 1 (:func:`delete_proposal`).
Measured figures: docs/algorithms.md ("Cost of a round's pass").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vbcore.kernels.estep import (
    BLOCK_ROWS,
    Array,
    Chunk,
    EStepParams,
    array_namespace,
    chunk_statistics,
    log_rho,
    normalise,
    to_numpy,
    vbem_kernel,
    weigh,
)
from vbcore.model.stats import SuffStats


@dataclass(frozen=True)
class MoveParams:
    """What a chunk needs for a move pass: the E-step, the pairs whose entropy change to gather, and
    the components a delete proposal keeps (None: no delete proposal) with the pairs in its indexing."""

    estep: EStepParams
    pairs: np.ndarray  # (P, 2)
    keep: np.ndarray | None  # (K',) components kept by the delete proposal
    keep_pairs: np.ndarray  # (P', 2), indices into keep


@dataclass(frozen=True)
class MoveResult:
    """Per chunk (then reduced): the regular statistics and ``sum ln sum rho``, the pairs' ``h``,
    and the same for the delete proposal's q(Z)."""

    stats: SuffStats
    log_norm: float
    h: np.ndarray
    alt: SuffStats | None
    alt_h: np.ndarray

    def merge(self, other: MoveResult) -> MoveResult:
        alt = None if self.alt is None or other.alt is None else self.alt.merge(other.alt)
        return MoveResult(self.stats.merge(other.stats), self.log_norm + other.log_norm,
                          self.h + other.h, alt, self.alt_h + other.alt_h)


#: :func:`pair_entropy` gathers the entries with both responsibilities non-zero unless a bound of their
#: count (per pair, the smaller of its two columns' non-zero counts) exceeds this share of the
#: (rows x pairs) entries: beyond it the dense formula is as cheap (measured in docs/algorithms.md).
GATHER_SHARE = 0.2


def _xlogx(r: Array, xp: Any) -> Array:
    return r * xp.log(xp.where(r > 0, r, xp.ones_like(r)))


def pair_entropy(resp: Array, pairs: np.ndarray, w: Array | None = None) -> np.ndarray:
    """``h_ab = sum_n w_n (s ln s - r_a ln r_a - r_b ln r_b)`` (``s = r_a + r_b``; ``w``: the rows'
    weights, None: 1) per pair, float64 (P,).

    A row's term is exactly 0 unless both ``r_a`` and ``r_b`` are non-zero (``0 ln 0 = 0`` and then
    ``s`` is the other one), and :func:`vbcore.kernels.estep.normalise` flushes responsibilities below the
    smallest normal number to exactly 0, so on separated data almost every term is 0. NumPy arrays:
    on the rows with at least two non-zero responsibilities, only the (row, pair) entries with both
    non-zero are evaluated and summed per pair with ``np.bincount`` (in row order, in float64), unless
    :data:`GATHER_SHARE` says the dense formula is as cheap. Both add each pair's non-zero terms in
    row order in float64, as the dense column sum does, and skip only exact zeros (the same bits in
    the tests). Other namespaces use the dense formula: CuPy's weighted ``bincount`` adds with atomics
    in no fixed order, and array-API arrays need not have data-dependent shapes.
    """
    if pairs.shape[0] == 0:
        return np.zeros(0)
    xp = array_namespace(resp)
    if xp is not np:
        return _dense_pair_entropy(resp, pairs, w, xp)
    a, b = pairs[:, 0], pairs[:, 1]
    nz = resp > 0
    cols = np.count_nonzero(nz, axis=0)
    if np.sum(np.minimum(cols[a], cols[b])) > GATHER_SHARE * nz.shape[0] * pairs.shape[0]:
        return _dense_pair_entropy(resp, pairs, w, np)
    rows = np.flatnonzero(np.count_nonzero(nz, axis=1) > 1)
    nzt = np.ascontiguousarray(nz[rows].T)  # (K, rows): a pair's two columns are two rows
    pi, rr = np.nonzero(nzt[a] & nzt[b])  # pair-major, rows ascending within a pair
    r = rows[rr]
    ra, rb = resp[r, a[pi]], resp[r, b[pi]]
    h = _xlogx(ra + rb, np) - _xlogx(ra, np) - _xlogx(rb, np)
    if w is not None:  # weighted rows: w_n h_n
        h = h * w[r]
    return np.bincount(pi, weights=h, minlength=pairs.shape[0])


def _dense_pair_entropy(resp: Array, pairs: np.ndarray, w: Array | None, xp: Any) -> np.ndarray:
    """:func:`pair_entropy` by the dense formula on every (row, pair) entry."""
    ra = xp.take(resp, xp.asarray(pairs[:, 0]), axis=1)
    rb = xp.take(resp, xp.asarray(pairs[:, 1]), axis=1)
    h = _xlogx(ra + rb, xp) - _xlogx(ra, xp) - _xlogx(rb, xp)
    if w is not None:  # weighted rows: w_n h_n
        h = h * xp.reshape(w, (-1, 1))
    return to_numpy(xp.sum(h, axis=0, dtype=xp.float64))


#: A row whose responsibilities of the deleted components sum to at least this share is re-computed
#: as the softmax of its ``ln rho`` over the kept ones (:func:`delete_proposal`).
FRESH_SHARE = 0.5


def delete_proposal(lr: Array, resp: Array, rlogr: Array, keep: Array, gone: Array) -> tuple[Array, Array]:
    """The delete proposal's q(Z) of a block and its ``sum_k r ln r`` per row.

    With ``d_n`` the responsibilities of the deleted components ``gone`` summed, a row gets
    ``r'_nk = c_n r_nk`` over ``keep`` with ``c_n = 1 / (1 - d_n)`` (computed in ``resp``'s dtype), the
    E-step with the deleted columns left out; a row with ``d_n >= FRESH_SHARE``, whose kept
    responsibilities are small and may have been flushed to 0, gets the softmax of its ``ln rho`` over
    ``keep`` instead (:func:`vbcore.kernels.estep.normalise`). Each row sums to 1 as a row of the regular
    q(Z) does, so this is a q(Z) and the ELBO of its statistics is exact. Its ``sum r ln r`` is
    ``c_n (sum_n - g_n) + ln c_n``, with ``sum_n`` the row's regular one and ``g_n`` that of the deleted
    columns. Where ``d_n`` is 0 or so small that ``c_n`` rounds to 1 (most rows: ``normalise`` flushes
    responsibilities below the smallest normal number to 0), the row keeps the bits of its kept
    responsibilities. NumPy: only the rows with ``c_n != 1`` are scaled and only those with
    ``d_n >= FRESH_SHARE`` normalised; other namespaces compute every row and select (the same q(Z)).
    """
    xp = array_namespace(lr)
    kept = xp.take(resp, keep, axis=1)
    lost = xp.take(resp, gone, axis=1)
    share = xp.sum(lost, axis=1)
    if xp is np:
        rows = np.flatnonzero(share > 0)
        if rows.size == 0:
            return kept, rlogr
        rlogr = rlogr.copy()
        rlogr[rows] -= np.sum(_xlogx(lost[rows], np), axis=1)
        far = rows[share[rows] >= FRESH_SHARE]
        near = rows[share[rows] < FRESH_SHARE]
        c = 1 / (1 - share[near])
        near, c = near[c != 1], c[c != 1]
        kept[near] *= c[:, None]
        rlogr[near] = rlogr[near] * c + np.log(c)
        if far.size:
            kept[far], _, rlogr[far] = normalise(lr[np.ix_(far, keep)])
        return kept, rlogr
    far = share >= FRESH_SHARE
    c = 1 / (1 - xp.where(far, xp.zeros_like(share), share))
    rlogr = (rlogr - xp.sum(_xlogx(lost, xp), axis=1)) * c + xp.log(c)
    fresh, _, fresh_rlogr = normalise(xp.take(lr, keep, axis=1))
    return (xp.where(xp.reshape(far, (-1, 1)), fresh, kept * xp.reshape(c, (-1, 1))),
            xp.where(far, fresh_rlogr, rlogr))


def move_kernel(chunk: Chunk, params: MoveParams) -> MoveResult:
    """The E-step pass of a move iteration, block by block (``BLOCK_ROWS``): regular statistics,
    the pairs' entropy changes, and the statistics of the delete proposal (:func:`delete_proposal`).

    Diagonal families: the regular statistics are :func:`vbcore.kernels.estep.vbem_kernel`'s, bit for bit
    (its block hook gathers the rest), so a round that accepts no move is a regular VB EM iteration;
    summing them otherwise (centred per block, then merged) put the bound up to 2.5e-8 of its size
    (0.6 nats on 100,000 x 512) below a regular pass's and showed as a decrease in the history."""
    xp = array_namespace(chunk.x)
    keep = gone = None
    if params.keep is not None:
        k = int(params.estep.const.shape[0])
        keep = xp.asarray(np.asarray(params.keep, dtype=np.int64))
        gone = xp.asarray(np.setdiff1d(np.arange(k), np.asarray(params.keep, dtype=np.int64)))
    if params.estep.covariance_type not in ("full", "tied"):
        return _fused_move_kernel(chunk, params, keep, gone)
    out: MoveResult | None = None
    for i in range(0, chunk.n_rows, BLOCK_ROWS):
        sub = _block(chunk, i, min(i + BLOCK_ROWS, chunk.n_rows))
        wb = sub.w
        lr = log_rho(sub, params.estep)
        resp, log_norm, rlogr = normalise(lr)  # chunk_statistics weighs r and r ln r
        alt, alt_h = None, np.zeros(params.keep_pairs.shape[0])
        if keep is not None:
            resp2, rlogr2 = delete_proposal(lr, resp, rlogr, keep, gone)
            alt, alt_h = chunk_statistics(sub, resp2, rlogr2), pair_entropy(resp2, params.keep_pairs, wb)
        total = float(to_numpy(xp.sum(weigh(sub, 0, resp, log_norm)[1], dtype=xp.float64)))
        stats = chunk_statistics(sub, resp, rlogr)
        part = MoveResult(stats, total, pair_entropy(resp, params.pairs, wb), alt, alt_h)
        out = part if out is None else out.merge(part)
    assert out is not None, "a chunk has rows"
    return out


def _block(chunk: Chunk, i: int, j: int) -> Chunk:
    return Chunk(x=chunk.x[i:j, :], feats=None if chunk.feats is None else chunk.feats[i:j, :],
                 shift=chunk.shift, diagonal=chunk.diagonal, pooled=chunk.pooled,
                 w=None if chunk.w is None else chunk.w[i:j])


def _fused_move_kernel(chunk: Chunk, params: MoveParams, keep: Array | None,
                       gone: Array | None) -> MoveResult:
    """:func:`move_kernel` for the diagonal families: the regular pass with a block hook."""
    h = np.zeros(params.pairs.shape[0])
    alt_h = np.zeros(params.keep_pairs.shape[0])
    alt: SuffStats | None = None

    def hook(i: int, lr: Array, resp: Array, rlogr: Array) -> None:
        nonlocal h, alt, alt_h
        sub = _block(chunk, i, i + resp.shape[0])
        h = h + pair_entropy(resp, params.pairs, sub.w)
        if keep is not None:
            resp2, rlogr2 = delete_proposal(lr, resp, rlogr, keep, gone)
            part = chunk_statistics(sub, resp2, rlogr2)
            alt = part if alt is None else alt.merge(part)
            alt_h = alt_h + pair_entropy(resp2, params.keep_pairs, sub.w)

    regular = vbem_kernel(chunk, params.estep, hook)
    return MoveResult(regular.stats, regular.log_norm, h, alt, alt_h)
