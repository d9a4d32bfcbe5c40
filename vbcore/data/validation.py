"""The one row validator: the rules every matrix of rows meets before vbcluster uses it.

Rows are dense, 2-D ``(n_samples, n_features)``, real numbers, with at least one column (and, for
data to fit or predict on, at least one row), and every value is finite. The estimator (arrays in
memory), ``vbcluster ingest`` (files before and batches while they are read, and store appends) and
the chunk check of stores and Dask arrays all apply these rules through this module, so a rule and
its message are written once. ``where`` names the data in messages (``"X"``, a file, ``"f.npz[key]"``,
a store) and ``first_row`` is the row offset of a block, so messages point at the row of the whole
source. Messages keep scikit-learn's wording where it has one, so its tooling recognises them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import sparse

from vbcore.data.limits import check_magnitude, weight_range
from vbcore.errors import InputError, InputTypeError

__all__ = ["NUMERIC_KINDS", "check_layout", "row_is_finite", "check_finite", "as_rows", "check_weights"]

#: dtype kinds accepted as features: booleans, signed and unsigned integers, floats
NUMERIC_KINDS = "biuf"
_RESHAPE = "Reshape your data: X.reshape(-1, 1) for a single feature, X.reshape(1, -1) for one row"


def check_layout(shape: tuple[int, ...], dtype: np.dtype, where: str, *, min_rows: int = 1,
                 reshape_hint: bool = False) -> None:
    """The rules that need no values (so that files can be checked before they are read).

    Parameters
    ----------
    shape : tuple of int
        The array's shape; it must be ``(n_samples, n_features)`` with ``n_features >= 1``.
    dtype : numpy dtype
        Must be real numeric (kind ``b``, ``i``, ``u`` or ``f``).
    where : str
        What the data is, for messages.
    min_rows : int
        Fewest rows accepted (0 lets an empty source or batch through).
    reshape_hint : bool
        Add scikit-learn's "reshape your data" advice to the 2-D message (arrays in memory).

    Raises
    ------
    InputError
        One line naming ``where``, the rule and the shape or dtype found.
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        raise InputError(f"Complex data not supported: {where} has dtype {dtype}")
    if dtype.kind not in NUMERIC_KINDS:
        raise InputError(f"{where} must be numeric, got dtype {dtype}")
    if len(shape) != 2:
        raise InputError(f"{where} must be 2-D (n_samples, n_features), got {len(shape)}-D of shape "
                         f"{tuple(shape)}" + (f". {_RESHAPE}" if reshape_hint else ""))
    if shape[0] < min_rows:
        raise InputError(f"{where} has n_samples={shape[0]}: found array with {shape[0]} sample(s) "
                         f"(shape={tuple(shape)}) while a minimum of {min_rows} is required.")
    if shape[1] < 1:
        raise InputError(f"{where} has n_features=0: found array with 0 feature(s) (shape={tuple(shape)}) "
                         "while a minimum of 1 is required.")


def row_is_finite(x: np.ndarray) -> np.ndarray:
    """Boolean mask of shape (n_samples,): True where every value of the row is finite."""
    return np.asarray(np.isfinite(x).all(axis=1))


def check_finite(x: np.ndarray, where: str, *, first_row: int = 0,
                 hint: str = "remove or impute those rows") -> None:
    """Raise on the first non-finite value of ``x`` (shape (n_samples, n_features)), row-major.

    The message names ``where``, the row (``first_row`` + its index in ``x``), the column and the
    value, and ends with ``hint`` (what to do about it).
    """
    finite = np.isfinite(x)
    if finite.all():
        return
    row, col = (int(v) for v in np.argwhere(~finite)[0])
    raise InputError(f"{where}: non-finite value at row {first_row + row}, column {col}: "
                     f"{x[row, col].item()} (NaN and inf are not allowed); {hint}")


def as_rows(X: Any, where: str = "X", *, min_rows: int = 1) -> np.ndarray:
    """Validate rows held in memory and return them as a C-contiguous float array.

    float32 stays float32; other numeric dtypes (and object arrays of numbers) become float64.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Dense data (a scipy sparse matrix is refused); finite values whose squares overflow the
        accumulation of their dtype are refused (:mod:`vbcore.data.limits`).
    where : str
        The data's name in messages.
    min_rows : int
        Fewest rows accepted.

    Returns
    -------
    ndarray of shape (n_samples, n_features), float32 or float64
    """
    if sparse.issparse(X):
        raise InputError(
            f"{where} is a scipy sparse matrix; sparse input is not supported: pass X.toarray() "
            "(feature stores hold dense features)"
        )
    try:
        arr = np.asarray(X)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise InputError(f"{where} cannot be converted to an array: {exc}") from None
    if arr.dtype.kind == "O":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise InputTypeError(
                f"{where} must be numeric; its dtype object holds a non-number: {exc}"
            ) from None
    check_layout(arr.shape, arr.dtype, where, min_rows=min_rows, reshape_hint=True)
    arr = np.ascontiguousarray(arr, dtype=np.float32 if arr.dtype == np.float32 else np.float64)
    check_finite(arr, where)
    # |x| whose squares overflow the accumulation of the array's own dtype (vbcore.data.limits): float64
    # arrays compute in float64, so only float32 ones meet the float32 limit
    check_magnitude(arr, where, accumulate=arr.dtype,
                    hint=", or pass float64 data (X.astype(np.float64)), which is computed in float64"
                    if arr.dtype == np.float32 else "")
    return arr


def check_array_2d(X: Any, name: str = "X") -> np.ndarray:
    """Validate data: dense, 2-D, numeric, at least one row and column, all finite (the estimator's
    entry point; :func:`as_rows`). float32 stays float32; other numeric dtypes become float64."""
    return as_rows(X, name)


def check_weights(w: Any, n_rows: int, where: str = "sample_weight", *, first_row: int = 0,
                  some_positive: bool = False, n_features: int | None = None,
                  dtype: Any = np.float32) -> np.ndarray:
    """Row weights as a float64 array of shape ``(n_rows,)``: one number per row, finite and >= 0
    (0 drops the row; an integer weight counts the row that many times), with ``n_features`` positive
    ones within :func:`vbcore.data.limits.weight_range` for the fit's ``dtype``, and, with
    ``some_positive`` (the weights of a fit), not all 0. One line names what is wrong and the first
    row where it is."""
    arr = np.asarray(w)
    if arr.dtype.kind not in NUMERIC_KINDS:
        raise InputError(f"{where}: weights must be numbers, got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.shape[0] != n_rows:
        got = "a scalar" if arr.ndim == 0 else f"shape {arr.shape}"
        raise InputError(f"{where}: expected one weight per row, shape ({n_rows},), got {got}")
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(f"{where}: row {first_row + i} has weight {float(arr[i])}; weights must be finite")
    neg = arr < 0
    if neg.any():
        i = int(np.argmax(neg))
        raise InputError(f"{where}: row {first_row + i} has weight {float(arr[i])}; weights must be >= 0")
    if n_features is not None:
        _check_weight_range(arr, where, first_row, n_features, dtype)
    if some_positive and n_rows and not arr.sum() > 0:  # scikit-learn's wording
        raise InputError(f"{where}: Sample weights must contain at least one non-zero number.")
    return arr


def _check_weight_range(arr: np.ndarray, where: str, first_row: int, n_features: int, dtype: Any) -> None:
    """Positive weights within :func:`vbcore.data.limits.weight_range` of the dtype the fit computes in."""
    lo, hi = weight_range(n_features, dtype)
    out = (arr > hi) | ((arr > 0) & (arr < lo))
    if not out.any():
        return
    i = int(np.argmax(out))
    side = (f"above the largest weight, {hi:.3g}" if arr[i] > hi
            else f"below the smallest positive weight, {lo:.3g}")
    raise InputError(f"{where}: row {first_row + i} has weight {float(arr[i])!r}, {side}, that "
                     f"{np.dtype(dtype).name} sums over {n_features} features compute with (the features' "
                     "limit); rescale the weights (0 drops a row)")
