"""The E-step is GEMM-shaped: no N x K x D temporary is ever built (measured with tracemalloc,
which sees NumPy's allocations)."""

import numpy as np
import pytest

from pipeline import VBMixture
from tests._memory import peak_fit_bytes


@pytest.mark.parametrize("ct", ["diag", "spherical", "fixed", "full"])
def test_peak_memory_far_below_n_k_d(ct):
    n, d, k = 20_000, 48, 40
    X = np.random.default_rng(0).random((n, d), dtype=np.float32)
    R = np.random.default_rng(1).dirichlet(np.ones(k), size=n)
    model = VBMixture(k, covariance_type=ct, max_iter=2, tol=0.0, chunk_rows=8192)
    peak = peak_fit_bytes(model, X, R)
    nkd_float32 = n * k * d * 4  # 154 MB: what one N x K x D float32 temporary would cost
    data = X.nbytes  # 3.8 MB
    # allowed: a few copies of the data and of the (N x K) float64 responsibilities
    assert peak < 4 * data + 3 * n * k * 8 + 16 * 2**20, peak
    assert peak < nkd_float32 / 4


def test_hard_assignment_learners_keep_no_square_cache():
    """sga-f squares only its minibatch rows (Learner.cache_squares = False): the prepared chunks
    take about the data's size, not 3x (the [x*x, x] cache of the diagonal families)."""
    import tracemalloc

    import sklearn.cluster  # noqa: F401  (import-time allocations are not the fit's)

    n, d = 200_000, 64
    X = np.random.default_rng(0).random((n, d), dtype=np.float32)  # 51 MB
    model = VBMixture(20, covariance_type="fixed", max_iter=3, tol=0.0, chunk_rows=8192, random_state=0,
                      learner="sga-f", learner_options={"minibatch": 1000})
    tracemalloc.start()
    try:
        model.fit(X)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * X.nbytes, peak  # with the cache the chunks alone take 3 x X.nbytes
