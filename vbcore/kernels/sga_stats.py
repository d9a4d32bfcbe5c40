"""The data-reading half of the point-estimate DP-mixture learners of Lim & Jiang 2024 (the SGA /
SGA+M / SGA+F and MM updates and the bound are in :mod:`vbcore.learners.sga`): the point
:class:`DPPoint`, the MAP assignment of eq. 19 as a GEMM (:func:`hard_kernel`, :func:`map_labels`),
the hard statistics of the assigned rows (:class:`HardStats`), k-means++ seeding, and selecting or
scaling statistics.

:func:`hard_kernel` makes one float32 ``(n x D) @ (D x K)`` GEMM per 2,048-row block, then
accumulates the hard statistics of the assigned rows (``n_k``, per-cluster mean and per-dimension
centred scatter) in float64. No N x K x D array exists.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from vbcore.kernels.estep import (
    BLOCK_ROWS,
    Chunk,
    add_rows,
    array_namespace,
    estep_const,
    merge_spread,
    row_spread,
    to_numpy,
)
from vbcore.model.posterior import Posterior
from vbcore.model.stats import SuffStats

Array = Any

#: smallest stick kept away from 0 and 1 (ln v and ln(1 - v) stay finite)
STICK_EPS = 1e-12


@dataclass(frozen=True)
class DPPoint:
    """Point estimates of the DP mixture (float64).

    Attributes
    ----------
    means : array of shape (n_components, n_features)
        ``E[mu_k]`` in the data's coordinates.
    sticks : array of shape (n_components,)
        ``E[v_k]`` in (0, 1).
    """

    means: np.ndarray
    sticks: np.ndarray

    @property
    def n_components(self) -> int:
        return int(self.means.shape[0])

    def take(self, order: np.ndarray) -> DPPoint:
        return DPPoint(self.means[order], self.sticks[order])


def log_stick_weights(sticks: np.ndarray) -> np.ndarray:
    """``ln v_k + sum_{l<k} ln(1 - v_l)`` (the weight terms of eq. 19), shape (K,)."""
    v = np.clip(sticks, STICK_EPS, 1.0 - STICK_EPS)
    return np.log(v) + np.concatenate(([0.0], np.cumsum(np.log1p(-v[:-1]))))


# ---- eq. 19: MAP assignments, as a GEMM -------------------------------------------------------
@dataclass(frozen=True)
class MapParams:
    """What a chunk needs for eq. 19 (small; sent once per pass).

    ``argmax_k x.m_k / sigma^2 - |m_k|^2 / (2 sigma^2) + ln pi_k`` (the row's own ``|x|^2`` and
    ``ln(1/sigma)`` are the same for every k), with rows and means shifted by ``shift``.

    Attributes
    ----------
    weights : array of shape (n_features, n_components)
        ``(m_k - shift) / sigma^2`` as columns.
    const : array of shape (n_components,)
        ``ln pi_k - |m_k - shift|^2 / (2 sigma^2)``.
    """

    weights: np.ndarray
    const: np.ndarray
    #: optional: sum each assigned row's share of the point posterior's ELBO (and its square) into
    #: the result (:class:`RowBound`)
    bound: RowBound | None = None


@dataclass(frozen=True)
class RowBound:
    """Each assigned row's share of the ELBO of the point's posterior
    (:func:`vbcore.learners.sga.point_posterior`), ``l_n = ln rho_{n z_n}`` (Kuusela et al. 2009 eq. 36 with
    a one-hot q(z_n)), from the MAP score the assignment already computed:
    ``l_n = s_{n z_n} + offset_{z_n} - half_precision |x_n - shift|^2``. The posterior's means are
    the point's and its precision is ``1 / sigma^2`` in every cluster, so ``ln rho_nk`` and the score
    differ only by a per-cluster constant and the row's own ``|x|^2`` term: O(n D) per pass, no gather.
    """

    offset: np.ndarray  # (K,): const_k of the posterior's E-step minus the score's const_k
    half_precision: float  # 1 / (2 sigma^2)


def row_bound(point: DPPoint, sigma2: float, post: Posterior, shift: np.ndarray) -> RowBound:
    """:class:`RowBound` of ``post``, which must be the 'fixed' posterior of ``point`` (its means,
    variance ``sigma2`` in every cluster), as :func:`vbcore.learners.sga.point_posterior` builds it."""
    if not (post.covariance_type == "fixed" and np.array_equal(post.means, point.means)
            and np.all(np.asarray(post.covariances) == sigma2)):
        raise ValueError("row bounds need the point's own 'fixed' posterior (same means, variance sigma^2)")
    offset = estep_const(post, shift) - map_const(point, sigma2, shift)
    return RowBound(offset=offset, half_precision=0.5 / float(sigma2))


def map_const(point: DPPoint, sigma2: float, shift: np.ndarray, m: np.ndarray | None = None) -> np.ndarray:
    """``map_params(...).const``: ``ln w_k - |mu_k - shift|^2 / (2 sigma^2)`` (``m``: the shifted means)."""
    m = point.means - shift[None, :] if m is None else m
    return log_stick_weights(point.sticks) - 0.5 * np.einsum("kd,kd->k", m, m) / sigma2


def map_params(point: DPPoint, sigma2: float, shift: np.ndarray, dtype: Any = np.float64,
               bound: RowBound | None = None) -> MapParams:
    """:class:`MapParams` of a point; ``dtype`` the data's (float32 data: the GEMM weights are cast
    once here, not in every chunk kernel); ``bound`` see :class:`MapParams`."""
    m = point.means - shift[None, :]
    const = map_const(point, sigma2, shift, m)
    w = np.empty((m.shape[1], m.shape[0]), dtype=np.dtype(dtype))
    np.multiply(m.T, 1.0 / sigma2, out=w, casting="same_kind")
    return MapParams(weights=w, const=const, bound=bound)


@dataclass(frozen=True)
class HardStats:
    """Raw float64 sums of the rows assigned to each cluster (shifted rows), kept only for the
    clusters that own rows (``idx``): a minibatch's chunk touches a few hundred of K = 1000 clusters,
    so the per-chunk results and their merges cost O(rows x D), not O(K x D). Additive; chunks merge
    in the engines' fixed order.

    Attributes
    ----------
    nk : array of shape (K,)
        Rows per cluster (all K).
    idx : int64 array of shape (u,)
        The clusters with ``nk > 0``, ascending.
    s1, s2 : arrays of shape (u, D)
        ``sum_n z_nk x_n`` and ``sum_n z_nk x_n * x_n`` of the clusters ``idx``: float64, or the
        data's float32 for a single block's sums (exact in float64; half the bytes to move).
    n_rows : int
    shift : array of shape (D,)
    weight : float or None
        The rows' total weight (weighted rows count their weight in ``nk``, ``s1``, ``s2`` and the
        bound sums, :attr:`vbcore.model.stats.SuffStats.weight`); None: unweighted.
    """

    nk: np.ndarray
    idx: np.ndarray
    s1: np.ndarray
    s2: np.ndarray
    n_rows: int
    shift: np.ndarray
    #: ``sum_n l_n`` and ``sum_n (l_n - mean)^2`` of ``l_n = ln rho_{n z_n}`` under ``MapParams.bound``
    #: (zeros without; :func:`vbcore.kernels.estep.row_spread`)
    bound: tuple[float, float] = (0.0, 0.0)
    weight: float | None = None

    def merge(self, other: HardStats) -> HardStats:
        a, b = self, other
        if not (a.idx.size == b.idx.size and np.array_equal(a.idx, b.idx)):
            return HardStats.combine([a, b])
        # the same clusters (full passes): plain adds, the same sums as combine's
        s1, s2 = np.add(a.s1, b.s1, dtype=np.float64), np.add(a.s2, b.s2, dtype=np.float64)
        return HardStats(a.nk + b.nk, a.idx, s1, s2, a.n_rows + b.n_rows, a.shift, _add_bounds([a, b]),
                         _add_weights([a, b]))

    @staticmethod
    def combine(parts: list[HardStats]) -> HardStats:
        """Sum of many results in list order into one (u, D) float64 array: for minibatch passes,
        where a tree of pairwise merges would rewrite the growing unions at every level. Each
        cluster's sums are added chunk after chunk, the same bits on any engine."""
        if not parts:
            raise ValueError("nothing to combine: there are no chunks")
        idx = functools.reduce(np.union1d, [p.idx for p in parts])
        d = parts[0].shift.shape[0]
        s1, s2 = np.zeros((idx.size, d)), np.zeros((idx.size, d))
        for p in parts:
            pos = np.searchsorted(idx, p.idx)
            add_rows(s1, pos, p.s1)
            add_rows(s2, pos, p.s2)
        nk = functools.reduce(np.add, [p.nk for p in parts])
        return HardStats(nk, idx, s1, s2, sum(p.n_rows for p in parts), parts[0].shift, _add_bounds(parts),
                         _add_weights(parts))

    def to_stats(self) -> SuffStats:
        """Centred statistics (mean, per-dimension scatter), ``sum_rlogr = 0`` (one-hot q(z))."""
        k, d = self.nk.shape[0], self.shift.shape[0]
        mean = np.zeros((k, d))
        scatter = np.zeros((k, d))
        if self.idx.size:
            n = self.nk[self.idx][:, None]
            m = np.asarray(self.s1, dtype=np.float64) / n
            mean[self.idx] = m
            scatter[self.idx] = np.maximum(np.asarray(self.s2, dtype=np.float64) - n * m * m, 0.0)
        return SuffStats(nk=self.nk.copy(), mean=mean, scatter=scatter, sum_rlogr=0.0,
                         n_rows=self.n_rows, shift=self.shift, weight=self.weight)


def _add_weights(parts: list[HardStats]) -> float | None:
    """The total weight of ``parts`` in list order (None when every part is unweighted)."""
    if all(p.weight is None for p in parts):
        return None
    return float(functools.reduce(lambda t, p: t + (p.n_rows if p.weight is None else p.weight), parts, 0.0))


def _add_bounds(parts: list[HardStats]) -> tuple[float, float]:
    """The ``bound`` pairs of ``parts`` combined in list order (:func:`vbcore.kernels.estep.merge_spread`)."""
    _, total, m2 = functools.reduce(merge_spread, [(p.n_rows, *p.bound) for p in parts])
    return total, m2


def row_bound_sums(xb: Array, scores: Array, lab: Array, bound: RowBound,
                   wb: Array | None = None) -> tuple[float, float]:
    """``sum_n l_n`` and ``sum_n (l_n - mean)^2`` (:class:`RowBound`) of a block's rows ``xb`` (shifted)
    from their MAP ``scores`` (n, K) and labels: ``l_n`` in the data's dtype, float64 sums; ``wb``:
    the rows' weights (``w_n l_n`` summed)."""
    xp = array_namespace(xb)
    top = xp.take_along_axis(scores, xp.reshape(lab, (-1, 1)), axis=1)[:, 0]
    offset = xp.take(xp.asarray(bound.offset, dtype=xb.dtype), lab)
    share = top + offset - bound.half_precision * xp.vecdot(xb, xb, axis=-1)
    return row_spread(share if wb is None else share * wb)


def _block_sums(xb: np.ndarray, fb: np.ndarray | None, lab: np.ndarray,
                wb: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-label sums of ``x`` and ``x*x`` over one block (at most BLOCK_ROWS rows, as the GEMM
    kernels): a sparse one-hot (labels x rows) matrix times the block, O(n D), in the block's dtype.
    ``fb`` is the cached ``[x*x, x]`` or None; ``wb`` the rows' weights (the one-hot's values; None:
    ones). Returns (labels present, sums of x, sums of x*x)."""
    from scipy import sparse

    nb, d = xb.shape
    uniq, inv = np.unique(lab, return_inverse=True)
    vals = np.ones(nb, dtype=xb.dtype) if wb is None else np.asarray(wb, dtype=xb.dtype)
    z = sparse.csr_matrix((vals, (inv, np.arange(nb))), shape=(uniq.size, nb))
    if fb is not None:
        g = z @ fb
        return uniq, g[:, d:], g[:, :d]
    return uniq, z @ xb, z @ (xb * xb)


def label_sums(x: np.ndarray, feats: np.ndarray | None, labels: np.ndarray, k: int, shift: np.ndarray,
               bound: tuple[float, float] = (0.0, 0.0), w: np.ndarray | None = None) -> HardStats:
    """:class:`HardStats` of rows ``x`` (shifted, NumPy; ``feats`` their ``[x*x, x]`` or None) with
    the given labels: :func:`_block_sums` per BLOCK_ROWS rows in the data's dtype, float64 across
    blocks; a single block's sums stay in its dtype (exact in float64: no K x D float64 arrays to
    fill and add for a minibatch's few hundred rows of a chunk). ``w``: the rows' weights (a
    cluster that holds only rows of weight 0 holds nothing)."""
    n, d = x.shape
    nk = np.bincount(labels, minlength=k).astype(np.float64) if w is None else np.bincount(
        labels, weights=np.asarray(w, dtype=np.float64), minlength=k)
    used = np.flatnonzero(nk)
    if w is not None:
        keep = nk[labels] > 0  # rows of clusters holding no weight add nothing
        x, labels, w = x[keep], labels[keep], w[keep]
        feats = None if feats is None else feats[keep]
    weight = None if w is None else float(nk.sum())
    m = x.shape[0]
    if 0 < m <= BLOCK_ROWS:
        _, g1, g2 = _block_sums(x, feats, labels, w)
        return HardStats(nk=nk, idx=used, s1=g1, s2=g2, n_rows=n, shift=shift, bound=bound, weight=weight)
    s1, s2 = np.zeros((used.size, d)), np.zeros((used.size, d))
    for a in range(0, m, BLOCK_ROWS):
        b = min(a + BLOCK_ROWS, m)
        uniq, g1, g2 = _block_sums(x[a:b], None if feats is None else feats[a:b], labels[a:b],
                                   None if w is None else w[a:b])
        pos = np.searchsorted(used, uniq)
        s1[pos] += g1  # float32 within the block, float64 across blocks
        s2[pos] += g2
    return HardStats(nk=nk, idx=used, s1=s1, s2=s2, n_rows=n, shift=shift, bound=bound, weight=weight)


def hard_kernel(chunk: Chunk, rows: np.ndarray | None, params: MapParams) -> HardStats:
    """MAP assignments (eq. 19) of some rows of a chunk and their hard statistics.

    Parameters
    ----------
    chunk : Chunk
        Prepared rows (shifted by ``chunk.shift``); ``feats`` (the ``[x*x, x]`` cache) are used
        when present, else ``x*x`` is formed per block.
    rows : int array of shape (m,), or None
        Positions inside the chunk (a minibatch), or None for every row.
    params : MapParams

    Returns
    -------
    HardStats
        Counts and float64 sums of the rows per cluster (``.to_stats()`` centres them).
    """
    x, feats, wts = chunk.x, chunk.feats, chunk.w
    xp = array_namespace(x)
    if rows is not None:
        idx = xp.asarray(np.asarray(rows, dtype=np.int64))
        x = xp.take(x, idx, axis=0)
        feats = None if feats is None else xp.take(feats, idx, axis=0)
        wts = None if wts is None else xp.take(wts, idx, axis=0)
    dt = x.dtype
    w = xp.asarray(params.weights, dtype=dt)
    const = xp.asarray(params.const, dtype=dt)
    k, d = params.const.shape[0], x.shape[1]
    n = int(x.shape[0])
    blocks = [(i, min(i + BLOCK_ROWS, n)) for i in range(0, n, BLOCK_ROWS)]
    spread: tuple[int, float, float] = (0, 0.0, 0.0)  # rows, sum and spread of l_n (RowBound)
    if xp is np:
        labs = []
        for a, b in blocks:
            scores = x[a:b] @ w + const
            labs.append(np.argmax(scores, axis=1))
            if params.bound is not None:
                wb = None if wts is None else wts[a:b]
                part = row_bound_sums(x[a:b], scores, labs[-1], params.bound, wb)
                spread = merge_spread(spread, (b - a, *part))
        labels = np.concatenate(labs) if labs else np.zeros(0, np.int64)
        return label_sums(x, feats, labels, k, chunk.shift, spread[1:], wts)
    # other namespaces (CuPy): one-hot GEMM, float32 per block, float64 across blocks, on the device
    acc = xp.zeros((k, 2 * d), dtype=xp.float64)
    nk_dev = xp.zeros((k,), dtype=xp.float64)
    for a, b in blocks:
        xb = x[a:b, :]
        scores = xb @ w + const
        lab = xp.argmax(scores, axis=1)
        onehot = xp.astype(xp.reshape(lab, (-1, 1)) == xp.reshape(xp.arange(k), (1, -1)), dt)
        wb = None if wts is None else wts[a:b]
        onehot = onehot if wb is None else onehot * xp.reshape(wb, (-1, 1))
        acc += xp.astype(xp.matrix_transpose(onehot) @ xp.concat((xb, xb * xb), axis=1), xp.float64)
        nk_dev += xp.sum(onehot, axis=0, dtype=xp.float64)
        if params.bound is not None:
            spread = merge_spread(spread, (b - a, *row_bound_sums(xb, scores, lab, params.bound, wb)))
    nk = to_numpy(nk_dev)
    used = np.flatnonzero(nk)
    g = to_numpy(xp.take(acc, xp.asarray(used), axis=0)) if used.size else np.zeros((0, 2 * d))
    weight = None if wts is None else float(nk.sum())
    return HardStats(nk=nk, idx=used, s1=g[:, :d], s2=g[:, d:], n_rows=n, shift=chunk.shift, bound=spread[1:],
                     weight=weight)


def map_labels(chunk: Chunk, params: MapParams) -> np.ndarray:
    """MAP labels (eq. 19) of every row of a chunk, int64 NumPy array (prediction)."""
    xp = array_namespace(chunk.x)
    w = xp.asarray(params.weights, dtype=chunk.x.dtype)
    const = xp.asarray(params.const, dtype=chunk.x.dtype)
    n = chunk.n_rows
    out = [np.asarray(to_numpy(xp.argmax(chunk.x[i : min(i + BLOCK_ROWS, n), :] @ w + const, axis=1)),
                      dtype=np.int64) for i in range(0, n, BLOCK_ROWS)]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


# ---- initialisation (Algorithm 1, step 3.iii) ---------------------------------------------------
def kmeanspp_seeds(x: np.ndarray, k: int, rng: np.random.Generator, project: int = 256,
                   weights: np.ndarray | None = None) -> np.ndarray:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007; ``2 + ln k`` candidates per step, as
    scikit-learn) on rows ``x``; returns the indices of the ``k`` seed rows.

    Seeding costs k sequential passes over the sample, so with ``D > project`` the squared distances
    are those of a Gaussian random projection to ``project`` dimensions (Johnson-Lindenstrauss:
    relative distortion about ``sqrt(2 / project)``), computed as float32 GEMMs with float64 sums.

    Parameters
    ----------
    x : array of shape (n, D)
    k : int, at most n
    rng : numpy Generator
    weights : array of shape (n,), positive, optional
        Row weights, as scikit-learn's ``kmeans_plusplus(sample_weight=...)``: the first seed is
        drawn in proportion to the weight, the candidates in proportion to ``w d^2``, and the
        greedy choice minimises ``sum w d^2`` -- a row of weight 3 seeds as three copies of it
        would. None, or all weights equal: the unweighted draws (the same bits).
    """
    n, d = x.shape
    k = min(int(k), n)
    w = None if weights is None or np.all(weights == weights[0]) else np.asarray(weights, dtype=np.float64)
    y = np.asarray(x, dtype=np.float32)
    if d > project:
        g = (rng.standard_normal((d, project)) / np.sqrt(project)).astype(np.float32)
        y = y @ g
    sq = np.einsum("ij,ij->i", y, y, dtype=np.float64)
    yt = np.ascontiguousarray(y.T)  # (p, n): the GEMM below has the long side as its columns

    def dist2(idx: np.ndarray) -> np.ndarray:
        prod = (y[idx] @ yt).astype(np.float64).T
        return np.maximum(sq[:, None] + sq[idx][None, :] - 2.0 * prod, 0.0)

    def draw(mass: np.ndarray, size: int | None) -> Any:
        u = rng.uniform(size=size) * mass.sum()
        return np.minimum(np.searchsorted(np.cumsum(mass), u), n - 1)

    chosen = [int(rng.integers(n))] if w is None else [int(draw(w, None))]
    d2 = dist2(np.array(chosen))[:, 0]
    trials = 2 + int(np.log(k)) if k > 1 else 1
    for _ in range(1, k):
        mass = d2 if w is None else w * d2
        total = mass.sum()
        if not total > 0:  # every row coincides with a seed: take unused rows in order
            rest = np.setdiff1d(np.arange(n), chosen)[: k - len(chosen)]
            chosen.extend(int(i) for i in rest)
            break
        cand = draw(mass, trials)
        new = np.minimum(d2[:, None], dist2(cand))
        best = int(np.argmin(new.sum(0) if w is None else w @ new))
        chosen.append(int(cand[best]))
        d2 = new[:, best]
    return np.asarray(chosen, dtype=np.int64)


def take_stats(stats: SuffStats, order: np.ndarray) -> SuffStats:
    """Statistics of the clusters ``order`` (pruning and re-ordering)."""
    return SuffStats(nk=stats.nk[order], mean=stats.mean[order], scatter=stats.scatter[order],
                     sum_rlogr=stats.sum_rlogr, n_rows=stats.n_rows, shift=stats.shift, weight=stats.weight)


def scale_stats(stats: SuffStats, factor: float) -> SuffStats:
    """Statistics of ``factor`` copies of the rows (a minibatch standing for the data set)."""
    return SuffStats(nk=stats.nk * factor, mean=stats.mean, scatter=stats.scatter * factor,
                     sum_rlogr=stats.sum_rlogr * factor, n_rows=int(round(stats.n_rows * factor)),
                     shift=stats.shift, weight=None if stats.weight is None else stats.weight * factor)


__all__ = ["STICK_EPS", "DPPoint", "HardStats", "MapParams", "RowBound", "hard_kernel", "kmeanspp_seeds",
           "log_stick_weights", "map_labels", "map_params", "row_bound", "row_bound_sums", "scale_stats",
           "take_stats"]
