"""The truncated E-step of the diagonal families as batched GEMMs (issue 52): no Python step per block.

A chunk's rows, sorted by the rank of their best cluster (:func:`vbcore.kernels.truncated.cluster_order`),
are cut into blocks of ``B`` consecutive rows (``block_rows``; the last one padded with zero rows). A
block's search space is the union of its rows' candidates, the neighbour lists of their best clusters
(``search='best'``) or of all their candidates (``'all'``) and ``n_random`` random clusters
(:func:`block_search`). The blocks are ordered by the size of their union and cut into
:data:`BUCKETS` buckets, each padded to its own largest union ``S`` (the GEMM, the weights' gather and
the top-C' sort scale with ``S``). Then, per bucket (all of its blocks at once):

* **logits**: one batched GEMM ``(blocks, B, 2D) @ (blocks, 2D, S)`` of the gathered ``[x*x, x]`` rows
  against their block's gathered weights, in the data's dtype, plus the float64 constants; padded
  columns are ``-inf``;
* **softmax**: the top ``C'`` of every row (:func:`top_columns`), their log-sum-exp, ``r`` and
  ``sum r ln r`` in float64;
* **statistics**: the dense ``(blocks, B, A)`` responsibilities on the ``A`` columns of each block that
  hold a weight in the dtype's normal range, one batched GEMM ``R^T [x*x, x]`` in the data's dtype,
  added into the K x 2D float64 sums in the order of the blocks in the pass (the same order on every
  engine and whatever the buckets: one sparse product whose rows add their terms in column order);
* **neighbour scores**: ``sum (ln rho_ns - max_j ln rho_nj)`` per (best cluster, searched cluster) by one
  ``reduceat`` over the runs of rows with one best cluster in one block.

Each row's q is the softmax of its exact ``ln rho`` over its kept clusters, the best C' of a search
space that holds its previous candidates: the bound stays exact for these q and never decreases
(:mod:`vbcore.kernels.truncated`). Memory per chunk: the gathered rows (n x 2D), the blocks' weights
(blocks x S x 2D) and the logits (n x S); no N x K array.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix

from vbcore.arrays import to_host
from vbcore.kernels.estep import Chunk, array_namespace, to_numpy

#: at most this many (block, cluster) flags are set at once when the search spaces are formed
MASK_LIMIT = 1 << 22
#: seconds per step of :func:`diag_pass`, summed over calls while a dict (``bench/bench_trunc_profile.py
#: kernel``); None: not measured
SECTIONS: dict[str, float] | None = None
#: the blocks of a pass are cut, by the size of their search space, into this many buckets, each padded
#: to its own largest search space
BUCKETS = 4


def _lap(name: str, t0: float) -> float:
    """Add the time since ``t0`` to :data:`SECTIONS` under ``name`` (when measuring); the time now."""
    t = time.perf_counter()
    if SECTIONS is not None:
        SECTIONS[name] = SECTIONS.get(name, 0.0) + t - t0
    return t


@dataclass
class BlockPass:
    """What :func:`diag_pass` returns for its rows (in the order given): candidates, responsibilities
    (float64), ``ln sum_{k in K_n} rho_nk``, ``sum r ln r``, the K x 2D float64 sums ``[sum r x^2, sum r
    x]``, the neighbour scores' keys (``c * K + s``), sums and counts, and the evaluations."""

    idx: np.ndarray
    resp: np.ndarray
    log_norm: np.ndarray
    rlogr: np.ndarray
    g: np.ndarray
    keys: np.ndarray
    sums: np.ndarray
    counts: np.ndarray
    evaluations: int


def top_columns(logits: np.ndarray, c: int) -> np.ndarray:
    """Column indices of each row's ``c`` largest values, largest first (ties: lower column)."""
    if c < logits.shape[1]:
        part = np.argpartition(-logits, c - 1, axis=1)[:, :c]
        part = np.sort(part, axis=1)  # the same columns in column order, so ties resolve by column
    else:
        part = np.broadcast_to(np.arange(logits.shape[1]), logits.shape)
    vals = np.take_along_axis(logits, part, axis=1)
    return np.take_along_axis(part, np.argsort(-vals, axis=1, kind="stable"), axis=1)


def stable_top(logits: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``c`` columns of each row's stable descending argsort (:func:`top_columns`' order) and
    their values: an unstable (SIMD) argsort, 2x faster at S ~ 20, whose first ``c + 1`` values are
    strictly decreasing on all rows but those with a tie there, which a stable argsort redoes."""
    full = np.argsort(-logits, axis=1)
    head = np.take_along_axis(logits, full[:, : c + 1], axis=1)
    top, sel = full[:, :c], head[:, :c]
    ties = np.flatnonzero(np.any(head[:, 1:] == head[:, :-1], axis=1))
    if ties.size:
        top[ties] = np.argsort(-logits[ties], axis=1, kind="stable")[:, :c]
        sel[ties] = np.take_along_axis(logits[ties], top[ties], axis=1)
    return top, np.ascontiguousarray(sel)


def block_search(prev: np.ndarray, bests: np.ndarray, neighbours: np.ndarray, size: int, candidates: int,
                 n_random: int, search: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The search spaces of blocks of ``size`` consecutive rows: per block the sorted union of its
    rows' candidates ``prev`` (m, C', -1 padded; every row has one), the neighbour lists (K, G) of
    their ``bests`` (``search='best'``) or of all their candidates (``'all'``), and ``n_random``
    clusters drawn from ``rng`` (more where the union has fewer than ``candidates``).

    Returns
    -------
    sidx : ndarray of shape (blocks, S) int64
        Each block's clusters, ascending, then its first cluster repeated up to the largest union S.
    valid : ndarray of shape (blocks, S) bool
        False on the padding.
    """
    m, k = prev.shape[0], neighbours.shape[0]
    nb = -(-m // size)
    blk = np.arange(m) // size
    lists = neighbours[bests] if search == "best" else neighbours[np.maximum(prev, 0)].reshape(m, -1)
    if search != "best":
        lists = np.where(np.repeat(prev >= 0, neighbours.shape[1], axis=1), lists, -1)
    draws = rng.integers(0, k, size=(nb, n_random))
    per = max(1, MASK_LIMIT // max(k, 1))  # blocks per slab of the (blocks, K) flags
    parts = []
    for b0 in range(0, nb, per):
        b1 = min(nb, b0 + per)
        r0, r1 = b0 * size, min(m, b1 * size)
        mask = np.zeros((b1 - b0, k), dtype=bool)
        for cols in (prev[r0:r1], lists[r0:r1]):
            ok = cols >= 0
            mask[np.broadcast_to(blk[r0:r1, None] - b0, cols.shape)[ok], cols[ok]] = True
        mask[np.repeat(np.arange(b1 - b0), n_random), draws[b0:b1].ravel()] = True
        for b in np.flatnonzero(mask.sum(axis=1) < min(candidates, k)):
            while mask[b].sum() < min(candidates, k):
                mask[b, rng.integers(0, k, size=candidates)] = True
        parts.append(mask)
    counts = np.concatenate([p.sum(axis=1) for p in parts])
    s = int(counts.max())
    sidx = np.empty((nb, s), dtype=np.int64)
    valid = np.arange(s)[None, :] < counts[:, None]
    first = 0
    for mask in parts:
        bi, ci = np.nonzero(mask)
        heads = np.cumsum(counts[first : first + mask.shape[0]]) - counts[first : first + mask.shape[0]]
        sidx[first : first + mask.shape[0]] = ci[heads][:, None]  # padding: the block's first cluster
        sidx[first + bi, np.arange(bi.size) - heads[bi]] = ci
        first += mask.shape[0]
    return sidx, valid


def buckets(counts: np.ndarray, n: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The blocks ordered by the size of their union ``counts`` (stable), cut into at most ``n`` runs of
    about equal length: the order and the runs' (start, stop) in it."""
    border = np.argsort(counts, kind="stable")
    cuts = np.unique(np.linspace(0, counts.size, min(n, counts.size) + 1).round().astype(np.int64))
    return border, [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def _gathered(chunk: Chunk, rows: np.ndarray, real: np.ndarray) -> Any:
    """``[x*x, x]`` of ``rows`` (every one a row of the chunk), zero where ``real`` is False, in the
    chunk's namespace."""
    xp = array_namespace(chunk.x)
    pad = not bool(real.all())
    if chunk.feats is not None and xp is np:
        out = np.empty((rows.size, chunk.feats.shape[1]), dtype=chunk.feats.dtype)
        np.take(chunk.feats, rows, axis=0, out=out, mode="clip")  # (in range: no checks)
        if pad:
            out[~real] = 0
        return out
    r = xp.asarray(rows)
    if chunk.feats is not None:
        f = xp.take(chunk.feats, r, axis=0)
    else:
        xb = xp.take(chunk.x, r, axis=0)
        f = xp.concat((xb * xb, xb), axis=1)
    if not pad:
        return f
    return xp.where(xp.asarray(real)[:, None], f, xp.zeros_like(f))


@dataclass
class _Rows:
    """One bucket's rows: logits' top C' (positions in the bucket's search spaces), their values and
    the rows' positions in the pass's sorted rows."""

    top: np.ndarray
    sel: np.ndarray
    pos: np.ndarray


def diag_pass(chunk: Chunk, rows: np.ndarray, prev: np.ndarray, bests: np.ndarray, params: Any, w: Any,
              rng: np.random.Generator) -> BlockPass:
    """The truncated E-step of ``rows`` of a chunk (diagonal families), sorted by the rank of their best
    cluster ``bests`` (all valid), with candidates ``prev``; ``params`` a
    :class:`vbcore.kernels.truncated.TruncParams`, ``w`` its weights (K, 2D) in the chunk's namespace and
    dtype. See the module docstring."""
    xp = array_namespace(chunk.x)
    m, k, c, size = rows.size, params.n_components, params.candidates, params.min_rows
    t = time.perf_counter()
    sidx, valid = block_search(prev, bests, params.neighbours, size, c, params.n_random, params.search, rng)
    nb = sidx.shape[0]
    counts = valid.sum(axis=1)
    border, runs = buckets(counts, BUCKETS)
    pos = (border[:, None] * size + np.arange(size)).ravel()  # each gathered row's place in ``rows``
    real = pos < m
    t = _lap("search spaces", t)
    f3 = xp.reshape(_gathered(chunk, rows[np.minimum(pos, m - 1)], real), (nb, size, -1))
    t = _lap("gathers (rows, weights)", t)
    parts, scored = [], []
    for b0, b1 in runs:
        part, sc = _bucket(f3[b0:b1, ...], border[b0:b1], pos[b0 * size : b1 * size], bests, sidx, counts,
                           params, w, xp)
        parts.append(part)
        scored.append(sc)
    t = time.perf_counter()
    top = np.empty((m, c), dtype=np.int64)  # positions in the block's search space
    sel = np.empty((m, c))
    for part in parts:
        top[part.pos], sel[part.pos] = part.top, part.sel
    mx = sel[:, :1]
    lse = mx[:, 0] + np.log(np.sum(np.exp(sel - mx), axis=1))
    r = np.exp(sel - lse[:, None])
    rlogr = np.sum(r * (sel - lse[:, None]), axis=1)
    t = _lap("softmax", t)
    keys, sums, cnts = _ordered_scores(scored)
    t = _lap("neighbour scores", t)
    rg = r
    if chunk.w is not None:  # weighted rows: the sums take w_n r_nk (vbcore.kernels.estep.weigh)
        rg = r * np.asarray(to_numpy(xp.take(chunk.w, xp.asarray(rows))), dtype=np.float64)[:, None]
    blk = np.arange(m) // size
    g = _moments(f3, rg, top, sidx, border, runs, pos, k, xp)
    evaluations = int(np.sum(np.bincount(blk, minlength=nb) * counts))
    idx = sidx[blk[:, None], top].astype(np.int32)
    return BlockPass(idx, r, lse, rlogr, g, keys, sums, cnts, evaluations)


def _bucket(f3: Any, blocks: np.ndarray, pos: np.ndarray, bests: np.ndarray, sidx: np.ndarray,
            counts: np.ndarray, params: Any, w: Any, xp: Any) -> tuple[_Rows, tuple]:
    """Logits, top C' and neighbour scores of one bucket's ``blocks`` (their gathered rows ``f3``, the
    rows' places ``pos`` in the pass), on the bucket's largest search space."""
    t = time.perf_counter()
    s = int(counts[blocks].max())
    si = sidx[blocks, :s]
    valid = np.arange(s)[None, :] < counts[blocks, None]
    ws = (np.take(w, si, axis=0, mode="clip") if xp is np else
          xp.reshape(xp.take(w, xp.asarray(si.ravel()), axis=0), (si.shape[0], s, f3.shape[2])))
    t = _lap("gathers (rows, weights)", t)
    lg = to_host(xp.matmul(f3, xp.matrix_transpose(ws)))  # the data's dtype
    t = _lap("logits GEMM", t)
    const = np.where(valid, params.estep.const[si], -np.inf)  # the padding: -inf, never kept
    logits = np.add(lg, const[:, None, :], dtype=np.float64).reshape(-1, s)
    size = f3.shape[1]
    lb = np.arange(logits.shape[0]) // size  # the rows' blocks in the bucket
    real = pos < bests.size
    if not real.all():
        logits, lb, pos = logits[real], lb[real], pos[real]
    top, sel = stable_top(logits, params.candidates)
    t = _lap("top C'", t)
    sc = _scores(logits - sel[:, :1], lb, bests[pos], si, valid, params.n_components)
    _lap("neighbour scores", t)
    return _Rows(top, sel, pos), (*sc, blocks)


def _scores(diff: np.ndarray, blk: np.ndarray, bests: np.ndarray, sidx: np.ndarray, valid: np.ndarray,
            k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Neighbour scores: ``diff`` (m, S) summed over each run of rows with one best cluster in one
    block, per searched cluster; keys ``best * K + searched``, sums, counts (padding left out) and
    each entry's block."""
    m = diff.shape[0]
    cut = np.flatnonzero((blk[1:] != blk[:-1]) | (bests[1:] != bests[:-1])) + 1
    starts = np.concatenate(([0], cut))
    sizes = np.diff(np.append(starts, m))
    sums = np.add.reduceat(diff, starts, axis=0)
    sb = blk[starts]
    ok = valid[sb]
    keys = bests[starts].astype(np.int64)[:, None] * np.int64(k) + sidx[sb]
    return (keys[ok], sums[ok], np.broadcast_to(sizes[:, None], ok.shape)[ok].astype(np.int64),
            np.broadcast_to(sb[:, None], ok.shape)[ok])


def _ordered_scores(scored: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The buckets' neighbour scores in the order of the blocks in the pass (that of one pass over the
    sorted rows: the same sums on every engine)."""
    keys = np.concatenate([s[0] for s in scored])
    order = np.argsort(np.concatenate([s[4][s[3]] for s in scored]), kind="stable")
    return (keys[order], np.concatenate([s[1] for s in scored])[order],
            np.concatenate([s[2] for s in scored])[order])


def _moments(f3: Any, rg: np.ndarray, top: np.ndarray, sidx: np.ndarray, border: np.ndarray,
             runs: list[tuple[int, int]], pos: np.ndarray, k: int, xp: Any) -> np.ndarray:
    """``g[j] = sum_n r_nj [x_n^2, x_n]`` (K, 2D) float64: per block one GEMM ``F_b^T R_b`` on the
    columns that hold a weight in the dtype's normal range (weights below it add nothing
    representable and subnormal operands slow the GEMM down 50x), added in the order of the blocks
    in the pass (one CSR product: per cluster, its blocks' rows added one by one in that order)."""
    t = time.perf_counter()
    nb, size = f3.shape[0], f3.shape[1]
    m = top.shape[0]
    dt = to_host(xp.zeros(0, dtype=f3.dtype)).dtype  # the GEMM's dtype, as NumPy's
    inv = np.empty(nb * size, dtype=np.int64)  # each row's place in the gathered (bucket) order
    inv[pos[pos < m]] = np.flatnonzero(pos < m)
    rk, ck = np.nonzero(rg >= np.finfo(dt).tiny)
    gi, col = inv[rk], top[rk, ck]
    gb = gi // size
    act = np.zeros((nb, sidx.shape[1]), dtype=bool)
    act[gb, col] = True
    rank = np.cumsum(act, axis=1) - 1  # a column's place among its block's active columns
    width = np.maximum(1, [int(act[b0:b1].sum(axis=1).max()) for b0, b1 in runs])
    sizes = np.array([(b1 - b0) * size for b0, b1 in runs]) * width
    offs = np.concatenate(([0], np.cumsum(sizes)))
    per = np.repeat(np.arange(len(runs)), [b1 - b0 for b0, b1 in runs])  # each block's bucket
    head = offs[per] + (np.arange(nb) - np.array([b0 for b0, _ in runs])[per]) * size * width[per]
    buf = np.zeros(int(offs[-1]), dtype=dt)  # the buckets' (blocks, B, active columns) R, one after another
    buf[head[gb] + (gi % size) * width[per[gb]] + rank[gb, col]] = rg[rk, ck]
    bi, ci = np.nonzero(act)  # (block, column) pairs, per block in column order
    t = _lap("statistics: dense R", t)
    vecs = []
    for i, (b0, b1) in enumerate(runs):
        rc = buf[offs[i] : offs[i + 1]].reshape(b1 - b0, size, int(width[i]))
        part = to_host(xp.matmul(xp.matrix_transpose(f3[b0:b1, ...]), xp.asarray(rc)))  # (blocks, 2D, a)
        t = _lap("statistics GEMM", t)
        p0, p1 = np.searchsorted(bi, [b0, b1])
        vecs.append(np.asarray(part.transpose(0, 2, 1)[bi[p0:p1] - b0, rank[bi[p0:p1], ci[p0:p1]]],
                               dtype=np.float64))
    keys = [sidx[border[bi], ci] * np.int64(nb) + border[bi]]
    key = np.concatenate(keys)
    order = np.argsort(key, kind="stable")
    key, vec = key[order] // nb, np.concatenate(vecs)[order]
    ptr = np.searchsorted(key, np.arange(k + 1))
    ones = csr_matrix((np.ones(key.size), np.arange(key.size), ptr), shape=(k, key.size))
    g = np.asarray(ones @ vec)  # row by row, in column order: g[j] = ((0 + v_1) + v_2) + ..., in block order
    _lap("statistics: float64 adds", t)
    return g
