"""The randomized solver of the projection stage (``pca_solver='randomized'``): subspace iteration on
the rows' covariance with a Rayleigh-Ritz step, a few engine passes of ``N x D x k`` GEMMs instead
of the exact pass's ``N D^2`` SYRKs.

The exact solver (:func:`vbcore.kernels.projection.fit_projection`) sums the D x D scatter: ``N D^2``
flops and a D x D float64 partial per chunk (128 MiB at D = 4096), whatever ``P``. This one never
forms it. Each pass multiplies the covariance ``C`` by a D x k basis (``k = P + oversample``):

* :func:`centred_rows` -- a chunk's rows minus the shift ``s`` every chunk shares (a row of the data,
  so the sums lose nothing far from the origin), once per chunk kept in memory;
* :func:`sketch_kernel` -- a chunk's :class:`SketchPart`, ``sum w (x - s)`` and ``sum w (x - s)(x -
  s)^T Q``, in float64 from products in the data's dtype (float32 rows: float32 GEMMs over blocks
  of :data:`~vbcore.kernels.projection.BLOCK_ROWS` rows); parts merge by adding, over the engine's
  fixed-order tree;
* :func:`randomized_projection` -- on the driver: ``Q_0`` Gaussian (from the fit's seed), ``Q_j =
  orth(C Q_{j-1})`` (randomized subspace iteration, Halko et al. 2011, Algorithm 4.4,
  on the symmetric ``C``: one product per pass), and after the last pass the Rayleigh-Ritz step on
  the span of the last basis: the ``P`` leading eigenpairs of ``Q^T C Q`` in the metric ``Q^T Q``.

The eigenvalues are Rayleigh quotients of ``C`` along the returned vectors, so ``variances`` are the
data's variances along them (whitening is exact for the directions found); the vectors span a
subspace that captures at most the variance the exact eigenvectors capture (Ky Fan), and all of it
when the centred rows span at most ``k`` dimensions. Measured (docs/benchmarks.md, "The projection
pass"): on the 108,754 x 4096 synthetic store at P = 128, 99.0% of the exact subspace's variance;
on Fashion-MNIST's EfficientNet features 99.7% (P = 128) and 99.8% (P = 64).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from vbcore.kernels.projection import (
    BLOCK_ROWS,
    Projection,
    Rows,
    centred_blocks,
    check_rows,
    projection_from_eigenpairs,
)

Array = Any

#: passes over the data: one to form the range, then subspace iterations; Rayleigh-Ritz on the last
PASSES = 3
#: basis vectors beyond P (``k = min(D, P + OVERSAMPLE)``)
OVERSAMPLE = 32


@dataclass(frozen=True)
class SketchPart:
    """A set of rows' total weight ``n``, ``total = sum w (x - s)`` (shape (D,)) and ``y = sum w
    (x - s)(x - s)^T Q`` (shape (D, k)), float64, about the shift ``s`` every part shares."""

    n: float
    total: np.ndarray
    y: np.ndarray

    def merge(self, other: SketchPart) -> SketchPart:
        return SketchPart(self.n + other.n, self.total + other.total, self.y + other.y)

    def scatter_times(self, basis: np.ndarray) -> np.ndarray:
        """``S Q`` for the centred scatter ``S = sum w (x - mean)(x - mean)^T`` and the float64
        ``basis`` the part was computed with: ``y - n delta (delta^T Q)``, ``delta = total / n``."""
        if not self.n > 0:
            return np.zeros_like(self.y)
        delta = self.total / self.n
        return self.y - self.n * np.outer(delta, delta @ basis)


def centred_rows(x: Array, shift: np.ndarray) -> Rows:
    """A chunk prepared for the passes (an engine ``prep``): its rows minus the shift every chunk
    shares, ``x - s`` in the rows' dtype (other dtypes: float64), in their array namespace. Float32
    rows of a float32 store and their first row as the shift: the float32 difference is the exact one
    correctly rounded, so one subtraction serves every pass of a chunk kept in memory."""
    from vbcore.kernels.estep import array_namespace

    xp = array_namespace(x)
    if x.dtype not in (xp.float32, xp.float64):
        x = xp.astype(x, xp.float64)
    return Rows(x - xp.asarray(shift, dtype=x.dtype))


def sketch_kernel(rows: Rows, offset: int, basis: Array, where: str | None) -> SketchPart:
    """A chunk's :class:`SketchPart` for ``basis`` (D x k, in the rows' dtype: float32 rows use
    float32 products), from rows already centred on the shift (:func:`centred_rows`), in their array
    namespace (NumPy, CuPy, any array-API library), returned as float64 NumPy arrays; ``where`` names
    a source whose rows are checked for non-finite values first (None: no check; see
    :func:`vbcore.kernels.projection.check_rows`). Unweighted NumPy rows go to BLAS as they are,
    :data:`~vbcore.kernels.projection.BLOCK_ROWS` at a time; weighted ones as ``sqrt(w) xc``."""
    from vbcore.kernels.estep import array_namespace, to_numpy

    check_rows(rows, offset, where)
    xc, w = rows.x, rows.w
    xp = array_namespace(xc)
    n, d = xc.shape
    k = int(basis.shape[1])
    w = None if w is None else xp.astype(xp.asarray(w), xp.float64)
    weight = n if w is None else float(xp.sum(w))
    if n == 0:
        return SketchPart(0, np.zeros(d), np.zeros((d, k)))
    q = xp.asarray(basis, dtype=xc.dtype)
    if xp is np:
        total, y = np.zeros(d), np.zeros((d, k))
        z = np.empty((min(BLOCK_ROWS, n), k), dtype=xc.dtype)
        product = np.empty((d, k), dtype=xc.dtype)
        if w is None:
            blocks: Any = (xc[i:i + BLOCK_ROWS] for i in range(0, n, BLOCK_ROWS))
        else:  # sqrt(w) xc written block by block, the weighted sums in float64
            blocks = centred_blocks(xc, np.zeros(d), None, w, total)
        for block in blocks:
            if w is None:
                total += np.sum(block, axis=0, dtype=np.float64)
            np.matmul(block, q, out=z[:len(block)])
            np.matmul(block.T, z[:len(block)], out=product)  # GEMMs in the data's dtype
            y += product
        return SketchPart(weight, total, y)
    total, y = xp.zeros(d, dtype=xp.float64), xp.zeros((d, k), dtype=xp.float64)
    for start in range(0, n, BLOCK_ROWS):
        stop = min(start + BLOCK_ROWS, n)
        block = xc[start:stop, :]
        if w is None:
            total += xp.sum(xp.astype(block, xp.float64), axis=0)
        else:
            total += w[start:stop] @ xp.astype(block, xp.float64)
            block = xp.astype(xp.astype(block, xp.float64) * xp.sqrt(w[start:stop])[:, None], xc.dtype)
        y += xp.astype(xp.matrix_transpose(block) @ (block @ q), xp.float64)
    return SketchPart(weight, to_numpy(total), to_numpy(y))


def randomized_projection(apply: Callable[[np.ndarray, bool], SketchPart], shift: np.ndarray,
                          n_components: int, whiten: bool, rng: np.random.Generator, dtype: Any,
                          eps: float, passes: int = PASSES, oversample: int = OVERSAMPLE) -> Projection:
    """The projection onto ``n_components`` leading principal components by randomized subspace
    iteration (see the module docstring).

    ``apply(basis, first)`` returns the :class:`SketchPart` of every row about ``shift`` for
    ``basis`` (D x k, in ``dtype``, the rows' dtype: the products' precision), reduced in a fixed
    order; ``first`` is True for the first pass (the one that checks the rows). ``rng`` draws the
    starting basis; ``eps`` is the precision of the products (as for
    :func:`vbcore.kernels.projection.fit_projection`)."""
    shift = np.asarray(shift, dtype=np.float64)
    d, p = shift.shape[0], int(n_components)
    k = min(d, p + int(oversample))
    q = rng.standard_normal((d, k))
    for i in range(int(passes)):
        basis = np.asarray(q, dtype=dtype)  # the basis the products see, exactly
        part = apply(basis, i == 0)
        b64 = basis.astype(np.float64)
        sq = part.scatter_times(b64)
        if i + 1 < passes:
            q = np.linalg.qr(sq)[0]
    small, gram = b64.T @ sq, b64.T @ b64
    values, s = scipy.linalg.eigh((small + small.T) * 0.5, (gram + gram.T) * 0.5,
                                  subset_by_index=[k - p, k - 1])
    values = values[::-1] / max(part.n - 1, 1)  # the covariance's Rayleigh quotients, decreasing
    vectors = b64 @ s[:, ::-1]  # orthonormal: s^T gram s = I
    mean = shift + (part.total / part.n if part.n > 0 else 0.0)
    return projection_from_eigenpairs(mean, values, vectors, whiten, part.n, eps)
