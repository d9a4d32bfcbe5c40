"""The truncated E-step of the diagonal families as batched GEMMs (issue 52): no Python step per block.

A chunk's rows, sorted by the rank of their best cluster (:func:`vbcore.kernels.truncated.cluster_order`),
are cut into blocks of ``B`` consecutive rows (``block_rows``; the last one padded with zero rows). A
block's search space is the union of its rows' candidates, the neighbour lists of their best clusters
(``search='best'``) or of all their candidates (``'all'``) and ``n_random`` random clusters
(:func:`block_search`), padded to the largest union of the chunk. Then, for the whole chunk at once:

* **logits**: one batched GEMM ``(blocks, B, 2D) @ (blocks, 2D, S)`` of the gathered ``[x*x, x]`` rows
  against their block's gathered weights, in the data's dtype, plus the float64 constants; padded
  columns are ``-inf``;
* **softmax**: the top ``C'`` of every row (:func:`top_columns`), their log-sum-exp, ``r`` and
  ``sum r ln r`` in float64;
* **statistics**: the dense ``(blocks, B, A)`` responsibilities on the ``A`` columns of each block that
  hold a weight in the dtype's normal range, one batched GEMM ``R^T [x*x, x]`` in the data's dtype,
  added into the K x 2D float64 sums in block order (the same order on every engine);
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

from vbcore.arrays import to_host
from vbcore.kernels.estep import Chunk, array_namespace, to_numpy

#: at most this many (block, cluster) flags are set at once when the search spaces are formed
MASK_LIMIT = 1 << 22
#: seconds per step of :func:`diag_pass`, summed over calls while a dict (``bench/bench_trunc_profile.py
#: kernel``); None: not measured
SECTIONS: dict[str, float] | None = None


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


def _gathered(chunk: Chunk, rows: np.ndarray, padded: int) -> Any:
    """``[x*x, x]`` of ``rows``, then zero rows up to ``padded`` rows, in the chunk's namespace."""
    xp = array_namespace(chunk.x)
    r = xp.asarray(rows)
    if chunk.feats is not None and xp is np:
        out = np.empty((padded, chunk.feats.shape[1]), dtype=chunk.feats.dtype)
        np.take(chunk.feats, rows, axis=0, out=out[: rows.size], mode="clip")  # (in range: no checks)
        out[rows.size :] = 0
        return out
    if chunk.feats is not None:
        f = xp.take(chunk.feats, r, axis=0)
    else:
        xb = xp.take(chunk.x, r, axis=0)
        f = xp.concat((xb * xb, xb), axis=1)
    if padded == rows.size:
        return f
    return xp.concat((f, xp.zeros((padded - rows.size, f.shape[1]), dtype=f.dtype)), axis=0)


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
    nb, s = sidx.shape
    t = _lap("search spaces", t)
    fs = _gathered(chunk, rows, nb * size)
    f3 = xp.reshape(fs, (nb, size, fs.shape[1]))
    ws = (np.take(w, sidx, axis=0, mode="clip") if xp is np else
          xp.reshape(xp.take(w, xp.asarray(sidx.ravel()), axis=0), (nb, s, fs.shape[1])))
    t = _lap("gathers (rows, weights)", t)
    lg = to_host(xp.matmul(f3, xp.matrix_transpose(ws)))  # the data's dtype
    t = _lap("logits GEMM", t)
    const = np.where(valid, params.estep.const[sidx], -np.inf)  # the padding: -inf, never kept
    logits = np.add(lg, const[:, None, :], dtype=np.float64).reshape(nb * size, s)[:m]
    blk = np.arange(m) // size
    top = np.argsort(-logits, axis=1, kind="stable")[:, :c]  # top_columns' order; 2x faster at S ~ 30
    t = _lap("top C'", t)
    sel = np.take_along_axis(logits, top, axis=1)
    mx = sel[:, :1]
    lse = mx[:, 0] + np.log(np.sum(np.exp(sel - mx), axis=1))
    r = np.exp(sel - lse[:, None])
    rlogr = np.sum(r * (sel - lse[:, None]), axis=1)
    t = _lap("softmax", t)
    keys, sums, counts = _scores(logits - mx, blk, bests, sidx, valid, k)
    t = _lap("neighbour scores", t)
    rg = r
    if chunk.w is not None:  # weighted rows: the sums take w_n r_nk (vbcore.kernels.estep.weigh)
        rg = r * np.asarray(to_numpy(xp.take(chunk.w, xp.asarray(rows))), dtype=np.float64)[:, None]
    g = _moments(f3, rg, top, sidx, valid.shape, size, k, xp)
    evaluations = int(np.sum(np.bincount(blk, minlength=nb) * valid.sum(axis=1)))
    idx = sidx[blk[:, None], top].astype(np.int32)
    return BlockPass(idx, r, lse, rlogr, g, keys, sums, counts, evaluations)


def _scores(diff: np.ndarray, blk: np.ndarray, bests: np.ndarray, sidx: np.ndarray, valid: np.ndarray,
            k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Neighbour scores: ``diff`` (m, S) summed over each run of rows with one best cluster in one
    block, per searched cluster; keys ``best * K + searched``, sums, counts (padding left out)."""
    m = diff.shape[0]
    cut = np.flatnonzero((blk[1:] != blk[:-1]) | (bests[1:] != bests[:-1])) + 1
    starts = np.concatenate(([0], cut))
    sizes = np.diff(np.append(starts, m))
    sums = np.add.reduceat(diff, starts, axis=0)
    sb = blk[starts]
    ok = valid[sb]
    keys = bests[starts].astype(np.int64)[:, None] * np.int64(k) + sidx[sb]
    return keys[ok], sums[ok], np.broadcast_to(sizes[:, None], ok.shape)[ok].astype(np.int64)


def _moments(f3: Any, rg: np.ndarray, top: np.ndarray, sidx: np.ndarray, shape: tuple[int, int], size: int,
             k: int, xp: Any) -> np.ndarray:
    """``g[j] = sum_n r_nj [x_n^2, x_n]`` (K, 2D) float64: per block one GEMM ``F_b^T R_b`` on the
    columns that hold a weight in the dtype's normal range (weights below it add nothing
    representable and subnormal operands slow the GEMM down 50x), added in block order."""
    t = time.perf_counter()
    nb, s = shape
    m = top.shape[0]
    dt = to_host(xp.zeros(0, dtype=f3.dtype)).dtype  # the GEMM's dtype, as NumPy's
    keep = rg >= np.finfo(dt).tiny
    dense = np.zeros((nb * size, s), dtype=dt)
    rr = np.broadcast_to(np.arange(m)[:, None], top.shape)
    dense[rr[keep], top[keep]] = rg[keep]
    d3 = dense.reshape(nb, size, s)
    act = (d3 != 0).any(axis=1)
    na = act.sum(axis=1)
    a = max(1, int(na.max()))
    cols = np.argsort(~act, axis=1, kind="stable")[:, :a]
    rc = np.take_along_axis(d3, cols[:, None, :], axis=2)
    t = _lap("statistics: dense R", t)
    part = to_host(xp.matmul(xp.matrix_transpose(f3), xp.asarray(rc)))  # (nb, 2D, a): 1.5-2x faster
    t = _lap("statistics GEMM", t)
    clusters = np.take_along_axis(sidx, cols, axis=1)
    g = np.zeros((k, part.shape[1]))
    bi, ai = np.nonzero(np.arange(a)[None, :] < na[:, None])
    for b, j in zip(bi.tolist(), ai.tolist(), strict=True):  # row by row: 10-20x faster than np.add.at
        g[clusters[b, j]] += part[b, :, j]
    _lap("statistics: float64 adds", t)
    return g
