"""Births from the rows the model explains worst: small classes that a uniform sample does not show.

A VB EM fit grown from few components can end with a class of a few dozen rows inside a component of
thousands (planted long-tailed data: classes of 10-89 rows in 50,000-100,000 stayed merged from the
lowest starts, docs/algorithms.md "Wider checks"): the births' uniform sample
(:func:`pipeline.fit.learners.growth.split_proposals`) holds none or one of its rows, so no test
sees two groups. Those rows are, however, the worst explained of all: far from their component's
mean, they have the lowest ``ln sum_k rho_nk``. When a birth check's split proposal is refused (or
it has none), one extra pass gathers the :data:`OUTLIER_ROWS` rows of lowest ``ln sum_k rho``
(:func:`worst_rows_kernel`, lowest first per chunk, then over all chunks in chunk order: the same
rows on every engine), groups each component's worst rows by single linkage (rows closer than
:data:`OUTLIER_LINK` times the model's typical variance per dimension), and proposes a child at the
mean of every group of at least :data:`OUTLIER_MIN_ROWS` rows that lies ``SPREAD_SPLIT`` times that
variance or more from its component's mean and :data:`OUTLIER_FAR` times as far as the worst of the
fit's rows would lie from the mean of one Gaussian (:func:`tail_ratio`)
(:func:`pipeline.fit.learners.growth.propose_outliers`). That proposal is judged on its own, like
any birth: accepted only when exact VB EM iterations raise the exact bound by more than ``tol`` per
row. (Tried before the splits, an accepted outlier birth could leave a doubling split proposal that
then fell short: a planted 2-D set from K = 3 ended with 4 clusters for 6.) Rows of real features
that are merely unusual rarely form such a tight, distant group.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage

from vbcore.kernels.estep import (
    Chunk,
    EStepParams,
    array_namespace,
    log_rho,
    normalise,
    prepare_chunk,
    to_numpy,
)

#: the worst-explained rows gathered (at most, and at most ``OUTLIER_MAX_BYTES`` of float64 rows)
OUTLIER_ROWS = 256
OUTLIER_MAX_BYTES = 1 << 26
#: rows closer than this many times the typical per-dimension spread (squared distance / D) are linked
OUTLIER_LINK = 4.0
#: a group of worst rows is a birth with at least this many rows
OUTLIER_MIN_ROWS = 3
#: the tail probability of :func:`tail_ratio`
OUTLIER_TAIL = 0.01
#: a group is a birth only this many times as far as :func:`tail_ratio` (measured: at 2x a group of
#: 136 of the worst rows of a 4-D planted set, 2.0x the bound, was born and the fit ended in a worse
#: optimum, 18 clusters for 20, NMI 0.975 against 0.987; the small planted classes it is for lie 3.5x
#: (12 rows in 16 dimensions) to 9-15x (10-89 rows in 32-64) the bound from their component's mean)
OUTLIER_FAR = 3.0


def tail_ratio(n_rows: float, d: int) -> float:
    """A bound on the largest squared distance per dimension (over the spread) of ``n_rows`` rows of
    one Gaussian from its mean, exceeded with probability at most ``OUTLIER_TAIL``: ``1 + 2 sqrt(t/D)
    + 2 t/D`` with ``t = ln(n_rows / OUTLIER_TAIL)`` (Laurent & Massart 2000, the chi-squared tail).
    In two dimensions the worst of 10,000 rows of a Gaussian reach about 10 (a spurious birth from
    a component's tail, which lost a class in a planted 2-D set); at D = 32, 100,000 rows: 3.4."""
    t = math.log(max(float(n_rows), 1.0) / OUTLIER_TAIL)
    return 1.0 + 2.0 * math.sqrt(t / d) + 2.0 * t / d


def worst_rows_kernel(chunk: Chunk, params: EStepParams, m: int,
                      means: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(ln sum_k rho, rows, counts, squares)``: the ``m`` rows of ``chunk`` with the lowest ``ln
    sum_k rho`` under ``params`` (shifted rows as the chunk holds them, float64; rows of weight 0 left
    out), lowest first (ties: row order), and per component the (weighted) count of the rows most
    likely under it and the sum of their squared distances to its mean (``means``, shifted): what
    the model's typical spread is measured from (:func:`spread_per_dimension`)."""
    xp = array_namespace(chunk.x)
    lr = log_rho(chunk, params)
    ln = to_numpy(normalise(lr)[1])
    owner = xp.argmax(lr, axis=1)
    centres = xp.take(xp.asarray(means, dtype=chunk.x.dtype), owner, axis=0)
    sq = to_numpy(xp.sum((chunk.x - centres) ** 2, axis=1, dtype=xp.float64))
    w = None if chunk.w is None else to_numpy(chunk.w)
    k, own = means.shape[0], np.asarray(to_numpy(owner), dtype=np.int64)
    counts = np.bincount(own, weights=w, minlength=k).astype(np.float64)
    squares = np.bincount(own, weights=sq if w is None else sq * w, minlength=k)
    if w is not None:
        ln = np.where(w > 0, ln, np.inf)
    order = np.argsort(ln, kind="stable")[:m]
    order = order[np.isfinite(ln[order])]
    rows = to_numpy(xp.take(chunk.x, xp.asarray(order), axis=0))
    return ln[order], rows, counts, squares


def spread_per_dimension(counts: np.ndarray, squares: np.ndarray, d: int) -> float:
    """The model's typical spread: the median over components holding at least
    ``OUTLIER_MIN_ROWS`` rows of their rows' mean squared distance to the mean, per dimension."""
    held = counts >= OUTLIER_MIN_ROWS
    return float(np.median(squares[held] / (counts[held] * d))) if held.any() else 0.0


def worst_rows(ctx: Any, params: EStepParams, means: np.ndarray,
               chunks: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """The fit's worst-explained rows (shifted, float64), lowest ``ln sum_k rho`` first, and the
    model's typical spread per dimension (one pass over the data, or over the chunks ``chunks``)."""
    m = int(min(ctx.n_rows, OUTLIER_ROWS, max(1, OUTLIER_MAX_BYTES // (8 * ctx.n_features))))
    handles = ctx.handles if chunks is None else [ctx.handles[int(i)] for i in chunks]
    parts = ctx.engine.map(worst_rows_kernel, handles, params, m, means)
    ln = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts])
    counts, squares = np.zeros(means.shape[0]), np.zeros(means.shape[0])
    for p in parts:  # in chunk order: the same sums on every engine
        counts += p[2]
        squares += p[3]
    return rows[np.argsort(ln, kind="stable")[:m]], spread_per_dimension(counts, squares, means.shape[1])


def outlier_groups(rows: np.ndarray, owner: np.ndarray, means: np.ndarray, spread: np.ndarray,
                   far: float) -> list[tuple[float, int, np.ndarray]]:
    """``(distance ratio, component, group mean)`` of every group of worst rows that is a birth: the
    rows of one component (``owner``) linked by single linkage at ``OUTLIER_LINK`` times the
    component's reference spread per dimension (``spread[k]``), at least ``OUTLIER_MIN_ROWS`` rows,
    whose mean lies at least ``far`` times that spread (squared distance per dimension) from the
    component's mean (``means``, shifted). Largest ratio first."""
    d = rows.shape[1]
    out = []
    for k in np.unique(owner):
        mine = rows[owner == k]
        ref = float(spread[k])
        if mine.shape[0] < OUTLIER_MIN_ROWS or not ref > 0:
            continue
        labels = fcluster(linkage(mine, method="single", metric="sqeuclidean"), OUTLIER_LINK * ref * d,
                          criterion="distance")
        for g in np.unique(labels):
            group = mine[labels == g]
            if group.shape[0] < OUTLIER_MIN_ROWS:
                continue
            centre = group.mean(0)
            ratio = float(((centre - means[k]) ** 2).sum() / (d * ref))
            if ratio >= far:
                out.append((ratio, int(k), centre))
    out.sort(key=lambda c: (-c[0], c[1]))
    return out


def outlier_births(ctx: Any, params: EStepParams, means: np.ndarray, far: float,
                   chunks: np.ndarray | None = None) -> list[tuple[float, int, np.ndarray]]:
    """:func:`outlier_groups` of the fit's worst-explained rows (one pass over the data, or over the
    chunks ``chunks``: a memoized refresh's new ones), each row given to the component it is most
    likely under, against the model's typical spread; groups at least ``far`` and ``OUTLIER_FAR``
    times :func:`tail_ratio` away."""
    if chunks is not None and chunks.size == 0:
        return []
    rows, typical = worst_rows(ctx, params, means, chunks)
    if rows.shape[0] < OUTLIER_MIN_ROWS or not typical > 0:
        return []
    far = max(far, OUTLIER_FAR * tail_ratio(ctx.n_weight, rows.shape[1]))
    chunk = prepare_chunk(rows, np.zeros(rows.shape[1]), params.covariance_type)
    owner = np.argmax(np.asarray(log_rho(chunk, params), dtype=np.float64), axis=1)
    return outlier_groups(rows, owner, means, np.full(means.shape[0], typical), far)


__all__ = ["OUTLIER_FAR", "OUTLIER_LINK", "OUTLIER_MIN_ROWS", "OUTLIER_ROWS", "outlier_births",
           "outlier_groups", "spread_per_dimension", "tail_ratio", "worst_rows", "worst_rows_kernel"]
