"""Pattern search for VB EM (Kuusela et al. 2009 sec. II-A; Honkela et al. 2003): moves of q(theta)
along the change of its parameters over the last VB EM cycle.

The line search runs in coordinates ``xi`` in which every point of the line is a valid posterior:

* weights: ``ln alpha_k`` (Dirichlet) or ``ln a_k, ln b_k`` (stick-breaking Beta posteriors);
* ``ln beta_k``; the means ``m_k`` as they are;
* degrees of freedom: ``ln(nu_k - D + 1)`` for the Wishart (``nu_k > D - 1``), ``ln nu_k`` for the
  Gamma families;
* ``E[Lambda_k]^-1``: the log-Cholesky factor (its lower triangle with the log of its diagonal) for
  'full' (of the one shared matrix for 'tied', whose ``nu`` is one number), the log variances for
  'diag' and 'spherical'; 'fixed' has none.

``extrapolate(old, new, lam)`` is the posterior at ``xi(new) + lam (xi(new) - xi(old))``:
``lam = 0`` gives ``new`` and ``lam = -1`` gives ``old`` (up to rounding).
"""

from __future__ import annotations

import numpy as np

from vbcore.model.posterior import Posterior


def _to_xi(post: Posterior) -> dict[str, np.ndarray]:
    d = post.n_features
    xi = {"wc": np.log(post.weight_concentration), "beta": np.log(post.mean_precision), "m": post.means}
    ct = post.covariance_type
    if ct == "fixed":
        return xi
    nu = post.degrees_of_freedom
    assert nu is not None
    wishart = ct in ("full", "tied")
    xi["nu"] = np.log(nu - d + 1.0) if wishart else np.log(nu)
    if wishart:
        chol = np.linalg.cholesky(post.covariances.reshape(-1, d, d))
        k = chol.shape[0]
        idx = np.arange(d)
        chol[:, idx, idx] = np.log(chol[:, idx, idx])
        xi["cov"] = chol[:, *np.tril_indices(d)].reshape(k, -1)
    else:
        xi["cov"] = np.log(post.covariances)
    return xi


def _from_xi(xi: dict[str, np.ndarray], like: Posterior) -> Posterior:
    d = like.n_features
    ct = like.covariance_type
    nu = None
    covariances = like.covariances
    if ct != "fixed":
        wishart = ct in ("full", "tied")
        nu = np.exp(xi["nu"]) + d - 1.0 if wishart else np.exp(xi["nu"])
        if wishart:
            k = xi["cov"].shape[0]  # K, or 1 for the shared matrix of 'tied'
            chol = np.zeros((k, d, d))
            rows, cols = np.tril_indices(d)
            chol[:, rows, cols] = xi["cov"]
            idx = np.arange(d)
            chol[:, idx, idx] = np.exp(chol[:, idx, idx])
            covariances = chol @ chol.transpose(0, 2, 1)
            if ct == "tied":
                covariances = covariances[0]
        else:
            covariances = np.exp(xi["cov"])
    return Posterior(ct, like.weight_type, np.exp(xi["wc"]), np.exp(xi["beta"]), xi["m"], nu, covariances)


class PatternLine:
    """The line through ``old`` and ``new`` in ``xi`` coordinates (both converted once)."""

    def __init__(self, old: Posterior, new: Posterior) -> None:
        self.new = new
        self.b = _to_xi(new)
        a = _to_xi(old)
        self.delta = {key: self.b[key] - a[key] for key in self.b}

    def at(self, lam: float) -> Posterior:
        """The posterior ``lam`` pattern steps beyond ``new`` along ``xi(new) - xi(old)``.

        Raises ``vbcore.errors.NumericalError`` when the result is not a valid posterior (far too
        long a step overflows).
        """
        return _from_xi({key: self.b[key] + lam * self.delta[key] for key in self.b}, self.new)


def extrapolate(old: Posterior, new: Posterior, lam: float) -> Posterior:
    """``PatternLine(old, new).at(lam)``."""
    return PatternLine(old, new).at(lam)
