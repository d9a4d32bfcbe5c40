"""Rows drawn and gathered through the engine: minibatches (uniform slices, grouped by chunk),
samples for initialisation and for the default fixed variance, k-means++ seeds. Neutral: the point
learners, SVI, growth and the fit setup read them (Lim & Jiang 2024 Algorithm 1 draws its minibatches
and seeds this way)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.fit.learners.base import FitContext
from vbcore.kernels.estep import Chunk, array_namespace, to_numpy
from vbcore.kernels.sga_stats import (
    kmeanspp_seeds,
)

#: times a sample draws more rows where most of those it drew weigh 0 (gather_drawn)
TOP_UP_ROUNDS = 8
#: ``minibatch_slice=0`` (the default): slices of AUTO_SLICE rows on stores of at least
#: AUTO_SLICE_MINIBATCHES minibatches' rows (1,000,000 at the default 4,000), single rows below
AUTO_SLICE = 32
AUTO_SLICE_MINIBATCHES = 250


# ---- minibatches ------------------------------------------------------------------------------
def chunk_bounds(ctx: FitContext) -> np.ndarray:
    """Start row of every chunk plus N at the end, shape (n_chunks + 1,)."""
    starts = ctx.chunk_starts or [s.start for s in ctx.source.chunk_slices()]
    return np.asarray([*starts, ctx.n_rows], dtype=np.int64)


def split_by_chunk(rows: np.ndarray, bounds: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
    """Sorted global rows -> (chunk ids that have rows, positions inside each of those chunks)."""
    which = np.searchsorted(bounds, rows, side="right") - 1
    ids, first = np.unique(which, return_index=True)
    parts = np.split(rows, first[1:])
    return [int(i) for i in ids], [p - bounds[i] for i, p in zip(ids, parts, strict=True)]


def minibatch_weight(stats: Any, m: int) -> float:
    """A minibatch's ``M`` in the N / M scaling: its ``m`` rows, or their total weight (weighted
    rows, so the statistics scale by the total weight, not the row count; at least a tiny positive
    number: a minibatch of zero-weight rows has zero statistics)."""
    return m if stats.weight is None else max(float(stats.weight), 1e-300)


def draw_rows(rng: np.random.Generator, n_rows: int, size: int) -> np.ndarray:
    """``size`` distinct rows out of ``n_rows`` (all rows when size >= n_rows), sorted."""
    if size >= n_rows:
        return np.arange(n_rows, dtype=np.int64)
    return np.sort(rng.choice(n_rows, size=size, replace=False)).astype(np.int64)


def draw_slices(rng: np.random.Generator, n_rows: int, size: int, slice_rows: int) -> np.ndarray:
    """A minibatch of contiguous slices, sorted: the rows are cut into slots of ``slice_rows``
    consecutive rows (the last one may be shorter) and ``ceil(size / slice_rows)`` distinct slots
    are drawn uniformly (:func:`draw_rows` of the slots), so every row is in the minibatch with the
    same probability and a chunk is read for a slice, not for a row or two. All rows when ``size >=
    n_rows``; ``slice_rows = 1`` is :func:`draw_rows`, draw for draw."""
    if size >= n_rows:
        return np.arange(n_rows, dtype=np.int64)
    s = max(1, int(slice_rows))
    slots = draw_rows(rng, -(-n_rows // s), -(-size // s))
    rows = (slots[:, None] * s + np.arange(s, dtype=np.int64)[None, :]).ravel()
    return rows[rows < n_rows]


def auto_slice(n_rows: int, size: int) -> int:
    """The rows per slice of ``minibatch_slice=0`` (the default): ``AUTO_SLICE`` on stores of at least
    ``AUTO_SLICE_MINIBATCHES`` minibatches' rows (and minibatches of at least ``AUTO_SLICE`` rows),
    single rows below (docs/algorithms.md, "Minibatches")."""
    big = size >= AUTO_SLICE and n_rows >= AUTO_SLICE_MINIBATCHES * size
    return AUTO_SLICE if big else 1


def minibatch(ctx: FitContext, iteration: int, size: int,
              slice_rows: int = 1) -> tuple[list[Any], list[np.ndarray], int]:
    """The handles, per-chunk positions and row count of iteration ``iteration``'s minibatch
    (:func:`draw_slices`: slices of ``slice_rows`` consecutive rows; 0: :func:`auto_slice`)."""
    slice_rows = int(slice_rows) or auto_slice(ctx.n_rows, size)
    rows = draw_slices(ctx.rng(iteration), ctx.n_rows, size, slice_rows)
    ids, parts = split_by_chunk(rows, chunk_bounds(ctx))
    return [ctx.handles[i] for i in ids], parts, int(rows.size)


def gather_kernel(chunk: Chunk, rows: np.ndarray) -> np.ndarray:
    """Rows of a chunk (shifted), as a float32/float64 NumPy array."""
    xp = array_namespace(chunk.x)
    x = xp.take(chunk.x, xp.asarray(np.asarray(rows, dtype=np.int64)), axis=0)
    return np.asarray(to_numpy(x), dtype=np.float64).astype(np.float32 if str(x.dtype) == "float32"
                                                           else np.float64)


def gather_weighted_kernel(chunk: Chunk, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows of a chunk (:func:`gather_kernel`) and their weights in float64 (None: unweighted rows),
    the rows of weight 0 left out where they are (only the others travel to the driver)."""
    x = gather_kernel(chunk, rows)
    if chunk.w is None:
        return x, None
    xp = array_namespace(chunk.w)
    w = to_numpy(xp.take(chunk.w, xp.asarray(np.asarray(rows, dtype=np.int64)), axis=0))  # (float64)
    return x[w > 0], w[w > 0]


def gather_weighted(engine: Any, handles: list[Any], bounds: np.ndarray,
                    rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Sorted global ``rows`` (shifted), gathered next to the data through the engine, in row order,
    and their weights (None: the rows are unweighted); ``bounds`` as :func:`chunk_bounds`. Rows of
    weight 0 are left out: a row of weight 0 is no row (it seeds nothing and is counted nowhere)."""
    ids, parts = split_by_chunk(rows, bounds)
    got = engine.map(gather_weighted_kernel, [handles[i] for i in ids], per_chunk=parts)
    x = np.concatenate([g[0] for g in got])
    return x, None if any(g[1] is None for g in got) else np.concatenate([g[1] for g in got])


def gather_drawn(engine: Any, handles: list[Any], bounds: np.ndarray, n_rows: int, size: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """A uniform sample of ``size`` of the ``n_rows`` rows (shifted), drawn with ``rng``, and their
    weights (:func:`gather_weighted`), in row order within each draw. Rows of weight 0 drawn are
    left out and more rows drawn among those not drawn yet (the share of positive weight seen so far
    setting how many, at most ``TOP_UP_ROUNDS`` times) until ``size`` rows of positive weight or
    every row: where most rows weigh 0 a sample holds as many rows as it would with those rows
    dropped. Unweighted rows: one draw."""
    rows = draw_rows(rng, n_rows, size)
    x, w = gather_weighted(engine, handles, bounds, rows)
    for _ in range(TOP_UP_ROUNDS):
        if w is None or x.shape[0] >= min(size, n_rows) or rows.size >= n_rows:
            break
        share = max(x.shape[0], 1) / rows.size  # rows of positive weight per row drawn
        want = min(n_rows - rows.size, int(np.ceil(1.25 * (size - x.shape[0]) / share)))
        fresh = draw_rows(rng, n_rows, rows.size + want)  # holds >= want rows not drawn yet
        fresh = fresh[~np.isin(fresh, rows)]
        more = np.sort(rng.choice(fresh, size=min(want, fresh.size), replace=False))
        mx, mw = gather_weighted(engine, handles, bounds, more)
        assert mw is not None
        rows = np.union1d(rows, more)
        x, w = np.concatenate((x, mx)), np.concatenate((w, mw))
    return x, w


def gather_sample(ctx: FitContext, size: int, key: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`gather_drawn` of the fit's rows with ``ctx.rng(*key)``."""
    return gather_drawn(ctx.engine, ctx.handles, chunk_bounds(ctx), ctx.n_rows, size, ctx.rng(*key))


def kmeanspp(sample: np.ndarray, k: int, seed: int,
             w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """k-means++ seeds (float64) and their row indices in ``sample``, drawn by the rows' weights ``w``
    where given (:func:`vbcore.kernels.sga_stats.kmeanspp_seeds`)."""
    idx = kmeanspp_seeds(sample, k, np.random.default_rng(seed), weights=w)
    return np.asarray(sample[idx], dtype=np.float64), idx


