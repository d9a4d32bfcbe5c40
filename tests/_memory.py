"""Peak memory of a fit, as tracemalloc sees it (NumPy's allocations included)."""

import tracemalloc

import numpy as np


def peak_fit_bytes(model, X: np.ndarray, resp_init: np.ndarray) -> int:
    """Fit ``model`` on ``X`` from ``resp_init`` and return the peak traced allocation in bytes.

    Modules the fit may import lazily (scikit-learn's k-means for the default fixed variance) are
    imported first: their import-time allocations are not the fit's memory, and counting them made
    the result depend on which tests ran before."""
    import sklearn.cluster  # noqa: F401

    tracemalloc.start()
    try:
        model.fit(X, resp_init=resp_init)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak
