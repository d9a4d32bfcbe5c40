"""``VBMixture.partial_fit`` (issue 28): batches folded into memoized statistics.

The bound after a call is the exact ELBO of every row seen (the kept statistics of each batch with the
posterior), it never decreases within a call, one batch of all rows is ``fit`` from the same start,
and five batches end within 0.1% of ``fit`` on all rows. What ``n_iter_``, ``converged_`` and ``lower_bound_``
mean follows scikit-learn's conventions for ``partial_fit`` (pipeline/fit/partial.py).
"""

import warnings

import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.engine.engines import tree_reduce
from tests._reference import planted_blobs, same_fit_bits
from vbcore.errors import ConfigError, InputError
from vbcore.model.elbo import elbo_terms

RNG = np.random.default_rng(8714)
CENTRES = RNG.normal(0.0, 5.0, size=(5, 4))
LAB = RNG.integers(0, 5, 3000)
X = CENTRES[LAB] + RNG.normal(size=(3000, 4))
KW = dict(n_components=6, covariance_type="diag", random_state=0, tol=1e-6, max_iter=200, reg_covar=0.0)


def test_the_bound_is_exact_over_every_row_seen_and_never_decreases():
    model = VBMixture(**KW)
    for batch in np.array_split(X, 5):
        model.partial_fit(batch)
        assert np.all(np.diff(model.lower_bounds_) >= -1e-9 * abs(model.lower_bound_))
        assert 1 <= model.n_iter_ == len(model.lower_bounds_) <= KW["max_iter"]
    state = model.partial_state_
    assert len(state.memos) == 5 and sum(m.stats.n_rows for m in state.memos) == X.shape[0]
    total = tree_reduce(state.memos).stats
    assert elbo_terms(total, model.posterior_, model.prior_).total == model.lower_bound_
    assert model.converged_


def test_one_batch_of_all_rows_is_fit_and_five_batches_end_near_it():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = VBMixture(**KW).fit(X)
    one = VBMixture(**KW).partial_fit(X)  # the first call of an unfitted model is fit
    same_fit_bits(one, full)
    five = VBMixture(**KW)  # (ten batches of 300 rows here start from too few rows: 4 clusters, -0.4%)
    for batch in np.array_split(X, 5):
        five.partial_fit(batch)
    assert five.lower_bound_ == pytest.approx(full.lower_bound_, rel=1e-3)


def test_weighted_batches_equal_repeated_rows():
    w = RNG.integers(0, 3, X.shape[0])
    a, b = VBMixture(**KW), VBMixture(**KW)
    a.partial_fit(X[:1000])
    b.partial_fit(X[:1000])
    a.partial_fit(X[1000:], sample_weight=w[1000:])
    b.partial_fit(np.repeat(X[1000:], w[1000:], axis=0))
    np.testing.assert_allclose(a.means_, b.means_, rtol=1e-9, atol=1e-9)
    assert a.lower_bound_ == pytest.approx(b.lower_bound_, rel=1e-10)


def test_partial_fit_errors_are_one_line():
    model = VBMixture(**KW).partial_fit(X[:500])
    with pytest.raises(InputError, match="X has 3 features, but VBMixture is expecting 4 features"):
        model.partial_fit(X[:500, :3])
    with pytest.raises(ConfigError, match="partial_fit runs VB EM on memoized statistics; learner 'ncg'"):
        VBMixture(**{**KW, "learner": "ncg"}).partial_fit(X[:500])
    with pytest.raises(InputError, match=r"sample_weight: row 2 has weight -1\.0; weights must be >= 0"):
        model.partial_fit(X[:3], sample_weight=[1.0, 1.0, -1.0])


def test_a_batch_passed_again_replaces_its_statistics_and_laps_reach_fit():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = VBMixture(**KW).fit(X)
    model = VBMixture(**KW)
    batches = np.array_split(X, 5)
    laps = []
    for _ in range(3):  # three laps over the same five batches
        for batch in batches:
            model.partial_fit(batch)
        laps.append(model.lower_bound_)
    assert len(model.partial_state_.memos) == 5
    assert sum(m.stats.n_rows for m in model.partial_state_.memos) == X.shape[0]
    assert laps[0] <= laps[1] <= laps[2]  # a revisit replaces the batch's statistics: the bound rises
    assert model.lower_bound_ == pytest.approx(full.lower_bound_, rel=1e-4)


def test_the_first_call_is_fit_of_its_batch_with_growth_and_moves():
    """The first call of an unfitted model fits its batch as ``fit`` does (the command line's model:
    births from 5 components to the 20 planted classes, moves), the same bits, and keeps the batch's
    statistics: their bound with the posterior is the fit's; a second batch then refines it."""
    x, _ = planted_blobs(n=6000, d=16, k=20, seed=11)
    x = x.astype(np.float32)
    kw = dict(n_components=5, covariance_type="diag", random_state=0, chunk_rows=500, max_iter=200,
              grow=True, prior_defaults="empirical", init_params="k-means++-projected")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = VBMixture(**kw).fit(x[:3000])
    first = VBMixture(**kw).partial_fit(x[:3000])
    same_fit_bits(first, full)
    assert first.n_effective_ == 20 and first.converged_ == full.converged_  # from 5 components: births
    (memo,) = first.partial_state_.memos
    assert memo.stats.n_rows == 3000
    assert elbo_terms(memo.stats, first.posterior_, first.prior_).total == pytest.approx(first.lower_bound_,
                                                                                          rel=1e-9)
    first.partial_fit(x[3000:])
    assert first.n_effective_ == 20 and len(first.partial_state_.memos) == 2
    assert np.all(np.diff(first.lower_bounds_) >= -1e-9 * abs(first.lower_bound_))


def test_later_calls_re_estimate_the_free_hyperparameters_as_fit_does():
    """With the pipeline's empirical priors ``beta0`` is re-estimated after every M-step, in later
    calls too (before, they kept the first batch's): it is the bound's maximiser given the final
    posterior, the bound is exact under that prior and never decreases within a call."""
    from vbcore.model.empirical import best_mean_precision

    kw = {**KW, "prior_defaults": "empirical"}
    model = VBMixture(**kw)
    batches = np.array_split(X, 3)
    model.partial_fit(batches[0])
    first = model.prior_.mean_precision
    for batch in batches[1:]:
        model.partial_fit(batch)
        assert np.all(np.diff(model.lower_bounds_) >= -1e-9 * abs(model.lower_bound_))
    assert "mean_precision" in model.prior_.empirical and model.prior_.mean_precision != first
    assert model.prior_.mean_precision == best_mean_precision(model.posterior_, model.prior_.mean)
    total = tree_reduce(model.partial_state_.memos).stats
    assert elbo_terms(total, model.posterior_, model.prior_).total == model.lower_bound_


@pytest.mark.parametrize("defaults", ["sklearn", "empirical"])
def test_the_prior_follows_every_row_seen(defaults):
    """The data-dependent defaults (prior mean, covariance prior, the empirical nu0) are built from
    the moments of every row seen, as ``fit`` builds them on all rows: after the last batch they are
    fit's (before, the first batch's); a batch passed again replaces its moments."""
    kw = {**KW, "prior_defaults": defaults}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = VBMixture(**kw).fit(X)
    model = VBMixture(**kw)
    batches = np.array_split(X, 5)
    for batch in [*batches, batches[2]]:
        model.partial_fit(batch)
    assert len(model.partial_state_.moments) == 5
    for name in ("mean", "covariance", "degrees_of_freedom"):
        want, got = getattr(full.prior_, name), getattr(model.prior_, name)
        if name == "covariance" and "degrees_of_freedom" in full.prior_.empirical:
            continue  # re-estimated by the bound, not a data default
        if "strength" in full.prior_.empirical and name != "mean":  # nu0 the bound's, the variance the rows'
            if name == "covariance":
                np.testing.assert_allclose(got / model.prior_.degrees_of_freedom,
                                           want / full.prior_.degrees_of_freedom, rtol=1e-10)
            continue
        np.testing.assert_allclose(got, want, rtol=1e-10, err_msg=name)
    assert model.prior_.n_components == full.prior_.n_components
    total = tree_reduce(model.partial_state_.memos).stats
    assert elbo_terms(total, model.posterior_, model.prior_).total == model.lower_bound_


def test_a_call_that_fails_changes_nothing(monkeypatch):
    """A batch whose pass fails (a worker lost, say) leaves the model as it was: its prior, kept
    statistics and moments; the next call folds the batch in as if the failure had not happened."""
    import pipeline.fit.partial

    kw = {**KW, "prior_defaults": "empirical"}
    model, twin = VBMixture(**kw), VBMixture(**kw)
    batches = np.array_split(X, 3)
    for m in (model, twin):
        m.partial_fit(batches[0])
        m.partial_fit(batches[1])
    prior, state = model.prior_, model.partial_state_
    n_memos, n_moments = len(state.memos), len(state.moments)

    def broken(*args, **kwargs):
        raise RuntimeError("the pass failed")

    with monkeypatch.context() as patch:
        patch.setattr(pipeline.fit.partial, "vbem_pass", broken)
        with pytest.raises(RuntimeError, match="the pass failed"):
            model.partial_fit(batches[2])
    assert model.partial_state_.prior is prior and model.prior_ is prior
    assert len(state.memos) == n_memos and len(state.moments) == n_moments
    model.partial_fit(batches[2])
    twin.partial_fit(batches[2])
    same_fit_bits(model, twin)


def test_batches_are_projected_onto_the_first_batchs_components():
    """``pca``: the first call's projection pass fixes the space every later batch is projected onto
    (a second call once failed: 'X has 4 features, but VBMixture is expecting 3'); a model fitted by
    ``fit`` continues in ``fit``'s space; the bound stays exact and monotone there."""
    kw = {**KW, "pca": 3}
    model = VBMixture(**kw)
    batches = np.array_split(X, 3)
    model.partial_fit(batches[0])
    first = model.projection_.to_arrays()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = VBMixture(**kw).fit(batches[0])
    for key, value in fitted.projection_.to_arrays().items():  # the first call is fit of its batch
        assert np.array_equal(value, first[key]), key
    for batch in batches[1:]:
        model.partial_fit(batch)
        assert np.all(np.diff(model.lower_bounds_) >= -1e-9 * abs(model.lower_bound_))
    for key, value in model.projection_.to_arrays().items():
        assert np.array_equal(value, first[key]), key
    total = tree_reduce(model.partial_state_.memos).stats
    assert elbo_terms(total, model.posterior_, model.prior_).total == model.lower_bound_
    assert model.predict(X).shape == (X.shape[0],) and model.n_features_in_ == 4
    fitted.partial_fit(batches[1])  # a model fitted by fit: its projection
    assert np.array_equal(fitted.projection_.components, first["projection_components"])
    with pytest.raises(ConfigError, match=r"partial_fit: its projection does not match the data or settings "
                                          r"\(pca 3 -> 2\)"):
        fitted.set_params(pca=2).partial_fit(batches[2])
    unprojected = r"partial_fit: pca=2, but the model was fitted without a projection"
    with pytest.raises(ConfigError, match=unprojected):
        VBMixture(**KW).partial_fit(batches[0]).set_params(pca=2).partial_fit(batches[1])
