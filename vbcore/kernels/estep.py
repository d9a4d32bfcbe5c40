"""Chunk kernels: the VB E-step (Kuusela et al. 2009 eqs. 35-36) and the statistics of eqs. 30-32, as GEMMs.

Everything that reads data lives here. Kernels take their array namespace from the data (NumPy or
CuPy) and use only array-API functions on it. Data of dtype float32 is multiplied with float32 GEMMs;
sums across rows are returned as float64 NumPy arrays. No N x K x D array is ever built:

* diagonal families: ``(x-m)^T P (x-m) = [x*x, x] @ [p; -2 p m]^T + m^T P m`` -- one
  (n x 2D) @ (2D x K) GEMM; statistics ``R^T @ [x*x, x]`` -- one (K x n) @ (n x 2D) GEMM;
* full: per component one (n x D) @ (D x D) GEMM with the precision Cholesky factor, and one
  (D x n) @ (n x D) GEMM for its centred scatter;
* tied (one shared ``E[Lambda] = U U^T``): ``y = x U`` once, then
  ``(x-m_k)^T E[Lambda] (x-m_k) = |y|^2 - 2 y . (U^T m_k) + |U^T m_k|^2`` -- one (n x D) @ (D x D) and
  one (n x D) @ (D x K) GEMM; statistics ``R^T @ x`` (K x n) @ (n x D) and the pooled scatter from
  ``x^T diag(sum_k r_nk) x`` (D x n) @ (n x D), minus ``sum_k N_k xbar_k xbar_k^T``.

A :class:`Chunk` caches the shifted rows and ``[x*x, x]`` so that repeated passes over persisted data
do not recompute them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from vbcore.arrays import array_namespace, to_host, to_numpy  # noqa: F401  (their home was here)
from vbcore.data.limits import BLOCK_ROWS  # the kernels' block size (the magnitude rule rests on it)
from vbcore.kernels.blockgemm import exp_floor, gemm_operands, log_rho_block, resp_t_dot
from vbcore.kernels.spread import add_rows, merge_spread, row_spread  # noqa: F401  (their home was here)
from vbcore.model.posterior import LOG_2PI, Posterior
from vbcore.model.priors import WISHART_TYPES
from vbcore.model.stats import SuffStats, diag_stats

Array = Any



class Sum64:
    """A float64 running sum of blocks, kept in the blocks' namespace (device memory for CuPy) and
    copied to the host once by :meth:`result` (once per chunk, not per block). Each block is cast to
    float64 and added in block order, the same adds as summing host copies of the blocks."""

    def __init__(self, xp: Any, shape: tuple[int, ...]) -> None:
        self.xp = xp
        self.total = xp.zeros(shape, dtype=xp.float64)

    def add(self, part: Array) -> None:
        self.total += self.xp.astype(part, self.xp.float64, copy=False)

    def result(self) -> np.ndarray:
        return to_numpy(self.total)


@dataclass(frozen=True)
class Chunk:
    """Rows of the data, prepared once for repeated passes.

    Attributes
    ----------
    x : array of shape (n_rows, n_features)
        Rows minus ``shift``, in the data's dtype (float32 or float64); with ``feats``, a view of
        its second half.
    feats : array of shape (n_rows, 2 * n_features) or None
        ``[x*x, x]`` cached for the diagonal families; None for 'full', or when the learner
        forms it per block (:meth:`features`).
    shift : ndarray of shape (n_features,)
        The float64 offset that was subtracted.
    diagonal : bool or None
        Prepared for a diagonal family ('diag', 'spherical', 'fixed'); None: whether ``feats`` is set.
    pooled : bool
        Prepared for 'tied': :func:`chunk_statistics` returns the pooled within-component scatter.
    w : array of shape (n_rows,) or None
        Row weights, data dtype (:func:`weigh_chunk`; the kernels' sums weigh rows by :func:`weigh`).
    """

    x: Array
    feats: Array | None
    shift: np.ndarray
    diagonal: bool | None = None
    pooled: bool = False
    w: Array | None = None

    @property
    def n_rows(self) -> int:
        return int(self.x.shape[0])

    @property
    def weight(self) -> float | None:
        """``sum_n w_n`` in float64 (:attr:`vbcore.model.stats.SuffStats.weight`); None when unweighted."""
        return None if self.w is None else float(np.sum(to_numpy(self.w)))

    @property
    def is_diagonal(self) -> bool:
        return self.feats is not None if self.diagonal is None else bool(self.diagonal)

    def features(self, start: int, stop: int, out: Any = None) -> Array:
        """``[x*x, x]`` of rows ``start:stop``: the cache when there is one, else formed here (into
        ``out[:stop - start]`` when given: a NumPy block buffer the caller reuses, warm in cache)."""
        if self.feats is not None:
            return self.feats[start:stop, :]
        xp = array_namespace(self.x)
        xb = self.x[start:stop, :]
        if out is None or xp is not np:
            return xp.concat((xb * xb, xb), axis=1)
        f, d = out[: stop - start], xb.shape[1]
        np.multiply(xb, xb, out=f[:, :d])
        f[:, d:] = xb
        return f


def prepare_chunk(x: Array, shift: np.ndarray, covariance_type: str, squares: bool | None = None,
                  projection: Any = None) -> Chunk:  # projection: a vbcore.kernels.projection.Projection
    """Project the rows (``projection``: the one place every fit's and prediction's rows are
    projected), subtract ``shift`` (float64, cast to the data dtype) and, for the diagonal families,
    cache ``[x*x, x]`` (saves an elementwise pass and a GEMM per iteration; the shifted rows are a
    view of its second half, so the chunk holds 2x the data, not 3x) unless ``squares`` is False (the
    hard-assignment learners square only the rows they touch)."""
    x = x if projection is None else projection.apply(x)
    xp, d = array_namespace(x), x.shape[1]
    s = xp.asarray(shift, dtype=x.dtype)
    diagonal = covariance_type not in WISHART_TYPES
    if not diagonal or (squares is not None and not bool(squares)):
        xs, feats = x - s, None
    elif xp is np:  # written once, in place
        feats = np.empty((x.shape[0], 2 * d), dtype=x.dtype)
        xs = np.subtract(x, s, out=feats[:, d:])
        np.multiply(xs, xs, out=feats[:, :d])
    else:
        feats = xp.concat(((xs := x - s) * xs, xs), axis=1)
        xs = feats[:, d:]
    return Chunk(x=xs, feats=feats, shift=np.asarray(shift, dtype=np.float64),
                 diagonal=diagonal, pooled=covariance_type == "tied")


def prepare_streamed_chunk(x: Array, shift: np.ndarray, covariance_type: str, squares: bool | None = None,
                           projection: Any = None) -> Chunk:
    """:func:`prepare_chunk` for a chunk read in every pass (streamed): no ``[x*x, x]`` cache. The
    kernels form it per 2,048-row block (:meth:`Chunk.features`), in cache, with the same products
    and so the same bits; writing a chunk-sized cache that one pass reads once cost more than the
    squares (docs/benchmarks.md, "Streamed passes")."""
    return prepare_chunk(x, shift, covariance_type, False, projection)


prepare_chunk.streamed = prepare_streamed_chunk  # type: ignore[attr-defined]  # what engines stream


def weigh_chunk(chunk: Chunk, w: Any) -> Chunk:
    """``chunk`` with row weights ``w`` (validated; None: unweighted), data dtype and namespace."""
    return chunk if w is None else replace(chunk, w=array_namespace(chunk.x).asarray(w, dtype=chunk.x.dtype))


def weigh(chunk: Chunk, start: int, resp: Array, *per_row: Array) -> tuple[Array, ...]:
    """``resp`` and each of ``per_row`` (``ln sum_k rho``, ``sum_k r ln r``) of rows ``start:`` times the
    rows' weights: the one place weights enter a kernel's sums (unweighted: the arrays as they are)."""
    if chunk.w is None:
        return (resp, *per_row)
    xp = array_namespace(resp)
    wb = chunk.w[start : start + int(resp.shape[0])]
    return (resp * xp.reshape(wb, (-1, 1)), *(v * wb for v in per_row))


@dataclass(frozen=True)
class EStepParams:
    """What a chunk needs from the global posterior for one E-step (small; sent once per pass).

    ``log rho_nk = const_k - 1/2 (x_n - m_k)^T E[Lambda_k] (x_n - m_k)`` (eq. 36), with
    ``const_k = E ln pi_k + 1/2 E ln|Lambda_k| - D/2 ln 2 pi - D/(2 beta_k)``; for the diagonal
    families ``weights`` (2D x K) and ``const`` already fold in the quadratic form's GEMM; for 'tied'
    ``weights`` is ``U^T (m_k - shift)`` as columns (D x K), ``prec_chol`` the shared ``U`` (D x D), and
    ``const`` holds ``-1/2 |U^T (m_k - shift)|^2``.
    """

    covariance_type: str
    const: np.ndarray  # (K,)
    weights: np.ndarray | None  # (2D, K) diagonal families, (D, K) tied
    means: np.ndarray | None  # (K, D) shifted means, full
    prec_chol: np.ndarray | None  # (K, D, D) full, (D, D) tied


def _base_const(post: Posterior) -> np.ndarray:
    d = post.n_features
    return (post.expected_log_weights() + 0.5 * post.expected_log_det_precision() - 0.5 * d * LOG_2PI
            - 0.5 * d / post.mean_precision)


def estep_const(post: Posterior, shift: np.ndarray) -> np.ndarray:
    """``estep_params(post, shift).const`` (the same bits) without the K x D weights."""
    if post.covariance_type in ("full", "tied"):
        return estep_params(post, shift).const
    m = post.means - shift[None, :]
    return _base_const(post) - 0.5 * np.sum(post.precision_diagonal() * m * m, axis=1)


def estep_params(post: Posterior, shift: np.ndarray) -> EStepParams:
    """Fold the posterior into the small arrays the E-step GEMMs use (Kuusela et al. 2009 eqs. 33-36)."""
    const = _base_const(post)
    m = post.means - shift[None, :]
    if post.covariance_type == "full":
        return EStepParams("full", const, None, m, post.precisions_cholesky)
    if post.covariance_type == "tied":
        u = post.precisions_cholesky
        mu = m @ u  # (K, D): rows U^T (m_k - shift)
        return EStepParams("tied", const - 0.5 * np.sum(mu * mu, axis=1), mu.T.copy(), None, u)
    p = post.precision_diagonal()  # (K, D)
    weights = np.concatenate((-0.5 * p, p * m), axis=1).T  # (2D, K)
    const = const - 0.5 * np.sum(p * m * m, axis=1)
    return EStepParams(post.covariance_type, const, weights, None, None)


def log_rho(chunk: Chunk, params: EStepParams) -> Array:
    """Unnormalised log responsibilities ``ln rho_nk`` (eq. 36), shape (n_rows, K), data dtype."""
    x = chunk.x
    xp = array_namespace(x)
    dt = x.dtype
    const = xp.asarray(params.const, dtype=dt)
    if params.covariance_type == "tied":
        return _tied_log_rho(x, params)
    if params.covariance_type != "full":
        return log_rho_block(chunk.features(0, chunk.n_rows), *gemm_operands(params, xp, dt))
    assert params.means is not None and params.prec_chol is not None
    k = params.const.shape[0]
    cols = []
    for j in range(k):
        u = xp.asarray(params.prec_chol[j], dtype=dt)
        y = x @ u - xp.asarray(params.means[j] @ params.prec_chol[j], dtype=dt)
        cols.append(xp.sum(y * y, axis=1))
    return const - 0.5 * xp.stack(cols, axis=1)


def _tied_log_rho(x: Array, params: EStepParams) -> Array:
    """``ln rho`` of rows ``x`` for 'tied': ``const_k - |y|^2/2 + y . mu_k`` with ``y = x U``."""
    xp = array_namespace(x)
    dt = x.dtype
    assert params.weights is not None and params.prec_chol is not None
    y = x @ xp.asarray(params.prec_chol, dtype=dt)
    half_sq = xp.reshape(0.5 * xp.sum(y * y, axis=1), (-1, 1))
    return y @ xp.asarray(params.weights, dtype=dt) + xp.asarray(params.const, dtype=dt) - half_sq


def normalise(log_r: Array) -> tuple[Array, Array, Array]:
    """Row-wise softmax (eq. 35) in few passes over the (n, K) array.

    Returns the responsibilities ``r``, ``ln sum_k rho_nk`` and ``sum_k r_nk ln r_nk`` per row
    (both (n,)). The last uses ``sum_k r ln r = (sum_k e_k z_k) / s - ln s`` with ``z = ln rho - max``,
    ``e = exp(z)``, ``s = sum_k e_k``, so ``ln r`` is never materialised.
    """
    xp = array_namespace(log_r)
    tiny = xp.finfo(log_r.dtype).smallest_normal
    z = log_r - (mx := xp.max(log_r, axis=1, keepdims=True))
    # r under the smallest normal number is 0 (subnormals: 60x slower GEMMs on x86; far below what 1
    # resolves), so is e = exp(z) under it (s >= 1: r and ln s keep their bits, sum r ln r loses < 1e-35
    # a row): exp and the products never see a subnormal (docs/algorithms.md, "Shapes the data make")
    cut = xp.asarray(exp_floor(xp.finfo(z.dtype).bits), dtype=z.dtype)
    e = xp.where(z >= cut, xp.exp(xp.maximum(z, cut)), xp.zeros_like(z))
    log_s = xp.log(s := xp.sum(e, axis=1))
    rlogr = xp.vecdot(e, z, axis=-1) / s - log_s
    r = e * xp.reshape(1.0 / s, (-1, 1))
    r = xp.where(r < tiny, xp.zeros_like(r), r)
    return r, mx[:, 0] + log_s, rlogr


def chunk_statistics(chunk: Chunk, resp: Array, rlogr: Array | None = None) -> SuffStats:
    """Sufficient statistics of a chunk given its responsibilities (eqs. 30-32), float64.

    Parameters
    ----------
    chunk : Chunk
    resp : array of shape (n_rows, K)
        Responsibilities, in the chunk's dtype.
    rlogr : array of shape (n_rows,), optional
        ``sum_k r_nk ln r_nk`` per row (from :func:`normalise`); summed in float64 when given.
    """
    xp = array_namespace(chunk.x)
    x = chunk.x
    if resp.dtype != x.dtype:
        resp = xp.astype(resp, x.dtype)
    if chunk.w is not None:
        resp, *rest = weigh(chunk, 0, resp, *(() if rlogr is None else (rlogr,)))
        rlogr = rest[0] if rest else None
    d = x.shape[1]
    nk = to_numpy(xp.sum(resp, axis=0, dtype=xp.float64))
    safe = np.where(nk > 0, nk, 1.0)
    sum_rlogr = 0.0 if rlogr is None else float(to_numpy(xp.sum(rlogr, dtype=xp.float64)))
    if chunk.is_diagonal:
        k = nk.shape[0]
        n = chunk.n_rows
        # [sum r x^2, sum r x], float64 over float32 blocks; [x*x, x] from the cache, or formed per
        # block when there is none (streamed chunks, the hard learners): the same products, the same bits
        g = Sum64(xp, (k, 2 * d))
        for i in range(0, n, BLOCK_ROWS):
            j = min(i + BLOCK_ROWS, n)  # in-bounds slice stops (the standard leaves others unspecified)
            g.add(resp_t_dot(xp, resp[i:j, :], chunk.features(i, j)))
        return _diag_stats(nk, g.result(), sum_rlogr, chunk)
    if chunk.pooled:
        sums = _PooledSums(xp, nk.shape[0], d)
        n = chunk.n_rows
        for i in range(0, n, BLOCK_ROWS):
            sums.add(chunk.x[i : min(i + BLOCK_ROWS, n), :], resp[i : min(i + BLOCK_ROWS, n), :])
        return sums.stats(sum_rlogr, chunk)
    # full: means first, then the exactly centred scatter per component (two passes, D x D GEMMs)
    mean = to_numpy(xp.matrix_transpose(resp) @ x) / safe[:, None]
    mean[nk <= 0] = 0.0
    k = nk.shape[0]
    scatter = np.empty((k, d, d))
    for j in range(k):
        xc = x - xp.asarray(mean[j], dtype=x.dtype)
        scatter[j] = to_numpy(xp.matrix_transpose(xc * resp[:, j : j + 1]) @ xc)
    scatter = 0.5 * (scatter + scatter.transpose(0, 2, 1))
    return SuffStats(nk=nk, mean=mean, scatter=scatter, sum_rlogr=sum_rlogr, n_rows=chunk.n_rows,
                     shift=chunk.shift, weight=chunk.weight)


def _diag_stats(nk: np.ndarray, g: np.ndarray, sum_rlogr: float, chunk: Chunk) -> SuffStats:
    """Centred statistics from ``g = [sum r x^2, sum r x]`` (K, 2D) of a chunk's shifted rows."""
    return diag_stats(nk, g, sum_rlogr, chunk.n_rows, chunk.shift, chunk.weight, owned=True)


class _PooledSums:
    """Float64 running sums of the 'tied' statistics over blocks of a chunk: ``N_k``,
    ``sum_n r_nk x_n`` (K x D) and ``sum_n (sum_k r_nk) x_n x_n^T`` (D x D), rows relative to the shift."""

    def __init__(self, xp: Any, k: int, d: int) -> None:
        self.nk = Sum64(xp, (k,))
        self.sx = Sum64(xp, (k, d))
        self.xx = Sum64(xp, (d, d))

    def add(self, xb: Array, resp: Array) -> None:
        xp = array_namespace(xb)
        self.nk.add(xp.sum(resp, axis=0, dtype=xp.float64))
        self.sx.add(xp.matrix_transpose(resp) @ xb)
        w = xp.reshape(xp.sum(resp, axis=1), (-1, 1))  # 1 for responsibilities; exact for any weights
        self.xx.add(xp.matrix_transpose(xb * w) @ xb)

    def stats(self, sum_rlogr: float, chunk: Chunk) -> SuffStats:
        return pooled_stats(self.nk.result(), self.sx.result(), self.xx.result(), sum_rlogr, chunk)


def pooled_stats(nk: np.ndarray, sx: np.ndarray, xx: np.ndarray, sum_rlogr: float, chunk: Chunk) -> SuffStats:
    """'tied' statistics from float64 sums ``N_k``, ``sum_n r_nk x_n`` (K, D) and ``sum_n w_n x_n x_n^T``
    (D, D; ``w_n = sum_k r_nk``): means and the pooled scatter ``sum_k N_k S_k = sum_n w_n x_n x_n^T -
    sum_k N_k xbar_k xbar_k^T``, stored with a leading axis of length 1 (one pooled group)."""
    safe = np.where(nk > 0, nk, 1.0)
    mean = sx / safe[:, None]
    mean[nk <= 0] = 0.0
    pooled = xx - (nk[:, None] * mean).T @ mean
    pooled = 0.5 * (pooled + pooled.T)
    return SuffStats(nk=nk, mean=mean, scatter=pooled[None], sum_rlogr=sum_rlogr,
                     n_rows=chunk.n_rows, shift=chunk.shift, pooled=True, weight=chunk.weight)


@dataclass(frozen=True)
class KernelResult:
    """What one VB EM pass returns per chunk: statistics, ``sum_n ln sum_k rho_nk`` and the sum of its
    squared deviations from their mean (:func:`row_spread`; a minibatch estimate's standard error)."""

    stats: SuffStats
    log_norm: float
    log_norm_m2: float = 0.0

    def merge(self, other: KernelResult) -> KernelResult:
        _, _, m2 = merge_spread((self.stats.n_rows, self.log_norm, self.log_norm_m2),
                                (other.stats.n_rows, other.log_norm, other.log_norm_m2))
        return KernelResult(self.stats.merge(other.stats), self.log_norm + other.log_norm, m2)

    def merge_owned(self, other: KernelResult) -> KernelResult:
        """:meth:`merge` into this result's arrays (the same bits): the in-process engines' tree."""
        _, _, m2 = merge_spread((self.stats.n_rows, self.log_norm, self.log_norm_m2),
                                (other.stats.n_rows, other.log_norm, other.log_norm_m2))
        return KernelResult(self.stats.merge_owned(other.stats), self.log_norm + other.log_norm, m2)

    def on_host(self) -> KernelResult:
        """This result with its statistics as NumPy arrays (itself when they are): what an engine
        returns from a reduction of :func:`vbem_pass_kernel`'s device results."""
        s = self.stats
        if isinstance(s.nk, np.ndarray):
            return self
        stats = replace(s, nk=to_numpy(s.nk), mean=to_numpy(s.mean), scatter=to_numpy(s.scatter))
        return KernelResult(stats, self.log_norm, self.log_norm_m2)


def vbem_kernel(chunk: Chunk, params: EStepParams, hook: Any = None, *, host: bool = True) -> KernelResult:
    """One VB EM chunk pass: E-step (eqs. 35-36) then statistics (eqs. 30-32). ``hook(i, ln rho, r,
    sum r ln r)`` sees each block's unweighted E-step (diagonal families; the move rounds' extras).
    ``host=False``: a diagonal family's statistics stay in the chunk's namespace (see
    :func:`vbem_pass_kernel`); NumPy chunks give the same result either way."""
    xp = array_namespace(chunk.x)
    if params.covariance_type == "tied":
        return _tied_kernel(chunk, params)
    if params.covariance_type == "full":
        resp, log_norm, rlogr = normalise(log_rho(chunk, params))  # chunk_statistics weighs r, r ln r
        log_norm = weigh(chunk, 0, resp, log_norm)[1]
        return KernelResult(chunk_statistics(chunk, resp, rlogr), *row_spread(log_norm))
    # diagonal families: E-step, softmax and statistics block by block (see BLOCK_ROWS)
    assert params.weights is not None
    dt = chunk.x.dtype
    w, const = gemm_operands(params, xp, dt)  # padded (see vbcore.kernels.blockgemm), once a pass
    k, d = params.const.shape[0], chunk.x.shape[1]
    g, nk, rows = Sum64(xp, (k, 2 * d)), Sum64(xp, (k,)), _RowSums()
    n = chunk.n_rows
    # a streamed chunk's [x*x, x] is formed block by block into one buffer (0.1 CPU s/GB less than a
    # fresh block each time); a persisted chunk's is its cache
    buf = np.empty((min(BLOCK_ROWS, n), 2 * d), dtype=dt) if chunk.feats is None and xp is np else None
    for i in range(0, n, BLOCK_ROWS):
        f = chunk.features(i, min(i + BLOCK_ROWS, n), buf)
        resp, log_norm, rlogr = normalise(lr := log_rho_block(f, w, const))
        if hook is not None:
            hook(i, lr, resp, rlogr)
        resp, log_norm, rlogr = weigh(chunk, i, resp, log_norm, rlogr)
        g.add(resp_t_dot(xp, resp, f))
        nk.add(xp.sum(resp, axis=0, dtype=xp.float64))
        rows.add(log_norm, rlogr)
    spread, sum_rlogr = rows.result()
    sums = (nk.result(), g.result()) if host else (nk.total, g.total)
    return KernelResult(_diag_stats(*sums, sum_rlogr, chunk), spread[1], spread[2])


def vbem_pass_kernel(chunk: Chunk, params: EStepParams) -> KernelResult:
    """:func:`vbem_kernel` for an engine's ``map_reduce``: a diagonal family's statistics stay where
    the chunk lives (device memory for CuPy), the reduction merges them there in the engine's fixed
    order, and the engine copies the reduced result to the host once (:meth:`KernelResult.on_host`).
    A chunk's K x 2D float64 statistics crossed the bus and were centred and merged on the host
    chunk by chunk: about 0.1 s a chunk at K = 1000, D = 4096 on an H100 (docs/benchmarks.md, "GPU").
    The same bits as :func:`vbem_kernel`: the merges and the centring are elementwise."""
    return vbem_kernel(chunk, params, host=False)


class _RowSums:
    """The per-row values of a chunk's blocks (``ln sum_k rho`` and ``sum_k r ln r``), kept where they
    were computed and summed on the host at the end, block by block in block order."""

    def __init__(self) -> None:
        self.log_norm: list[Array] = []
        self.rlogr: list[Array] = []

    def add(self, log_norm: Array, rlogr: Array) -> None:
        self.log_norm.append(log_norm)
        self.rlogr.append(rlogr)

    def result(self) -> tuple[tuple[int, float, float], float]:
        """``(rows, sum, spread)`` of ``ln sum_k rho`` (:func:`merge_spread` over the blocks) and
        ``sum_n sum_k r ln r`` (float64 sums per block, added in block order)."""
        spread: tuple[int, float, float] = (0, 0.0, 0.0)
        sum_rlogr = 0.0
        if not self.log_norm:
            return spread, sum_rlogr
        xp = array_namespace(self.log_norm[0])
        sizes = [int(v.shape[0]) for v in self.log_norm]
        log_norm = to_host(xp.concat(self.log_norm, axis=0))
        rlogr = to_host(xp.concat(self.rlogr, axis=0))
        start = 0
        for size in sizes:
            stop = start + size
            spread = merge_spread(spread, (size, *row_spread(log_norm[start:stop])))
            sum_rlogr += float(np.sum(rlogr[start:stop], dtype=np.float64))
            start = stop
        return spread, sum_rlogr


def _tied_kernel(chunk: Chunk, params: EStepParams) -> KernelResult:
    """The 'tied' VB EM chunk pass, block by block (see BLOCK_ROWS): E-step GEMMs, softmax, and the
    statistics GEMMs of the same block while it is in cache."""
    xp = array_namespace(chunk.x)
    sums, rows, n = _PooledSums(xp, params.const.shape[0], chunk.x.shape[1]), _RowSums(), chunk.n_rows
    for i in range(0, n, BLOCK_ROWS):
        xb = chunk.x[i : min(i + BLOCK_ROWS, n), :]
        resp, log_norm, rlogr = weigh(chunk, i, *normalise(_tied_log_rho(xb, params)))
        sums.add(xb, resp)
        rows.add(log_norm, rlogr)
    spread, sum_rlogr = rows.result()
    return KernelResult(sums.stats(sum_rlogr, chunk), spread[1], spread[2])


def responsibilities(chunk: Chunk, params: EStepParams) -> Array:
    """Responsibilities of the chunk's rows (eq. 35), data dtype."""
    return normalise(log_rho(chunk, params))[0]
