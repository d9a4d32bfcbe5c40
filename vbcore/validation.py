"""Row validation: the one place that says what a valid data matrix is (dense, 2-D, numeric, at
least one row and column, all finite)."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import sparse

from vbcore.errors import InputError, InputTypeError


def check_array_2d(X: Any, name: str = "X") -> np.ndarray:
    """Validate data: dense, 2-D, numeric, at least one row and column, all finite.

    float32 stays float32; other numeric dtypes (and object arrays of numbers) become float64.
    Messages keep scikit-learn's wording where it has one, so its tooling recognises them.
    """
    if sparse.issparse(X):
        raise InputError(
            f"{name} is a scipy sparse matrix; sparse input is not supported: pass X.toarray() "
            "(feature stores hold dense features)"
        )
    try:
        arr = np.asarray(X)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise InputError(f"{name} cannot be converted to an array: {exc}") from None
    if arr.dtype.kind == "c":
        raise InputError(f"Complex data not supported: {name} has dtype {arr.dtype}")
    if arr.dtype.kind == "O":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise InputTypeError(
                f"{name} must be numeric; its dtype object holds a non-number: {exc}"
            ) from None
    if arr.dtype.kind not in "biuf":
        raise InputError(f"{name} must be numeric, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise InputError(
            f"{name} must be 2-D (n_samples, n_features), got {arr.ndim}-D of shape {arr.shape}. "
            "Reshape your data: X.reshape(-1, 1) for a single feature, X.reshape(1, -1) for one row"
        )
    if arr.shape[0] < 1:
        raise InputError(
            f"{name} has n_samples=0: found array with 0 sample(s) (shape={arr.shape}) while a "
            "minimum of 1 is required."
        )
    if arr.shape[1] < 1:
        raise InputError(
            f"{name} has n_features=0: found array with 0 feature(s) (shape={arr.shape}) while a "
            "minimum of 1 is required."
        )
    arr = np.ascontiguousarray(arr, dtype=np.float32 if arr.dtype == np.float32 else np.float64)
    finite = np.isfinite(arr)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise InputError(
            f"{name} contains non-finite values (NaN or inf); the first is at row {row}, "
            f"column {col}: {arr[row, col].item()}"
        )
    return arr
