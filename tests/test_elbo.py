"""The exact ELBO: closed-form evidence for one component, monotone VB EM, terms against direct
formulas and Monte Carlo."""

import numpy as np
import pytest
from scipy import stats as st
from sklearn.datasets import load_iris, load_wine

from pipeline import VBMixture
from tests._reference import (
    log_evidence_fixed_bruteforce,
    log_evidence_normal_gamma_shared,
    log_evidence_normal_wishart,
)
from vbcore.model.elbo import kl_beta, kl_dirichlet, kl_gamma, kl_wishart
from vbcore.model.posterior import Posterior

TYPES = ["full", "diag", "spherical", "fixed"]
WEIGHTS = ["dirichlet_process", "dirichlet_distribution"]


def _one_component(X, ct, **prior):
    return VBMixture(1, covariance_type=ct, weight_concentration_prior_type="dirichlet_distribution",
                     reg_covar=0.0, max_iter=3, tol=0.0, **prior).fit(X)


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(0)
    return rng.normal(size=(40, 3)) @ np.array([[1.0, 0.3, 0], [0, 0.7, 0.2], [0, 0, 1.5]]) + 2.0


def test_one_component_full_equals_normal_wishart_evidence(small):
    X = small
    m0, cov0 = np.array([1.0, -0.5, 2.0]), np.array([[2.0, 0.3, 0.1], [0.3, 1.0, 0.0], [0.1, 0.0, 0.5]])
    model = _one_component(X, "full", mean_prior=m0, mean_precision_prior=0.7,
                           degrees_of_freedom_prior=4.5, covariance_prior=cov0)
    exact = log_evidence_normal_wishart(X, m0, 0.7, 4.5, cov0)
    assert model.lower_bound_ == pytest.approx(exact, rel=1e-10)
    assert model.lower_bounds_ == pytest.approx([exact] * 3, rel=1e-10)


def test_one_component_diag_equals_product_of_1d_evidences(small):
    X = small
    m0, s0 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 0.5])
    model = _one_component(X, "diag", mean_prior=m0, mean_precision_prior=2.0,
                           degrees_of_freedom_prior=1.5, covariance_prior=s0)
    exact = sum(log_evidence_normal_wishart(X[:, [j]], m0[[j]], 2.0, 1.5, np.array([[s0[j]]]))
                for j in range(3))
    assert model.lower_bound_ == pytest.approx(exact, rel=1e-10)


def test_one_component_spherical_equals_shared_gamma_evidence(small):
    X = small
    d = X.shape[1]
    model = _one_component(X, "spherical", mean_prior=np.zeros(d), mean_precision_prior=0.3,
                           degrees_of_freedom_prior=2.0, covariance_prior=1.7)
    exact = log_evidence_normal_gamma_shared(X, np.zeros(d), 0.3, 2.0 * d / 2, d * 1.7 / 2)
    assert model.lower_bound_ == pytest.approx(exact, rel=1e-10)


def test_one_component_fixed_equals_bruteforce_gaussian_evidence(small):
    X = small[:25]
    m0 = np.array([2.0, 2.0, 2.0])
    model = _one_component(X, "fixed", mean_prior=m0, mean_precision_prior=0.5, fixed_variance=1.3)
    exact = log_evidence_fixed_bruteforce(X, m0, 0.5, 1.3)
    assert model.lower_bound_ == pytest.approx(exact, rel=1e-10)


def test_dp_single_stick_is_a_strict_bound(small):
    """With the DP prior, one component keeps mass for k > 1: the bound is below the evidence."""
    X = small
    m0, cov0 = X.mean(0), np.cov(X.T)
    exact = log_evidence_normal_wishart(X, m0, 1.0, 3.0, cov0)
    dp = VBMixture(1, covariance_type="full", reg_covar=0.0, max_iter=2,
                   covariance_prior=cov0).fit(X)
    assert dp.lower_bound_ < exact


@pytest.mark.parametrize("wt", WEIGHTS)
@pytest.mark.parametrize("ct", TYPES)
@pytest.mark.parametrize("dataset", ["iris", "wine"])
def test_elbo_never_decreases(ct, wt, dataset):
    X = load_iris().data if dataset == "iris" else load_wine().data
    X = (X - X.mean(0)) / X.std(0) if dataset == "wine" else X
    model = VBMixture(8, covariance_type=ct, weight_concentration_prior_type=wt, reg_covar=0.0,
                      init_params="random", random_state=3, max_iter=150, tol=0.0).fit(X)
    lb = model.lower_bounds_
    assert len(lb) == 150
    steps = np.diff(lb)
    assert steps.min() >= -1e-9 * np.abs(lb).max(), f"ELBO decreased by {-steps.min():.3e}"
    assert lb[-1] > lb[0] + 1.0  # and it does move
    terms = model.elbo_terms_
    total = terms["log_likelihood"] - terms["kl_assignments"] - terms["kl_weights"] - terms["kl_components"]
    assert total == pytest.approx(model.lower_bound_, rel=1e-14)
    assert min(terms["kl_weights"], terms["kl_components"]) >= 0


# ---- terms against independent references ----------------------------------------------------
def test_kl_dirichlet_monte_carlo():
    rng = np.random.default_rng(0)
    alpha, alpha0 = np.array([3.0, 1.5, 7.0, 0.8]), np.full(4, 0.5)
    s = rng.dirichlet(alpha, size=400_000)
    mc = st.dirichlet(alpha).logpdf(s.T) - st.dirichlet(alpha0).logpdf(s.T)
    assert kl_dirichlet(alpha, alpha0) == pytest.approx(mc.mean(), abs=4 * mc.std() / np.sqrt(len(mc)))


def test_kl_beta_monte_carlo():
    rng = np.random.default_rng(1)
    a, b = 4.0, 2.5
    s = rng.beta(a, b, size=400_000)
    mc = st.beta(a, b).logpdf(s) - st.beta(1.0, 0.7).logpdf(s)
    assert kl_beta(np.array(a), np.array(b), 1.0, 0.7) == pytest.approx(
        mc.mean(), abs=4 * mc.std() / np.sqrt(len(mc)))


def test_kl_gamma_monte_carlo():
    rng = np.random.default_rng(2)
    a, b, a0, b0 = 3.0, 2.0, 1.2, 0.6
    s = rng.gamma(a, 1.0 / b, size=400_000)
    mc = st.gamma(a, scale=1 / b).logpdf(s) - st.gamma(a0, scale=1 / b0).logpdf(s)
    assert kl_gamma(a, b, a0, b0) == pytest.approx(mc.mean(), abs=4 * mc.std() / np.sqrt(len(mc)))


def test_kl_wishart_against_scipy_entropy_and_cross_entropy():
    """KL = -H[q] - E_q ln p; H from scipy, E_q ln p by Monte Carlo over scipy samples."""
    rng = np.random.default_rng(3)
    d, nu, nu0 = 3, 7.5, 4.0
    cov = np.array([[1.0, 0.2, 0.0], [0.2, 0.8, 0.1], [0.0, 0.1, 1.3]])  # E[Lambda]^-1
    cov0 = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 0.7]])  # W0^-1
    W, W0 = np.linalg.inv(nu * cov), np.linalg.inv(cov0)
    q, p = st.wishart(df=nu, scale=W), st.wishart(df=nu0, scale=W0)
    samples = q.rvs(size=200_000, random_state=rng)
    cross = p.logpdf(np.moveaxis(samples, 0, -1))
    post = Posterior("full", "dirichlet_distribution", np.ones(1), np.ones(1), np.zeros((1, d)),
                     np.array([nu]), cov[None])
    log_det_prec = np.linalg.slogdet(np.linalg.inv(cov))[1]
    ours = kl_wishart(np.array([nu]), cov[None], nu0, cov0, np.array([log_det_prec]),
                      post.expected_log_det_precision())[0]
    ref = -q.entropy() - cross.mean()
    assert ours == pytest.approx(ref, abs=4 * cross.std() / np.sqrt(len(cross)))


def test_expected_log_det_full_monte_carlo():
    rng = np.random.default_rng(4)
    d, nu = 3, 6.0
    cov = np.array([[1.0, 0.3, 0.0], [0.3, 2.0, 0.2], [0.0, 0.2, 0.5]])
    post = Posterior("full", "dirichlet_distribution", np.ones(1), np.ones(1), np.zeros((1, d)),
                     np.array([nu]), cov[None])
    s = st.wishart(df=nu, scale=np.linalg.inv(nu * cov)).rvs(size=200_000, random_state=rng)
    ld = np.linalg.slogdet(s)[1]
    se = ld.std() / np.sqrt(len(ld))
    assert post.expected_log_det_precision()[0] == pytest.approx(ld.mean(), abs=4 * se)
    np.testing.assert_allclose(np.mean(s, axis=0), np.linalg.inv(cov), atol=0.02)


def test_expected_log_weights_dp_monte_carlo():
    rng = np.random.default_rng(5)
    a, b = np.array([5.0, 3.0, 2.0]), np.array([4.0, 2.0, 1.0])
    post = Posterior("diag", "dirichlet_process", np.vstack((a, b)), np.ones(3), np.zeros((3, 1)),
                     np.full(3, 2.0), np.ones((3, 1)))
    v = rng.beta(a, b, size=(400_000, 3))
    pi = v * np.concatenate((np.ones((len(v), 1)), np.cumprod(1 - v[:, :-1], axis=1)), axis=1)
    assert post.expected_log_weights() == pytest.approx(np.log(pi).mean(0), abs=5e-3)
    assert post.expected_weights() == pytest.approx(pi.mean(0), abs=2e-3)
