"""vbcore.learners.gradients: eqs. 48-51 against finite differences of the exact ELBO, the natural gradient
against an explicit G^-1 grad, and the objective against vbcore.model.elbo (float64, small problems)."""

import numpy as np
import pytest

from vbcore.kernels.estep import chunk_statistics, estep_params, log_rho, prepare_chunk
from vbcore.learners.gradients import (
    GradSums,
    LogitState,
    conditional_update,
    log_softmax,
    logit_gradient,
    logit_gradient_kernel,
    logit_init_kernel,
    logit_trial_kernel,
    mean_gradient,
    mean_metric,
    mean_natural_gradient,
)
from vbcore.model.elbo import elbo_terms
from vbcore.model.mstep import m_step
from vbcore.model.priors import default_prior

TYPES = ["full", "diag", "spherical", "fixed"]
WEIGHTS = ["dirichlet_distribution", "dirichlet_process"]


def _problem(ct, wt, n=14, d=3, k=4, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    X = (rng.normal(size=(n, d)) + rng.integers(0, 3, size=(n, 1)) * 2.0).astype(dtype)
    cov = np.cov(X.T.astype(np.float64)) + 0.1 * np.eye(d)
    prior = default_prior(covariance_type=ct, weight_type=wt, n_components=k,
                          data_mean=X.mean(0) + 0.3, data_covariance=cov if ct == "full" else np.diag(cov),
                          mean_precision=0.7, weight_concentration=0.8, fixed_variance=1.3)
    shift = np.asarray(X[0], dtype=np.float64)
    chunk = prepare_chunk(X, shift, ct)
    gamma = rng.normal(size=(n, k)) * 1.5
    gamma[:, -1] = 0.0  # gamma_nK is fixed (eq. 47)
    means = X.astype(np.float64)[rng.choice(n, k, replace=False)] + rng.normal(size=(k, d)) * 0.3
    return chunk, prior, gamma, means


def _objective(chunk, prior, gamma, means):
    """f(gamma, m): the exact ELBO with every other parameter at its VB update given (R, m)."""
    log_r, r, rlogr = log_softmax(gamma)
    stats = chunk_statistics(chunk, r, rlogr)
    post = conditional_update(stats, prior, means)
    return elbo_terms(stats, post, prior).total, stats, post, log_r


def _fd(f, x, eps=1e-6):
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        out[idx] = (f(xp) - f(xm)) / (2 * eps)
    return out


@pytest.mark.parametrize("wt", WEIGHTS)
@pytest.mark.parametrize("ct", TYPES)
def test_gradients_match_finite_differences(ct, wt):
    chunk, prior, gamma, means = _problem(ct, wt)
    _, stats, post, log_r = _objective(chunk, prior, gamma, means)
    g, h = logit_gradient(log_r, log_rho(chunk, estep_params(post, chunk.shift)), natural=False)
    assert np.array_equal(g, h) and np.all(g[:, -1] == 0.0)
    gm = mean_gradient(stats, post, prior)

    def f_gamma(free):
        return _objective(chunk, prior, np.hstack((free, gamma[:, -1:])), means)[0]

    def f_means(m):
        return _objective(chunk, prior, gamma, m)[0]

    # C = -ELBO: the gradients of eqs. 48-51 are minus those of the ELBO
    fd_gamma = _fd(f_gamma, gamma[:, :-1])
    fd_means = _fd(f_means, means)
    np.testing.assert_allclose(-g[:, :-1], fd_gamma, rtol=1e-6, atol=1e-7 * np.abs(fd_gamma).max())
    np.testing.assert_allclose(-gm, fd_means, rtol=1e-6, atol=1e-7 * np.abs(fd_means).max())
    assert np.abs(fd_gamma).max() > 1e-2 and np.abs(fd_means).max() > 1e-2  # a real test point


def test_with_eq41_precision_the_logit_gradient_would_not_be_exact():
    """Why the other parameters follow conditional_update: with W_k from eq. 41 (optimal only at the
    means of eq. 40) eq. 49 misses the dependence of W_k on R away from eq. 40's means."""
    chunk, prior, gamma, means = _problem("full", "dirichlet_distribution")

    def f41(free):
        _, r, rlogr = log_softmax(np.hstack((free, gamma[:, -1:])))
        stats = chunk_statistics(chunk, r, rlogr)
        post = m_step(stats, prior)
        post = type(post)(post.covariance_type, post.weight_type, post.weight_concentration,
                          post.mean_precision, means, post.degrees_of_freedom, post.covariances)
        return elbo_terms(stats, post, prior).total

    _, stats, _, log_r = _objective(chunk, prior, gamma, means)
    post41 = m_step(stats, prior)
    post41 = type(post41)(post41.covariance_type, post41.weight_type, post41.weight_concentration,
                          post41.mean_precision, means, post41.degrees_of_freedom, post41.covariances)
    g, _ = logit_gradient(log_r, log_rho(chunk, estep_params(post41, chunk.shift)), natural=False)
    fd = _fd(f41, gamma[:, :-1])
    assert np.abs(-g[:, :-1] - fd).max() > 1e-3 * np.abs(fd).max()


@pytest.mark.parametrize("wt", WEIGHTS)
@pytest.mark.parametrize("ct", TYPES)
def test_conditional_update_is_the_m_step_at_eq40_means_and_optimal_elsewhere(ct, wt):
    chunk, prior, gamma, means = _problem(ct, wt, seed=3)
    _, r, rlogr = log_softmax(gamma)
    stats = chunk_statistics(chunk, r, rlogr)
    vb = m_step(stats, prior)
    cond = conditional_update(stats, prior, vb.means)
    for name in ("weight_concentration", "mean_precision", "means", "covariances"):
        np.testing.assert_allclose(getattr(cond, name), getattr(vb, name), rtol=1e-12, atol=0)
    if ct == "fixed":
        return
    # at other means, the precision posterior of conditional_update maximises the ELBO: perturbing
    # its covariances or degrees of freedom (in either direction) lowers the bound
    post = conditional_update(stats, prior, means)
    best = elbo_terms(stats, post, prior).total
    rng = np.random.default_rng(1)
    for _ in range(6):
        noise = rng.normal(size=post.covariances.shape) * 1e-3
        if ct == "full":
            noise = noise + noise.transpose(0, 2, 1)
        cov = post.covariances * (1 + noise) if ct != "full" else post.covariances + noise * 0.05
        for nu in (post.degrees_of_freedom, post.degrees_of_freedom * (1 + 1e-3 * rng.normal(size=4))):
            other = type(post)(ct, wt, post.weight_concentration, post.mean_precision, post.means, nu, cov)
            assert elbo_terms(stats, other, prior).total < best


@pytest.mark.parametrize("ct", TYPES)
def test_natural_gradient_is_explicit_inverse_fisher_times_gradient(ct):
    chunk, prior, gamma, means = _problem(ct, "dirichlet_process", n=9, k=4, seed=5)
    _, stats, post, log_r = _objective(chunk, prior, gamma, means)
    lr = log_rho(chunk, estep_params(post, chunk.shift))
    g, h = logit_gradient(log_r, lr, natural=True)
    r = np.exp(log_r)
    k = r.shape[1]
    for n in range(r.shape[0]):
        rn = r[n, : k - 1]
        b = np.diag(rn) - np.outer(rn, rn)  # B_n on the K-1 free logits
        np.testing.assert_allclose(h[n, : k - 1], np.linalg.solve(b, g[n, : k - 1]), rtol=1e-9, atol=1e-12)
    assert np.all(h[:, -1] == 0.0)
    a = mean_metric(post)  # A_k = beta_k nu_k W_k
    gm = mean_gradient(stats, post, prior)
    hm = mean_natural_gradient(stats, post, prior)
    for j in range(k):
        np.testing.assert_allclose(hm[j], np.linalg.solve(a[j], gm[j]), rtol=1e-9, atol=1e-12)
    if ct == "full":  # A_k from its definition
        w = np.linalg.inv(post.covariances[0] * post.degrees_of_freedom[0])
        np.testing.assert_allclose(a[0], post.mean_precision[0] * post.degrees_of_freedom[0] * w, rtol=1e-10)


@pytest.mark.parametrize("ct", ["full", "diag"])
def test_unit_natural_step_is_the_vb_em_update(ct):
    """A natural-gradient step of length 1 gives the VB E-step for the logits and eq. 40 for the
    means (seed 000 sec. IV-C; Sato 2001)."""
    chunk, prior, gamma, means = _problem(ct, "dirichlet_distribution", seed=2)
    _, stats, post, log_r = _objective(chunk, prior, gamma, means)
    lr = log_rho(chunk, estep_params(post, chunk.shift))
    _, h = logit_gradient(log_r, lr, natural=True)
    new_log_r = log_softmax(log_r - h)[0]
    np.testing.assert_allclose(new_log_r, log_softmax(lr)[0], rtol=0, atol=1e-12)
    new_m = post.means - mean_natural_gradient(stats, post, prior)
    np.testing.assert_allclose(new_m, m_step(stats, prior).means, rtol=1e-12)


@pytest.mark.parametrize("ct", ["full", "diag"])
def test_chunk_kernels_compose_and_float32_tracks_float64(ct):
    """init -> gradient -> trial through the per-chunk kernels: the directional derivative from the
    gradient sums matches a finite difference of the ELBO along the direction, and float32 data
    gives the float64 numbers to float32 accuracy."""
    res = {}
    for dtype in (np.float64, np.float32):
        chunk, prior, _, _ = _problem(ct, "dirichlet_process", n=40, seed=4, dtype=dtype)
        post0 = m_step(chunk_statistics(chunk, np.full((40, 4), 0.25, dtype=dtype)), prior)
        post0 = type(post0)(ct, post0.weight_type, post0.weight_concentration, post0.mean_precision,
                            post0.means + np.arange(12).reshape(4, 3) * 0.2, post0.degrees_of_freedom,
                            post0.covariances)
        state, stats = logit_init_kernel(chunk, estep_params(post0, chunk.shift))
        post = conditional_update(stats, prior, post0.means)
        state, sums = logit_gradient_kernel(chunk, state, estep_params(post, chunk.shift), 0.0, 0.0, True)
        assert isinstance(sums, GradSums) and isinstance(state, LogitState)
        assert sums.gh > 0 and sums.g_pprev == 0.0  # natural direction is a descent direction
        hm, gm = mean_natural_gradient(stats, post, prior), mean_gradient(stats, post, prior)

        def elbo_at(lam, state=state, chunk=chunk, prior=prior, post=post, hm=hm):
            st = logit_trial_kernel(chunk, state, lam, 0.0)
            return elbo_terms(st, conditional_update(st, prior, post.means - lam * hm), prior).total

        d0 = -(sums.gh + float(np.sum(gm * hm)))  # dC/dlam at 0 along p = -h
        eps = 1e-5 if dtype == np.float64 else 1e-2
        fd = -(elbo_at(eps) - elbo_at(-eps)) / (2 * eps)
        res[dtype] = (d0, fd, elbo_at(0.0), elbo_at(1.0))
    d0, fd, e0, e1 = res[np.float64]
    assert fd == pytest.approx(d0, rel=1e-6)
    assert e1 > e0  # the unit natural step (a VB EM step) improves the bound
    for a, b in zip(res[np.float32], res[np.float64], strict=True):
        assert a == pytest.approx(b, rel=1e-3)


@pytest.mark.parametrize("ct", ["full", "diag"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_chunk_kernels_use_only_the_array_api(ct, dtype):
    """The logit kernels on array-api-strict chunks (any non-standard call raises there) give the
    NumPy numbers."""
    xps = pytest.importorskip("array_api_strict")
    from tests._kernel_checks import close, close_stats, posterior, three_clusters
    from vbcore.kernels.estep import to_numpy

    X = three_clusters().astype(dtype)
    prior, post = posterior(X.astype(np.float64), ct)
    params = estep_params(post, prior.mean)
    out = {}
    for name, x in (("np", X), ("strict", xps.asarray(X))):
        chunk = prepare_chunk(x, prior.mean, ct)
        state, stats = logit_init_kernel(chunk, params)
        cond = conditional_update(stats, prior, post.means + 0.1)
        state, sums = logit_gradient_kernel(chunk, state, estep_params(cond, prior.mean), 0.0, 0.0, True)
        trial = logit_trial_kernel(chunk, state, 0.7, 0.0)
        state2, sums2 = logit_gradient_kernel(chunk, state, estep_params(cond, prior.mean), 0.7, 0.0, True)
        out[name] = (stats, sums, trial, state2, sums2)
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    (s0, g0, t0, st0, h0), (s1, g1, t1, st1, h1) = out["np"], out["strict"]
    close_stats(s1, s0, rtol, "init")
    close_stats(t1, t0, rtol, "trial")
    for a, b in ((g1, g0), (h1, h0)):
        for f in ("gg", "gh", "g_hprev", "g_pprev"):
            assert getattr(a, f) == pytest.approx(getattr(b, f), rel=10 * rtol, abs=1e-9), f
    for f in ("log_r", "h", "p"):
        close(getattr(st1, f), to_numpy(getattr(st0, f)), 10 * rtol, f)


@pytest.mark.parametrize("wt", WEIGHTS)
@pytest.mark.parametrize("ct", TYPES)
def test_pattern_line_passes_through_both_posteriors_and_stays_valid(ct, wt):
    from vbcore.learners.pattern import PatternLine

    chunk, prior, gamma, _ = _problem(ct, wt, seed=6)
    _, r, rlogr = log_softmax(gamma)
    old = m_step(chunk_statistics(chunk, r, rlogr), prior)
    _, r2, rlogr2 = log_softmax(gamma * 0.3)
    new = m_step(chunk_statistics(chunk, r2, rlogr2), prior)
    line = PatternLine(old, new)
    fields = ("weight_concentration", "mean_precision", "means", "degrees_of_freedom", "covariances")
    for lam, ref in ((0.0, new), (-1.0, old)):
        got = line.at(lam)
        for f in fields:
            if getattr(ref, f) is not None:
                np.testing.assert_allclose(getattr(got, f), getattr(ref, f), rtol=1e-12, err_msg=f)
    far = line.at(25.0)  # a long extrapolation is still a valid posterior with a finite bound
    assert np.all(far.weight_concentration > 0) and np.all(far.mean_precision > 0)
    if ct != "fixed":  # Wishart: nu > D - 1; Gamma shapes: nu > 0
        assert np.all(far.degrees_of_freedom > (prior.n_features - 1 if ct == "full" else 0))
    assert np.isfinite(elbo_terms(chunk_statistics(chunk, r2, rlogr2), far, prior).total)
