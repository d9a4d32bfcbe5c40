"""Empirical Bayes for the mixture's hyperparameters: the exact ELBO maximised over the prior.

Only ``kl_components`` of the bound (:func:`vbcore.model.elbo.elbo_terms`) depends on the prior of the
means and precisions, and with q(Z) and q(theta) held fixed it is a sum of K terms, each the
expectation of ``ln p(mu_k, Lambda_k)`` under q. Each update below is the exact maximiser of the
bound over one hyperparameter with everything else held, so applying them between the M-step and
the bound's evaluation never lowers the bound (coordinate ascent on one objective); the next
iteration's M-step then uses the updated prior (MacKay 1992 calls this the evidence framework;
Bishop 2006 sec. 10.2 gives the model). Closed forms, with ``E[Lambda_k]`` the posterior mean precision:

* covariance prior (``W0^-1`` of the Wishart families, the Gamma rates ``s0`` of the diagonal ones):
  ``K nu0 (sum_k E[Lambda_k])^-1`` -- per dimension for 'diag' (``s0_d = K nu0 / sum_k E[lambda_kd]``),
  one scale for 'spherical';
* the strength ``nu0`` of the Gamma priors with their mean ``1 / v`` held (:func:`best_strength`);
* mean precision: ``beta0 = K D / sum_k [D / beta_k + (m_k - m0)^T E[Lambda_k] (m_k - m0)]``;
* the strength ``nu0`` of the Gamma priors (diag, spherical), jointly with their rates: with the
  rates at their optimum the bound is concave in the shape ``a0`` (``nu0 / 2`` for diag, ``nu0 D / 2``
  for spherical) and stationary where ``ln a0 - psi(a0) = mean[ln mean_k E[lambda_k] - mean_k
  E[ln lambda_k]]`` (the maximum-likelihood equation of a Gamma shape, solved by Newton's method as
  Minka 2002 does); the rates follow from it.

``m0`` stays where it was set (it is also the rows' shift); the Wishart families' ``nu0`` too (it
must stay above D - 1). 'fixed' has no covariance prior: only ``beta0`` moves.

**The 'empirical' defaults free ``beta0`` only; the 'bound' defaults ``beta0`` and the 'strength'**
(:func:`vbcore.model.priors.default_prior`; issues 26, 51): ``nu0`` of the diagonal families with the
prior's mean precision ``nu0 / s0`` held (:func:`best_strength`), at least ``STRENGTH_FLOOR``: with
the floor, the posterior rate of a dimension without spread stays at least ``STRENGTH_FLOOR v / 2``
and the bound stays bounded (below the floor, ``a0 -> 0`` is the singularity described next, in
another coordinate).
With the covariance prior free as well, the bound has no maximum wherever a component has no spread
in some dimension (ReLU features: a cluster that is exactly 0 there). Scaling ``beta0`` and the
Gamma rates by ``s`` (q following) moves the bound by ``c ln s`` with
``c = sum_{k,d} (1/2 + a0) - sum_{(k,d) without spread} (a0 + N_k / 2)``, negative once the
(component, dimension) pairs without spread hold more than about ``(1 + 2 a0) K D`` rows in all (the
30 classes of issue 26's synthetic 20,000 x 64 store: 28,777 rows against 5,760 with ``a0 = 1``);
the bound then grows without limit as ``s -> 0``. Each update above is still the exact coordinate
maximum, so the ascent runs to that singularity: on that store, in float64 with ``reg_covar = 0``,
``beta0`` fell to 1e-29 and the precisions rose to 1e23 within 30 iterations; with the default
``reg_covar`` they stop at its floor (1e6), where the float32 E-step's rounding made the reported
bound fall by up to hundreds of nats (float64 rows: monotone; docs/decisions.md). The
covariance prior and ``nu0`` updates stay available through :attr:`Prior.empirical` for data
without such ties; with ``beta0`` alone (the covariance prior held) the bound is bounded above.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior

#: the least ``nu0`` the 'strength' update takes: one row's worth of the prior (see :func:`best_strength`)
STRENGTH_FLOOR = 1.0

#: the hyperparameters empirical Bayes may re-estimate (:attr:`Prior.empirical` names a subset)
EMPIRICAL = ("mean_precision", "covariance", "degrees_of_freedom", "strength")


def quad_to_prior_mean(post: Posterior, m0: np.ndarray) -> np.ndarray:
    """``(m_k - m0)^T E[Lambda_k] (m_k - m0)`` per component, shape (K,)."""
    v = post.means - m0
    ct = post.covariance_type
    if ct in ("full", "tied"):
        u = post.precisions_cholesky
        y = v @ u if ct == "tied" else np.einsum("kd,kde->ke", v, u)
        return np.sum(y * y, axis=1)
    if ct in ("spherical", "fixed"):
        return np.einsum("kd,kd->k", v, v) / post.covariances
    return np.sum(v * v / post.covariances, axis=1)


def best_covariance_prior(post: Posterior, nu0: float) -> np.ndarray:
    """The covariance prior that maximises the bound given q(Lambda): ``K nu0 (sum_k E[Lambda_k])^-1``."""
    ct = post.covariance_type
    k = post.n_components
    if ct == "tied":  # K equal factors: nu0 E[Lambda]^-1
        return nu0 * post.covariances
    if ct == "full":
        total = post.precisions().sum(0)
        out = k * nu0 * np.linalg.inv(total)
        return 0.5 * (out + out.T)
    if ct == "diag":
        return k * nu0 / np.sum(1.0 / post.covariances, axis=0)
    return np.asarray(k * nu0 / np.sum(1.0 / post.covariances))  # spherical


def gamma_shape(c: float, a: float = 1.0) -> float:
    """The root ``a`` of ``ln a - psi(a) = c`` (c > 0), by Newton's method on ``1/a`` (Minka 2002)."""
    from scipy.special import digamma, polygamma

    if not c > 0:
        return float("inf")
    a = 0.5 / c if not a > 0 else a
    for _ in range(100):
        g = np.log(a) - digamma(a) - c
        step = g / (1.0 / a - polygamma(1, a))
        nxt = a - step
        a = nxt if nxt > 0 else a / 2.0
        if abs(step) <= 1e-13 * a:
            break
    return float(a)


def best_gamma_prior(post: Posterior) -> tuple[float, np.ndarray]:
    """``(nu0, covariance prior)`` of a diagonal family at the bound's joint maximum given q(Lambda)."""
    from scipy.special import digamma

    nu, cov, d = post.degrees_of_freedom, post.covariances, post.n_features
    assert nu is not None
    if post.covariance_type == "diag":
        shape = 0.5 * nu[:, None]  # q(lambda_kd) = Gamma(nu_k / 2, nu_k cov_kd / 2)
        e_log = digamma(shape) - np.log(shape * cov)
        e_lam = 1.0 / cov
        c = float(np.mean(np.log(e_lam.mean(0)) - e_log.mean(0)))
        a0 = gamma_shape(c)
        return 2.0 * a0, 2.0 * a0 / e_lam.mean(0)
    shape = 0.5 * nu * d  # spherical: q(lambda_k) = Gamma(nu_k D / 2, nu_k D cov_k / 2)
    e_log = digamma(shape) - np.log(shape * cov)
    c = float(np.log(np.mean(1.0 / cov)) - np.mean(e_log))
    a0 = gamma_shape(c)
    nu0 = 2.0 * a0 / d
    return nu0, np.asarray(nu0 / np.mean(1.0 / cov))


def best_strength(post: Posterior, prior: Prior) -> float:
    """``nu0`` of a diagonal family at the bound's maximum given q(Lambda), with the prior's mean
    precision ``nu0 / s0`` held (the prior variance stays the data's; only its weight moves).

    With ``a0 = nu0 / 2`` (diag; ``nu0 D / 2`` spherical) and rate ``a0 v`` (``v = s0 / nu0``), the
    expected log prior of component k, dimension d is ``a0 ln(a0 v) - ln Gamma(a0) + (a0 - 1) E ln
    lambda - a0 v E lambda``; its sum is concave in ``a0`` (``1/a0 - psi'(a0) < 0``) and stationary where
    ``ln a0 - psi(a0) = -1 - mean[ln v + E ln lambda - v E lambda]`` (the right side is >= 0 by Jensen:
    ``E ln lambda <= ln E lambda`` and ``ln x - x <= -1``), solved as :func:`gamma_shape`. Unlike
    freeing the rate as well, the maximum is finite where a component has no spread (a large
    ``E lambda`` only lowers ``a0``); it does not grow with the number of rows."""
    from scipy.special import digamma

    nu, cov, d = post.degrees_of_freedom, post.covariances, post.n_features
    assert nu is not None and prior.covariance is not None
    v = np.asarray(prior.covariance, dtype=np.float64) / float(prior.degrees_of_freedom)
    if post.covariance_type == "diag":
        shape = 0.5 * nu[:, None]
        e_log = digamma(shape) - np.log(shape * cov)
        c = float(np.mean(np.log(v) + e_log - v / cov))
        return max(STRENGTH_FLOOR, 2.0 * gamma_shape(-1.0 - c))
    shape = 0.5 * nu * d
    e_log = digamma(shape) - np.log(shape * cov)
    c = float(np.mean(np.log(v) + e_log - v / cov))
    return max(STRENGTH_FLOOR, 2.0 * gamma_shape(-1.0 - c) / d)


def best_mean_precision(post: Posterior, m0: np.ndarray) -> float:
    """The ``beta0`` that maximises the bound given q(mu, Lambda)."""
    d = post.n_features
    k = post.n_components
    total = float(np.sum(d / post.mean_precision + quad_to_prior_mean(post, m0)))
    return k * d / total


def empirical_update(prior: Prior, post: Posterior) -> Prior:
    """The prior with its free hyperparameters (``prior.empirical``) at the bound's maximum given q.

    Never lowers :func:`vbcore.model.elbo.elbo_terms` for the same statistics and posterior. A value that
    would not be finite and positive (a degenerate posterior) leaves that hyperparameter as it was."""
    free = prior.empirical
    if not free:
        return prior
    changes: dict[str, object] = {}
    if "mean_precision" in free:
        beta0 = best_mean_precision(post, prior.mean)
        if np.isfinite(beta0) and beta0 > 0:
            changes["mean_precision"] = float(beta0)
    if ("degrees_of_freedom" in free and post.covariance_type in ("diag", "spherical")
            and post.n_components > 1):
        nu0, cov = best_gamma_prior(post)
        if np.isfinite(nu0) and nu0 > 0 and np.all(np.isfinite(cov)) and np.all(cov > 0):
            changes["degrees_of_freedom"] = float(nu0)
            changes["covariance"] = np.asarray(cov, dtype=np.float64)
    elif ("strength" in free and post.covariance_type in ("diag", "spherical")
            and prior.covariance is not None):
        nu0 = best_strength(post, prior)
        if np.isfinite(nu0) and nu0 > 0:
            changes["degrees_of_freedom"] = float(nu0)
            changes["covariance"] = (np.asarray(prior.covariance, dtype=np.float64)
                                     * (nu0 / float(prior.degrees_of_freedom)))
    elif "covariance" in free and prior.covariance is not None and post.covariance_type != "fixed":
        cov = best_covariance_prior(post, float(prior.degrees_of_freedom))
        if np.all(np.isfinite(cov)) and (cov.ndim == 2 or np.all(cov > 0)):
            changes["covariance"] = np.asarray(cov, dtype=np.float64)
    return replace(prior, **changes) if changes else prior


def prior_state(prior: Prior) -> dict[str, np.ndarray]:
    """The re-estimated hyperparameters as arrays (for checkpoints); empty when none are free."""
    out: dict[str, np.ndarray] = {}
    if "mean_precision" in prior.empirical:
        out["prior.mean_precision"] = np.asarray(prior.mean_precision, dtype=np.float64)
    if "covariance" in prior.empirical and prior.covariance is not None:
        out["prior.covariance"] = np.asarray(prior.covariance, dtype=np.float64)
    if "strength" in prior.empirical and prior.covariance is not None:
        out["prior.covariance"] = np.asarray(prior.covariance, dtype=np.float64)
    if "degrees_of_freedom" in prior.empirical or "strength" in prior.empirical:
        out["prior.degrees_of_freedom"] = np.asarray(prior.degrees_of_freedom, dtype=np.float64)
    return out


def prior_from_state(prior: Prior, state: dict[str, np.ndarray] | object) -> Prior:
    """``prior`` with the hyperparameters of :func:`prior_state` restored (bit for bit)."""
    get = state.get if hasattr(state, "get") else (lambda key: None)  # type: ignore[attr-defined]
    changes: dict[str, object] = {}
    beta0 = get("prior.mean_precision")
    if beta0 is not None:
        changes["mean_precision"] = float(np.asarray(beta0))
    nu0 = get("prior.degrees_of_freedom")
    if nu0 is not None:
        changes["degrees_of_freedom"] = float(np.asarray(nu0))
    cov = get("prior.covariance")
    if cov is not None:
        changes["covariance"] = np.array(cov, dtype=np.float64)
    return replace(prior, **changes) if changes else prior
