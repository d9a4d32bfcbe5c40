"""Births from the worst-explained rows (pipeline/fit/learners/outliers.py): the rows are those of
lowest ``ln sum_k rho`` (brute force, every engine), a tight distant group of them is a birth and a
Gaussian's own tail is not, and a fit grown from few components finds classes of a few rows that a
uniform sample misses, with a monotone exact bound."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pipeline.engine.engines import DaskEngine, LocalEngine
from pipeline.engine.sources import ArraySource
from pipeline.estimator import VBMixture
from pipeline.fit.learners.outliers import outlier_groups, tail_ratio, worst_rows_kernel
from pipeline.fit.spec import estimator_params
from tests._kernel_checks import posterior
from vbcore.kernels.estep import estep_params, log_rho, normalise, prepare_chunk, weigh_chunk


def _lowest(X, prior, params, m, w=None):
    ln = normalise(log_rho(prepare_chunk(X, prior.mean, "diag"), params))[1].astype(np.float64)
    if w is not None:
        ln = np.where(w > 0, ln, np.inf)
    order = np.argsort(ln, kind="stable")[:m]
    return ln[order], X[order] - prior.mean


def test_the_worst_rows_are_those_of_lowest_log_normaliser():
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(0, 1, (300, 4)), rng.normal(6, 1, (300, 4)), rng.normal(30, 1, (5, 4))])
    prior, post = posterior(X, "diag", k=2)
    params = estep_params(post, prior.mean)
    means = post.means - prior.mean
    ln, rows, counts, squares = worst_rows_kernel(prepare_chunk(X, prior.mean, "diag"), params, 7, means)
    want_ln, want_rows = _lowest(X, prior, params, 7)
    np.testing.assert_array_equal(ln, want_ln)
    np.testing.assert_allclose(rows, want_rows, rtol=0, atol=1e-12)
    assert np.all(np.diff(ln) >= 0)
    # per component: the rows most likely under it, and their squared distances to its mean
    owner = np.argmax(log_rho(prepare_chunk(X, prior.mean, "diag"), params), axis=1)
    np.testing.assert_array_equal(counts, np.bincount(owner, minlength=2))
    sq = ((X - post.means[owner]) ** 2).sum(1)
    np.testing.assert_allclose(squares, np.bincount(owner, weights=sq, minlength=2), rtol=1e-12)
    w = np.ones(X.shape[0])
    w[-5:] = 0.0  # the far rows weigh nothing: they are no rows
    w[:3] = 2.0
    ln_w, _, counts_w, _ = worst_rows_kernel(weigh_chunk(prepare_chunk(X, prior.mean, "diag"), w), params, 7,
                                             means)
    np.testing.assert_array_equal(ln_w, _lowest(X, prior, params, 7, w)[0])
    np.testing.assert_allclose(counts_w, np.bincount(owner, weights=w, minlength=2))


def test_the_worst_rows_of_a_pass_are_the_same_on_both_engines(client):
    from types import SimpleNamespace

    from pipeline.fit.learners.outliers import worst_rows

    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(0, 1, (900, 3)), rng.normal(25, 1, (4, 3))])[rng.permutation(904)]
    prior, post = posterior(X, "diag", k=2)
    params = estep_params(post, prior.mean)
    got = []
    for engine in (LocalEngine(threads=2), DaskEngine(client)):
        handles = engine.prepare(ArraySource(X, chunk_rows=128), prepare_chunk, prior.mean, "diag")
        ctx = SimpleNamespace(engine=engine, handles=handles, n_rows=X.shape[0], n_features=3)
        got.append(worst_rows(ctx, params, post.means - prior.mean))
    np.testing.assert_array_equal(got[0][0], got[1][0])
    assert got[0][1] == got[1][1] > 0
    np.testing.assert_allclose(got[0][0], _lowest(X, prior, params, 904)[1][:got[0][0].shape[0]], atol=1e-12)


def test_a_tight_distant_group_is_a_birth_and_a_tail_is_not():
    rng = np.random.default_rng(2)
    d = 8
    tail = rng.normal(0, 1, (40, d)) * 2.5  # a component's own far rows, scattered all round
    group = rng.normal(12.0, 0.5, (5, d))  # five rows close together, 12 spreads away per dimension
    pair = rng.normal(-12.0, 0.5, (2, d))  # too few rows
    rows = np.concatenate([tail, group, pair])
    found = outlier_groups(rows, np.zeros(rows.shape[0], dtype=int), np.zeros((1, d)), np.ones(1), far=8.0)
    assert len(found) == 1
    ratio, k, centre = found[0]
    assert k == 0 and ratio > 100
    np.testing.assert_allclose(centre, group.mean(0))
    assert outlier_groups(rows, np.zeros(rows.shape[0], dtype=int), np.zeros((1, d)), np.ones(1),
                          far=2 * ratio) == []


def test_the_tail_bound_holds_for_gaussian_rows():
    """The largest squared distance per dimension of n Gaussian rows stays under tail_ratio (it is a
    1% bound; the seeds are fixed) and the bound falls with the dimension."""
    rng = np.random.default_rng(3)
    for n, d in ((10_000, 2), (20_000, 8), (5_000, 64)):
        worst = float((rng.normal(size=(n, d)) ** 2).sum(1).max() / d)
        assert worst < tail_ratio(n, d), (n, d, worst)
    assert tail_ratio(10_000, 2) > tail_ratio(10_000, 32) > tail_ratio(10_000, 512) > 1.0


@pytest.mark.parametrize("start", [2, 4])
def test_a_fit_grown_from_few_components_finds_classes_of_a_few_rows(start):
    """Three classes of 3,000 rows and two of 12, far apart (16 dimensions): from 2 or 4 components
    the command line's model (growth, moves) finds all five; the history of the exact bound never
    falls. Without the outlier births the two small classes stayed inside larger ones."""
    rng = np.random.default_rng(4)
    centres = rng.normal(scale=6.0, size=(5, 16))
    sizes = [3000, 3000, 3000, 12, 12]
    y = np.repeat(np.arange(5), sizes)
    X = centres[y] + rng.normal(size=(y.size, 16))  # float64: the bound monotone to rounding
    params = estimator_params()
    params["covariance_type"] = "diag"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = VBMixture(start, **{**params, "random_state": 0}).fit(X)
    labels = model.predict(X)
    assert model.n_effective_ == 5
    for c in (3, 4):  # each small class is a cluster of its own
        assert np.unique(labels[y == c]).size == 1
        assert np.sum(labels == labels[y == c][0]) == 12
    assert np.all(np.diff(model.lower_bounds_) >= -1e-9 * np.abs(model.lower_bounds_).max())


def test_the_worst_rows_of_standard_chunks_equal_numpys():
    """The kernel uses the array API only (it runs on CuPy chunks): array-api-strict chunks give the
    NumPy chunk's rows, counts and squares."""
    xps = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(0, 1, (300, 4)), rng.normal(8, 1, (300, 4)), rng.normal(40, 1, (4, 4))])
    prior, post = posterior(X, "diag", k=2)
    params = estep_params(post, prior.mean)
    means = post.means - prior.mean
    ref = worst_rows_kernel(prepare_chunk(X, prior.mean, "diag"), params, 9, means)
    got = worst_rows_kernel(prepare_chunk(xps.asarray(X), prior.mean, "diag"), params, 9, means)
    for a, b in zip(got, ref, strict=True):
        assert type(a) is np.ndarray
        np.testing.assert_allclose(a, b, rtol=1e-12)
