"""Awkward but legal inputs: empty components, D = 1, duplicated points, offset float32; K > N refused,
K = N."""

import numpy as np
import pytest
from sklearn.datasets import load_iris

from pipeline import VBMixture
from vbcore.errors import ConfigError, InputError

TYPES = ["full", "diag", "spherical", "fixed"]


def _monotone(lb):
    return np.diff(lb).min() >= -1e-9 * np.abs(lb).max()


@pytest.mark.parametrize("ct", TYPES)
def test_empty_components_stay_finite(ct):
    X = load_iris().data
    k = 6
    R = np.zeros((len(X), k))
    R[:, 0] = 0.5
    R[:, 1] = 0.5  # components 2..5 start empty
    # empty components kept (VB EM prunes them by default, issue 6) to check that they stay finite
    m = VBMixture(k, covariance_type=ct, reg_covar=0.0, max_iter=20, tol=0.0,
                  learner_options={"prune_below": 0.0}).fit(X, resp_init=R)
    assert np.isfinite(m.lower_bounds_).all() and _monotone(m.lower_bounds_)
    assert np.all(np.isfinite(m.means_)) and np.all(np.isfinite(m.covariances_))
    np.testing.assert_allclose(m.means_[5], m.prior_.mean)  # empty -> prior mean


@pytest.mark.parametrize("ct", TYPES)
def test_one_dimension(ct):
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(-5, 1, 200), rng.normal(5, 1, 200)])[:, None]
    m = VBMixture(5, covariance_type=ct, random_state=0, reg_covar=0.0, max_iter=200).fit(X)
    assert _monotone(m.lower_bounds_)
    used = m.weights_ > 0.01
    mu = m.means_[used, 0]
    assert np.all(np.abs(np.abs(mu) - 5) < 1.0)  # every used component sits inside one of the modes
    assert m.weights_[used][mu < 0].sum() == pytest.approx(0.5, abs=0.05)
    labels = m.predict(X)
    assert not set(labels[:200]) & set(labels[200:])  # no component straddles the two modes


@pytest.mark.parametrize("ct", TYPES)
def test_duplicated_points(ct):
    """Many copies of few points: scatter is zero inside clusters; the prior keeps it proper."""
    X = np.repeat(np.array([[0.0, 0.0], [3.0, 3.0], [0.0, 3.0]]), 50, axis=0)
    m = VBMixture(4, covariance_type=ct, random_state=0, reg_covar=0.0, max_iter=100).fit(X)
    assert np.isfinite(m.lower_bound_) and _monotone(m.lower_bounds_)
    assert len(np.unique(m.predict(X))) == 3


@pytest.mark.parametrize("ct", ["full", "diag"])
def test_float32_offset_by_1e4_matches_float64(ct):
    rng = np.random.default_rng(1)
    X32 = (np.vstack([rng.normal(c, 1.0, size=(300, 8)) for c in (0.0, 4.0, 8.0)]) + 1e4).astype(np.float32)
    X64 = X32.astype(np.float64)
    R = np.zeros((900, 5))
    R[np.arange(900), rng.integers(0, 5, 900)] = 1
    kw = dict(covariance_type=ct, max_iter=25, tol=0.0, reg_covar=0.0)
    m32 = VBMixture(5, **kw).fit(X32, resp_init=R)
    m64 = VBMixture(5, **kw).fit(X64, resp_init=R)
    assert m32.lower_bound_ == pytest.approx(m64.lower_bound_, rel=1e-5)
    np.testing.assert_allclose(m32.means_, m64.means_, rtol=1e-5)
    assert (m32.predict(X32) == m64.predict(X64)).mean() > 0.99


@pytest.mark.parametrize("ct", TYPES)
def test_more_components_than_rows(ct):
    """K > N is refused up front, as scikit-learn's BayesianGaussianMixture refuses it (issue 53, item
    10: -k 100000 on 500 rows ran out of memory); K = N, one component per row, fits."""
    X = load_iris().data[:6]
    with pytest.raises(ConfigError, match=r"n_components \(-k\) is 10 but the data hold 6 rows"):
        VBMixture(10, covariance_type=ct, init_params="random", random_state=0).fit(X)
    m = VBMixture(6, covariance_type=ct, init_params="random", random_state=0, reg_covar=0.0,
                  max_iter=30).fit(X)
    assert np.isfinite(m.lower_bound_) and _monotone(m.lower_bounds_)
    assert m.predict_proba(X).shape == (6, 6)
    k2 = VBMixture(6, covariance_type=ct, random_state=0).fit(X)  # k-means with K = N
    assert np.isfinite(k2.lower_bound_)


def test_single_row():
    """One row is no mixture: one line, as scikit-learn's BayesianGaussianMixture refuses it (a fit of
    it once ran to its iteration limit and reported 0 clusters); predicting one row is fine."""
    with pytest.raises(InputError, match=r"found 1 sample\(s\) \(rows\) while a minimum of 2 is required"):
        VBMixture(2, covariance_type="diag", random_state=0).fit(np.array([[1.0, 2.0]]))
    m = VBMixture(2, covariance_type="diag", random_state=0).fit(np.array([[1.0, 2.0], [1.5, 2.5]]))
    assert np.isfinite(m.lower_bound_) and m.predict([[1.0, 2.0]]).shape == (1,)
