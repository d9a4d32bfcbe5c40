"""The largest feature magnitude vbcluster computes with: a rule applied wherever rows enter.

Float32 data is multiplied with float32 GEMMs (float64 accumulators across blocks): within one
block of ``BLOCK_ROWS`` rows, sums of ``x * x`` over rows and features are float32. After the rows
are shifted by one row (which can double a magnitude), every such sum stays below float32's largest
value, with a further factor 16 of headroom for the products with precisions, when

    |x| <= sqrt(finfo(float32).max / (4 * 16 * BLOCK_ROWS * n_features)),

about 6e15 for 64 features. Float64 data (arrays in memory given to the estimator; every other
numeric dtype is converted to float64 there) computes in float64 throughout, so the same rule holds
with float64's largest value: about 5e150 for 64 features, and values such as 1e20 or 1e100 fit as
they are. Larger values are refused, naming the row, the column and the value as the source holds
it (a float64 1e300 is reported as 1e300, not as the "inf" it would become in float32):

* at ingest (stores hold float32: the float32 rule, whatever the source's dtype);
* in ``VBMixture.fit``/``predict``/... (:func:`vbcore.data.validation.as_rows`): the rule of the array's
  own dtype; float32 arrays beyond the float32 limit are told to pass float64 or rescale.

Row weights multiply the rows' terms in the same sums, in the same dtype, so they are held to the same
limit (:func:`weight_range`): a positive weight lies within ``[1 / L, L]`` for the feature limit ``L``
(1e30 overflowed float32 sums of squares; 1e-320 is no float32 number at all and made the float64
M-step divide by a subnormal); 0 drops a row.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vbcore.errors import InputError

#: Rows per block inside a chunk, in every chunk kernel (:mod:`vbcore.kernels.estep`): its home is
#: here because the limit below rests on it. The (block x K) logits and responsibilities stay in
#: cache between the E-step GEMM, the softmax and the statistics GEMM, and each block's float32 GEMM
#: result is accumulated in float64. A fixed constant, so results do not depend on the machine.
BLOCK_ROWS = 2048
HEADROOM = 16.0


def max_abs_value(n_features: int, dtype: Any = np.float32) -> float:
    """The largest |x| that accumulation in ``dtype`` (float32 or float64) handles for rows of
    ``n_features`` features."""
    top = float(np.finfo(np.float64 if np.dtype(dtype) == np.float64 else np.float32).max)
    return math.sqrt(top / (4.0 * HEADROOM * BLOCK_ROWS * max(int(n_features), 1)))


def weight_range(n_features: int, dtype: Any = np.float32) -> tuple[float, float]:
    """The smallest and the largest positive row weight computed with: ``1 / L`` and ``L`` for the
    feature limit ``L = max_abs_value(n_features, dtype)`` (about 1.7e-16 and 6e15 in float32 for
    64 features)."""
    limit = max_abs_value(n_features, dtype)
    return 1.0 / limit, limit


def _first_too_large(X: np.ndarray, limit: float) -> tuple[int, int] | None:
    """(row, column) of the first finite value of ``X`` beyond ``limit`` in row-major order."""
    if X.dtype.kind in "biu":
        if X.dtype.itemsize < 8 or int(np.abs(X.astype(np.float64)).max()) <= limit:
            return None
    elif float(X.max()) <= limit and -float(X.min()) <= limit:  # no temporary (False for NaN, inf)
        return None
    mag = np.abs(X.astype(np.float64, copy=False))
    big = np.isfinite(mag) & (mag > limit)
    if not big.any():
        return None
    row, col = (int(v) for v in np.argwhere(big)[0])
    return row, col


def check_magnitude(X: np.ndarray, where: str, first_row: int = 0, *, n_features: int | None = None,
                    first_col: int = 0, accumulate: Any = np.float32, hint: str = "") -> None:
    """Refuse finite values beyond :func:`max_abs_value` (NaN and inf are left to the caller's check).

    Parameters
    ----------
    X : ndarray of shape (n_rows, n_columns)
        The rows as the source holds them (before any cast to float32); all of them or some columns.
    where : str
        The source, for the message.
    first_row, first_col : int
        Row and column numbers of ``X[0, 0]`` in the source.
    n_features : int, optional
        Features of the whole row (default ``X.shape[1]``), which set the limit.
    accumulate : dtype
        float32 (stores, float32 arrays) or float64 (float64 arrays): whose largest value counts.
    hint : str
        What to do, appended to the default advice (rescale).
    """
    if X.size == 0 or X.dtype.kind not in "biuf":
        return
    d = X.shape[1] if n_features is None else int(n_features)
    limit = max_abs_value(d, accumulate)
    hit = _first_too_large(X, limit)
    if hit is None:
        return
    row, col = hit
    raise InputError(
        f"{where}: value {X[row, col].item()!r} at row {first_row + row}, column {first_col + col} is too "
        f"large: {np.dtype(accumulate).name} accumulation over {d} features overflows beyond "
        f"|x| = {limit:.3g}; rescale (standardise) the features{hint}"
    )
