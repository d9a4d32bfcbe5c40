"""The low-rank-plus-diagonal family (vbcore.model.mfa): its bound against independent float64 formulas
and Monte Carlo, the exact evidence at rank 0, a bound that never decreases, planted low-rank classes."""

from dataclasses import replace

import numpy as np
import pytest
from scipy import stats as st
from scipy.special import digamma, gammaln

from vbcore.data.metrics import nmi
from vbcore.model import mfa

TOL64 = 1e-9  # relative, float64 against float64
WEIGHTS = ["dirichlet_distribution", "dirichlet_process"]


def _planted(n_per=60, k=3, d=8, q=2, seed=0, noise=0.3):
    """k classes, each its own mean and q-dimensional subspace, plus diagonal noise."""
    rng = np.random.default_rng(seed)
    ys, labels = [], []
    for c in range(k):
        lam = rng.normal(size=(d, q)) * 2.0
        mu = rng.normal(size=d) * 4.0
        ys.append(rng.normal(size=(n_per, q)) @ lam.T + mu + noise * rng.normal(size=(n_per, d)))
        labels.append(np.full(n_per, c))
    return np.concatenate(ys), np.concatenate(labels)


def _prior(y, weight_type="dirichlet_distribution", alpha0=1.0):
    return mfa.MfaPrior(weight_type, alpha0, y.mean(0) + 0.1, 1e-6)


def _fitted(y, labels, k, q, weight_type="dirichlet_distribution", iters=3, seed=0):
    """A posterior some iterations in (not at a fixed point: the test covers any q)."""
    prior = _prior(y, weight_type)
    post = mfa.initial_posterior(y, labels, k, q, prior, seed=seed)
    for _ in range(iters):
        stats, _, _ = mfa.estep(y, post, operand=mfa.stacked_operand(post, np.float64))
        post = mfa.m_step(stats, post, prior)
    return prior, post


def _q_x(post, y):
    """q(x_n | k) written from the model directly: precision I + sum_d E[l_kd l_kd^T] / Psi_d over the
    factor block, mean from the linear term; per row, per component, in loops."""
    k, d, q1 = post.loadings.shape
    q = q1 - 1
    a_inv = np.linalg.inv(post.precision)
    means = np.zeros((y.shape[0], k, q))
    covs = np.zeros((k, q, q))
    for c in range(k):
        second = sum((np.outer(post.loadings[c, j], post.loadings[c, j]) + post.noise[j] * a_inv[c])
                     / post.noise[j] for j in range(d))
        prec = np.eye(q) + second[:q, :q]
        covs[c] = np.linalg.inv(prec)
        for n in range(y.shape[0]):
            lin = sum(post.loadings[c, j, :q] * y[n, j] / post.noise[j] for j in range(d)) - second[:q, q]
            means[n, c] = covs[c] @ lin
    return means, covs


def _log_weights(post):
    wc = post.weight_concentration
    if post.weight_type == "dirichlet_distribution":
        return digamma(wc) - digamma(wc.sum())
    a, b = wc
    out = digamma(a) - digamma(a + b)
    return out + np.concatenate(([0.0], np.cumsum(digamma(b) - digamma(a + b))[:-1]))


def _kl_weights(post, prior):
    wc, a0 = post.weight_concentration, prior.weight_concentration
    if post.weight_type == "dirichlet_distribution":
        prior_w = np.full_like(wc, a0)
        return (gammaln(wc.sum()) - gammaln(wc).sum() - gammaln(prior_w.sum()) + gammaln(prior_w).sum()
                + ((wc - prior_w) * (digamma(wc) - digamma(wc.sum()))).sum())
    kl = 0.0
    for a, b in zip(*wc, strict=True):  # KL of Beta(a, b) || Beta(1, a0) by quadrature-free formula
        kl += (st.beta(a, b).entropy() * -1.0
               - ((a0 - 1.0) * (digamma(b) - digamma(a + b)) - (gammaln(a0) - gammaln(1 + a0))
                  - gammaln(1.0)))
    return kl


def _per_term_bound(y, resp, post, prior, x_post=None, y_q=None):
    """The bound of q(z) = ``resp``, q(x | z) that of ``x_post`` (default ``post``) given the rows ``y_q``
    (default ``y``) and q(L) of ``post``, term by term: E[ln p(y | x, z, L)] per (n, k, d), E[ln p(x)]
    and H[q(x)] from scipy, KL(q(L) || p(L)) per row of L from the Gaussian KL, E[ln p(z | pi)] -
    E[ln q(z)], KL(q(pi) || p(pi))."""
    k, d, q1 = post.loadings.shape
    q = q1 - 1
    mx, sx = _q_x(post if x_post is None else x_post, y if y_q is None else y_q)
    a_inv = np.linalg.inv(post.precision)
    e_log_pi = _log_weights(post)
    total = 0.0
    for n in range(y.shape[0]):
        for c in range(k):
            r = resp[n, c]
            if r == 0.0:
                continue
            ex = np.append(mx[n, c], 1.0)
            cov_x = np.zeros((q1, q1))
            cov_x[:q, :q] = sx[c]
            lik = 0.0
            for j in range(d):
                mu, cov_l = post.loadings[c, j], post.noise[j] * a_inv[c]
                sq = (y[n, j] - mu @ ex) ** 2 + ex @ cov_l @ ex + np.trace((np.outer(mu, mu) + cov_l) @ cov_x)
                lik += -0.5 * np.log(2 * np.pi * post.noise[j]) - 0.5 * sq / post.noise[j]
            log_px = -0.5 * q * np.log(2 * np.pi) - 0.5 * (mx[n, c] @ mx[n, c] + np.trace(sx[c]))
            ent = st.multivariate_normal(np.zeros(q), sx[c]).entropy() if q else 0.0
            total += r * (lik + log_px + ent + e_log_pi[c] - np.log(r))
    omega = post.omega()
    for c in range(k):
        for j in range(d):
            m0 = np.zeros(q1)
            m0[-1] = prior.mean[j]
            s1, s0 = post.noise[j] * a_inv[c], post.noise[j] * np.diag(1.0 / omega[c])
            diff = post.loadings[c, j] - m0
            total -= 0.5 * (np.trace(np.linalg.solve(s0, s1)) + diff @ np.linalg.solve(s0, diff) - q1
                            + np.linalg.slogdet(s0)[1] - np.linalg.slogdet(s1)[1])
    return total - _kl_weights(post, prior)


@pytest.mark.parametrize("weight_type", WEIGHTS)
@pytest.mark.parametrize("q", [0, 1, 2])
def test_bound_against_per_term_formulas(weight_type, q):
    y, labels = _planted(n_per=12, k=3, d=4, q=2)
    prior, post = _fitted(y, labels, 3, q, weight_type)
    stats, resp, log_norm = mfa.estep(y, post, operand=mfa.stacked_operand(post, np.float64))
    terms = mfa.elbo(stats, post, prior)
    assert terms.total == pytest.approx(_per_term_bound(y, resp, post, prior), rel=TOL64)
    # the E-step's closed form (ln sum_k rho_nk per row) is the same bound
    assert terms.total == pytest.approx(log_norm.sum() - terms.kl_weights - terms.kl_components, rel=TOL64)
    # and after the M-step, on the same statistics, against the same formulas
    post2 = mfa.m_step(stats, post, prior)
    assert mfa.elbo(stats, post2, prior).total == pytest.approx(_per_term_bound(y, resp, post2, prior, post),
                                                                rel=TOL64)


def test_bound_against_monte_carlo():
    """The likelihood's expectation over q(L) q(x | z) sampled (seeded), within 4 standard errors."""
    y, labels = _planted(n_per=10, k=2, d=3, q=1)
    prior, post = _fitted(y, labels, 2, 1)
    stats, resp, _ = mfa.estep(y, post, operand=mfa.stacked_operand(post, np.float64))
    terms = mfa.elbo(stats, post, prior)
    rng = np.random.default_rng(1)
    mx, sx = _q_x(post, y)
    a_inv = np.linalg.inv(post.precision)
    s = 20_000
    draws = np.zeros(s)
    for c in range(2):
        chol_l = np.linalg.cholesky(a_inv[c])
        lam = post.loadings[c][None] + np.sqrt(post.noise)[None, :, None] * np.einsum(
            "ij,sdj->sdi", chol_l, rng.standard_normal((s, 3, 2)))
        for n in range(y.shape[0]):
            x = mx[n, c] + np.sqrt(sx[c][0, 0]) * rng.standard_normal(s)
            mean = lam[:, :, 0] * x[:, None] + lam[:, :, 1]
            ll = st.norm.logpdf(y[n][None], mean, np.sqrt(post.noise)[None]).sum(1)
            lx = st.norm.logpdf(x) - st.norm.logpdf(x, mx[n, c], np.sqrt(sx[c][0, 0]))
            draws += resp[n, c] * (ll + lx)
    estimate = draws.mean()
    se = draws.std() / np.sqrt(s)
    assert abs(estimate - (terms.log_likelihood)) < 4 * se + 1e-9


def test_rank_zero_one_component_is_the_exact_evidence():
    """q = 0, K = 1, Dirichlet weights: y_n ~ N(mu, Psi), mu_d ~ N(m0_d, Psi_d / beta0): the bound at
    the optimal q(mu) equals ln p(Y) = sum_d ln N(y_.d; m0_d 1, Psi_d (I + 1 1^T / beta0))."""
    y, _ = _planted(n_per=25, k=2, d=5, q=1)
    prior = _prior(y)
    post = mfa.initial_posterior(y, np.zeros(len(y), dtype=int), 1, 0, prior)
    post = mfa.MfaPosterior(post.weight_concentration, post.weight_type, post.loadings, post.precision,
                            np.array([0.5, 1.0, 2.0, 1.5, 0.7]), post.ard, 0.3)
    stats, _, _ = mfa.estep(y, post, operand=mfa.stacked_operand(post, np.float64))
    post = mfa.m_step(stats, post, prior, ard=False, free_mean_precision=False, noise=False)
    n = y.shape[0]
    exact = sum(st.multivariate_normal(np.full(n, prior.mean[j]),
                                       post.noise[j] * (np.eye(n) + np.ones((n, n)) / 0.3)).logpdf(y[:, j])
                for j in range(5))
    assert mfa.elbo(stats, post, prior).total == pytest.approx(exact, rel=TOL64)


@pytest.mark.parametrize("weight_type", WEIGHTS)
def test_bound_never_decreases(weight_type):
    y, labels = _planted(n_per=80, k=4, d=10, q=3, seed=2)
    rng = np.random.default_rng(0)
    start = rng.integers(0, 6, size=len(y))  # a poor start: six random groups
    prior = _prior(y, weight_type)
    post = mfa.initial_posterior(y, start, 6, 2, prior, seed=0)
    history = []
    for _ in range(60):
        stats, _, _ = mfa.estep(y, post, operand=mfa.stacked_operand(post, np.float64))
        post = mfa.m_step(stats, post, prior)
        history.append(mfa.elbo(stats, post, prior).total)
    assert np.all(np.diff(history) >= -1e-9 * np.abs(history[1:]))
    assert history[-1] > history[0]


def test_float32_gemm_matches_float64():
    """The E-step's GEMM in float32 (float64 after it) stays within float32's tolerance of float64."""
    y, labels = _planted(n_per=50, k=3, d=16, q=2)
    prior, post = _fitted(y, labels, 3, 2)
    s64, _, _ = mfa.estep(y, post, operand=mfa.stacked_operand(post, np.float64))
    s32, _, _ = mfa.estep(y.astype(np.float32), post)
    e64, e32 = mfa.elbo(s64, post, prior).total, mfa.elbo(s32, post, prior).total
    assert e32 == pytest.approx(e64, rel=1e-5)


def test_statistics_merge_over_chunks():
    """Statistics of chunks merged in order equal those of all rows (the bound to float64 rounding)."""
    y, labels = _planted(n_per=40, k=3, d=6, q=2)
    prior, post = _fitted(y, labels, 3, 2)
    op = mfa.stacked_operand(post, np.float64)
    whole, _, _ = mfa.estep(y, post, operand=op)
    parts = [mfa.estep(y[i:i + 37], post, operand=op)[0] for i in range(0, len(y), 37)]
    merged = parts[0]
    for p in parts[1:]:
        merged = merged.merge(p)
    assert mfa.elbo(merged, post, prior).total == pytest.approx(mfa.elbo(whole, post, prior).total, rel=1e-12)
    np.testing.assert_allclose(merged.yx, whole.yx, rtol=1e-10)


def test_weighted_rows_equal_repeated_rows():
    y, labels = _planted(n_per=20, k=2, d=5, q=1)
    prior, post = _fitted(y, labels, 2, 1)
    w = np.arange(len(y)) % 3
    rep = np.repeat(y, w, axis=0)
    a, _, _ = mfa.estep(y, post, weights=w.astype(float), operand=mfa.stacked_operand(post, np.float64))
    b, _, _ = mfa.estep(rep, post, operand=mfa.stacked_operand(post, np.float64))
    assert mfa.elbo(a, post, prior).total == pytest.approx(mfa.elbo(b, post, prior).total, rel=1e-12)


def test_recovers_planted_low_rank_classes():
    """Four classes, each its own mean and 3-dimensional subspace, from nearest-centre starts of eight
    components (three seeds): the start with the highest bound finds the planted classes (the bound
    ranks the local optima the way the truth does)."""
    y, labels = _planted(n_per=150, k=4, d=20, q=3, seed=5, noise=0.2)
    prior = _prior(y, "dirichlet_process")
    best = (-np.inf, 0.0)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        centres = y[rng.choice(len(y), 8, replace=False)]
        start = np.argmin(((y[:, None] - centres[None]) ** 2).sum(-1), axis=1)
        post = mfa.initial_posterior(y, start, 8, 3, prior, seed=0)
        for _ in range(150):
            stats, resp, _ = mfa.estep(y, post)
            post = mfa.m_step(stats, post, prior)
        best = max(best, (mfa.elbo(stats, post, prior).total, nmi(labels, resp.argmax(1))))
    assert best[1] > 0.99


def test_merge_proposal_of_a_split_class_raises_the_bound():
    """One planted class split in two along its widest direction: the merged proposal, after one
    iteration, bounds the rows higher than one more iteration of the split posterior, and has one
    component fewer; candidates rank the split pair first."""
    y, labels = _planted(n_per=200, k=2, d=10, q=2, seed=4, noise=0.2)
    first = y[labels == 0]
    side = (first - first.mean(0)) @ np.linalg.svd(first - first.mean(0), full_matrices=False)[2][0] > 0
    start = labels * 2
    start[np.flatnonzero(labels == 0)[side]] = 1  # components 0 and 1: halves of class 0
    prior = _prior(y, "dirichlet_process")
    post = mfa.initial_posterior(y, start, 3, 2, prior, seed=0)
    for _ in range(30):
        stats, _, _ = mfa.estep(y, post)
        post = mfa.m_step(stats, post, prior)
    stats, _, _ = mfa.estep(y, post)
    assert mfa.merge_candidates(stats, 3)[0] == (0, 1)

    def one_iteration(p):
        s, resp, _ = mfa.estep(y, p)
        new = mfa.m_step(s, p, prior)
        return mfa.elbo(s, new, prior).total, resp

    kept, _ = one_iteration(post)
    proposal = mfa.merge_proposal(stats, post, prior, 0, 1)
    merged, resp = one_iteration(proposal)
    assert proposal.n_components == 2 and merged > kept
    assert nmi(labels, resp.argmax(1)) > 0.99


def _cell(eps):
    """Two-point Gauss-Legendre nodes and weights of the uniform cell [-eps/2, eps/2]^D: exact for the
    expectation of any polynomial of degree 3 in each coordinate of u (the bound is quadratic in it)."""
    g = np.array([-1.0, 1.0]) / np.sqrt(3.0)
    grid = np.array(np.meshgrid(*[g] * len(eps), indexing="ij")).reshape(len(eps), -1).T
    return grid * (eps / 2.0)[None, :], np.full(len(grid), 1.0 / len(grid))


@pytest.mark.parametrize("q", [0, 2])
def test_dequantized_bound_is_the_bound_averaged_over_the_cell(q):
    """With q(z, x) held (those of the rows ``y``), the bound of the rows ``y + u``, ``u`` uniform on the
    cell of widths ``eps`` (term by term, exact quadrature), is the bound of ``dequantized(stats, eps^2 /
    12)``: the plain bound less ``N/2 sum_d eps_d^2 / 12 / Psi_d``. With q(x | z) the optimum for each
    ``y + u`` (q(z) held) it is the plain bound less ``resolution_penalty``, a smaller penalty (equal at
    rank 0); re-optimising q(z) too only raises it (each is a lower bound on the dequantized rows'
    evidence)."""
    y, labels = _planted(n_per=8, k=2, d=3, q=2, seed=6)
    prior, post = _fitted(y, labels, 2, q)
    stats, resp, _ = mfa.estep(y, post, operand=mfa.stacked_operand(post, np.float64))
    eps = np.array([0.5, 0.2, 0.9])
    nodes, w = _cell(eps)
    held = sum(wi * _per_term_bound(y + u, resp, post, prior, y_q=y) for u, wi in zip(nodes, w, strict=True))
    deq = mfa.elbo(mfa.dequantized(stats, eps ** 2 / 12.0), post, prior).total
    assert deq == pytest.approx(held, rel=TOL64)
    penalty = mfa.held_penalty(post.noise, len(y), eps ** 2 / 12.0)
    assert penalty == pytest.approx(len(y) * (eps ** 2 / 24.0 / post.noise).sum(), rel=1e-12)
    assert mfa.elbo(stats, post, prior).total - deq == pytest.approx(penalty, rel=1e-9)
    # q(x | z) the optimum for each y + u (q(z) held): the marginal precisions' penalty, and no more
    free = sum(wi * _per_term_bound(y + u, resp, post, prior) for u, wi in zip(nodes, w, strict=True))
    marginal = mfa.resolution_penalty(post, resp.sum(0), eps ** 2 / 12.0)
    assert free == pytest.approx(_per_term_bound(y, resp, post, prior) - marginal, rel=TOL64)
    assert marginal <= penalty and (q == 0) == (marginal == pytest.approx(penalty, rel=1e-12))
    refit = sum(wi * mfa.elbo(mfa.estep(y + u, post, operand=mfa.stacked_operand(post, np.float64))[0],
                              post, prior).total for u, wi in zip(nodes, w, strict=True))
    assert refit >= deq


def test_dequantized_m_step_adds_the_variance_and_the_bound_never_decreases():
    """The M-step of the dequantized statistics: ``Psi`` of the plain one plus the variance, q(L) and the
    hyperparameters the same, and ``Psi`` the bound's maximiser (moving it lowers the bound); VB EM on
    them never decreases their bound."""
    y, labels = _planted(n_per=60, k=3, d=6, q=2, seed=7)
    prior, post = _fitted(y, labels, 3, 2)
    stats, _, _ = mfa.estep(y, post, operand=mfa.stacked_operand(post, np.float64))
    v = 0.05
    plain, deq = mfa.m_step(stats, post, prior), mfa.m_step(mfa.dequantized(stats, v), post, prior)
    np.testing.assert_allclose(deq.noise, plain.noise + v, rtol=1e-12)
    np.testing.assert_array_equal(deq.loadings, plain.loadings)
    np.testing.assert_array_equal(deq.ard, plain.ard)
    best = mfa.elbo(mfa.dequantized(stats, v), deq, prior).total
    for f in (0.98, 1.02):
        for j in (0, 5):
            moved = deq.noise.copy()
            moved[j] *= f
            assert mfa.elbo(mfa.dequantized(stats, v), replace(deq, noise=moved), prior).total < best
    history = []
    post = mfa.initial_posterior(y, np.random.default_rng(0).integers(0, 5, len(y)), 5, 2, prior, seed=0)
    for _ in range(40):
        stats = mfa.dequantized(mfa.estep(y, post, operand=mfa.stacked_operand(post, np.float64))[0], v)
        post = mfa.m_step(stats, post, prior)
        history.append(mfa.elbo(stats, post, prior).total)
    assert np.all(np.diff(history) >= -1e-9 * np.abs(history[1:])) and history[-1] > history[0]
