"""The exact evidence lower bound, with every constant, as named terms (Kuusela et al. 2009 eqs. 42-46).

``ELBO = log_likelihood - kl_assignments - kl_weights - kl_components`` where

* ``log_likelihood = E[ln p(X | Z, mu, Lambda)]`` (eq. 46);
* ``kl_assignments = E[ln q(Z) - ln p(Z | pi)] = sum r ln r - sum_k N_k E ln pi_k`` (eq. 43);
* ``kl_weights = KL(q(pi) || p(pi))`` (eq. 44), or ``sum_k KL(q(v_k) || Beta(1, alpha0))`` for the DP;
* ``kl_components = sum_k KL(q(mu_k, Lambda_k) || p(mu_k, Lambda_k))`` (eq. 45).

For 'tied' the K precisions keep their own Wishart priors and share one variational factor
``q(Lambda_k) = q(Lambda)`` (the model whose exact coordinate ascent is scikit-learn's tied update):
the likelihood needs only the pooled scatter ``sum_k N_k S_k``, and ``kl_components`` holds K equal
Wishart KLs (docs/algorithms.md has the derivation).

Because every constant is kept, bounds compare across K, component families, learners and libraries,
and for one component with Dirichlet weights the ELBO equals the exact log evidence.
The ELBO is evaluated from the statistics of q(Z) and the posterior q(theta) that the M-step built
from them, which is the value VB EM increases monotonically.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.special import betaln, digamma, gammaln, multigammaln

from vbcore.model.posterior import LOG_2PI, Posterior
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats

ArrayOrFloat = np.ndarray | float


@dataclass(frozen=True)
class ElboTerms:
    log_likelihood: float
    kl_assignments: float
    kl_weights: float
    kl_components: float

    @property
    def total(self) -> float:
        return self.log_likelihood - self.kl_assignments - self.kl_weights - self.kl_components

    def as_dict(self) -> dict[str, float]:
        out = asdict(self)
        out["total"] = self.total
        return out


def kl_dirichlet(alpha: np.ndarray, alpha0: np.ndarray) -> float:
    """KL(Dir(alpha) || Dir(alpha0)) (eq. 44)."""
    a_sum = alpha.sum()
    return float(
        gammaln(a_sum) - gammaln(alpha).sum() - gammaln(alpha0.sum()) + gammaln(alpha0).sum()
        + ((alpha - alpha0) * (digamma(alpha) - digamma(a_sum))).sum()
    )


def kl_beta(a: np.ndarray, b: np.ndarray, a0: float, b0: float) -> np.ndarray:
    """KL(Beta(a, b) || Beta(a0, b0)), elementwise."""
    return (
        betaln(a0, b0) - betaln(a, b) + (a - a0) * digamma(a) + (b - b0) * digamma(b)
        + (a0 - a + b0 - b) * digamma(a + b)
    )


def kl_gamma(a: ArrayOrFloat, b: ArrayOrFloat, a0: ArrayOrFloat, b0: ArrayOrFloat) -> np.ndarray:
    """KL(Gamma(shape a, rate b) || Gamma(shape a0, rate b0)), elementwise."""
    return (a - a0) * digamma(a) - gammaln(a) + gammaln(a0) + a0 * (np.log(b) - np.log(b0)) + a * (b0 - b) / b


def kl_wishart(nu: np.ndarray, cov: np.ndarray, nu0: float, cov0: np.ndarray,
               log_det_prec: np.ndarray, e_log_det: np.ndarray) -> np.ndarray:
    """KL(W(W_k, nu_k) || W(W0, nu0)) per component, with ``W_k = (nu_k cov_k)^-1``, ``W0^-1 = cov0``.

    ``ln B(W, nu) = -nu/2 ln|W| - nu D/2 ln 2 - ln Gamma_D(nu/2)`` (Bishop 2006 B.79); the KL is
    ``ln B(W,nu) - ln B(W0,nu0) + (nu-nu0)/2 E ln|Lambda| - nu D/2 + nu/2 Tr(W0^-1 W)``.
    """
    d = cov0.shape[0]
    log_det_w = log_det_prec - d * np.log(nu)  # ln|W_k|
    _, log_det_cov0 = np.linalg.slogdet(cov0)
    log_b = -0.5 * nu * log_det_w - 0.5 * nu * d * np.log(2.0) - multigammaln(0.5 * nu, d)
    log_b0 = 0.5 * nu0 * log_det_cov0 - 0.5 * nu0 * d * np.log(2.0) - multigammaln(0.5 * nu0, d)
    prec = np.linalg.inv(cov)  # E[Lambda_k] = nu_k W_k
    trace = np.einsum("ij,kji->k", cov0, prec)  # Tr(W0^-1 E[Lambda]) = nu Tr(W0^-1 W)
    return log_b - log_b0 + 0.5 * (nu - nu0) * e_log_det - 0.5 * nu * d + 0.5 * trace


def quad_precision(post: Posterior, v: np.ndarray) -> np.ndarray:
    """``v_k^T E[Lambda_k] v_k`` for (K, D) vectors."""
    if post.covariance_type == "tied":
        y = v @ post.precisions_cholesky
        return np.sum(y * y, axis=1)
    if post.covariance_type == "full":
        y = np.einsum("kd,kde->ke", v, post.precisions_cholesky)
        return np.sum(y * y, axis=1)
    if post.covariance_type in ("spherical", "fixed"):  # one precision per component: no (K, D) copy
        return np.einsum("kd,kd->k", v, v) / post.covariances
    return np.sum(post.precision_diagonal() * v * v, axis=1)


def trace_scatter(post: Posterior, scatter: np.ndarray) -> np.ndarray:
    """``Tr(E[Lambda_k] N_k S_k)``; for 'tied' the one value ``Tr(E[Lambda] sum_k N_k S_k)`` (shape (1,))
    from a pooled (1, D, D) or per-component (K, D, D) scatter."""
    if post.covariance_type == "tied":
        pooled = scatter[0] if scatter.shape[0] == 1 else scatter.sum(0)
        return np.array([np.sum(post.precisions() * pooled)])
    if post.covariance_type == "full":
        prec = np.einsum("kij,klj->kil", post.precisions_cholesky, post.precisions_cholesky)
        return np.einsum("kij,kji->k", prec, scatter)
    if post.covariance_type in ("spherical", "fixed"):
        return np.sum(scatter, axis=1) / post.covariances
    return np.sum(post.precision_diagonal() * scatter, axis=1)


def elbo_terms(stats: SuffStats, post: Posterior, prior: Prior) -> ElboTerms:
    """The exact ELBO of (q(Z) summarised by ``stats``, q(theta) = ``post``) under ``prior``."""
    nk = stats.nk
    d = post.n_features
    beta, beta0 = post.mean_precision, prior.mean_precision
    e_log_det = post.expected_log_det_precision()
    e_log_pi = post.expected_log_weights()

    # eq. 46: 1/2 sum_k N_k {E ln|Lambda| - D/beta - Tr(E[Lambda] S)
    #                         - (xbar-m)^T E[Lambda] (xbar-m) - D ln 2pi}
    xbar_minus_m = stats.mean - (post.means - stats.shift)
    if post.covariance_type == "tied":  # one trace term, sum_k of the per-component ones
        log_lik = 0.5 * np.sum(nk * (e_log_det - d / beta - d * LOG_2PI)) - 0.5 * (
            trace_scatter(post, stats.scatter)[0] + np.sum(nk * quad_precision(post, xbar_minus_m))
        )
    else:
        log_lik = 0.5 * np.sum(nk * (e_log_det - d / beta - d * LOG_2PI)) - 0.5 * np.sum(
            trace_scatter(post, stats.scatter) + nk * quad_precision(post, xbar_minus_m)
        )

    # eq. 43
    kl_z = stats.sum_rlogr - float(np.sum(nk * e_log_pi))

    # eq. 44 / stick-breaking
    wc = post.weight_concentration
    alpha0 = prior.weight_concentration
    if post.weight_type == "dirichlet_distribution":
        kl_w = kl_dirichlet(wc, np.full_like(wc, alpha0))
    else:
        kl_w = float(np.sum(kl_beta(wc[0], wc[1], 1.0, alpha0)))

    # eq. 45 (with the sign of the (m - m0) term corrected, see docs/algorithms.md)
    kl_mean = 0.5 * d * (beta0 / beta - 1.0 + np.log(beta / beta0)) + 0.5 * beta0 * quad_precision(
        post, post.means - prior.mean
    )
    ct = post.covariance_type
    if ct == "fixed":
        kl_prec = np.zeros_like(nk)
    elif ct == "tied":  # K copies of one Wishart KL (one per component's precision, all with q(Lambda))
        assert post.degrees_of_freedom is not None and prior.covariance is not None
        log_det_prec = np.atleast_1d(2.0 * np.log(np.diagonal(post.precisions_cholesky)).sum())
        one = kl_wishart(np.atleast_1d(post.degrees_of_freedom), post.covariances[None],
                         prior.degrees_of_freedom, np.asarray(prior.covariance), log_det_prec, e_log_det[:1])
        kl_prec = np.full(nk.shape, one[0])
    elif ct == "full":
        assert post.degrees_of_freedom is not None and prior.covariance is not None
        log_det_prec = 2.0 * np.log(np.diagonal(post.precisions_cholesky, axis1=1, axis2=2)).sum(1)
        kl_prec = kl_wishart(post.degrees_of_freedom, post.covariances, prior.degrees_of_freedom,
                             np.asarray(prior.covariance), log_det_prec, e_log_det)
    else:
        nu = post.degrees_of_freedom
        assert nu is not None and prior.covariance is not None
        nu0 = prior.degrees_of_freedom
        if ct == "diag":
            a, b = 0.5 * nu[:, None], 0.5 * nu[:, None] * post.covariances
            kl_prec = kl_gamma(a, b, 0.5 * nu0, 0.5 * np.asarray(prior.covariance)[None, :]).sum(1)
        else:
            s0 = float(np.asarray(prior.covariance))
            kl_prec = kl_gamma(0.5 * nu * d, 0.5 * nu * d * post.covariances, 0.5 * nu0 * d, 0.5 * d * s0)
    return ElboTerms(
        log_likelihood=float(log_lik),
        kl_assignments=float(kl_z),
        kl_weights=float(kl_w),
        kl_components=float(np.sum(kl_mean + kl_prec)),
    )


def minibatch_standard_error(n_rows: float, m: float, m2: float) -> float:
    """Standard error of a minibatch estimate ``(N/M) sum_{n in B} l_n`` of ``sum_n l_n`` over all N
    rows, from the minibatch's sum of squared deviations ``m2 = sum_{n in B} (l_n - mean)^2``, for B
    drawn uniformly without replacement (``pipeline.fit.learners.sampling.draw_rows``):
    ``N sqrt((1 - M/N) s^2 / M)`` with the sample variance ``s^2 = m2 / (M - 1)`` (Cochran 1977,
    chapter 2).

    ``l_n`` is row n's share of the ELBO (``ln sum_k rho_nk`` for a VB E-step, ``ln rho_{n z_n}`` for a
    one-hot q(z_n)); the global terms of the bound (the KL divergences of q(theta)) are computed
    exactly and add no error. 0 when the minibatch is the whole data set; NaN below two rows.
    """
    n, m = int(n_rows), int(m)
    if m >= n:
        return 0.0
    if m < 2:
        return float("nan")
    var = max(float(m2), 0.0) / (m - 1)
    return float(n * np.sqrt((1.0 - m / n) * var / m))
