"""Shared checks for the chunk kernels on other array namespaces (array-api-strict, CuPy)."""

from __future__ import annotations

from functools import reduce

import numpy as np
import pytest

from vbcore.kernels.estep import (
    BLOCK_ROWS,
    KernelResult,
    chunk_statistics,
    estep_params,
    log_rho,
    normalise,
    prepare_chunk,
    responsibilities,
    to_numpy,
    vbem_kernel,
)
from vbcore.model.elbo import elbo_terms
from vbcore.model.mstep import m_step
from vbcore.model.priors import default_prior

K = 4


def three_clusters():
    """Three clusters far from the origin; more rows than two blocks, the last block partial."""
    rng = np.random.default_rng(7)
    n = 2 * BLOCK_ROWS + 300
    centres = np.array([[0.0] * 5, [4.0] * 5, [-3.0, 2.0, -3.0, 2.0, -3.0]])
    labels = rng.integers(0, 3, size=n)
    return 50.0 + centres[labels] + rng.normal(scale=[1.0, 0.5, 2.0, 1.0, 0.7], size=(n, 5))


def posterior(X, ct, k=K, seed=0):
    """A NumPy posterior from random responsibilities (as in tests/test_kernels.py)."""
    prior = default_prior(covariance_type=ct, weight_type="dirichlet_process", n_components=k,
                          data_mean=X.mean(0), data_covariance=np.cov(X.T))
    R = np.random.default_rng(seed).dirichlet(np.ones(k), size=X.shape[0])
    post = m_step(chunk_statistics(prepare_chunk(X, prior.mean, ct), R), prior, 1e-6)
    return prior, post


def close(ours, ref, rtol, what, scale=None):
    """``ours`` (copied to the host by ``to_numpy``) equals the NumPy ``ref`` to ``rtol`` relative to
    ``scale`` (default: the array's magnitude)."""
    ref = np.asarray(ref, dtype=np.float64)
    got = to_numpy(ours)
    assert got.shape == ref.shape, what
    if scale is None:
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale, err_msg=what)


def close_stats(ours, ref, rtol, what):
    for name in ("nk", "mean", "scatter"):
        a, b = getattr(ours, name), getattr(ref, name)
        assert isinstance(a, np.ndarray) and a.dtype == np.float64, f"{what}.{name} is not host float64"
        close(a, b, rtol, f"{what}.{name}")
    assert ours.n_rows == ref.n_rows
    np.testing.assert_array_equal(ours.shift, ref.shift)
    assert ours.sum_rlogr == pytest.approx(ref.sum_rlogr, rel=rtol), f"{what}.sum_rlogr"


def run_kernels(x, shift, ct, params):
    chunk = prepare_chunk(x, shift, ct)
    lr = log_rho(chunk, params)
    r, log_norm, rlogr = normalise(lr)
    return {
        "chunk": chunk, "log_rho": lr, "resp": r, "log_norm": log_norm, "rlogr": rlogr,
        "stats": chunk_statistics(chunk, r, rlogr), "kernel": vbem_kernel(chunk, params),
        "responsibilities": responsibilities(chunk, params),
    }


def vbem_loop(chunks, prior, post, n_iter):
    """VB EM by hand over the chunks: E-step + statistics per chunk, merged in chunk order, M-step,
    exact ELBO. ``reg_covar = 0`` so the ELBO is guaranteed never to decrease."""
    elbos = []
    for _ in range(n_iter):
        params = estep_params(post, prior.mean)
        res = reduce(KernelResult.merge, [vbem_kernel(c, params) for c in chunks])
        post = m_step(res.stats, prior, 0.0)
        elbos.append(elbo_terms(res.stats, post, prior).total)
    return post, np.array(elbos)
