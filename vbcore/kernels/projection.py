"""The projection stage: principal components of the rows, computed in one pass and applied per chunk.

Three pieces, each usable alone:

* :func:`row_moments` -- a chunk's row count (weighted rows: their total weight), mean and *centred*
  scatter ``sum w (x - xbar)(x - xbar)^T`` in float64 (an integer weight counts a row that many
  times, 0 drops it); :meth:`RowMoments.merge` combines two parts with the pairwise correction of
  Chan et al. 1979 (``S = S_a + S_b + n_a n_b / n (xbar_b - xbar_a)(xbar_b - xbar_a)^T``), so an
  engine's fixed-order tree reduction gives the moments of the whole matrix in one pass without
  the cancellation of ``sum x x^T - n xbar xbar^T`` on data far from the origin;
* :func:`fit_projection` -- the eigendecomposition of the covariance on the driver, the ``p`` leading
  eigenvectors with a fixed sign, optionally whitened (:func:`leading_eigh`: float64, or for the
  scatter of float32 rows a float32 eigensolver refined by a float64 Rayleigh-Ritz step);
* :class:`Projection` -- ``(x - mean) @ W`` on a chunk, one GEMM in the data's dtype (float32 data:
  a float32 GEMM), in the chunk's array namespace (NumPy or CuPy).

Float32 rows are centred in float64 and multiplied with float32 products of at most ``BLOCK_ROWS``
rows, each block's product summed into float64 (the project's rule: float32 GEMMs, float64
accumulators); float64 rows use float64 products. On NumPy rows each product is ``block.T @
block`` into reused buffers, which NumPy computes with a BLAS SYRK (one triangle: half a GEMM's
flops) without holding the GIL, so the pass costs what its ``N D^2`` flops cost on every thread of
the engine; other array namespaces (CuPy) use ``xc.T @ xc``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from vbcore.data.validation import check_finite
from vbcore.errors import ConfigError, InputError

Array = Any

#: rows per float32 SYRK of a chunk's scatter; each block's product is added in float64
BLOCK_ROWS = 4096
#: bytes of the float64 scratch in which rows are centred (small enough to stay in cache)
SCRATCH_BYTES = 1 << 20
#: keys of a projection in a saved run (``posterior.npz``) or a checkpoint
KEYS = ("projection_mean", "projection_components", "projection_variances", "projection_whiten",
        "projection_n_rows")
#: the key of the rows' normalisation before the projection (absent in runs saved before it existed:
#: 'none')
NORMALIZE_KEY = "projection_normalize"


@dataclass(frozen=True)
class Rows:
    """A chunk's rows as the projection pass reads them, with their weights (None: unweighted;
    :func:`vbcore.kernels.estep.weigh_chunk` sets them)."""

    x: Array
    w: Array | None = None


@dataclass(frozen=True)
class RowMoments:
    """Row count (weighted rows: their total weight), mean and centred scatter of a set of rows
    (float64).

    Attributes
    ----------
    n : int or float
        The rows, or their total weight.
    shift : ndarray of shape (D,)
        A reference point common to every part (the first row of the data).
    offset : ndarray of shape (D,)
        The mean minus ``shift``: small numbers, exact to the precision of the data's spread even
        far from the origin, so the merges' mean differences lose nothing.
    scatter : ndarray of shape (D, D)
        ``sum_n w_n (x_n - mean)(x_n - mean)^T`` (``w_n = 1`` for unweighted rows).
    """

    n: float
    shift: np.ndarray
    offset: np.ndarray
    scatter: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        return self.shift + self.offset

    def merge(self, other: RowMoments) -> RowMoments:
        """The moments of both sets (Chan et al. 1979, the pairwise update)."""
        return self._merged(other, None)

    def merge_owned(self, other: RowMoments) -> RowMoments:
        """:meth:`merge` adding into ``self.scatter`` (the same bits, no new D x D array): only for
        moments nothing else holds (the local engine's reduction)."""
        return self._merged(other, self.scatter)

    def _merged(self, other: RowMoments, out: np.ndarray | None) -> RowMoments:
        if self.n == 0:
            return other
        if other.n == 0:
            return self
        n = self.n + other.n
        delta = other.offset - self.offset
        offset = self.offset + delta * (other.n / n)
        scatter = np.add(self.scatter, other.scatter, out=out)
        _add_outer(scatter, delta, delta * (self.n * other.n / n))
        return RowMoments(n, self.shift, offset, scatter)

    def covariance(self) -> np.ndarray:
        """The unbiased sample covariance ``scatter / (n - 1)`` (weighted rows: ``n`` their total
        weight, so integer weights give the covariance of the repeated rows)."""
        return self.scatter / max(self.n - 1, 1)


def check_pca(pca: int, n_features: int, n_rows: int | None = None) -> None:
    """``pca`` against the data's shape: at most the features, and at most the rows."""
    if pca > n_features:
        raise ConfigError(f"pca (--pca) must be at most the number of features ({n_features}), got {pca}")
    if n_rows is not None and pca > n_rows:
        raise ConfigError(f"pca (--pca) must be at most the number of rows ({n_rows}), got {pca}")


def moments_kernel(rows: Rows, offset: int, shift: np.ndarray, where: str | None) -> RowMoments:
    """A chunk's :class:`RowMoments` (an engine kernel) of its :class:`Rows`; rows of sources not
    validated on the driver (``where`` names the source) are first checked for non-finite values (one
    line naming the row; device rows are checked on the device, copied only to name a bad row)."""
    check_rows(rows, offset, where)
    return row_moments(rows.x, shift, rows.w)


def check_rows(rows: Rows, offset: int, where: str | None) -> None:
    """Rows of a source not validated on the driver (``where`` names it; None: nothing to check)
    against non-finite values: one line naming the row (device rows are checked on the device,
    copied only to name a bad row)."""
    from vbcore.kernels.estep import array_namespace, to_numpy

    if where is None:
        return
    x = rows.x
    xp = array_namespace(x)
    if xp is np or not bool(xp.all(xp.isfinite(x))):
        check_finite(x if xp is np else to_numpy(x), where, first_row=offset,
                     hint="clean the data (vbcluster ingest rejects or drops such rows)")


def row_moments(x: Array, shift: np.ndarray, w: Array | None = None) -> RowMoments:
    """The :class:`RowMoments` of one chunk's rows, shape (n_rows, D), in their array namespace
    (NumPy, CuPy, any array-API library), returned as float64 NumPy arrays; ``shift`` (float64,
    shape (D,)) is the reference point every part shares; ``w`` the rows' weights (None: each 1),
    summed in float64: each row enters the scatter as ``sqrt(w) (x - xbar)``."""
    from vbcore.kernels.estep import array_namespace, to_numpy

    xp = array_namespace(x)
    if x.dtype not in (xp.float32, xp.float64):
        x = xp.astype(x, xp.float64)
    shift = np.asarray(shift, dtype=np.float64)
    n, d = x.shape
    w = None if w is None else xp.astype(xp.asarray(w), xp.float64)
    total = n if w is None else float(xp.sum(w))
    if n == 0 or not total > 0:
        return RowMoments(0, shift, np.zeros(d), np.zeros((d, d)))
    s = xp.asarray(shift, dtype=xp.float64)
    # a first mean, then the sums of the rows centred on it: the (naive) column sums' rounding
    # does not reach the mean, and the scatter is summed over centred rows
    if w is None:
        guess = (xp.sum(x, axis=0, dtype=xp.float64) - n * s) / n
    else:  # float64 products of a few rows at a time (no float64 copy of the chunk)
        step = max(1, SCRATCH_BYTES // (8 * d))
        wsum = xp.zeros(d, dtype=xp.float64)
        for start in range(0, n, step):
            stop = min(start + step, n)  # (the array API does not allow a stop past the end)
            wsum += w[start:stop] @ xp.astype(x[start:stop, :], xp.float64)
        guess = wsum / total - s
    if xp is np:
        residual, scatter = _centred_scatter_blas(x, shift, guess, w)
        _add_outer(scatter, -residual, residual / total)  # the scatter about the corrected mean
        return RowMoments(total, shift, guess + residual / total, scatter)
    scatter, residual = xp.zeros((d, d), dtype=xp.float64), xp.zeros(d, dtype=xp.float64)
    for start in range(0, n, BLOCK_ROWS):
        stop = min(start + BLOCK_ROWS, n)
        xc = (xp.astype(x[start:stop, :], xp.float64) - s) - guess
        if w is None:
            residual += xp.sum(xc, axis=0)
        else:
            residual += w[start:stop] @ xc
            xc = xc * xp.sqrt(w[start:stop])[:, None]
        xc = xp.astype(xc, x.dtype, copy=False)
        scatter += xp.astype(xp.matrix_transpose(xc) @ xc, xp.float64)  # a GEMM in the data's dtype
    scatter -= residual[:, None] * (residual / total)[None, :]  # the scatter about the corrected mean
    return RowMoments(total, shift, to_numpy(guess + residual / total), to_numpy(scatter))


def _centred_scatter_blas(x: np.ndarray, shift: np.ndarray, guess: np.ndarray,
                          w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """NumPy rows: ``sum_n w_n xc_n`` and ``sum_n w_n xc_n xc_n^T`` of ``xc = (x - shift) - guess``
    (``w_n = 1`` without weights).

    Each block of :func:`centred_blocks` is multiplied by itself, ``block.T @ block``, into a reused
    product added into a float64 accumulator. For the product of an array with its own transpose
    NumPy calls BLAS's SYRK (``ssyrk`` for float32 rows, ``dsyrk`` for float64: one triangle, half a
    GEMM's flops), mirrors the triangle, and releases the GIL while it runs, so the engine's threads
    multiply their chunks at once (SciPy's BLAS wrappers hold the GIL: two threads took turns, 1.66 s
    for four 4,096-row SYRKs against 1.69 s on one thread; NumPy's 0.93-0.96 s). Every product is
    exactly symmetric, so is their sum.
    """
    d = x.shape[1]
    acc = np.zeros((d, d), dtype=np.float64)
    product = np.empty((d, d), dtype=x.dtype)
    residual = np.zeros(d, dtype=np.float64)
    for block in centred_blocks(x, shift, guess, w, residual):
        np.matmul(block.T, block, out=product)  # the block's scatter (a SYRK: see above)
        acc += product
    return residual, acc


def centred_blocks(x: np.ndarray, shift: np.ndarray, guess: np.ndarray | None, w: np.ndarray | None,
                   residual: np.ndarray) -> Iterator[np.ndarray]:
    """NumPy rows ``x`` as blocks of at most :data:`BLOCK_ROWS` rows of ``sqrt(w) ((x - shift) -
    guess)`` (``guess`` None: ``x - shift``) in ``x``'s dtype, each written into one reused buffer
    (valid until the next block), with ``sum w ((x - shift) - guess)`` added into the float64
    ``residual``. Rows are centred in float64 a few at a time, in a scratch that stays in cache, and
    written once in the data's dtype (float32 rows: rounded once, as the float32 products see them)."""
    n, d = x.shape
    rows = min(BLOCK_ROWS, n)
    block = np.empty((rows, d), dtype=x.dtype)
    scratch = np.empty((max(1, SCRATCH_BYTES // (8 * d)), d), dtype=np.float64)
    for start in range(0, n, rows):
        m = min(rows, n - start)
        for i in range(0, m, len(scratch)):
            j = min(i + len(scratch), m)
            t = scratch[:j - i]
            np.subtract(x[start + i:start + j], shift, out=t)
            if guess is not None:
                np.subtract(t, guess, out=t)
            if w is None:
                residual += np.sum(t, axis=0)
            else:
                sw = w[start + i:start + j]
                residual += sw @ t
                np.multiply(t, np.sqrt(sw)[:, None], out=t)
            block[i:j] = t
        yield block[:m]


def _add_outer(a: np.ndarray, u: np.ndarray, v: np.ndarray) -> None:
    """``a += outer(u, v)`` in place, a row block at a time (no D x D temporary; the same bits)."""
    step = max(1, SCRATCH_BYTES // (8 * max(len(v), 1)))
    for i in range(0, len(u), step):
        a[i:i + step] += np.outer(u[i:i + step], v)


@dataclass(frozen=True)
class Projection:
    """``x -> (n(x) - mean) @ components * scale``: the leading principal components of the data, after
    the rows' normalisation ``n`` (``normalize``: :mod:`vbcore.data.normalize`; 'none': the rows).

    Attributes
    ----------
    mean : ndarray of shape (D,)
        The data mean (float64).
    components : ndarray of shape (D, p)
        Orthonormal eigenvectors of the covariance, by decreasing eigenvalue; each column's entry of
        largest magnitude is positive (a fixed sign, as scikit-learn's ``svd_flip``).
    variances : ndarray of shape (p,)
        The covariance's eigenvalues (``scatter / (n - 1)``): the variance along each component.
    whiten : bool
        Divide each coordinate by its standard deviation (unit variance along every component).
    n_rows : int
        Rows the moments were computed from (weighted rows: their total weight, rounded).
    normalize : str
        The rows' normalisation before the projection ('none', 'l2', 'power-l2'); ``mean``,
        ``components`` and ``variances`` are those of the normalised rows.
    """

    mean: np.ndarray
    components: np.ndarray
    variances: np.ndarray
    whiten: bool
    n_rows: int
    normalize: str = "none"

    @property
    def n_features_in(self) -> int:
        return int(self.components.shape[0])

    @property
    def n_components(self) -> int:
        return int(self.components.shape[1])

    def matrix(self) -> np.ndarray:
        """``W`` of shape (D, p), float64: the components, divided by the standard deviations when
        whitening."""
        if not self.whiten:
            return self.components
        return self.components / np.sqrt(self.variances)[None, :]

    def normalized(self, x: Array) -> Array:
        """The rows as the projection sees them (:func:`vbcore.data.normalize.normalize_chunk`)."""
        from vbcore.data.normalize import normalize_chunk

        return normalize_chunk(x, self.normalize)

    def apply(self, x: Array) -> Array:
        """``(n(x) - mean) @ W`` of rows of shape (n, D), in their array namespace and dtype (one GEMM)."""
        from vbcore.kernels.estep import array_namespace

        if x.shape[1] != self.n_features_in:
            raise InputError(f"the projection takes rows of {self.n_features_in} features, got "
                             f"{x.shape[1]}")
        xp = array_namespace(x)
        dtype = x.dtype if x.dtype in (xp.float32, xp.float64) else xp.float64
        x = xp.asarray(self.normalized(x), dtype=dtype)
        return (x - xp.asarray(self.mean, dtype=dtype)) @ xp.asarray(self.matrix(), dtype=dtype)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """Rows of the projected space mapped back to the input space (float64): ``y W^+ + mean`` (of the
        normalised rows where ``normalize`` is set: the normalisation has no inverse)."""
        y = np.asarray(y, dtype=np.float64)
        if self.whiten:
            y = y * np.sqrt(self.variances)[None, :]
        return y @ self.components.T + self.mean

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The projection as named arrays (:data:`KEYS`), for ``posterior.npz`` and checkpoints."""
        out = dict(zip(KEYS, (self.mean, self.components, self.variances, np.asarray(self.whiten),
                              np.asarray(self.n_rows, dtype=np.int64)), strict=True))
        if self.normalize != "none":  # (a run without it reads as before, and older readers read it)
            out[NORMALIZE_KEY] = np.asarray(self.normalize)
        return out

    @classmethod
    def from_arrays(cls, arrays: Any) -> Projection | None:
        """The projection saved by :meth:`to_arrays`, or None when ``arrays`` holds none."""
        if KEYS[0] not in arrays:
            return None
        mean, components, variances = (np.asarray(arrays[k], dtype=np.float64) for k in KEYS[:3])
        normalize = str(arrays[NORMALIZE_KEY]) if NORMALIZE_KEY in arrays else "none"
        return cls(mean, components, variances, bool(arrays[KEYS[3]]), int(arrays[KEYS[4]]), normalize)


def leading_eigh(cov: np.ndarray, p: int, single: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The ``p`` leading eigenpairs of the symmetric float64 ``cov``, by increasing eigenvalue.

    Only those ``p`` (LAPACK's MRRR, ``syevr``): at D = 4096 the full decomposition costs more than
    the pass that summed the scatter. ``single`` (a scatter summed from float32 rows, whose precision
    is float32's): the eigenvectors of ``cov`` rounded to float32 (``ssyevr``, half the time of
    ``dsyevr``), then one Rayleigh-Ritz step in float64 on their span (``Q^T cov Q`` and a ``p x p``
    eigh). The eigenvalues are then the float64 ones to about 1e-11; the subspace is within float32's
    eigensolver error of the float64 one, which is below what float32 moments carry (on the
    108,754 x 4096 store: 2.4e-5 rad, against 7.7e-5 between the float32-summed scatter's subspace
    and the float64-summed one's)."""
    d = cov.shape[0]
    if not single:
        return scipy.linalg.eigh(cov, subset_by_index=[d - p, d - 1], driver="evr")
    _, approx = scipy.linalg.eigh(cov.astype(np.float32), subset_by_index=[d - p, d - 1], driver="evr")
    q, _ = np.linalg.qr(approx.astype(np.float64))
    small = q.T @ (cov @ q)
    values, u = np.linalg.eigh((small + small.T) * 0.5)
    return values, q @ u


def fit_projection(moments: RowMoments, n_components: int, whiten: bool = False,
                   eps: float = float(np.finfo(np.float64).eps)) -> Projection:
    """The ``n_components`` leading principal components of the rows the moments describe.

    ``eps`` is the relative precision of the scatter (that of the GEMMs that summed it: float32's
    for float32 rows): eigenvalues at most ``D * eps * lambda_max`` count as zero, so whitening
    them is refused."""
    d, p = moments.mean.shape[0], int(n_components)
    check_pca(p, d)  # (the rows: by the pass, against the source's rows, not their total weight)
    cov = moments.covariance()
    cov = (cov + cov.T) * 0.5  # exactly symmetric for eigh
    values, vectors = leading_eigh(cov, p, single=eps > 2 * float(np.finfo(np.float64).eps))
    return projection_from_eigenpairs(moments.mean, values[::-1], vectors[:, ::-1], whiten, moments.n, eps)


def projection_from_eigenpairs(mean: np.ndarray, values: np.ndarray, vectors: np.ndarray, whiten: bool,
                               n_rows: float, eps: float) -> Projection:
    """The :class:`Projection` of the covariance's leading eigenpairs (``values`` decreasing, the
    columns of ``vectors`` orthonormal): each vector's entry of largest magnitude made positive, and
    with ``whiten`` a one-line ConfigError for an eigenvalue at most ``D * eps * lambda_max`` (see
    :func:`fit_projection`)."""
    d, p = vectors.shape
    big = np.argmax(np.abs(vectors), axis=0)
    vectors = vectors * np.sign(vectors[big, np.arange(p)])[None, :]
    floor = d * eps * max(float(values[0]), 0.0) if p else 0.0
    if whiten:
        bad = np.flatnonzero(values <= floor)
        if bad.size:
            j = int(bad[0])
            fix = f"use --pca {j} or less, or drop --whiten" if j else "drop --whiten"
            raise ConfigError(
                f"whiten (--whiten): principal component {j + 1} of {p} has variance "
                f"{float(values[j]):.3g} (not above {floor:.3g}): the data span only {j} dimension(s); "
                f"{fix}")
    return Projection(np.array(mean, dtype=np.float64), np.ascontiguousarray(vectors),
                      np.maximum(values, 0.0), bool(whiten), int(round(n_rows)))
