"""Slow, obviously-right references for the tests (not part of the package)."""

from __future__ import annotations

import numpy as np
from scipy.special import digamma, gammaln, multigammaln
from sklearn.mixture import BayesianGaussianMixture
from sklearn.mixture._gaussian_mixture import _estimate_log_gaussian_prob

TOL = {np.float64: 1e-10, np.float32: 1e-4}


class SklearnFromResp(BayesianGaussianMixture):
    """scikit-learn's BayesianGaussianMixture started from given responsibilities.

    ``exact_diag=True`` replaces, for covariance_type='diag', scikit-learn's ``E ln|Lambda|`` (the
    Wishart formula ``sum_i psi((nu - i)/2)``) by the exact one of independent Gamma precisions,
    ``D psi(nu/2)``; that single term is the only difference between its diag model and ours
    (docs/decisions.md). Everything else is scikit-learn's own code.
    """

    def __init__(self, resp=None, exact_diag=False, **kwargs):
        super().__init__(**kwargs)
        self.resp = resp
        self.exact_diag = exact_diag

    @classmethod
    def _get_param_names(cls):
        return sorted(set(BayesianGaussianMixture._get_param_names()) | {"resp", "exact_diag"})

    def _initialize_parameters(self, X, random_state, xp=None):
        self._initialize(X, np.asarray(self.resp, dtype=float))

    def _estimate_log_prob(self, X, xp=None):
        if not (self.exact_diag and self.covariance_type == "diag"):
            return super()._estimate_log_prob(X, xp=xp)
        d = X.shape[1]
        nu = self.degrees_of_freedom_
        log_gauss = _estimate_log_gaussian_prob(
            X, self.means_, self.precisions_cholesky_, self.covariance_type
        ) - 0.5 * d * np.log(nu)
        log_lambda = d * np.log(2.0) + d * digamma(0.5 * nu)
        return log_gauss + 0.5 * (log_lambda - d / self.mean_precision_)


def log_evidence_normal_wishart(X, m0, beta0, nu0, cov0):
    """ln p(X) of x_n ~ N(mu, Lambda^-1), mu ~ N(m0, (beta0 Lambda)^-1), Lambda ~ W(cov0^-1, nu0)."""
    n, d = X.shape
    xbar = X.mean(0)
    S = (X - xbar).T @ (X - xbar)
    betan, nun = beta0 + n, nu0 + n
    covn = cov0 + S + beta0 * n / betan * np.outer(xbar - m0, xbar - m0)
    return (
        -0.5 * n * d * np.log(np.pi)
        + multigammaln(0.5 * nun, d) - multigammaln(0.5 * nu0, d)
        + 0.5 * nu0 * np.linalg.slogdet(cov0)[1] - 0.5 * nun * np.linalg.slogdet(covn)[1]
        + 0.5 * d * np.log(beta0 / betan)
    )


def log_evidence_normal_gamma_shared(X, m0, beta0, a0, b0):
    """ln p(X) with one Gamma(a0, b0) precision shared by all D dimensions (spherical)."""
    n, d = X.shape
    xbar = X.mean(0)
    betan = beta0 + n
    an = a0 + 0.5 * n * d
    bn = b0 + 0.5 * (((X - xbar) ** 2).sum() + beta0 * n / betan * ((xbar - m0) ** 2).sum())
    return (-0.5 * n * d * np.log(2 * np.pi) + 0.5 * d * np.log(beta0 / betan)
            + gammaln(an) - gammaln(a0) + a0 * np.log(b0) - an * np.log(bn))


def log_evidence_fixed_bruteforce(X, m0, beta0, sigma2):
    """ln p(X) for x_n ~ N(mu, sigma2 I), mu ~ N(m0, sigma2/beta0 I): the joint Gaussian of all rows,
    evaluated with scipy per dimension (rows are correlated through mu)."""
    from scipy.stats import multivariate_normal

    n, d = X.shape
    cov = sigma2 * np.eye(n) + sigma2 / beta0 * np.ones((n, n))
    return sum(multivariate_normal(mean=np.full(n, m0[j]), cov=cov).logpdf(X[:, j]) for j in range(d))


def brute_log_rho(X, post):
    """ln rho_nk by explicit loops over components in float64 (seed 000 eq. 36)."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    out = np.empty((n, post.n_components))
    e_log_pi = post.expected_log_weights()
    e_log_det = post.expected_log_det_precision()
    for k in range(post.n_components):
        if post.covariance_type == "full":
            prec = np.linalg.inv(post.covariances[k])
        elif post.covariance_type == "tied":
            prec = np.linalg.inv(post.covariances)
        else:
            prec = np.diag(post.precision_diagonal()[k])
        diff = X - post.means[k]
        quad = np.einsum("ni,ij,nj->n", diff, prec, diff)
        out[:, k] = (e_log_pi[k] + 0.5 * e_log_det[k] - 0.5 * d * np.log(2 * np.pi)
                     - 0.5 * d / post.mean_precision[k] - 0.5 * quad)
    return out


def brute_stats(X, resp):
    """N_k, xbar_k, N_k S_k (full) by explicit loops in float64."""
    X = np.asarray(X, dtype=np.float64)
    resp = np.asarray(resp, dtype=np.float64)
    k = resp.shape[1]
    nk = resp.sum(0)
    mean = np.zeros((k, X.shape[1]))
    scat = np.zeros((k, X.shape[1], X.shape[1]))
    for j in range(k):
        if nk[j] > 0:
            mean[j] = (resp[:, j : j + 1] * X).sum(0) / nk[j]
            diff = X - mean[j]
            scat[j] = (resp[:, j, None, None] * diff[:, :, None] * diff[:, None, :]).sum(0)
    return nk, mean, scat


def stats_of(x: np.ndarray, resp: np.ndarray, ct: str, shift: np.ndarray):
    """The kernels' statistics of rows ``x`` under the responsibilities ``resp`` (with ``sum r ln r``)."""
    from vbcore.kernels.estep import chunk_statistics, prepare_chunk

    rlogr = np.sum(np.where(resp > 0, resp * np.log(np.where(resp > 0, resp, 1.0)), 0.0), axis=1)
    return chunk_statistics(prepare_chunk(x, shift, ct), resp, rlogr)


def planted_blobs(n: int = 3000, d: int = 6, k: int = 8, seed: int = 0, scale: float = 6.0,
                  unequal: bool = False):
    """``n`` rows of ``k`` unit-variance Gaussian classes in ``d`` dimensions (centres drawn with
    standard deviation ``scale``; class shares equal, or drawn from Dirichlet(2) with ``unequal``), and
    their labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=scale, size=(k, d))
    lab = rng.choice(k, size=n, p=rng.dirichlet(np.full(k, 2.0))) if unequal else rng.integers(0, k, size=n)
    return centres[lab] + rng.normal(size=(n, d)), lab


def planted_subspaces(n_classes: int, d: int, rows: int, spread: float, apart: float, noise: float,
                      seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Classes each with its own mean (``apart`` x a normal) and 2-dimensional subspace (``spread`` x a
    normal loading) in ``d`` dimensions, ``rows`` each plus isotropic ``noise``; rows shuffled."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in range(n_classes):
        lam = rng.normal(size=(d, 2)) * spread
        mu = rng.normal(size=d) * apart
        xs.append(rng.normal(size=(rows, 2)) @ lam.T + mu + noise * rng.normal(size=(rows, d)))
        ys.append(np.full(rows, c))
    order = rng.permutation(n_classes * rows)
    return np.concatenate(xs)[order], np.concatenate(ys)[order]


def same_fit_bits(a, b) -> None:
    """Two fitted VBMixture models have the same bits (means, covariances, weights, ELBO history)."""
    for name in ("means_", "covariances_", "weights_", "lower_bounds_"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.n_iter_ == b.n_iter_


def planted_small_classes(n_classes: int = 100, d: int = 32, lo: int = 25, hi: int = 400, seed: int = 0,
                          scale: float = 6.0, copies: int = 1):
    """Issue 51's shape, small: ``n_classes`` diagonal Gaussian classes of ``lo``-``hi`` rows (sizes
    log-uniform; per-dimension spreads 0.5-1.5), centres drawn with standard deviation ``scale``, every
    third class's neighbour placed near it; ``copies`` times as many rows of each class (the same
    classes, a store ``copies`` times larger). Rows (float32) and labels."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(lo), np.log(hi), n_classes)).astype(int)
    centres = rng.normal(0, scale, (n_classes, d))
    for j in range(0, n_classes - 1, 3):
        centres[j + 1] = centres[j] + rng.normal(0, 1.4 * scale / np.sqrt(d), d)
    spreads = np.exp(rng.uniform(np.log(0.5), np.log(1.5), (n_classes, d)))
    x = np.concatenate([c + s * rng.standard_normal((m * copies, d))
                        for c, s, m in zip(centres, spreads, sizes, strict=True)])
    return x.astype(np.float32), np.repeat(np.arange(n_classes), sizes * copies)
