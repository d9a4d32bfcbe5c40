"""The chunk kernels use only the array API standard: run them on array-api-strict arrays.

array-api-strict is a deliberately minimal implementation of the standard: any non-standard call
(NumPy-only functions or keywords, out-of-bounds slices, positive ``vecdot`` axes, flat indexing of a
2-D array, mixed float32/float64 arithmetic, ...) raises there. The kernels take their namespace from
their input (``array_namespace(x)``), so feeding them array-api-strict chunks and getting the NumPy
results back shows they would run on any compliant library (CuPy: ``tests/test_gpu.py``).

The posterior and the E-step parameters stay NumPy float64 on the host by design; only the chunk
(``Chunk.x``, ``Chunk.feats``) and what the kernels derive from it live in the array's namespace.

The standard *allows* float32 op float64 (it promotes to float64), so array-api-strict does not
catch a float64 operand slipping into float32 work. ``_float64_spy`` does: during a float32 run
every array created must be float32, except the deliberate float64 accumulations
``xp.sum(..., dtype=xp.float64)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import reduce

import numpy as np
import pytest

from vbcore.elbo import elbo_terms
from vbcore.kernels import (
    BLOCK_ROWS,
    KernelResult,
    array_namespace,
    chunk_statistics,
    estep_params,
    log_rho,
    normalise,
    prepare_chunk,
    responsibilities,
    to_numpy,
    vbem_kernel,
)
from vbcore.mstep import m_step
from vbcore.priors import default_prior

TYPES = ["full", "diag", "spherical", "fixed"]
DTYPES = [np.float64, np.float32]
RTOL = {np.float64: 1e-12, np.float32: 1e-5}
#: 2023.12 is the version NumPy 2.0 implements (the oldest the kernels need); 2025.12 the newest.
API_VERSIONS = ["2023.12", "2025.12"]
K = 4


@pytest.fixture(scope="module")
def xps():
    return pytest.importorskip("array_api_strict")


@pytest.fixture(scope="module")
def data():
    """Three clusters far from the origin; more rows than two blocks, the last block partial."""
    rng = np.random.default_rng(7)
    n = 2 * BLOCK_ROWS + 300
    centres = np.array([[0.0] * 5, [4.0] * 5, [-3.0, 2.0, -3.0, 2.0, -3.0]])
    labels = rng.integers(0, 3, size=n)
    return 50.0 + centres[labels] + rng.normal(scale=[1.0, 0.5, 2.0, 1.0, 0.7], size=(n, 5))


def _posterior(X, ct, k=K, seed=0):
    """A NumPy posterior from random responsibilities (as in tests/test_kernels.py)."""
    prior = default_prior(covariance_type=ct, weight_type="dirichlet_process", n_components=k,
                          data_mean=X.mean(0), data_covariance=np.cov(X.T))
    R = np.random.default_rng(seed).dirichlet(np.ones(k), size=X.shape[0])
    post = m_step(chunk_statistics(prepare_chunk(X, prior.mean, ct), R), prior, 1e-6)
    return prior, post


def _close(ours, ref, rtol, what):
    """``ours`` (any namespace, copied to the host by ``to_numpy``) equals the NumPy ``ref`` to ``rtol``
    relative to the array's magnitude."""
    ref = np.asarray(ref, dtype=np.float64)
    got = to_numpy(ours)
    assert got.shape == ref.shape, what
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale, err_msg=what)


def _close_stats(ours, ref, rtol, what):
    for name in ("nk", "mean", "scatter"):
        a, b = getattr(ours, name), getattr(ref, name)
        assert isinstance(a, np.ndarray) and a.dtype == np.float64, f"{what}.{name} is not host float64"
        _close(a, b, rtol, f"{what}.{name}")
    assert ours.n_rows == ref.n_rows
    np.testing.assert_array_equal(ours.shift, ref.shift)
    assert ours.sum_rlogr == pytest.approx(ref.sum_rlogr, rel=rtol), f"{what}.sum_rlogr"


def _run_kernels(x, shift, ct, params):
    """Every chunk kernel on ``x``; returns the results by name."""
    chunk = prepare_chunk(x, shift, ct)
    lr = log_rho(chunk, params)
    r, log_norm, rlogr = normalise(lr)
    return {
        "chunk": chunk, "log_rho": lr, "resp": r, "log_norm": log_norm, "rlogr": rlogr,
        "stats": chunk_statistics(chunk, r, rlogr), "kernel": vbem_kernel(chunk, params),
        "responsibilities": responsibilities(chunk, params),
    }


@contextmanager
def _float64_spy(xps, monkeypatch) -> Iterator[list[tuple[int, ...]]]:
    """Record the shape of every float64 strict array created, other than by ``xp.sum(...,
    dtype=xp.float64)``. Hooks array-api-strict's private constructor ``Array._new``, through which
    every array it returns is built."""
    array_cls = type(xps.asarray(0.0))
    new = array_cls.__dict__.get("_new")
    if not isinstance(new, classmethod):
        pytest.skip("array_api_strict.Array._new is gone; update _float64_spy")
    orig_sum = xps.sum
    seen: list[tuple[int, ...]] = []
    allowed = [False]

    def spy_new(cls, x, /, device):
        a = new.__func__(cls, x, device=device)
        if a.dtype == xps.float64 and not allowed[0]:
            seen.append(tuple(a.shape))
        return a

    def spy_sum(x, /, *, dtype=None, **kwargs):
        allowed[0] = dtype == xps.float64
        try:
            return orig_sum(x, dtype=dtype, **kwargs)
        finally:
            allowed[0] = False

    with monkeypatch.context() as m:
        m.setattr(array_cls, "_new", classmethod(spy_new))
        m.setattr(xps, "sum", spy_sum)
        yield seen


def _vbem_loop(chunks, prior, post, n_iter):
    """VB EM by hand over the chunks: E-step + statistics per chunk, merged in chunk order, M-step,
    exact ELBO. ``reg_covar = 0`` so the ELBO is guaranteed never to decrease."""
    elbos = []
    for _ in range(n_iter):
        params = estep_params(post, prior.mean)
        res = reduce(KernelResult.merge, [vbem_kernel(c, params) for c in chunks])
        post = m_step(res.stats, prior, 0.0)
        elbos.append(elbo_terms(res.stats, post, prior).total)
    return post, np.array(elbos)


# ---- the namespace and the host copy ------------------------------------------------------------
def test_namespace_is_taken_from_the_array(xps):
    x = xps.asarray(np.ones((3, 2), dtype=np.float32))
    assert array_namespace(x) is xps
    assert array_namespace(np.ones(2)) is np


def test_to_numpy_copies_standard_arrays_to_host_float64(xps):
    host = np.arange(12, dtype=np.float32).reshape(4, 3)
    for x in (xps.asarray(host), xps.asarray(host, device=xps.Device("device1"))):
        got = to_numpy(x)
        assert type(got) is np.ndarray and got.dtype == np.float64
        np.testing.assert_array_equal(got, host)
    s = to_numpy(xps.sum(xps.asarray(host), dtype=xps.float64))  # 0-d results of reductions
    assert s.shape == () and float(s) == 66.0


def test_strict_arrays_catch_what_the_kernels_must_not_do(xps, monkeypatch):
    """The guarantees these tests rely on: array-api-strict refuses NumPy-only indexing, converts
    host NumPy float64 arrays given an explicit dtype, and -- the standard promotes float32 op
    float64 to float64 -- ``_float64_spy`` sees such a promotion (and ignores float64 sums)."""
    a32 = xps.ones((3, 2), dtype=xps.float32)
    with pytest.raises(IndexError):
        a32[0:10, :]  # out-of-bounds stop
    with pytest.raises(IndexError):
        a32[0:2]  # fewer indices than dimensions
    with pytest.raises(ValueError):
        xps.vecdot(a32, a32, axis=1)  # the standard wants a negative axis
    assert xps.asarray(np.ones(2), dtype=xps.float32).dtype == xps.float32
    assert (a32 + xps.ones((3, 2), dtype=xps.float64)).dtype == xps.float64  # allowed by the standard
    with _float64_spy(xps, monkeypatch) as seen:
        xps.sum(a32, axis=0, dtype=xps.float64)
        assert seen == []
        a32 @ xps.asarray(np.ones((2, 4)))
        assert seen == [(2, 4), (3, 4)]
    assert (a32 + 1.0).dtype == xps.float32


# ---- the kernels on strict arrays equal the NumPy kernels ----------------------------------------
@pytest.mark.parametrize("api_version", API_VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("ct", TYPES)
def test_kernels_on_strict_arrays_match_numpy(xps, monkeypatch, data, ct, dtype, api_version):
    prior, post = _posterior(data, ct)
    params = estep_params(post, prior.mean)
    X = data.astype(dtype)
    ref = _run_kernels(X, prior.mean, ct, params)
    x = xps.asarray(X)
    flags = {"api_version": api_version, "boolean_indexing": False, "data_dependent_shapes": False,
             "enabled_extensions": ()}  # the strictest setting: no data-dependent shapes, no linalg
    with xps.ArrayAPIStrictFlags(**flags), _float64_spy(xps, monkeypatch) as float64_arrays:
        ours = _run_kernels(x, prior.mean, ct, params)
    if dtype == np.float32:
        assert float64_arrays == [], "float64 arrays were computed from float32 data"
    tol = RTOL[dtype]
    want = xps.float64 if dtype == np.float64 else xps.float32
    # the arrays stay in the strict namespace and in the data's dtype (never promoted)
    chunk = ours["chunk"]
    arrays = {"chunk.x": chunk.x, **{n: ours[n] for n in ("log_rho", "resp", "log_norm", "rlogr",
                                                           "responsibilities")}}
    if ct != "full":
        arrays["chunk.feats"] = chunk.feats
    else:
        assert chunk.feats is None
    for name, arr in arrays.items():
        assert array_namespace(arr) is xps, f"{name} left the strict namespace"
        assert arr.dtype == want, f"{name} has dtype {arr.dtype}, not {want}"
    np.testing.assert_array_equal(chunk.shift, prior.mean)
    assert chunk.n_rows == X.shape[0]
    # and the numbers are NumPy's
    _close(chunk.x, ref["chunk"].x, tol, "chunk.x")
    if ct != "full":
        _close(chunk.feats, ref["chunk"].feats, tol, "chunk.feats")
    for name in ("log_rho", "resp", "log_norm", "rlogr", "responsibilities"):
        _close(ours[name], ref[name], tol, name)
    _close_stats(ours["stats"], ref["stats"], tol, "chunk_statistics")
    _close_stats(ours["kernel"].stats, ref["kernel"].stats, tol, "vbem_kernel")
    assert ours["kernel"].log_norm == pytest.approx(ref["kernel"].log_norm, rel=tol)


@pytest.mark.parametrize("ct", TYPES)
def test_statistics_accept_responsibilities_of_another_float_dtype(xps, data, ct):
    """chunk_statistics casts float64 responsibilities to a float32 chunk's dtype (xp.astype)."""
    prior, _ = _posterior(data, ct)
    X = data[:300].astype(np.float32)
    R = np.random.default_rng(2).dirichlet(np.ones(K), size=X.shape[0])
    ref = chunk_statistics(prepare_chunk(X, prior.mean, ct), R)
    ours = chunk_statistics(prepare_chunk(xps.asarray(X), prior.mean, ct), xps.asarray(R))
    _close_stats(ours, ref, RTOL[np.float32], "chunk_statistics")


# ---- a whole VB EM loop on strict chunks -----------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("ct", TYPES)
def test_vbem_loop_on_strict_chunks_matches_numpy(xps, data, ct, dtype):
    prior, post0 = _posterior(data, ct)
    X = data.astype(dtype)
    parts = np.array_split(np.arange(X.shape[0]), 3)
    np_chunks = [prepare_chunk(X[p], prior.mean, ct) for p in parts]
    xp_chunks = [prepare_chunk(xps.asarray(X[p]), prior.mean, ct) for p in parts]
    post_np, elbo_np = _vbem_loop(np_chunks, prior, post0, 10)
    post_xp, elbo_xp = _vbem_loop(xp_chunks, prior, post0, 10)
    tol = RTOL[dtype]
    steps = np.diff(elbo_xp)
    slack = (1e-9 if dtype == np.float64 else 1e-5) * np.abs(elbo_xp).max()
    assert steps.min() >= -slack, f"ELBO decreased by {-steps.min():.3e}"
    assert elbo_xp[-1] > elbo_xp[0]
    np.testing.assert_allclose(elbo_xp, elbo_np, rtol=tol)
    _close(post_xp.means, post_np.means, tol, "means")
    _close(post_xp.covariances, post_np.covariances, 100 * tol, "covariances")
