"""The posterior predictive density (vbcore/model/predictive.py) for every covariance type, against
scipy.stats
densities, numerical integrals over the precision, and its normalisation."""

import numpy as np
import pytest
from scipy import integrate
from scipy import stats as st
from scipy.special import gammaln, logsumexp

from pipeline import VBMixture
from vbcore.kernels.estep import chunk_statistics, prepare_chunk
from vbcore.model.mstep import m_step
from vbcore.model.predictive import component_predictive, posterior_predictive_logpdf
from vbcore.model.priors import COVARIANCE_TYPES, default_prior


def _model(ct, d=3, k=3, n=200, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) + 3.0 * rng.integers(0, 3, size=(n, 1))
    prior = default_prior(covariance_type=ct, weight_type="dirichlet_process", n_components=k,
                          data_mean=X.mean(0), data_covariance=np.atleast_2d(np.cov(X.T)),
                          weight_concentration=2.0, fixed_variance=0.8 if ct == "fixed" else None)
    R = rng.dirichlet(np.ones(k), size=n)
    post = m_step(chunk_statistics(prepare_chunk(X, prior.mean, ct), R), prior, 0.0)
    return X, prior, post


def _scipy_component(x, ct, m, beta, nu, cov):
    """The component's predictive as a scipy.stats log density (Bishop 2006 eq. 10.81 and analogues)."""
    d = x.shape[1]
    s = (1.0 + beta) / beta
    if ct == "fixed":
        return st.multivariate_normal(m, cov * s * np.eye(d)).logpdf(x).reshape(-1)
    if ct in ("full", "tied"):
        dof = nu + 1 - d
        return st.multivariate_t(loc=m, shape=cov * nu * s / dof, df=dof).logpdf(x).reshape(-1)
    if ct == "diag":
        return st.t(df=nu, loc=m, scale=np.sqrt(cov * s)).logpdf(x).sum(1)
    return st.multivariate_t(loc=m, shape=cov * s * np.eye(d), df=nu * d).logpdf(x).reshape(-1)


@pytest.mark.parametrize("ct", COVARIANCE_TYPES)
def test_mixture_predictive_matches_scipy(ct):
    """``sum_k E[pi_k] St_k(x) + (1 - sum E[pi_k]) St_prior(x)`` with scipy.stats densities."""
    X, prior, post = _model(ct)
    ours = posterior_predictive_logpdf(X, post, prior)
    w = post.expected_weights()
    nu = post.degrees_of_freedom
    cols = []
    for k in range(post.n_components):
        cov = post.covariances if ct == "tied" else post.covariances[k]
        nu_k = None if nu is None else (float(nu) if ct == "tied" else nu[k])
        cols.append(np.log(w[k]) + _scipy_component(X, ct, post.means[k], post.mean_precision[k], nu_k, cov))
    rest = 1.0 - w.sum()
    assert rest > 1e-3  # the truncated DP leaves mass to the prior predictive
    if ct == "fixed":
        cov0, nu0 = prior.fixed_variance, None
    else:
        nu0 = prior.degrees_of_freedom
        cov0 = np.asarray(prior.covariance) / nu0
    cols.append(np.log(rest) + _scipy_component(X, ct, prior.mean, prior.mean_precision, nu0, cov0))
    np.testing.assert_allclose(ours, logsumexp(np.stack(cols, 1), axis=1), rtol=1e-10)


def _gamma_integral(x, m, beta, shape, rate, d):
    """``int N(x | m, (1 + 1/beta)/lam I) Gamma(lam | shape, rate) dlam`` (mu integrated in closed
    form: the convolution of N(x | mu, I/lam) with N(mu | m, I/(beta lam))), by quadrature."""
    s = 1.0 + 1.0 / beta
    r2 = float(np.sum((x - m) ** 2))
    log_norm = shape * np.log(rate) - gammaln(shape)  # the Gamma density, written out

    def f(lam):
        return np.exp(-0.5 * d * np.log(2 * np.pi * s / lam) - 0.5 * lam * r2 / s
                      + log_norm + (shape - 1) * np.log(lam) - rate * lam)

    return integrate.quad(f, 0, np.inf, epsabs=0, epsrel=1e-11, limit=200)[0]


@pytest.mark.parametrize("ct", ["full", "tied", "diag", "spherical"])
def test_one_dimensional_predictive_is_the_integral_over_the_precision(ct):
    """D = 1: every family's precision posterior is a Gamma (the 1-D Wishart W(W, nu) is
    Gamma(nu/2, rate 1/(2W))); integrate it out numerically."""
    m, beta, nu, cov = np.array([0.4]), 2.5, 6.0, 1.7
    xs = np.array([[-3.0], [0.0], [0.4], [2.2], [7.5]])
    ours = component_predictive(xs, ct, m, beta, nu, np.array([[cov]]) if ct in ("full", "tied") else
                                np.array([cov]) if ct == "diag" else cov)
    ref = [_gamma_integral(x, m, beta, 0.5 * nu, 0.5 * nu * cov, 1) for x in xs]
    np.testing.assert_allclose(np.exp(ours), ref, rtol=1e-8)


def test_spherical_predictive_is_the_integral_over_its_shared_precision():
    """D = 3: one Gamma(nu D/2, nu D c/2) precision for all dimensions gives nu D degrees of freedom."""
    m, beta, nu, c = np.array([0.1, -0.5, 1.0]), 1.5, 4.0, 0.9
    xs = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 3.0], [0.1, -0.5, 1.0]])
    ours = component_predictive(xs, "spherical", m, beta, nu, c)
    ref = [_gamma_integral(x, m, beta, 0.5 * nu * 3, 0.5 * nu * 3 * c, 3) for x in xs]
    np.testing.assert_allclose(np.exp(ours), ref, rtol=1e-8)


def test_diag_predictive_is_the_product_of_one_dimensional_integrals():
    m, beta, nu, c = np.array([0.1, -0.5]), 1.5, 5.0, np.array([0.7, 2.0])
    x = np.array([[1.0, 1.0]])
    ours = component_predictive(x, "diag", m, beta, nu, c)
    ref = np.prod([_gamma_integral(x[0, j : j + 1], m[j : j + 1], beta, 0.5 * nu, 0.5 * nu * c[j], 1)
                   for j in range(2)])
    assert np.exp(ours[0]) == pytest.approx(ref, rel=1e-8)


@pytest.mark.parametrize("ct", ["full", "tied"])
def test_wishart_predictive_against_an_average_over_precision_draws(ct):
    """D = 3: the Student-t equals ``E_{Lambda ~ W}[N(x | m, (1 + 1/beta) Lambda^-1)]``; averaged over
    50,000 scipy Wishart draws (a check of the degrees of freedom and scale, to Monte Carlo error)."""
    m, beta, nu = np.array([0.2, 0.0, -1.0]), 2.0, 7.0
    a = np.array([[1.0, 0.3, 0.0], [0.3, 2.0, -0.4], [0.0, -0.4, 0.5]])
    cov = a / nu  # E[Lambda]^-1 = W^-1 / nu
    x = np.array([[0.5, 0.5, -0.5], [0.2, 0.0, -1.0]])
    ours = np.exp(component_predictive(x, ct, m, beta, nu, cov))
    lams = st.wishart(df=nu, scale=np.linalg.inv(a)).rvs(size=50_000, random_state=0)
    s = 1.0 + 1.0 / beta
    for i in range(2):
        diff = x[i] - m
        quad = np.einsum("i,nij,j->n", diff, lams, diff) / s
        dens = np.exp(0.5 * np.linalg.slogdet(lams)[1] - 1.5 * np.log(2 * np.pi * s) - 0.5 * quad)
        err = 4 * dens.std() / np.sqrt(dens.size)
        assert abs(dens.mean() - ours[i]) < err, (dens.mean(), ours[i], err)


@pytest.mark.parametrize("ct", COVARIANCE_TYPES)
def test_predictive_integrates_to_one(ct):
    """D = 1, DP weights: the density over the line (components and the prior's rest, a Student-t
    with heavy tails) integrates to 1."""
    _, prior, post = _model(ct, d=1, k=3, seed=2)

    def f(x):
        return float(np.exp(posterior_predictive_logpdf(np.array([[x]]), post, prior))[0])

    centre = float(prior.mean[0])
    total = sum(integrate.quad(f, a, b, epsabs=1e-11, epsrel=1e-11, limit=400)[0]
                for a, b in ((-np.inf, centre - 20), (centre - 20, centre + 20), (centre + 20, np.inf)))
    assert total == pytest.approx(1.0, abs=1e-7)


def test_estimator_scores_with_the_predictive():
    X, _, _ = _model("tied", seed=3)
    m = VBMixture(3, covariance_type="tied", max_iter=5, random_state=0).fit(X)
    np.testing.assert_array_equal(m.score_samples(X), posterior_predictive_logpdf(X, m.posterior_, m.prior_))
