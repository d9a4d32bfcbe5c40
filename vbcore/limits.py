"""The largest feature magnitude vbcluster computes with: a rule applied where rows enter a store.

Float32 data is multiplied with float32 GEMMs (float64 accumulators across blocks): within one
block of ``BLOCK_ROWS`` rows, sums of ``x * x`` over rows and features are float32. After the rows
are shifted by one row (which can double a magnitude), every such sum stays below float32's largest
value, with a further factor 16 of headroom for the products with precisions, when

    |x| <= sqrt(finfo(float32).max / (4 * 16 * BLOCK_ROWS * n_features)),

about 6e15 for 64 features. Larger values are refused where they are ingested, naming the row, the
column and the value as the source holds it (a float64 1e300 is reported as 1e300, not as the "inf"
it would become in float32); rescale such features (standardise them) before clustering.
"""

from __future__ import annotations

import math

import numpy as np

from vbcore.errors import InputError
from vbcore.kernels import BLOCK_ROWS

HEADROOM = 16.0


def max_abs_value(n_features: int) -> float:
    """The largest |x| that float32 accumulation handles for rows of ``n_features`` features."""
    top = float(np.finfo(np.float32).max)
    return math.sqrt(top / (4.0 * HEADROOM * BLOCK_ROWS * max(int(n_features), 1)))


def check_magnitude(X: np.ndarray, where: str, first_row: int = 0) -> None:
    """Refuse finite values beyond :func:`max_abs_value` (NaN and inf are left to the caller's check).

    Parameters
    ----------
    X : ndarray of shape (n_rows, n_features)
        The rows as the source holds them (before any cast to float32).
    where : str
        The source, for the message.
    first_row : int
        Row number of ``X[0]`` in the source.
    """
    if X.size == 0 or X.dtype.kind not in "biuf":
        return
    limit = max_abs_value(X.shape[1])
    if X.dtype.kind in "biu":
        if X.dtype.itemsize < 8 or int(np.abs(X.astype(np.float64)).max()) <= limit:
            return
    else:
        top = float(np.max(np.abs(X)))
        if top <= limit:  # (False for NaN and inf: then look closer)
            return
    mag = np.abs(X.astype(np.float64, copy=False))
    big = np.isfinite(mag) & (mag > limit)
    if not big.any():
        return
    row, col = (int(v) for v in np.argwhere(big)[0])
    raise InputError(
        f"{where}: value {X[row, col].item()!r} at row {first_row + row}, column {col} is too large: "
        f"float32 accumulation over {X.shape[1]} features overflows beyond |x| = {limit:.3g}; "
        "rescale (standardise) the features"
    )
