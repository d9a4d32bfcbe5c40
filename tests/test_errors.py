"""Every bad input gets one clear, typed error whose message names what is wrong and where."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse
from sklearn.datasets import load_iris
from sklearn.exceptions import NotFittedError

from pipeline import VBMixture
from vbcore.errors import ConfigError, InputError, NumericalError, VBClusterError


@pytest.fixture(scope="module")
def iris():
    return load_iris().data.astype(np.float64)


@pytest.fixture(scope="module")
def fitted(iris):
    return VBMixture(n_components=3, covariance_type="diag", max_iter=10, random_state=0).fit(iris)


def _fit(X, **kw):
    kw.setdefault("n_components", 2)
    kw.setdefault("max_iter", 2)
    kw.setdefault("random_state", 0)
    return VBMixture(**kw).fit(X)


def test_error_types_are_value_errors():
    for err in (InputError, ConfigError, NumericalError):
        assert issubclass(err, ValueError)
        assert issubclass(err, VBClusterError)
    assert not issubclass(VBClusterError, ValueError)


# ---- data ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_X_names_row_and_column(iris, bad):
    X = iris.copy()
    X[7, 2] = bad
    with pytest.raises(InputError, match=r"row 7, column 2"):
        _fit(X)


def test_non_finite_float32_X_names_row_and_column(iris):
    X = iris.astype(np.float32)
    X[11, 0] = np.nan
    with pytest.raises(InputError, match=r"row 11, column 0"):
        _fit(X)


def test_first_non_finite_entry_is_reported(iris):
    X = iris.copy()
    X[9, 1] = np.inf
    X[7, 3] = np.nan  # row-major first
    with pytest.raises(InputError, match=r"row 7, column 3"):
        _fit(X)


@pytest.mark.parametrize("method", ["predict", "predict_proba", "score_samples", "score"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_X_after_fitting(iris, fitted, method, bad):
    X = iris[:20].copy()
    X[7, 2] = bad
    with pytest.raises(InputError, match=r"row 7, column 2"):
        getattr(fitted, method)(X)


@pytest.mark.parametrize(
    "X, pattern",
    [
        (np.arange(10.0), r"2-D.*got 1-D"),
        (np.zeros((4, 3, 2)), r"2-D.*got 3-D"),
        (np.float64(3.0), r"2-D.*got 0-D"),
        (np.zeros((0, 4)), r"n_samples=0"),
        (np.zeros((5, 0)), r"n_features=0"),
        (np.array([["a", "b"], ["c", "d"]]), r"numeric"),
        (np.array([[1.0, 2.0], [3.0, 4.0]]) + 1j, r"Complex data not supported"),
        (np.array([[1.0, {"a": 1}]], dtype=object), r"must be numeric.*dict"),
        (sparse.csr_matrix(np.eye(3)), r"sparse input is not supported.*toarray"),
    ],
    ids=["1d", "3d", "0d", "no-rows", "no-columns", "strings", "complex", "object", "sparse"],
)
def test_bad_X_shapes_and_types(X, pattern):
    with pytest.raises(InputError, match=pattern):
        _fit(X)


def test_bad_X_in_predict(fitted):
    with pytest.raises(InputError, match=r"2-D"):
        fitted.predict(np.zeros(4))
    with pytest.raises(InputError, match=r"n_samples=0"):
        fitted.predict(np.zeros((0, 4)))
    with pytest.raises(InputError, match=r"numeric"):
        fitted.score_samples([["x", "y", "z", "w"]])


def test_predict_with_other_number_of_features(iris, fitted):
    for method in ("predict", "predict_proba", "score_samples", "score"):
        with pytest.raises(InputError, match=r"X has 3 features, but VBMixture is expecting 4 features"):
            getattr(fitted, method)(iris[:, :3])


@pytest.mark.parametrize("method", ["predict", "predict_proba", "score_samples", "score"])
def test_unfitted_model_raises_not_fitted(iris, method):
    with pytest.raises(NotFittedError):
        getattr(VBMixture(n_components=2), method)(iris)


# ---- settings ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params, pattern",
    [
        (dict(n_components=0), r"n_components.*got 0"),
        (dict(n_components=-1), r"n_components.*got -1"),
        (dict(n_components=2.5), r"n_components.*got 2\.5"),
        (dict(n_components=True), r"n_components.*got True"),
        (dict(n_components="3"), r"n_components"),
        (dict(covariance_type="banana"), r"covariance_type.*'banana'"),
        (dict(weight_concentration_prior_type="x"), r"weight_concentration_prior_type.*'x'"),
        (dict(learner="nope"), r"learner.*'nope'"),
        (dict(init_params="x"), r"init_params.*'x'"),
        (dict(max_iter=-1), r"max_iter.*got -1"),
        (dict(max_iter=2.5), r"max_iter"),
        (dict(max_iter=True), r"max_iter"),
        (dict(tol=-1), r"tol.*got -1"),
        (dict(tol=np.nan), r"tol.*got nan"),
        (dict(tol=np.inf), r"tol"),
        (dict(reg_covar=-1), r"reg_covar.*got -1"),
        (dict(reg_covar=np.nan), r"reg_covar"),
        (dict(chunk_rows=0), r"chunk_rows.*got 0"),
        (dict(chunk_rows=-5), r"chunk_rows"),
        (dict(chunk_rows=2.5), r"chunk_rows"),
    ],
    ids=lambda v: repr(v) if not isinstance(v, dict) else None,
)
def test_bad_settings(iris, params, pattern):
    with pytest.raises(ConfigError, match=pattern):
        _fit(iris, **params)


# ---- priors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1, np.nan, np.inf])
def test_weight_concentration_prior(iris, value):
    with pytest.raises(ConfigError, match=r"weight_concentration_prior must"):
        _fit(iris, weight_concentration_prior=value)


@pytest.mark.parametrize("value", [0, -1, np.nan])
def test_mean_precision_prior(iris, value):
    with pytest.raises(ConfigError, match=r"mean_precision_prior"):
        _fit(iris, mean_precision_prior=value)


@pytest.mark.parametrize("value", [np.zeros(3), np.zeros(5), np.zeros((4, 1)), 0.0])
def test_mean_prior_wrong_shape(iris, value):
    with pytest.raises(ConfigError, match=r"mean_prior.*shape"):
        _fit(iris, mean_prior=value)


def test_mean_prior_not_finite(iris):
    with pytest.raises(ConfigError, match=r"mean_prior.*finite"):
        _fit(iris, mean_prior=np.array([0.0, np.nan, 0.0, 0.0]))


@pytest.mark.parametrize("value", [3.0, 2.0, 0.0, -1.0, np.nan])
def test_degrees_of_freedom_prior_full(iris, value):
    # iris has D = 4: 'full' needs nu0 > D - 1 = 3
    with pytest.raises(ConfigError, match=r"degrees_of_freedom_prior.*> n_features - 1 = 3"):
        _fit(iris, covariance_type="full", degrees_of_freedom_prior=value)


def test_degrees_of_freedom_prior_full_just_above_bound_is_accepted(iris):
    m = _fit(iris, covariance_type="full", degrees_of_freedom_prior=3.5)
    np.testing.assert_allclose(m.degrees_of_freedom_.sum(), 2 * 3.5 + iris.shape[0])


@pytest.mark.parametrize("ct", ["diag", "spherical"])
@pytest.mark.parametrize("value", [0.0, -1.0, np.nan])
def test_degrees_of_freedom_prior_diagonal_families(iris, ct, value):
    with pytest.raises(ConfigError, match=r"degrees_of_freedom_prior"):
        _fit(iris, covariance_type=ct, degrees_of_freedom_prior=value)


@pytest.mark.parametrize(
    "ct, value",
    [
        ("full", np.eye(3)),
        ("full", np.ones(4)),
        ("full", 1.0),
        ("diag", np.ones(3)),
        ("diag", np.eye(4)),
        ("spherical", np.ones(4)),
        ("spherical", np.eye(4)),
    ],
)
def test_covariance_prior_wrong_shape(iris, ct, value):
    with pytest.raises(ConfigError, match=rf"covariance_prior must have shape.*{ct}"):
        _fit(iris, covariance_type=ct, covariance_prior=value)


def test_covariance_prior_not_symmetric(iris):
    c = np.eye(4)
    c[0, 1] = 0.5  # positive definite but not symmetric
    with pytest.raises(ConfigError, match=r"covariance_prior must be symmetric"):
        _fit(iris, covariance_type="full", covariance_prior=c)


@pytest.mark.parametrize("c", [-np.eye(4), np.ones((4, 4)), np.diag([1.0, 1.0, 0.0, 1.0])])
def test_covariance_prior_not_positive_definite(iris, c):
    with pytest.raises(ConfigError, match=r"covariance_prior must be positive definite"):
        _fit(iris, covariance_type="full", covariance_prior=c)


@pytest.mark.parametrize("ct", ["full", "diag", "spherical"])
def test_covariance_prior_not_finite(iris, ct):
    value = {"full": np.full((4, 4), np.nan), "diag": np.array([1.0, np.inf, 1.0, 1.0]),
             "spherical": np.nan}[ct]
    with pytest.raises(ConfigError, match=r"covariance_prior.*non-finite"):
        _fit(iris, covariance_type=ct, covariance_prior=value)


@pytest.mark.parametrize("bad", [0.0, -0.5])
def test_covariance_prior_diag_non_positive_entry(iris, bad):
    c = np.ones(4)
    c[2] = bad
    with pytest.raises(ConfigError, match=r"covariance_prior must be > 0.*entry 2"):
        _fit(iris, covariance_type="diag", covariance_prior=c)


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_covariance_prior_spherical_non_positive(iris, bad):
    with pytest.raises(ConfigError, match=r"covariance_prior must be > 0"):
        _fit(iris, covariance_type="spherical", covariance_prior=bad)


@pytest.mark.parametrize("value", [0, -2, np.nan])
def test_fixed_variance(iris, value):
    with pytest.raises(ConfigError, match=r"fixed_variance"):
        _fit(iris, covariance_type="fixed", fixed_variance=value)


# ---- resp_init -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(150, 3), (149, 2), (150,), (2, 150)])
def test_resp_init_wrong_shape(iris, shape):
    r = np.full(shape, 1.0 / (shape[-1] if len(shape) > 1 else 1))
    with pytest.raises(InputError, match=r"resp_init must have shape.*\(150, 2\)"):
        VBMixture(n_components=2, max_iter=2).fit(iris, resp_init=r)


def test_resp_init_negative_entry(iris):
    r = np.full((150, 2), 0.5)
    r[3] = [1.5, -0.5]  # sums to 1 but is negative
    with pytest.raises(InputError, match=r"resp_init.*>= 0.*row 3\b"):
        VBMixture(n_components=2, max_iter=2).fit(iris, resp_init=r)


def test_resp_init_non_finite_entry(iris):
    r = np.full((150, 2), 0.5)
    r[12, 1] = np.nan
    with pytest.raises(InputError, match=r"resp_init.*finite.*row 12\b"):
        VBMixture(n_components=2, max_iter=2).fit(iris, resp_init=r)


def test_resp_init_row_not_summing_to_one(iris):
    r = np.full((150, 2), 0.5)
    r[5] = [0.5, 0.6]
    with pytest.raises(InputError, match=r"resp_init rows must sum to 1; row 5 sums to .*1\.1"):
        VBMixture(n_components=2, max_iter=2).fit(iris, resp_init=r)


def _bad_sum_resp():
    r = np.full((150, 2), 0.5)
    r[5] = [0.5, 0.6]
    return r


def _nan_X(iris):
    X = iris.copy()
    X[7, 2] = np.nan
    return X


@pytest.mark.parametrize("case", ["resp_init_sum", "X_nan"])
def test_messages_show_plain_numbers(iris, case):
    with pytest.raises(InputError) as info:
        if case == "resp_init_sum":
            VBMixture(n_components=2, max_iter=2).fit(iris, resp_init=_bad_sum_resp())
        else:
            VBMixture(n_components=2, max_iter=2).fit(_nan_X(iris))
    assert "np.float64" not in str(info.value)
    assert ("sums to 1.1" in str(info.value)) if case == "resp_init_sum" else (": nan" in str(info.value))


def test_resp_init_with_warm_start_on_fitted_model(iris):
    r = np.full((150, 2), 0.5)
    # allowed while the model is unfitted
    m = VBMixture(n_components=2, max_iter=2, warm_start=True).fit(iris, resp_init=r)
    with pytest.raises(ConfigError, match=r"resp_init.*warm_start"):
        m.fit(iris, resp_init=r)


# ---- warm start ----------------------------------------------------------------------------------
def test_warm_start_with_other_n_features(iris):
    m = VBMixture(n_components=2, max_iter=2, warm_start=True, random_state=0).fit(iris)
    with pytest.raises(ConfigError, match=r"warm_start.*n_features 4 -> 3"):
        m.fit(iris[:, :3])


def test_warm_start_with_other_covariance_type(iris):
    m = VBMixture(n_components=2, max_iter=2, warm_start=True, random_state=0).fit(iris)
    m.set_params(covariance_type="diag")
    with pytest.raises(ConfigError, match=r"warm_start.*covariance_type 'full' -> 'diag'"):
        m.fit(iris)


# ---- a failed fit changes nothing ----------------------------------------------------------------
def _snapshot(m):
    return {
        "means_": m.means_.copy(),
        "covariances_": m.covariances_.copy(),
        "weights_": m.weights_.copy(),
        "lower_bound_": m.lower_bound_,
        "lower_bounds_": m.lower_bounds_.copy(),
        "n_iter_": m.n_iter_,
        "n_features_in_": m.n_features_in_,
    }


def _assert_unchanged(m, snap):
    for name, value in snap.items():
        np.testing.assert_array_equal(getattr(m, name), value, err_msg=name)


@pytest.mark.parametrize("warm_start", [False, True])
def test_failed_fit_leaves_fitted_model_unchanged(iris, warm_start):
    m = VBMixture(n_components=3, covariance_type="diag", max_iter=5, random_state=0,
                  warm_start=warm_start).fit(iris)
    snap = _snapshot(m)
    labels = m.predict(iris)

    X = iris.copy()
    X[7, 2] = np.nan
    with pytest.raises(InputError, match=r"row 7, column 2"):
        m.fit(X)
    _assert_unchanged(m, snap)

    with pytest.raises(InputError, match=r"resp_init must have shape"):
        m.set_params(warm_start=False).fit(iris, resp_init=np.ones((150, 2)))
    _assert_unchanged(m, snap)

    m.set_params(covariance_prior=np.array([1.0, 0.0, 1.0, 1.0]))
    with pytest.raises(ConfigError, match=r"covariance_prior"):
        m.fit(iris)
    _assert_unchanged(m, snap)

    m.set_params(covariance_prior=None, covariance_type="banana")
    with pytest.raises(ConfigError, match=r"covariance_type"):
        m.fit(iris)
    _assert_unchanged(m, snap)

    np.testing.assert_array_equal(m.set_params(covariance_type="diag").predict(iris), labels)


# ---- once-found defects, now fixed (kept as regression tests) -----------------------------------
def test_warm_start_with_other_n_components(iris):
    m = VBMixture(n_components=3, max_iter=2, warm_start=True, random_state=0).fit(iris)
    m.set_params(n_components=5)
    with pytest.raises(ConfigError, match=r"warm_start.*n_components 3 -> 5"):
        m.fit(iris)
    assert m.means_.shape == (3, 4)  # the fitted model is untouched


def test_warm_start_with_other_weight_type(iris):
    m = VBMixture(n_components=3, max_iter=2, warm_start=True, random_state=0).fit(iris)
    m.set_params(weight_concentration_prior_type="dirichlet_distribution")
    with pytest.raises(ConfigError, match=r"warm_start.*weight_concentration_prior_type"):
        m.fit(iris)


@pytest.mark.parametrize("name, value", [("tol", None), ("reg_covar", None),
                                         ("weight_concentration_prior", "a"),
                                         ("mean_precision_prior", "a"),
                                         ("degrees_of_freedom_prior", "a"),
                                         ("covariance_prior", "a"),
                                         ("mean_prior", ["a"] * 4)])
def test_non_numeric_settings_raise_config_error(iris, name, value):
    with pytest.raises(ConfigError, match=name):
        _fit(iris, **{name: value})


def test_singular_default_prior_blames_the_data(iris):
    with pytest.raises(ConfigError, match=r"covariance of the data .* is singular.*too few rows"):
        VBMixture(n_components=1, max_iter=2).fit(iris[:2])


def test_one_row_is_no_mixture(tmp_path):
    """One row (an array or a store): one line, where a fit of it once ran 200 iterations to report 0
    clusters; a ``partial_fit`` batch may still be one row."""
    from pipeline.store.features import FeatureStore

    with pytest.raises(InputError, match=r"array of shape \(1, 3\): found 1 sample\(s\) \(rows\) while a "
                                         r"minimum of 2 is required to fit a mixture"):
        VBMixture(2).fit(np.ones((1, 3)))
    FeatureStore.create(tmp_path / "one.zarr", 3, chunk_rows=4).append(np.ones((1, 3), dtype=np.float32))
    one = r"one\.zarr \(1 x 3\): found 1 sample\(s\) \(rows\) while a minimum of 2"
    with pytest.raises(InputError, match=one):
        VBMixture(2, learner="sga-f").fit(str(tmp_path / "one.zarr"))
    model = VBMixture(2, covariance_type="diag").partial_fit(np.random.default_rng(0).normal(size=(50, 3)))
    assert model.partial_fit(np.ones((1, 3))).n_features_in_ == 3


def test_a_reg_covar_that_swamps_the_data_warns():
    """Features of scale 1e-4 (three classes 5 deviations apart): the absolute reg_covar 1e-6 is 7.6
    times the data's variance per dimension and the fit finds one cluster; the warning names the
    fix, which finds the three."""
    rng = np.random.default_rng(0)
    centres, y = rng.normal(size=(3, 8)) * 5, rng.integers(0, 3, 3000)
    x = centres[y] + rng.normal(size=(3000, 8))
    from pipeline.fit.spec import estimator_params

    kw = dict(estimator_params(), n_components=6, covariance_type="diag", random_state=0)  # the CLI's model
    with pytest.warns(UserWarning, match=r"^reg_covar 1e-06 is 7\.\d+ times the data's mean variance per "
                                         r"dimension .*rescale \(standardise\) the features or lower "
                                         r"reg_covar$") as caught:
        swamped = VBMixture(**kw).fit(x * 1e-4)
    assert swamped.n_effective_ == 1
    assert "--reg-covar" not in str(caught[0].message)  # the estimator's words only
    cli = caught[0].message.worded("cli")  # the command line's (pipeline/cli_format.show_warning)
    assert cli.startswith("--reg-covar 1e-06 is 7.") and cli.endswith("or lower --reg-covar"), cli
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # neither at the data's own scale nor with the fix
        from sklearn.exceptions import ConvergenceWarning

        warnings.simplefilter("ignore", ConvergenceWarning)
        assert VBMixture(**kw).fit(x).n_effective_ == 3
        assert VBMixture(reg_covar=1e-14, **kw).fit(x * 1e-4).n_effective_ == 3


def test_the_command_line_prints_a_faced_warning_in_its_own_words(capsys):
    """pipeline/cli_format.show_warning (the CLI's warnings.showwarning) prints a FacedWarning with the
    flags, one line; the same warning's str() names the estimator's parameter."""
    from pipeline.cli_format import show_warning
    from vbcore.errors import FacedWarning

    w = FacedWarning("{reg_covar} 0.5 is 3 times the data's mean variance; lower {reg_covar}")
    assert str(w) == "reg_covar 0.5 is 3 times the data's mean variance; lower reg_covar"
    show_warning(w, FacedWarning, "f.py", 1)
    assert capsys.readouterr().err == ("warning: --reg-covar 0.5 is 3 times the data's mean variance; "
                                       "lower --reg-covar\n")
