"""The posterior predictive density of the mixture: ``ln p(x | data) = ln sum_k E[pi_k] St_k(x)``.

Each component's predictive integrates its Gaussian against ``q(mu_k, Lambda_k)`` in closed form:

* full and tied: a D-variate Student-t with ``nu_k + 1 - D`` degrees of freedom and scale matrix
  ``(1 + beta_k) / (beta_k (nu_k + 1 - D)) W_k^-1`` (Bishop 2006, eq. 10.81); 'tied' uses the shared
  ``W, nu`` for every component;
* diag: a product of 1-D Student-t with ``nu_k`` degrees of freedom and squared scale
  ``c_kd (1 + beta_k) / beta_k`` (independent Gamma precisions);
* spherical: one Gamma precision shared by the D dimensions, a D-variate Student-t with ``nu_k D``
  degrees of freedom and scale ``c_k (1 + beta_k) / beta_k`` times the identity;
* fixed: a Gaussian with variance ``sigma^2 (1 + beta_k) / beta_k``.

For the truncated Dirichlet process the expected weights sum to less than one; the rest belongs to the
components beyond the truncation, whose posterior is the prior, so it takes the prior predictive.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.linalg import solve_triangular
from scipy.special import gammaln, logsumexp

from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior


def student_t_logpdf(X: np.ndarray, loc: np.ndarray, chol_prec: np.ndarray, dof: float,
                     full: bool) -> np.ndarray:
    """Multivariate Student-t log density with precision ``U U^T`` (full) or ``diag(U**2)``.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    loc : array of shape (n_features,)
    chol_prec : array of shape (n_features, n_features) or (n_features,)
        ``U`` with the inverse scale matrix ``U U^T``, or its diagonal square roots.
    dof : float
    full : bool
        Whether ``chol_prec`` is a matrix.

    Returns
    -------
    array of shape (n_samples,)
    """
    d = X.shape[1]
    if full:
        y = (X - loc) @ chol_prec
        log_det = 2.0 * np.log(np.diag(chol_prec)).sum()
    else:
        y = (X - loc) * chol_prec
        log_det = 2.0 * np.log(chol_prec).sum()
    maha = np.sum(y * y, axis=1)
    return (gammaln(0.5 * (dof + d)) - gammaln(0.5 * dof) - 0.5 * d * np.log(dof * np.pi)
            + 0.5 * log_det - 0.5 * (dof + d) * np.log1p(maha / dof))


def component_predictive(X: np.ndarray, ct: str, m: np.ndarray, beta: float, nu: float | None,
                         cov: Any) -> np.ndarray:
    """Posterior predictive log density of one component, shape (n_samples,).

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    ct : str
        The covariance type ('tied' is computed as 'full' with the shared ``W, nu``).
    m : array of shape (n_features,)
    beta : float
    nu : float or None
        None for 'fixed'.
    cov : array of shape (D, D), (D,) or float
        ``E[Lambda_k]^-1`` (``W^-1 / nu`` for full and tied; the variances otherwise).
    """
    d = X.shape[1]
    scale = (1.0 + beta) / beta
    if ct == "fixed":
        var = cov * scale
        return -0.5 * d * np.log(2 * np.pi * var) - 0.5 * np.sum((X - m) ** 2, axis=1) / var
    assert nu is not None
    if ct in ("full", "tied"):
        dof = nu + 1.0 - d
        # precision L = dof * beta / (1 + beta) * W, W = (nu cov)^-1
        sigma = np.asarray(cov) * nu * scale / dof
        chol = np.linalg.cholesky(sigma)
        u = solve_triangular(chol, np.eye(d), lower=True).T
        return student_t_logpdf(X, m, u, dof, True)
    if ct == "diag":  # independent 1-D t's with nu dof, scale^2 = cov (1+beta)/beta
        s2 = np.asarray(cov) * scale
        z = (X - m) ** 2 / s2
        return np.sum(gammaln(0.5 * (nu + 1)) - gammaln(0.5 * nu) - 0.5 * np.log(nu * np.pi * s2)
                      - 0.5 * (nu + 1) * np.log1p(z / nu), axis=1)
    # spherical: one shared Gamma precision -> multivariate t with nu*D dof
    var_sph = float(cov) * scale
    return student_t_logpdf(X, m, np.full(d, 1.0 / np.sqrt(var_sph)), nu * d, False)


def posterior_predictive_logpdf(X: np.ndarray, post: Posterior, prior: Prior) -> np.ndarray:
    """``ln p(x | data)`` under the variational posterior: ``ln sum_k E[pi_k] St_k(x)``.

    Parameters
    ----------
    X : array of shape (n_samples, n_features), float64
    post : Posterior
    prior : Prior

    Returns
    -------
    array of shape (n_samples,)
    """
    ct = post.covariance_type
    w = post.expected_weights()
    nu = post.degrees_of_freedom
    tied = ct == "tied"
    cols = []
    for k in range(post.n_components):
        nu_k = None if nu is None else float(nu) if tied else nu[k]
        cov_k = post.covariances if tied else post.covariances[k]
        cols.append(np.log(w[k]) + component_predictive(X, ct, post.means[k], post.mean_precision[k],
                                                        nu_k, cov_k))
    rest = 1.0 - w.sum()
    if post.weight_type == "dirichlet_process" and rest > 0:
        if ct == "fixed":
            cov0: Any = prior.fixed_variance
            nu0 = None
        else:  # each component beyond K has its own precision with the prior W(W0, nu0) (or Gamma)
            nu0 = prior.degrees_of_freedom
            cov0 = np.asarray(prior.covariance) / nu0
        cols.append(np.log(rest) + component_predictive(X, ct, prior.mean, prior.mean_precision,
                                                         nu0, cov0))
    return logsumexp(np.stack(cols, axis=1), axis=1)
