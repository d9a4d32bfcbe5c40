"""covariance_type='tied': parity with scikit-learn, the exact ELBO, the E-step, learners, resume.

The model (docs/algorithms.md): every component keeps its own Wishart prior on its precision, and the
K precisions share one variational factor ``q(Lambda) = W(W, nu)``; its exact coordinate ascent is
scikit-learn's tied update (``nu = nu0 + N/K``), and its ELBO holds K equal Wishart KLs.
"""

import warnings

import numpy as np
import pytest
from scipy import stats as st
from scipy.special import digamma, gammaln
from sklearn.datasets import load_breast_cancer, load_iris, load_wine

from pipeline import VBMixture
from pipeline.fit.learners import LEARNERS
from tests._reference import SklearnFromResp, log_evidence_normal_wishart
from vbcore.errors import ConfigError
from vbcore.kernels.estep import (
    KernelResult,
    chunk_statistics,
    estep_params,
    log_rho,
    prepare_chunk,
    responsibilities,
    vbem_kernel,
)
from vbcore.learners.pattern import PatternLine
from vbcore.model.elbo import elbo_terms
from vbcore.model.mstep import m_step
from vbcore.model.priors import COVARIANCE_TYPES, default_prior
from vbcore.model.stats import SuffStats

RTOL = 1e-8
DATASETS = {"iris": lambda: load_iris().data, "wine": lambda: load_wine().data,
            "breast_cancer": lambda: load_breast_cancer().data}


def _rel(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _resp(n, k, seed):
    return np.random.default_rng(seed).dirichlet(np.ones(k), size=n)


def _sklearn_kw(X, wt, k, reg_covar=1e-6, max_iter=30):
    return dict(n_components=k, covariance_type="tied", weight_concentration_prior_type=wt,
                max_iter=max_iter, tol=0.0, reg_covar=reg_covar, covariance_prior=np.cov(X.T))


def _blobs(n=600, d=3, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(3, d))
    a = rng.normal(size=(d, d)) / np.sqrt(d) + np.eye(d)  # one shared, correlated covariance
    return offset + centres[rng.integers(0, 3, size=n)] + rng.normal(size=(n, d)) @ a.T


# ---- parity with scikit-learn --------------------------------------------------------------------
@pytest.mark.parametrize("wt", ["dirichlet_process", "dirichlet_distribution"])
def test_m_step_matches_unmodified_sklearn(wt):
    """One M-step from the same responsibilities is scikit-learn's ``_estimate_wishart_tied``."""
    X = load_wine().data
    k = 5
    R = _resp(X.shape[0], k, 1)
    kw = _sklearn_kw(X, wt, k, max_iter=1)
    ref = SklearnFromResp(resp=R, **kw)
    ref._check_parameters(X, xp=np)
    ref._initialize(X, R)
    ours = VBMixture(**{**kw, "max_iter": 0}).fit(X, resp_init=R)
    assert ours.covariances_.shape == ours.precisions_cholesky_.shape == ours.precisions_.shape == (13, 13)
    assert np.ndim(ours.degrees_of_freedom_) == 0
    for name in ("means_", "covariances_", "degrees_of_freedom_", "precisions_cholesky_", "mean_precision_"):
        assert _rel(getattr(ours, name), getattr(ref, name)) < 1e-12, name
    assert _rel(np.asarray(ours.weight_concentration_), np.asarray(ref.weight_concentration_)) < 1e-12


@pytest.mark.parametrize("data", sorted(DATASETS))
@pytest.mark.parametrize("wt", ["dirichlet_process", "dirichlet_distribution"])
def test_thirty_iterations_match_sklearn(data, wt):
    """From the same responsibilities (one M-step, then 30 E/M iterations): means, covariances,
    weights, and the responsibilities of the last posterior agree to 1e-8; the ELBO differs from
    scikit-learn's bound (which drops constants) by the same constant at every iteration."""
    X = DATASETS[data]()
    k = 6
    R = _resp(X.shape[0], k, 0)
    kw = _sklearn_kw(X, wt, k)
    ref = SklearnFromResp(resp=R, **kw)
    with pytest.warns(Warning):  # 30 iterations did not converge
        ref.fit(X)
    ours = VBMixture(**kw).fit(X, resp_init=R)
    assert ours.n_iter_ == ref.n_iter_ == 30
    assert ours.n_components_ == k  # tied never prunes
    for name in ("weights_", "means_", "covariances_", "degrees_of_freedom_", "mean_precision_",
                 "precisions_cholesky_", "precisions_"):
        assert _rel(getattr(ours, name), getattr(ref, name)) < RTOL, name
    assert _rel(np.asarray(ours.weight_concentration_), np.asarray(ref.weight_concentration_)) < RTOL
    assert _rel(ours.predict_proba(X), ref.predict_proba(X)) < RTOL
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))


@pytest.mark.parametrize("wt", ["dirichlet_process", "dirichlet_distribution"])
def test_sklearn_bound_is_ours_minus_the_constant_of_full(wt):
    """scikit-learn's bound drops constants and simplifies with the M-step's optimality (so only
    for reg_covar = 0): there our ELBO minus its bound is one constant over all iterations, and the
    same constant as for 'full' (its tied bound counts K Wishart normalisers, as ours does)."""
    X = load_wine().data
    k = 4
    R = _resp(X.shape[0], k, 3)
    gaps = {}
    for ct in ("full", "tied"):
        kw = {**_sklearn_kw(X, wt, k, reg_covar=0.0, max_iter=15), "covariance_type": ct}
        ref = SklearnFromResp(resp=R, **kw)
        with pytest.warns(Warning):
            ref.fit(X)
        ours = VBMixture(**kw, learner_options={"prune_below": 0.0}).fit(X, resp_init=R)
        theirs = np.asarray(ref.lower_bounds_, dtype=float).ravel()
        assert np.ptp(theirs) > 1.0  # the bound moved, so a constant gap says something
        gap = ours.lower_bounds_ - theirs
        assert np.ptp(gap) < 1e-9 * np.abs(ours.lower_bounds_).max(), ct
        gaps[ct] = gap[-1]
    assert gaps["tied"] == pytest.approx(gaps["full"], rel=1e-10)


def test_tied_scale_is_the_mean_of_the_full_scales():
    """scikit-learn's ``test_compare_covar_type``: after one M-step, ``nu W^-1`` (tied) is the mean
    over components of ``nu_k W_k^-1`` (full)."""
    X = load_iris().data
    R = _resp(X.shape[0], 4, 5)
    full = VBMixture(4, covariance_type="full", max_iter=0).fit(X, resp_init=R)
    tied = VBMixture(4, covariance_type="tied", max_iter=0).fit(X, resp_init=R)
    scales = full.covariances_ * full.degrees_of_freedom_[:, None, None]
    np.testing.assert_allclose(tied.covariances_ * tied.degrees_of_freedom_, scales.mean(0), rtol=1e-12)
    np.testing.assert_allclose(tied.covariances_ @ tied.precisions_, np.eye(4), atol=1e-10)


# ---- the exact ELBO -------------------------------------------------------------------------------
@pytest.mark.parametrize("wt", ["dirichlet_process", "dirichlet_distribution"])
@pytest.mark.parametrize("data", ["wine", "blobs"])
def test_elbo_never_decreases(data, wt):
    X = load_wine().data if data == "wine" else _blobs()
    R = np.random.default_rng(1).dirichlet(np.full(5, 0.3), size=X.shape[0])  # a rough start
    m = VBMixture(5, covariance_type="tied", weight_concentration_prior_type=wt, reg_covar=0.0,
                  max_iter=60, tol=0.0).fit(X, resp_init=R)
    steps = np.diff(m.lower_bounds_)
    assert m.lower_bounds_[-1] - m.lower_bounds_[0] > 1.0
    assert steps.min() >= -1e-10 * np.abs(m.lower_bounds_).max(), steps.min()


def test_reordered_sticks_keep_the_pooled_scatter():
    """VB EM's ``reorder`` option sorts the DP sticks by N_k before the M-step (SuffStats.take): the
    pooled scatter is one matrix for all components and stays; the bound still never decreases."""
    X = _blobs(seed=5)
    R = np.random.default_rng(2).dirichlet(np.full(5, 0.3), size=X.shape[0])
    kw = dict(n_components=5, covariance_type="tied", reg_covar=0.0, max_iter=15, tol=0.0)
    m = VBMixture(**kw, learner_options={"reorder": True}).fit(X, resp_init=R)
    assert np.diff(m.lower_bounds_).min() >= -1e-10 * np.abs(m.lower_bounds_).max()
    assert np.all(np.diff(m.counts_) <= 1e-9)  # sorted by expected count
    assert m.covariances_.shape == (3, 3) and m.n_components_ == 5


def _wishart_expectations(nu, W):
    """``E[Lambda]`` and ``E ln|Lambda|`` of W(W, nu) from scipy alone: the mean, and the entropy
    ``H = -E ln q`` with ``ln q`` affine in ``(ln|Lambda|, Lambda)``, evaluated at the mean."""
    q = st.wishart(df=nu, scale=W)
    d = W.shape[0]
    e_lam = q.mean()
    log_det_mean = np.linalg.slogdet(e_lam)[1]
    e_log_det = log_det_mean + (-q.entropy() - q.logpdf(e_lam)) / (0.5 * (nu - d - 1))
    return q, e_lam, e_log_det


def _gauss_kl(m1, c1, m0, c0):
    """KL(N(m1, c1) || N(m0, c0)) for covariance matrices."""
    d = m1.shape[0]
    c0inv = np.linalg.inv(c0)
    diff = m0 - m1
    return 0.5 * (np.trace(c0inv @ c1) + diff @ c0inv @ diff - d
                  + np.linalg.slogdet(c0)[1] - np.linalg.slogdet(c1)[1])


def _bruteforce_elbo(X, R, post, prior):
    """Every expectation of the tied model's ELBO, computed independently in float64."""
    n, d = X.shape
    k = R.shape[1]
    nu = float(post.degrees_of_freedom)
    W = np.linalg.inv(post.covariances * nu)
    q, e_lam, e_log_det = _wishart_expectations(nu, W)
    # E ln p(X | Z, mu, Lambda), with E[(x - mu_k)^T Lambda (x - mu_k)]
    #   = D/beta_k + (x - m_k)^T E[Lambda] (x - m_k)
    loglik = 0.0
    for j in range(k):
        diff = X - post.means[j]
        quad = np.einsum("ni,ij,nj->n", diff, e_lam, diff) + d / post.mean_precision[j]
        loglik += np.sum(R[:, j] * (0.5 * e_log_det - 0.5 * d * np.log(2 * np.pi) - 0.5 * quad))
    # weights
    wc = post.weight_concentration
    a0 = prior.weight_concentration
    if post.weight_type == "dirichlet_distribution":
        e_log_pi = digamma(wc) - digamma(wc.sum())
        e_log_p_pi = gammaln(k * a0) - k * gammaln(a0) + (a0 - 1) * e_log_pi.sum()
        kl_w = -st.dirichlet(wc).entropy() - e_log_p_pi
    else:
        a, b = wc
        e_log_v, e_log_1mv = digamma(a) - digamma(a + b), digamma(b) - digamma(a + b)
        e_log_pi = e_log_v + np.concatenate(([0.0], np.cumsum(e_log_1mv)[:-1]))
        e_log_p_v = -gammaln(1.0) - gammaln(a0) + gammaln(1.0 + a0) + (a0 - 1) * e_log_1mv
        kl_w = float(np.sum(-st.beta(a, b).entropy() - e_log_p_v))
    kl_z = np.sum(R * np.log(np.maximum(R, 1e-300))) - np.sum(R @ e_log_pi)
    # means: the Gaussian KL given Lambda is affine in Lambda, so its expectation is its value at E[Lambda]
    kl_mu = sum(_gauss_kl(post.means[j], np.linalg.inv(post.mean_precision[j] * e_lam), prior.mean,
                          np.linalg.inv(prior.mean_precision * e_lam)) for j in range(k))
    # K Wishart KLs: -H[q] - E_q ln p(Lambda), ln p affine in (ln|Lambda|, Lambda) too
    p = st.wishart(df=prior.degrees_of_freedom, scale=np.linalg.inv(prior.covariance))
    e_log_p = p.logpdf(e_lam) + 0.5 * (prior.degrees_of_freedom - d - 1) * (
        e_log_det - np.linalg.slogdet(e_lam)[1])
    kl_lam = k * (-q.entropy() - e_log_p)
    return loglik - kl_z - kl_w - kl_mu - kl_lam


@pytest.mark.parametrize("wt", ["dirichlet_process", "dirichlet_distribution"])
def test_elbo_matches_bruteforce(wt):
    """The ELBO of any (q(Z), q(theta)) pair -- here q(theta) is built from other responsibilities --
    against the independent float64 evaluation above, to 1e-10."""
    X = _blobs(n=300, d=3, seed=2)
    k = 4
    prior = default_prior(covariance_type="tied", weight_type=wt, n_components=k,
                          data_mean=X.mean(0) + 0.3, data_covariance=np.cov(X.T),
                          mean_precision=0.7, degrees_of_freedom=4.5, weight_concentration=0.4)
    shift = X[5].copy()
    post = m_step(chunk_statistics(prepare_chunk(X, shift, "tied"), _resp(300, k, 8)), prior, 0.0)
    R = _resp(300, k, 9)
    stats = chunk_statistics(prepare_chunk(X, shift, "tied"), R, np.sum(R * np.log(R), axis=1))
    ours = elbo_terms(stats, post, prior).total
    assert ours == pytest.approx(_bruteforce_elbo(X, R, post, prior), rel=1e-10)


def test_one_component_equals_normal_wishart_evidence():
    """K = 1: tied is full; one M-step from r = 1 gives the exact posterior, ELBO = ln p(X)."""
    X = _blobs(n=80, d=3, seed=4)
    m0, cov0 = X.mean(0) + 1.0, 2.0 * np.eye(3)
    m = VBMixture(1, covariance_type="tied", weight_concentration_prior_type="dirichlet_distribution",
                  mean_prior=m0, covariance_prior=cov0, degrees_of_freedom_prior=5.0,
                  mean_precision_prior=0.5, reg_covar=0.0, max_iter=1).fit(X)
    assert m.lower_bound_ == pytest.approx(log_evidence_normal_wishart(X, m0, 0.5, 5.0, cov0), rel=1e-10)


# ---- the E-step and the statistics ---------------------------------------------------------------
def _bruteforce_log_rho(X, post):
    n, d = X.shape
    prec = np.linalg.inv(post.covariances)
    nu = float(post.degrees_of_freedom)
    e_log_det = (np.sum(digamma(0.5 * (nu + 1 - np.arange(1, d + 1)))) + d * np.log(2)
                 + np.linalg.slogdet(prec / nu)[1])
    e_log_pi = post.expected_log_weights()
    out = np.empty((n, post.n_components))
    for i in range(n):
        for j in range(post.n_components):
            diff = X[i] - post.means[j]
            out[i, j] = (e_log_pi[j] + 0.5 * e_log_det - 0.5 * d * np.log(2 * np.pi)
                         - 0.5 * d / post.mean_precision[j] - 0.5 * diff @ prec @ diff)
    return out


def _posterior(X, k=4, seed=0):
    prior = default_prior(covariance_type="tied", weight_type="dirichlet_process", n_components=k,
                          data_mean=X.mean(0), data_covariance=np.cov(X.T))
    post = m_step(chunk_statistics(prepare_chunk(X, prior.mean, "tied"), _resp(len(X), k, seed)), prior, 1e-6)
    return prior, post


def test_estep_and_statistics_match_a_per_row_loop():
    X = _blobs(n=250, d=4, seed=3, offset=30.0)
    prior, post = _posterior(X)
    shift = X[0].copy()
    chunk = prepare_chunk(X, shift, "tied")
    assert chunk.feats is None and not chunk.is_diagonal and chunk.pooled
    ref = _bruteforce_log_rho(X, post)
    np.testing.assert_allclose(log_rho(chunk, estep_params(post, shift)), ref, rtol=1e-10, atol=1e-9)
    R = np.exp(ref - ref.max(1, keepdims=True))
    R /= R.sum(1, keepdims=True)
    result = vbem_kernel(chunk, estep_params(post, shift))
    nk = R.sum(0)
    means = R.T @ X / nk[:, None]
    pooled = sum((R[:, j, None] * (X - means[j])).T @ (X - means[j]) for j in range(R.shape[1]))
    s = result.stats
    assert s.pooled and s.scatter.shape == (1, 4, 4)
    np.testing.assert_allclose(s.nk, nk, rtol=1e-10)
    np.testing.assert_allclose(s.raw_mean(), means, rtol=1e-10)
    np.testing.assert_allclose(s.scatter[0], pooled, rtol=1e-9, atol=1e-9 * np.abs(pooled).max())
    assert s.sum_rlogr == pytest.approx(np.sum(R * np.log(R)), rel=1e-10)
    log_norm = np.log(np.exp(ref - ref.max(1, keepdims=True)).sum(1)) + ref.max(1)
    assert result.log_norm == pytest.approx(log_norm.sum(), rel=1e-12)


def test_chunks_merge_to_the_whole():
    """Pooled statistics of three chunks merged in order equal those of one chunk; a pooled and a
    per-component summary do not merge."""
    X = _blobs(n=500, d=3, seed=6)
    prior, post = _posterior(X)
    params = estep_params(post, prior.mean)
    whole = vbem_kernel(prepare_chunk(X, prior.mean, "tied"), params)
    parts = [vbem_kernel(prepare_chunk(X[s], prior.mean, "tied"), params)
             for s in (slice(0, 97), slice(97, 300), slice(300, 500))]
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert isinstance(merged, KernelResult) and merged.stats.n_rows == 500
    for name in ("nk", "mean", "scatter"):
        np.testing.assert_allclose(getattr(merged.stats, name), getattr(whole.stats, name), rtol=1e-10,
                                   atol=1e-10 * np.abs(getattr(whole.stats, name)).max())
    full = chunk_statistics(prepare_chunk(X, prior.mean, "full"), _resp(500, 4, 1))
    with pytest.raises(ValueError, match="cannot merge statistics"):
        whole.stats.merge(SuffStats(full.nk, full.mean, full.scatter[:1], 0.0, 500, full.shift))


def test_float32_data_computes_in_float32_close_to_float64():
    X = _blobs(n=3000, d=5, seed=7, offset=1e3)
    prior, post = _posterior(X)
    shift = X[0].copy()
    params = estep_params(post, shift)
    c64 = prepare_chunk(X, shift, "tied")
    c32 = prepare_chunk(X.astype(np.float32), shift, "tied")
    lr = log_rho(c32, params)
    assert lr.dtype == np.float32 and responsibilities(c32, params).dtype == np.float32
    np.testing.assert_allclose(responsibilities(c32, params), responsibilities(c64, params), atol=1e-4)
    a, b = vbem_kernel(c32, params).stats, vbem_kernel(c64, params).stats
    assert a.scatter.dtype == np.float64
    for name in ("nk", "mean", "scatter"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-4,
                                   atol=1e-4 * np.abs(getattr(b, name)).max())
    kw = dict(n_components=3, covariance_type="tied", random_state=0, max_iter=20, tol=0.0)
    m32, m64 = VBMixture(**kw).fit(X.astype(np.float32)), VBMixture(**kw).fit(X)
    assert m32.lower_bound_ == pytest.approx(m64.lower_bound_, rel=1e-5)
    np.testing.assert_allclose(m32.covariances_, m64.covariances_, rtol=1e-3)


# ---- learners, validation, resume -----------------------------------------------------------------
def test_every_learner_declares_its_covariance_types():
    for name, cls in LEARNERS.items():
        assert set(cls.covariance_types) <= set(COVARIANCE_TYPES), name
    assert {n for n, c in LEARNERS.items() if "tied" in c.covariance_types} == {"vbem", "vbem-ps"}


NO_TIED = sorted(n for n, c in LEARNERS.items() if "tied" not in c.covariance_types)


@pytest.mark.parametrize("learner", NO_TIED)
def test_other_learners_refuse_tied_before_touching_data(learner):
    """The refusal comes from validation: the data argument (a store path that does not exist) is
    never opened."""
    with pytest.raises(ConfigError, match=rf"^learner '{learner}' fits covariance .*, not 'tied' "):
        VBMixture(3, covariance_type="tied", learner=learner).fit("/nonexistent/store.zarr")
    with pytest.raises(ConfigError, match=rf"learner '{learner}' fits covariance"):
        VBMixture(3, covariance_type="tied", learner=learner).spec()


@pytest.mark.parametrize("wt", ["dirichlet_process", "dirichlet_distribution"])
def test_pattern_search_runs_tied(wt):
    X = load_wine().data
    kw = dict(n_components=5, covariance_type="tied", weight_concentration_prior_type=wt, reg_covar=0.0,
              tol=0.0, max_iter=30, random_state=0)
    ps = VBMixture(learner="vbem-ps", **kw).fit(X)
    em = VBMixture(learner="vbem", **kw).fit(X)
    assert np.diff(ps.lower_bounds_).min() >= -1e-10 * np.abs(ps.lower_bounds_).max()
    assert ps.lower_bound_ >= em.lower_bound_ - 1e-6 * abs(em.lower_bound_)
    assert ps.covariances_.shape == (13, 13)


def test_pattern_line_of_tied_posteriors():
    X = _blobs(n=200, d=3)
    _, old = _posterior(X, seed=1)
    _, new = _posterior(X, seed=2)
    line = PatternLine(old, new)
    for lam, want in ((0.0, new), (-1.0, old)):
        got = line.at(lam)
        np.testing.assert_allclose(got.covariances, want.covariances, rtol=1e-12)
        assert float(got.degrees_of_freedom) == pytest.approx(float(want.degrees_of_freedom), rel=1e-12)
    mid = line.at(0.5)
    assert mid.covariances.shape == (3, 3) and np.ndim(mid.degrees_of_freedom) == 0


@pytest.mark.parametrize("learner", ["vbem", "vbem-ps"])
def test_checkpoint_resume_is_bitwise(tmp_path, learner):
    X = load_wine().data
    kw = dict(n_components=5, covariance_type="tied", tol=0.0, random_state=0, learner=learner)
    VBMixture(max_iter=7, checkpoint_dir=str(tmp_path), checkpoint_every=3, **kw).fit(X)
    resumed = VBMixture(max_iter=16, checkpoint_dir=str(tmp_path), checkpoint_every=3, **kw).fit(X)
    assert resumed.resumed_from_.endswith("ckpt-00000007")
    straight = VBMixture(max_iter=16, **kw).fit(X)
    for name in ("means_", "covariances_", "weights_", "lower_bounds_", "precisions_cholesky_",
                 "degrees_of_freedom_"):
        assert np.array_equal(getattr(resumed, name), getattr(straight, name)), name


def test_prior_validation_names_the_problem():
    X = load_iris().data
    shape = r"covariance_prior must have shape \(4, 4\) for covariance_type='tied'"
    with pytest.raises(ConfigError, match=shape):
        VBMixture(2, covariance_type="tied", covariance_prior=np.ones(4)).fit(X)
    dof = r"degrees_of_freedom_prior must be > n_features - 1 = 3 for 'tied'"
    with pytest.raises(ConfigError, match=dof):
        VBMixture(2, covariance_type="tied", degrees_of_freedom_prior=2.5).fit(X)
    with pytest.raises(ConfigError, match="covariance_prior must be positive definite"):
        VBMixture(2, covariance_type="tied", covariance_prior=-np.eye(4)).fit(X)


def test_warm_start_and_sample_free_attributes():
    """A warm-started tied fit continues from the fitted posterior (its first bound is not below the
    last one) and keeps scikit-learn's attribute shapes."""
    X = load_iris().data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = VBMixture(3, covariance_type="tied", reg_covar=0.0, max_iter=5, tol=0.0, random_state=0,
                      warm_start=True).fit(X)
        last = m.lower_bound_
        m.fit(X)
    assert m.lower_bounds_[0] >= last - 1e-9 * abs(last)
    assert m.means_.shape == (3, 4) and m.covariances_.shape == (4, 4) and m.weights_.shape == (3,)


def test_store_fit_is_bitwise_on_local_and_dask_and_round_trips_a_run_directory(tmp_path, client):
    """Real Zarr store, real two-process Dask cluster: the same bits as the local engine; the run
    directory (posterior.npz) rebuilds a model that predicts the same."""
    from pipeline.estimator import load_model
    from pipeline.runs.directory import save_run
    from pipeline.store.features import FeatureStore

    X = _blobs(n=1500, d=4, seed=11).astype(np.float32)
    path = tmp_path / "blobs.zarr"
    FeatureStore.create(path, 4, chunk_rows=256, labels=False).append(X)
    kw = dict(n_components=4, covariance_type="tied", max_iter=12, tol=0.0, random_state=0)
    local = VBMixture(**kw).fit(str(path))
    remote = VBMixture(engine=client, **kw).fit(str(path))
    for name in ("means_", "covariances_", "weights_", "precisions_cholesky_", "lower_bounds_"):
        assert np.array_equal(getattr(local, name), getattr(remote, name)), name
    save_run(tmp_path / "run", local, str(path))
    again = load_model(tmp_path / "run")
    assert np.array_equal(again.covariances_, local.covariances_)
    assert float(again.degrees_of_freedom_) == float(local.degrees_of_freedom_)
    np.testing.assert_array_equal(again.predict_proba(X), local.predict_proba(X))
