"""Row normalisation of features before clustering: ``'l2'`` and ``'power-l2'`` (pure NumPy).

* ``'none'``: the rows as they are;
* ``'l2'``: each row divided by its Euclidean norm;
* ``'power-l2'``: power normalisation ``x -> sign(x) |x|^0.5`` of every value, then the row divided
  by its Euclidean norm (Perronnin et al. 2010, "Improving the Fisher kernel for large-scale
  image classification"; docs/references.md). On pooled ReLU features it evens out a few large
  activations against many small ones.

The arithmetic is float64 whatever the input (the result is cast once, at the end), in row blocks
so that memory stays at a few blocks. **An all-zero row stays all zeros** (its norm is 0: it is not
divided, and no NaN appears); a zero row has no direction to keep, and refusing it would refuse
real features (an image with no active unit). A row holding NaN or inf yields NaN or inf:
callers check finiteness first (the feature store does, :func:`pipeline.store.features.check_rows`).

The feature store applies the transform at ingest (``vbcluster ingest --normalize``) and records it;
:func:`normalize_rows` is the same transform for arrays held in memory (``VBMixture`` users), and a
fit applies it before its projection (``vbcluster fit --normalize``,
:class:`vbcore.kernels.projection.Projection`: saved with the run, so ``assign`` and refreshes apply
it too).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vbcore.errors import ConfigError

__all__ = ["NORMALIZATIONS", "check_normalization", "normalize_block", "normalize_chunk", "normalize_rows"]

#: the transforms, in the order the documentation lists them
NORMALIZATIONS = ("none", "l2", "power-l2")
_BLOCK_ROWS = 2048


def check_normalization(method: Any, where: str = "normalize") -> str:
    """``method`` as one of :data:`NORMALIZATIONS` (None: ``'none'``); anything else is a one-line error."""
    if method is None:
        return "none"
    if not isinstance(method, str) or method not in NORMALIZATIONS:
        raise ConfigError(f"{where} must be one of {', '.join(NORMALIZATIONS)}, got {method!r}")
    return method


def normalize_block(x: Any, method: str, xp: Any = np) -> Any:
    """One block of rows normalised by ``method`` ('l2' or 'power-l2'), in float64 (a new array) of the
    array namespace ``xp`` (NumPy, or CuPy for a device's chunks: the same arithmetic)."""
    b = xp.array(x, dtype=xp.float64)  # a copy: the caller's rows are never changed
    if method == "power-l2":
        xp.multiply(xp.sign(b), xp.sqrt(xp.abs(b)), out=b)
    norm = xp.sqrt(xp.einsum("ij,ij->i", b, b))
    nonzero = norm > 0
    b[nonzero] /= norm[nonzero, None]
    return b


def normalize_chunk(x: Any, method: str) -> Any:
    """A chunk's rows as a fit's projection sees them (:class:`vbcore.kernels.projection.Projection`):
    normalised by ``method`` in float64 in their array namespace (NumPy or CuPy), cast back to their
    floating dtype (float64 for other input); ``x`` itself for 'none'."""
    from vbcore.arrays import array_namespace

    if method == "none":
        return x
    xp = array_namespace(x)
    dtype = x.dtype if x.dtype in (xp.float32, xp.float64) else xp.float64
    return normalize_block(x, method, xp).astype(dtype, copy=False)


def normalize_rows(X: Any, method: str = "power-l2", *, dtype: Any = None) -> np.ndarray:
    """Rows of ``X`` normalised by ``method`` (see the module docstring).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Numeric rows (a memory map is read block by block).
    method : {'none', 'l2', 'power-l2'}
    dtype : dtype, optional
        Of the result (default: ``X``'s floating dtype; float64 for integer input).

    Returns
    -------
    ndarray of shape (n_samples, n_features)
        A new array; ``X`` is not modified. All-zero rows stay all zeros.
    """
    method = check_normalization(method, "method")
    arr = X if isinstance(X, np.ndarray) else np.asarray(X)
    if arr.ndim != 2:
        raise ConfigError(f"normalize_rows: X must be 2-D (n_samples, n_features), got shape {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise ConfigError(f"normalize_rows: X must be numeric, got dtype {arr.dtype}")
    out_dtype = np.dtype(dtype) if dtype is not None else (
        arr.dtype if arr.dtype.kind == "f" else np.dtype(np.float64))
    if method == "none":
        return np.array(arr, dtype=out_dtype)
    out = np.empty(arr.shape, dtype=out_dtype)
    for s in range(0, arr.shape[0], _BLOCK_ROWS):
        out[s:s + _BLOCK_ROWS] = normalize_block(arr[s:s + _BLOCK_ROWS], method)
    return out
