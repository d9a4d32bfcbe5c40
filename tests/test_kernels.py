"""Chunk kernels against float64 brute force; statistics merge; float32 accuracy."""

import functools

import numpy as np
import pytest

from pipeline.engine.engines import split_rows
from tests._reference import TOL, brute_log_rho, brute_stats
from vbcore.kernels.estep import chunk_statistics, estep_params, log_rho, normalise, prepare_chunk
from vbcore.model.mstep import m_step
from vbcore.model.priors import default_prior

TYPES = ["full", "diag", "spherical", "fixed"]


def _posterior(X, ct, wt="dirichlet_process", k=4, seed=0):
    rng = np.random.default_rng(seed)
    prior = default_prior(covariance_type=ct, weight_type=wt, n_components=k,
                          data_mean=X.mean(0), data_covariance=np.cov(X.T))
    R = rng.dirichlet(np.ones(k), size=X.shape[0])
    chunk = prepare_chunk(X, prior.mean, ct)
    return prior, m_step(chunk_statistics(chunk, R), prior, 1e-6), R


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(42)
    return np.vstack([rng.normal(loc=c, scale=s, size=(60, 5)) for c, s in ((0, 1), (4, 0.5), (-3, 2))])


@pytest.mark.parametrize("ct", TYPES)
def test_log_rho_matches_bruteforce(data, ct):
    prior, post, _ = _posterior(data, ct)
    chunk = prepare_chunk(data, prior.mean, ct)
    ours = log_rho(chunk, estep_params(post, prior.mean))
    np.testing.assert_allclose(ours, brute_log_rho(data, post), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("ct", TYPES)
def test_log_rho_float32_close_to_float64_on_offset_data(data, ct):
    """float32 GEMMs stay accurate on data far from the origin, because chunks are shifted."""
    X32 = (data + 1e4).astype(np.float32)
    X = X32.astype(np.float64)  # the same numbers: float32 cannot hold more digits of the input
    prior, post, _ = _posterior(X, ct)
    chunk = prepare_chunk(X32, prior.mean, ct)
    ours = log_rho(chunk, estep_params(post, prior.mean))
    assert ours.dtype == np.float32
    ref = brute_log_rho(X, post)
    np.testing.assert_allclose(ours, ref, rtol=TOL[np.float32], atol=TOL[np.float32] * np.abs(ref).max())


@pytest.mark.parametrize("ct", ["full", "diag"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_statistics_match_bruteforce_and_do_not_depend_on_chunking(data, ct, dtype):
    X = (data + 1e4).astype(dtype)
    R = np.random.default_rng(1).dirichlet(np.ones(3), size=len(X)).astype(dtype)
    nk, mean, scat = brute_stats(X.astype(np.float64), R.astype(np.float64))
    shift = X.astype(np.float64).mean(0)
    whole = chunk_statistics(prepare_chunk(X, shift, ct), R)
    parts = functools.reduce(lambda a, b: a.merge(b), [chunk_statistics(prepare_chunk(x, shift, ct), r)
                             for x, r in zip(split_rows(X, 17), split_rows(R, 17), strict=True)])
    tol = TOL[dtype]
    for s in (whole, parts):
        assert s.nk.dtype == np.float64 and s.mean.dtype == np.float64
        np.testing.assert_allclose(s.nk, nk, rtol=tol)
        np.testing.assert_allclose(s.raw_mean(), mean, rtol=tol)
        expect = scat if ct == "full" else np.diagonal(scat, axis1=1, axis2=2)
        np.testing.assert_allclose(s.scatter, expect, rtol=100 * tol, atol=100 * tol * np.abs(expect).max())
    if dtype == np.float64:  # the pairwise merge is exact up to rounding
        np.testing.assert_allclose(parts.scatter, whole.scatter, rtol=1e-12)


def test_merge_handles_empty_components():
    X = np.arange(12.0).reshape(6, 2)
    R = np.zeros((6, 3))
    R[:3, 0] = 1
    R[3:, 1] = 1  # component 2 is empty everywhere, component 0 only in the first chunk
    shift = np.zeros(2)
    a = chunk_statistics(prepare_chunk(X[:3], shift, "diag"), R[:3])
    b = chunk_statistics(prepare_chunk(X[3:], shift, "diag"), R[3:])
    m = a.merge(b)
    np.testing.assert_array_equal(m.nk, [3, 3, 0])
    np.testing.assert_allclose(m.mean, [[2, 3], [8, 9], [0, 0]])
    np.testing.assert_allclose(m.scatter, [[8, 8], [8, 8], [0, 0]])


def test_merge_rejects_mismatched_shifts():
    X = np.ones((3, 2))
    a = chunk_statistics(prepare_chunk(X, np.zeros(2), "diag"), np.ones((3, 1)))
    b = chunk_statistics(prepare_chunk(X, np.ones(2), "diag"), np.ones((3, 1)))
    with pytest.raises(ValueError, match="different shifts"):
        a.merge(b)


def test_normalise_is_a_stable_softmax():
    lr = np.array([[1000.0, 1001.0, -1e5], [-3.0, -3.0, -3.0]])
    r, log_norm, rlogr = normalise(lr)
    np.testing.assert_allclose(r.sum(1), 1.0)
    np.testing.assert_allclose(log_norm, [1001.0 + np.log1p(np.exp(-1.0)), -3.0 + np.log(3.0)])
    from scipy.special import logsumexp, xlogy

    np.testing.assert_allclose(r, np.exp(lr - logsumexp(lr, axis=1, keepdims=True)))
    np.testing.assert_allclose(rlogr, xlogy(r, r).sum(1), rtol=1e-12)


def test_rlogr_is_accumulated(data):
    prior, post, _ = _posterior(data, "diag")
    chunk = prepare_chunk(data, prior.mean, "diag")
    r, _, rlogr = normalise(log_rho(chunk, estep_params(post, prior.mean)))
    s = chunk_statistics(chunk, r, rlogr)
    from scipy.special import xlogy

    assert s.sum_rlogr == pytest.approx(xlogy(r, r).sum(), rel=1e-12)


@pytest.mark.parametrize("ct", TYPES)
def test_owned_merges_and_statistics_are_the_same_bits(ct):
    """The in-process reduction's ``merge_owned`` (into the left side's arrays) and ``diag_stats``
    computed into its input's halves give :meth:`SuffStats.merge`'s and the plain computation's
    bits, empty components and weighted rows included; ``engine.map_reduce`` over chunks equals a
    reduction with plain merges."""
    from pipeline.engine.engines import LocalEngine, tree_reduce
    from vbcore.kernels.estep import vbem_kernel
    from vbcore.model.stats import diag_stats

    rng = np.random.default_rng(5)
    X = rng.normal(size=(900, 7)) * rng.uniform(0.5, 3.0, size=7) + 40.0
    prior, post, _ = _posterior(X, ct, k=6)
    params = estep_params(post, prior.mean)
    chunks = [prepare_chunk(x, prior.mean, ct) for x in split_rows(X.astype(np.float32), 128)]
    plain = tree_reduce([vbem_kernel(c, params) for c in chunks])  # KernelResult.merge
    owned = LocalEngine(threads=2).map_reduce(vbem_kernel, chunks, params)  # merge_owned
    for name in ("nk", "mean", "scatter"):
        np.testing.assert_array_equal(getattr(owned.stats, name), getattr(plain.stats, name))
    assert (owned.log_norm, owned.log_norm_m2) == (plain.log_norm, plain.log_norm_m2)
    nk = rng.uniform(0.0, 50.0, size=6)
    nk[[1, 4]] = 0.0  # empty components: zero mean and scatter either way
    g = rng.normal(size=(6, 14)) * 30.0
    a = diag_stats(nk, g.copy(), -3.0, 90, np.zeros(7), weight=12.5)
    b = diag_stats(nk, g.copy(), -3.0, 90, np.zeros(7), weight=12.5, owned=True)
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.scatter, b.scatter)
    left, right = (diag_stats(nk * s, g * s, 0.0, 90, np.zeros(7), weight=w)
                   for s, w in ((1.0, 3.0), (0.7, None)))
    merged = left.merge(right)
    spent = diag_stats(nk, g.copy(), 0.0, 90, np.zeros(7), weight=3.0).merge_owned(right)
    for name in ("nk", "mean", "scatter"):
        np.testing.assert_array_equal(getattr(spent, name), getattr(merged, name))
    assert spent.total_weight == merged.total_weight == 93.0
