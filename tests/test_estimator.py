"""``pipeline.VBMixture`` behaves like a scikit-learn estimator.

References are independent of the package: scikit-learn's own utilities (clone, pipelines,
cross-validation) and, for ``score_samples``, the posterior predictive rebuilt from the fitted
attributes with nothing but ``scipy.stats`` distributions (Bishop eq. 10.81 and its Gamma
analogues).
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp
from sklearn.base import clone
from sklearn.datasets import load_iris
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.validation import check_is_fitted

from pipeline import VBMixture

COV_TYPES = ["full", "diag", "spherical", "fixed"]
WEIGHT_TYPES = ["dirichlet_process", "dirichlet_distribution"]
INIT_PARAMS = ["kmeans", "k-means++", "random", "random_from_data"]


@pytest.fixture(scope="module")
def iris():
    return load_iris().data.astype(np.float64)


def _resp(n, k, seed=0):
    return np.random.default_rng(seed).dirichlet(np.ones(k), size=n)


def _fitted_attrs(est):
    return sorted(a for a in vars(est) if a.endswith("_") and not a.startswith("_"))


# ---- 1. parameters, clone ----------------------------------------------------------------------
def test_get_params_lists_every_constructor_argument():
    names = [p for p in inspect.signature(VBMixture.__init__).parameters if p != "self"]
    est = VBMixture(n_components=4, covariance_type="diag", random_state=3)
    params = est.get_params()
    assert sorted(params) == sorted(names)
    assert params["n_components"] == 4
    assert params["covariance_type"] == "diag"
    assert params["random_state"] == 3


def test_set_params_changes_the_parameter():
    est = VBMixture(n_components=5)
    assert est.set_params(n_components=3) is est
    assert est.n_components == 3
    assert est.get_params()["n_components"] == 3


def test_clone_copies_params_and_drops_fitted_state(iris):
    est = VBMixture(n_components=3, covariance_type="diag", max_iter=5, random_state=0).fit(iris)
    assert _fitted_attrs(est)  # the fitted one has them
    cloned = clone(est)
    assert cloned is not est
    assert cloned.get_params() == est.get_params()
    assert _fitted_attrs(cloned) == []
    with pytest.raises(NotFittedError):
        check_is_fitted(cloned)
    with pytest.raises(NotFittedError):
        cloned.predict(iris)
    # clone of an unfitted estimator too
    fresh = clone(VBMixture(n_components=2, tol=1e-4))
    assert fresh.get_params()["tol"] == 1e-4
    assert _fitted_attrs(fresh) == []


# ---- 2. fitted attributes ----------------------------------------------------------------------
@pytest.mark.parametrize("wt", WEIGHT_TYPES)
@pytest.mark.parametrize("ct", COV_TYPES)
def test_fitted_attributes_have_sklearn_shapes(iris, ct, wt):
    X = iris
    n, d = X.shape
    k = 5
    m = VBMixture(n_components=k, covariance_type=ct, weight_concentration_prior_type=wt,
                  max_iter=30, random_state=0).fit(X)
    assert m.n_features_in_ == d
    assert m.weights_.shape == (k,)
    assert np.all(m.weights_ >= 0)
    assert m.weights_.sum() == pytest.approx(1.0, abs=1e-12)
    assert m.means_.shape == (k, d)
    cov_shape = {"full": (k, d, d), "diag": (k, d), "spherical": (k,), "fixed": (k,)}[ct]
    assert m.covariances_.shape == cov_shape
    assert m.precisions_.shape == cov_shape
    assert m.precisions_cholesky_.shape == cov_shape
    if ct == "full":
        eye = np.broadcast_to(np.eye(d), (k, d, d))
        np.testing.assert_allclose(m.precisions_ @ m.covariances_, eye, atol=1e-8)
        # precisions_ = U U^T with U = precisions_cholesky_ (scikit-learn's layout)
        u = m.precisions_cholesky_
        np.testing.assert_allclose(u @ u.transpose(0, 2, 1), m.precisions_, rtol=1e-12)
    else:
        np.testing.assert_allclose(m.precisions_ * m.covariances_, 1.0, rtol=1e-12)
        np.testing.assert_allclose(m.precisions_cholesky_**2, m.precisions_, rtol=1e-12)
    if ct == "fixed":
        assert m.degrees_of_freedom_ is None
    else:
        assert m.degrees_of_freedom_.shape == (k,)
        assert np.all(m.degrees_of_freedom_ > 0)
    assert m.mean_precision_.shape == (k,)
    assert np.all(m.mean_precision_ > 0)
    if wt == "dirichlet_process":
        assert isinstance(m.weight_concentration_, tuple)
        assert len(m.weight_concentration_) == 2
        assert all(np.shape(a) == (k,) for a in m.weight_concentration_)
    else:
        assert isinstance(m.weight_concentration_, np.ndarray)
        assert m.weight_concentration_.shape == (k,)
        alpha = m.weight_concentration_
        np.testing.assert_allclose(m.weights_, alpha / alpha.sum(), rtol=1e-12)
    assert isinstance(m.converged_, (bool, np.bool_))
    assert isinstance(m.n_iter_, int) and 1 <= m.n_iter_ <= 30
    assert len(m.lower_bounds_) == m.n_iter_
    assert m.lower_bound_ == m.lower_bounds_[-1]
    assert np.isfinite(m.lower_bound_)
    assert set(m.elbo_terms_) == {"log_likelihood", "kl_assignments", "kl_weights",
                                  "kl_components", "total"}
    t = m.elbo_terms_
    assert t["total"] == m.lower_bound_
    assert t["total"] == pytest.approx(
        t["log_likelihood"] - t["kl_assignments"] - t["kl_weights"] - t["kl_components"], rel=1e-12
    )


# ---- 3. predictions ----------------------------------------------------------------------------
@pytest.mark.parametrize("ct", COV_TYPES)
def test_predict_proba_and_predict(iris, ct):
    k = 4
    m = VBMixture(n_components=k, covariance_type=ct, max_iter=20, random_state=0).fit(iris)
    p = m.predict_proba(iris)
    assert p.shape == (iris.shape[0], k)
    assert np.all(p >= 0)
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(m.predict(iris), p.argmax(1))


@pytest.mark.parametrize("init", ["kmeans", "random"])
def test_fit_predict_equals_fit_then_predict(iris, init):
    kw = dict(n_components=4, covariance_type="full", init_params=init, max_iter=20, random_state=7)
    labels = VBMixture(**kw).fit_predict(iris)
    np.testing.assert_array_equal(labels, VBMixture(**kw).fit(iris).predict(iris))
    assert labels.shape == (iris.shape[0],)


@pytest.mark.parametrize("init", ["kmeans", "k-means++"])
def test_the_kmeans_starts_see_a_sample_of_sample_size_rows(monkeypatch, init):
    """One 65,536-row chunk of an array used to hand scikit-learn's k-means every row (70,000
    Fashion-MNIST rows: 59 s of an 81 s fit); it gets ``sample_size(K)`` distinct rows of the data,
    drawn with the fit's seed, and none when the data are smaller."""
    import sklearn.cluster

    from pipeline.fit.setup import sample_size

    seen = []
    real = sklearn.cluster.KMeans.fit if init == "kmeans" else sklearn.cluster.kmeans_plusplus

    def spy(*args, **kwargs):
        seen.append(np.array(args[1] if init == "kmeans" else args[0]))
        return real(*args, **kwargs)

    if init == "kmeans":
        monkeypatch.setattr(sklearn.cluster.KMeans, "fit", spy)
    else:
        monkeypatch.setattr(sklearn.cluster, "kmeans_plusplus", spy)
    X = np.random.default_rng(0).normal(size=(sample_size(3) + 2500, 2)).astype(np.float32)
    kw = dict(n_components=3, init_params=init, max_iter=1, random_state=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one iteration: not converged
        VBMixture(**kw).fit(X)
        VBMixture(**kw).fit(X)
        VBMixture(**kw).fit(X[: sample_size(3) - 1])
    assert [a.shape[0] for a in seen] == [sample_size(3)] * 2 + [sample_size(3) - 1]
    np.testing.assert_array_equal(seen[0], seen[1])  # the seed decides the sample
    assert np.unique(seen[0], axis=0).shape[0] == sample_size(3)
    rows = {r.tobytes() for r in X.astype(np.float64)}
    assert all(r.tobytes() in rows for r in seen[0][:50])  # rows of the data, not new ones


# ---- 4. score_samples against a scipy.stats reference ------------------------------------------
def _component_logpdf(X, ct, loc, beta, nu, cov):
    """Posterior (or prior) predictive of one component, built only from scipy.stats."""
    d = X.shape[1]
    if ct == "full":
        df = nu + 1 - d
        shape = cov * nu * (1 + beta) / (beta * df)
        return stats.multivariate_t(loc=loc, shape=shape, df=df).logpdf(X)
    if ct == "diag":
        scale = np.sqrt(cov * (1 + beta) / beta)
        return sum(stats.t(df=nu, loc=loc[j], scale=scale[j]).logpdf(X[:, j]) for j in range(d))
    if ct == "spherical":
        shape = cov * (1 + beta) / beta * np.eye(d)
        return stats.multivariate_t(loc=loc, shape=shape, df=nu * d).logpdf(X)
    assert ct == "fixed"
    return stats.multivariate_normal(mean=loc, cov=cov * (1 + 1 / beta) * np.eye(d)).logpdf(X)


def _reference_score_samples(model, X):
    ct = model.covariance_type
    k = model.n_components
    nu = model.degrees_of_freedom_
    if model.weight_concentration_prior_type == "dirichlet_distribution":
        alpha = np.asarray(model.weight_concentration_)
        w = alpha / alpha.sum()
        rest = 0.0
    else:
        a, b = model.weight_concentration_
        ev = a / (a + b)
        w = np.array([ev[j] * np.prod(1 - ev[:j]) for j in range(k)])
        rest = 1.0 - w.sum()
        assert 0 < rest < 1
        assert w.sum() + rest == pytest.approx(1.0, abs=1e-15)
        np.testing.assert_allclose(model.weights_, w / w.sum(), rtol=1e-12)
    cols = [np.log(w[j]) + _component_logpdf(X, ct, model.means_[j], model.mean_precision_[j],
                                             None if nu is None else nu[j], model.covariances_[j])
            for j in range(k)]
    if rest > 0:
        p = model.prior_
        if ct == "fixed":
            nu0, cov0 = None, p.fixed_variance
        else:
            nu0 = p.degrees_of_freedom
            cov0 = np.asarray(p.covariance) / nu0
        cols.append(np.log(rest) + _component_logpdf(X, ct, p.mean, p.mean_precision, nu0, cov0))
    return logsumexp(np.stack(cols, axis=1), axis=1)


@pytest.mark.parametrize("wt", WEIGHT_TYPES)
@pytest.mark.parametrize("ct", COV_TYPES)
def test_score_samples_matches_scipy_predictive(iris, ct, wt):
    m = VBMixture(n_components=5, covariance_type=ct, weight_concentration_prior_type=wt,
                  max_iter=30, random_state=0).fit(iris)
    # evaluate on the data and on points away from it (heavy tails matter there)
    rng = np.random.default_rng(1)
    X = np.vstack([iris, iris.mean(0) + 3 * iris.std(0) * rng.standard_normal((20, iris.shape[1]))])
    ref = _reference_score_samples(m, X)
    got = m.score_samples(X)
    assert got.shape == (X.shape[0],)
    np.testing.assert_allclose(got, ref, rtol=1e-9)
    assert m.score(X) == pytest.approx(np.mean(ref), rel=1e-9)
    assert m.score(X) == pytest.approx(np.mean(got), rel=1e-14)


# ---- 5. warm start -----------------------------------------------------------------------------
@pytest.mark.parametrize("ct", ["full", "diag"])
def test_warm_start_continues_from_the_posterior(iris, ct):
    k = 4
    R = _resp(iris.shape[0], k)
    kw = dict(n_components=k, covariance_type=ct, tol=0.0, random_state=0)
    cold = VBMixture(max_iter=10, **kw).fit(iris, resp_init=R)
    warm = VBMixture(max_iter=5, warm_start=True, **kw).fit(iris, resp_init=R)
    first_bound = warm.lower_bound_
    first_bounds = warm.lower_bounds_.copy()
    warm.fit(iris)
    assert warm.n_iter_ == 5
    assert warm.lower_bounds_[0] >= first_bound - 1e-9 * abs(first_bound)
    np.testing.assert_allclose(np.concatenate([first_bounds, warm.lower_bounds_]),
                               cold.lower_bounds_, rtol=1e-10)
    np.testing.assert_allclose(warm.lower_bound_, cold.lower_bound_, rtol=1e-10)
    np.testing.assert_allclose(warm.means_, cold.means_, rtol=1e-10)
    np.testing.assert_allclose(warm.covariances_, cold.covariances_, rtol=1e-10)
    np.testing.assert_allclose(warm.weights_, cold.weights_, rtol=1e-10)


def test_without_warm_start_refit_starts_over(iris):
    R = _resp(iris.shape[0], 3)
    kw = dict(n_components=3, covariance_type="diag", tol=0.0, max_iter=5)
    a = VBMixture(**kw).fit(iris, resp_init=R)
    b = VBMixture(**kw).fit(iris, resp_init=R)
    a.fit(iris, resp_init=R)  # warm_start=False: the same as a fresh fit
    np.testing.assert_array_equal(a.lower_bounds_, b.lower_bounds_)


# ---- 6. determinism ----------------------------------------------------------------------------
@pytest.mark.parametrize("init", INIT_PARAMS)
def test_same_random_state_is_bitwise_reproducible(iris, init):
    kw = dict(n_components=4, covariance_type="full", init_params=init, max_iter=15)
    a = VBMixture(random_state=0, **kw).fit(iris)
    b = VBMixture(random_state=0, **kw).fit(iris)
    assert np.array_equal(a.means_, b.means_)
    assert np.array_equal(a.lower_bounds_, b.lower_bounds_)
    assert np.array_equal(a.covariances_, b.covariances_)


def test_different_random_state_differs():
    X = load_iris().data
    kw = dict(n_components=4, covariance_type="full", init_params="random", max_iter=3)
    a = VBMixture(random_state=0, **kw).fit(X)
    b = VBMixture(random_state=1, **kw).fit(X)
    assert not np.array_equal(a.means_, b.means_)
    assert not np.array_equal(a.lower_bounds_, b.lower_bounds_)


# ---- 7. chunking -------------------------------------------------------------------------------
@pytest.mark.parametrize("wt", WEIGHT_TYPES)
@pytest.mark.parametrize("ct", ["full", "diag"])
def test_chunk_rows_does_not_change_the_answer(iris, ct, wt):
    k = 5
    R = _resp(iris.shape[0], k, seed=2)
    kw = dict(n_components=k, covariance_type=ct, weight_concentration_prior_type=wt,
              max_iter=20, tol=0.0)
    small = VBMixture(chunk_rows=7, **kw).fit(iris, resp_init=R)
    big = VBMixture(chunk_rows=10**6, **kw).fit(iris, resp_init=R)
    np.testing.assert_allclose(small.means_, big.means_, rtol=1e-10)
    np.testing.assert_allclose(small.covariances_, big.covariances_, rtol=1e-10)
    np.testing.assert_allclose(small.lower_bounds_, big.lower_bounds_, rtol=1e-10)
    np.testing.assert_allclose(small.predict_proba(iris), big.predict_proba(iris), rtol=1e-8,
                               atol=1e-12)


@pytest.mark.parametrize("init", ["kmeans", "k-means++-projected"])
def test_an_array_and_its_ingested_store_give_the_same_bits(tmp_path, init):
    """In-memory arrays are cut into the chunks `vbcluster ingest` writes (8,192 rows), so the
    summation order, and every bit of the fit, is the same for the rows and for their store."""
    from pipeline.store.features import FeatureStore

    rng = np.random.default_rng(0)
    X = (rng.normal(size=(20_000, 6)) + 3 * rng.integers(0, 4, 20_000)[:, None]).astype(np.float32)
    store = FeatureStore.create(tmp_path / "s.zarr", 6, labels=False)
    store.append(X)
    assert store.chunk_rows == VBMixture().chunk_rows < X.shape[0] // 2  # several chunks each
    kw = dict(n_components=6, max_iter=10, tol=0.0, random_state=0, init_params=init)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ten iterations: not converged
        a, b = VBMixture(**kw).fit(X), VBMixture(**kw).fit(str(tmp_path / "s.zarr"))
    np.testing.assert_array_equal(a.lower_bounds_, b.lower_bounds_)
    np.testing.assert_array_equal(a.means_, b.means_)
    np.testing.assert_array_equal(a.covariances_, b.covariances_)


# ---- 8. float32 --------------------------------------------------------------------------------
@pytest.mark.parametrize("ct", ["full", "diag"])
def test_float32_input_matches_float64(iris, ct):
    k = 4
    R = _resp(iris.shape[0], k, seed=3)
    kw = dict(n_components=k, covariance_type=ct, max_iter=20, tol=0.0)
    m64 = VBMixture(**kw).fit(iris, resp_init=R)
    m32 = VBMixture(**kw).fit(iris.astype(np.float32), resp_init=R)
    assert np.isfinite(m32.lower_bound_)
    assert m32.lower_bound_ == pytest.approx(m64.lower_bound_, rel=1e-4)
    agree = np.mean(m32.predict(iris.astype(np.float32)) == m64.predict(iris))
    assert agree >= 0.99
    np.testing.assert_allclose(m32.means_, m64.means_, rtol=1e-3, atol=1e-3)


# ---- 9. scikit-learn tooling -------------------------------------------------------------------
def test_in_a_pipeline(iris):
    pipe = make_pipeline(StandardScaler(),
                         VBMixture(n_components=3, covariance_type="diag", random_state=0))
    labels = pipe.fit(iris).predict(iris)
    assert labels.shape == (iris.shape[0],)
    assert labels.min() >= 0 and labels.max() < 3
    # the pipeline's predict is the estimator's predict on the scaled data
    Z = StandardScaler().fit_transform(iris)
    np.testing.assert_array_equal(labels, pipe[-1].predict(Z))
    assert np.isfinite(pipe.score(iris))


def test_cross_val_score_uses_score(iris):
    est = VBMixture(n_components=3, covariance_type="diag", max_iter=20, random_state=0)
    scores = cross_val_score(est, iris, cv=3)
    assert scores.shape == (3,)
    assert np.all(np.isfinite(scores))


# ---- 10. max_iter=0 ----------------------------------------------------------------------------
@pytest.mark.parametrize("ct", COV_TYPES)
def test_max_iter_zero_with_resp_init(iris, ct):
    R = _resp(iris.shape[0], 3)
    m = VBMixture(n_components=3, covariance_type=ct, max_iter=0).fit(iris, resp_init=R)
    assert m.n_iter_ == 0
    assert len(m.lower_bounds_) == 0
    assert np.isfinite(m.lower_bound_)
    assert m.converged_ is False
    # the state is the single M-step from R: its means are the prior-shrunk weighted means
    beta0, m0 = m.prior_.mean_precision, m.prior_.mean
    nk = R.sum(0)
    expected = (beta0 * m0 + R.T @ iris) / (beta0 + nk)[:, None]
    np.testing.assert_allclose(m.means_, expected, rtol=1e-12)
    p = m.predict_proba(iris)
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)


def test_predict_reads_a_store_chunk_by_chunk(iris, tmp_path):
    """fit takes a store path, so predict does: the labels of the store's rows, chunk by chunk,
    equal those of the same rows as an array; the array-only methods refuse a store in one line."""
    from pipeline.ingest import ingest
    from vbcore.errors import InputError

    np.save(tmp_path / "iris.npy", iris.astype(np.float32))
    store = str(tmp_path / "iris.zarr")
    ingest(str(tmp_path / "iris.npy"), store, chunk_rows=40)  # 4 chunks, the last one short
    m = VBMixture(n_components=3, covariance_type="diag", max_iter=20, random_state=0).fit(store)
    labels = m.predict(store)
    assert labels.shape == (iris.shape[0],)
    np.testing.assert_array_equal(labels, m.predict(iris.astype(np.float32)))
    with pytest.raises(InputError, match=r"iris\.zarr: a feature store; this method takes arrays"):
        m.predict_proba(store)
