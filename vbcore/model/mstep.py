"""The VB M-step: q(pi) q(mu, Lambda) from sufficient statistics (Kuusela et al. 2009 eqs. 37-41).

A pure function of (statistics, prior): it returns a new :class:`Posterior` and touches no data, so
the driver runs it on the reduced statistics of all chunks.
"""

from __future__ import annotations

import numpy as np

from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats


def weight_posterior(nk: np.ndarray, prior: Prior) -> np.ndarray:
    """``alpha_k = alpha0 + N_k`` (eq. 37), or the stick posteriors
    ``q(v_k) = Beta(1 + N_k, alpha0 + sum_{j>k} N_j)`` for the truncated DP."""
    alpha0 = prior.weight_concentration
    if prior.weight_type == "dirichlet_distribution":
        return alpha0 + nk
    tail = np.concatenate((np.cumsum(nk[::-1])[-2::-1], [0.0]))
    return np.vstack((1.0 + nk, alpha0 + tail))


def _tied_wishart(stats: SuffStats, prior: Prior, reg_covar: float, shrink: np.ndarray,
                  diff: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The shared ``q(Lambda) = W(W, nu)`` of 'tied': the normalised geometric mean of the K
    per-component optima of eq. 41 (scikit-learn's ``_estimate_wishart_tied``; docs/algorithms.md)::

        nu     = nu0 + N / K
        W^-1   = W0^-1 + (1/K) sum_k [N_k S_k + beta0 N_k / beta_k (xbar_k - m0)(xbar_k - m0)^T]

    Returns ``nu`` (0-d) and ``covariances = W^-1 / nu`` (D, D). ``stats.scatter`` may be pooled
    (1, D, D) or per component (K, D, D).
    """
    nk = stats.nk
    k, d = nk.shape[0], prior.n_features
    pooled = stats.scatter[0] if stats.pooled else stats.scatter.sum(0)
    between = (shrink[:, None] * diff).T @ diff  # sum_k beta0 N_k / beta_k d_k d_k^T, one GEMM
    winv = np.asarray(prior.covariance) + (pooled + between + reg_covar * nk.sum() * np.eye(d)) / k
    winv = 0.5 * (winv + winv.T)
    nu = np.asarray(prior.degrees_of_freedom + nk.sum() / k, dtype=np.float64)
    return nu, winv / nu


def m_step(stats: SuffStats, prior: Prior, reg_covar: float = 0.0) -> Posterior:
    """Optimal q(pi, mu, Lambda) given q(Z) summarised by ``stats``.

    ``reg_covar`` adds ``N_k * reg_covar`` to the diagonal of the scatter (``N * reg_covar`` to the
    pooled scatter of 'tied'), exactly as scikit-learn does; it makes the update a slightly
    regularised one, so the ELBO is guaranteed monotone only for ``reg_covar = 0``.

    Parameters
    ----------
    stats : SuffStats
        Reduced statistics of all rows (means relative to ``stats.shift``).
    prior : Prior
    reg_covar : float
    """
    nk = stats.nk
    beta0, nu0 = prior.mean_precision, prior.degrees_of_freedom
    beta = beta0 + nk  # eq. 38
    m0s = prior.mean - stats.shift  # prior mean in shifted coordinates
    diff = stats.mean - m0s  # xbar_k - m0, where N_k > 0 (mean is 0 otherwise and N_k = 0)
    means = (beta0 * m0s + nk[:, None] * stats.mean) / beta[:, None] + stats.shift  # eq. 40
    shrink = beta0 * nk / beta  # beta0 N_k / (beta0 + N_k)
    ct = prior.covariance_type
    if ct == "fixed":
        assert prior.fixed_variance is not None
        covariances = np.full(nk.shape, prior.fixed_variance)
        nu = None
    else:
        nu = nu0 + nk  # eq. 39
        d = prior.n_features
        cov0 = np.asarray(prior.covariance)
        if ct == "full":
            # eq. 41: W_k^-1 = W0^-1 + N_k S_k + beta0 N_k/(beta0+N_k) (xbar_k - m0)(xbar_k - m0)^T
            winv = (
                cov0[None]
                + stats.scatter
                + reg_covar * nk[:, None, None] * np.eye(d)[None]
                + shrink[:, None, None] * diff[:, :, None] * diff[:, None, :]
            )
            winv = 0.5 * (winv + winv.transpose(0, 2, 1))
            covariances = winv / nu[:, None, None]
        elif ct == "tied":
            nu, covariances = _tied_wishart(stats, prior, reg_covar, shrink, diff)
        elif ct == "diag":
            rate2 = cov0[None] + stats.scatter + reg_covar * nk[:, None] + shrink[:, None] * diff**2
            covariances = rate2 / nu[:, None]
        else:  # spherical
            rate2 = cov0 + (stats.scatter.sum(1) + shrink * (diff**2).sum(1)) / d + reg_covar * nk
            covariances = rate2 / nu
    return Posterior(
        covariance_type=ct,
        weight_type=prior.weight_type,
        weight_concentration=weight_posterior(nk, prior),
        mean_precision=beta,
        means=means,
        degrees_of_freedom=nu,
        covariances=covariances,
    )
