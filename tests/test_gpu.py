"""The chunk kernels on CuPy arrays equal the NumPy kernels (needs CuPy and a CUDA device).

Every test here is marked ``gpu``; ``tests/conftest.py`` skips them when CuPy cannot be imported or
sees no device. CuPy is imported inside the tests (the ``cp`` fixture), so this module collects
without it. The E-step parameters and the statistics stay NumPy float64 on the host by design;
only the chunk and what the kernels derive from it live on the device.

float32 GEMMs: CuPy uses TF32 tensor cores for float32 matmul only when ``CUPY_TF32=1``; these
tolerances assume the default (off).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests._kernel_checks import close as _close
from tests._kernel_checks import close_stats as _close_stats
from tests._kernel_checks import posterior as _posterior
from tests._kernel_checks import run_kernels as _run_kernels
from tests._kernel_checks import three_clusters
from tests._kernel_checks import vbem_loop as _vbem_loop
from vbcore.kernels.estep import (
    array_namespace,
    estep_params,
    prepare_chunk,
)

pytestmark = pytest.mark.gpu

TYPES = ["full", "tied", "diag", "spherical", "fixed"]
DTYPES = [np.float64, np.float32]
#: device vs host: different GEMM kernels, so equal only to rounding of the data's dtype
RTOL = {np.float64: 1e-10, np.float32: 1e-5}
K = 4

#: what the kernels call on ``array_namespace(x)``
KERNEL_FUNCTIONS = ("asarray", "astype", "concat", "exp", "float64", "log", "matrix_transpose", "max",
                    "reshape", "stack", "sum", "vecdot")


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.fixture(scope="module")
def data():
    """Three clusters far from the origin; more rows than two blocks, the last block partial."""
    return three_clusters()


def test_cupy_arrays_give_the_kernels_cupys_namespace(cp):
    """``array_namespace`` must return a namespace that makes CuPy arrays and has every function the
    kernels call; otherwise the kernels fall back to NumPy and fail on device data."""
    x = cp.asarray(np.ones((3, 2), dtype=np.float32))
    xp = array_namespace(x)
    y = xp.asarray(np.ones(2), dtype=x.dtype)
    assert isinstance(y, cp.ndarray), (
        f"array_namespace(cupy array) is {getattr(xp, '__name__', xp)!r}, not a CuPy namespace "
        f"(CuPy {cp.__version__}: cupy.ndarray has __array_namespace__ = "
        f"{hasattr(x, '__array_namespace__')})")
    missing = [name for name in KERNEL_FUNCTIONS if not hasattr(xp, name)]
    assert not missing, f"{getattr(xp, '__name__', xp)} lacks {missing}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("ct", TYPES)
def test_kernels_on_cupy_match_numpy(cp, data, ct, dtype):
    prior, post = _posterior(data, ct)
    params = estep_params(post, prior.mean)
    X = data.astype(dtype)
    ref = _run_kernels(X, prior.mean, ct, params)
    x = cp.asarray(X)
    ours = _run_kernels(x, prior.mean, ct, params)
    cp.cuda.Stream.null.synchronize()
    tol = RTOL[dtype]
    chunk = ours["chunk"]
    arrays = {"chunk.x": chunk.x, **{n: ours[n] for n in ("log_rho", "resp", "log_norm", "rlogr",
                                                           "responsibilities")}}
    if ct not in ("full", "tied"):
        arrays["chunk.feats"] = chunk.feats
    else:
        assert chunk.feats is None
    for name, arr in arrays.items():  # on the device, in the data's dtype
        assert isinstance(arr, cp.ndarray), f"{name} is a {type(arr)}, not on the device"
        assert arr.dtype == x.dtype, f"{name} has dtype {arr.dtype}, not {x.dtype}"
    np.testing.assert_array_equal(chunk.shift, prior.mean)
    _close(chunk.x, ref["chunk"].x, tol, "chunk.x")
    if ct not in ("full", "tied"):
        _close(chunk.feats, ref["chunk"].feats, tol, "chunk.feats")
    # an absolute error e in ln rho moves r by at most 2 e and r ln r, ln sum rho by about e
    lr_scale = float(np.max(np.abs(ref["log_rho"])))
    _close(ours["log_rho"], ref["log_rho"], tol, "log_rho")
    for name in ("resp", "log_norm", "rlogr", "responsibilities"):
        _close(ours[name], ref[name], tol, name, scale=2 * lr_scale)
    _close_stats(ours["stats"], ref["stats"], tol, "chunk_statistics")
    _close_stats(ours["kernel"].stats, ref["kernel"].stats, tol, "vbem_kernel")
    assert ours["kernel"].log_norm == pytest.approx(ref["kernel"].log_norm, rel=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("ct", TYPES)
def test_vbem_loop_on_cupy_chunks_matches_numpy(cp, data, ct, dtype):
    """10 VB EM iterations over 3 device chunks: the ELBO never decreases and the posterior means
    are the NumPy loop's to 1e-4."""
    prior, post0 = _posterior(data, ct)
    X = data.astype(dtype)
    parts = np.array_split(np.arange(X.shape[0]), 3)
    np_chunks = [prepare_chunk(X[p], prior.mean, ct) for p in parts]
    gpu_chunks = [prepare_chunk(cp.asarray(X[p]), prior.mean, ct) for p in parts]
    post_np, elbo_np = _vbem_loop(np_chunks, prior, post0, 10)
    post_gpu, elbo_gpu = _vbem_loop(gpu_chunks, prior, post0, 10)
    steps = np.diff(elbo_gpu)
    slack = (1e-9 if dtype == np.float64 else 1e-5) * np.abs(elbo_gpu).max()
    assert steps.min() >= -slack, f"ELBO decreased by {-steps.min():.3e}"
    assert elbo_gpu[-1] > elbo_gpu[0]
    np.testing.assert_allclose(elbo_gpu, elbo_np, rtol=1e-10 if dtype == np.float64 else 1e-4)
    np.testing.assert_allclose(post_gpu.means, post_np.means, rtol=1e-4)
