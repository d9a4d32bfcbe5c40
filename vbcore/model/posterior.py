"""The variational posterior q(pi) q(mu, Lambda) and the expectations the E-step and ELBO need.

Precisions are stored through ``covariances = E[Lambda_k]^-1`` as in scikit-learn: for 'full'
``covariances[k] = W_k^-1 / nu_k`` (Kuusela et al. 2009 eq. 41 divided by eq. 39); for 'tied' one shared
``q(Lambda) = W(W, nu)`` with ``covariances = W^-1 / nu`` of shape (D, D), ``nu`` a 0-d array and
``precisions_cholesky`` (D, D), scikit-learn's layout. For 'diag' the posterior is
``lambda_kd ~ Gamma(nu_k/2, nu_k covariances[k, d]/2)``, for 'spherical'
``lambda_k ~ Gamma(nu_k D/2, nu_k D covariances[k]/2)``; for 'fixed' ``covariances[k] = sigma^2``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.linalg import solve_triangular
from scipy.special import digamma

from vbcore.errors import NumericalError

LOG_2PI = float(np.log(2.0 * np.pi))


@dataclass(frozen=True)
class Posterior:
    """Variational parameters of the mixture (all float64).

    Attributes
    ----------
    covariance_type, weight_type : str
    weight_concentration : array of shape (n_components,) or (2, n_components)
        ``alpha_k`` (Kuusela et al. 2009 eq. 37) or the Beta parameters ``(a_k, b_k)`` of the sticks.
    mean_precision : array of shape (n_components,)
        ``beta_k`` (eq. 38).
    means : array of shape (n_components, n_features)
        ``m_k`` (eq. 40).
    degrees_of_freedom : array of shape (n_components,), () or None
        ``nu_k`` (eq. 39); 0-d (one ``nu``) for 'tied'; None for 'fixed'.
    covariances : array of shape (K, D, D), (D, D), (K, D) or (K,)
        ``E[Lambda_k]^-1`` (full, diag, spherical, fixed), ``E[Lambda]^-1`` (tied).
    precisions_cholesky : array of the shape of ``covariances``
        ``U`` with ``E[Lambda] = U U^T`` (full, tied), ``E[Lambda]^(1/2)`` (the others).
    """

    covariance_type: str
    weight_type: str
    weight_concentration: np.ndarray
    mean_precision: np.ndarray
    means: np.ndarray
    degrees_of_freedom: np.ndarray | None
    covariances: np.ndarray
    precisions_cholesky: np.ndarray = field(repr=False, default=None)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        if self.precisions_cholesky is None:
            object.__setattr__(
                self, "precisions_cholesky", precision_cholesky(self.covariances, self.covariance_type)
            )

    @property
    def n_components(self) -> int:
        return int(self.means.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.means.shape[1])

    def take(self, indices: np.ndarray | list[int]) -> Posterior:
        """The posterior of the components ``indices`` (a 1-d integer array, in that order; an index
        may repeat, e.g. to append copies of components), every field taken as stored: nothing is
        recomputed, so ``take(range(K))`` equals the original bit for bit.

        Per-component fields are indexed along the component axis: ``weight_concentration`` ((K,) or
        the sticks' (2, K)), ``mean_precision``, ``means``, ``degrees_of_freedom``, ``covariances`` and
        ``precisions_cholesky`` (full, diag, spherical, fixed). For 'tied' the shared ``covariances``,
        ``precisions_cholesky`` (D, D) and 0-d ``degrees_of_freedom`` are not per component: they are
        copied unchanged.

        For ``weight_type='dirichlet_process'`` the raw Beta parameters ``(a_k, b_k)`` of the selected
        sticks are taken. A stick is a fraction of what the earlier sticks leave, so in a new order
        (or with components dropped) they describe different mixture weights; a caller that wants
        sticks consistent with the new order (as SVI's pruning does) re-derives them itself.
        """
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise ValueError("Posterior.take: indices must be a 1-d integer array (for a boolean mask, "
                             f"pass np.flatnonzero(mask)); got dtype {idx.dtype} and shape {idx.shape}")
        idx = idx.astype(np.intp, copy=False)
        nu = self.degrees_of_freedom
        if self.covariance_type == "tied":
            shared = (None if nu is None else nu.copy(), self.covariances.copy(),
                      self.precisions_cholesky.copy())
        else:
            shared = (None if nu is None else nu[idx], self.covariances[idx], self.precisions_cholesky[idx])
        return Posterior(self.covariance_type, self.weight_type, self.weight_concentration[..., idx],
                         self.mean_precision[idx], self.means[idx], *shared)

    # ---- expectations -------------------------------------------------------------------------
    def expected_log_weights(self) -> np.ndarray:
        """``E[ln pi_k]`` (Kuusela et al. 2009 eq. 34; Blei & Jordan 2006 for the truncated DP)."""
        return expected_log_weights(self.weight_concentration, self.weight_type)

    def expected_weights(self) -> np.ndarray:
        """``E[pi_k]``. For the DP these sum to less than one: the rest belongs to k > K."""
        wc = self.weight_concentration
        if self.weight_type == "dirichlet_distribution":
            return wc / wc.sum()
        a, b = wc
        ev = a / (a + b)
        return ev * np.concatenate(([1.0], np.cumprod(1.0 - ev[:-1])))

    def expected_log_det_precision(self) -> np.ndarray:
        """``E[ln |Lambda_k|]``, shape (K,) (Kuusela et al. 2009, eq. 33, for 'full' and 'tied',
        where all K are equal; Gamma moments for the others)."""
        d = self.n_features
        if self.covariance_type == "fixed":
            return -d * np.log(self.covariances)
        nu = self.degrees_of_freedom
        assert nu is not None
        log_det_prec = log_det_from_cholesky(self.precisions_cholesky, self.covariance_type, d)
        if self.covariance_type in ("full", "tied"):
            # E ln|Lambda| = sum_i psi((nu+1-i)/2) + D ln 2 + ln|W|, with W = (nu * cov)^-1
            i = np.arange(1, d + 1)
            nu_k = np.atleast_1d(nu)
            psi = digamma(0.5 * (nu_k[:, None] + 1 - i[None, :])).sum(1)
            value = psi + d * np.log(2.0) - d * np.log(nu_k) + log_det_prec
            return np.broadcast_to(value, (self.n_components,)).copy()
        if self.covariance_type == "diag":
            # sum_d psi(nu/2) - ln(nu sigma_d^2 / 2)
            return d * (digamma(0.5 * nu) + np.log(2.0) - np.log(nu)) + log_det_prec
        # spherical: D (psi(nu D/2) - ln(nu D sigma^2/2))
        return d * (digamma(0.5 * nu * d) + np.log(2.0) - np.log(nu * d)) + log_det_prec

    def precision_diagonal(self) -> np.ndarray:
        """``E[Lambda_k]`` as per-dimension vectors (K, D) for the diagonal families."""
        d = self.n_features
        if self.covariance_type == "diag":
            return 1.0 / self.covariances
        if self.covariance_type in ("spherical", "fixed"):
            return np.repeat((1.0 / self.covariances)[:, None], d, axis=1)
        raise ValueError("precision_diagonal is defined for the diagonal families only")

    def precisions(self) -> np.ndarray:
        """``E[Lambda_k]`` in scikit-learn's ``precisions_`` layout: (K, D, D) full, (D, D) tied,
        (K, D) diag, (K,) spherical and fixed."""
        u = self.precisions_cholesky
        if self.covariance_type == "full":
            return np.einsum("kij,klj->kil", u, u)
        if self.covariance_type == "tied":
            return u @ u.T
        return u**2


def expected_log_weights(weight_concentration: np.ndarray, weight_type: str) -> np.ndarray:
    if weight_type == "dirichlet_distribution":
        return digamma(weight_concentration) - digamma(weight_concentration.sum())
    a, b = weight_concentration
    dab = digamma(a + b)
    log_v = digamma(a) - dab
    log_1mv = digamma(b) - dab
    return log_v + np.concatenate(([0.0], np.cumsum(log_1mv[:-1])))


def precision_cholesky(covariances: np.ndarray, covariance_type: str) -> np.ndarray:
    """Cholesky factors ``U`` of ``E[Lambda]`` with ``E[Lambda] = U U^T`` (scikit-learn's layout)."""
    if covariance_type == "tied":
        try:
            chol = np.linalg.cholesky(covariances)
        except np.linalg.LinAlgError:
            raise NumericalError(
                "the shared (tied) covariance is not positive definite; increase reg_covar or "
                "covariance_prior, or scale the data"
            ) from None
        return solve_triangular(chol, np.eye(covariances.shape[0]), lower=True).T
    if covariance_type == "full":
        k, d, _ = covariances.shape
        out = np.empty_like(covariances)
        eye = np.eye(d)
        for j in range(k):
            try:
                chol = np.linalg.cholesky(covariances[j])
            except np.linalg.LinAlgError:
                raise NumericalError(
                    f"the covariance of component {j} is not positive definite; increase reg_covar "
                    "or covariance_prior, or scale the data"
                ) from None
            out[j] = solve_triangular(chol, eye, lower=True).T
        return out
    if np.any(covariances <= 0) or not np.all(np.isfinite(covariances)):
        j = int(np.flatnonzero(~(covariances > 0) | ~np.isfinite(covariances))[0]) // max(
            1, covariances.size // covariances.shape[0]
        )
        raise NumericalError(
            f"the variance of component {j} is not positive and finite; increase reg_covar or "
            "covariance_prior, or scale the data"
        )
    return 1.0 / np.sqrt(covariances)


def log_det_from_cholesky(prec_chol: np.ndarray, covariance_type: str, d: int) -> np.ndarray:
    """``ln |E[Lambda_k]|`` from the Cholesky factors (a scalar for 'tied')."""
    if covariance_type == "tied":
        return 2.0 * np.log(np.diagonal(prec_chol)).sum()
    if covariance_type == "full":
        return 2.0 * np.log(np.diagonal(prec_chol, axis1=1, axis2=2)).sum(1)
    if covariance_type == "diag":
        return 2.0 * np.log(prec_chol).sum(1)
    return 2.0 * d * np.log(prec_chol)


# ---- the one posterior (de)serialiser (checkpoints and run directories) ----------------------------
def posterior_arrays(post: Posterior, prefix: str = "", suffix: str = "") -> dict[str, np.ndarray]:
    """The arrays that define ``post``, keyed ``prefix + field + suffix`` (checkpoints use the bare
    field names, run directories the estimator's ``means_`` style); see :func:`posterior_from_arrays`."""
    out = {"weight_concentration": np.asarray(post.weight_concentration),
           "mean_precision": post.mean_precision, "means": post.means, "covariances": post.covariances}
    if post.degrees_of_freedom is not None:
        out["degrees_of_freedom"] = post.degrees_of_freedom
    return {prefix + k + suffix: np.asarray(v) for k, v in out.items()}


def posterior_from_arrays(arrays: dict[str, np.ndarray] | Any, covariance_type: str, weight_type: str,
                          prefix: str = "", suffix: str = "") -> Posterior:
    """The posterior written by :func:`posterior_arrays` (a dict or an open ``.npz``)."""
    def key(name: str) -> str:
        return prefix + name + suffix

    dof = key("degrees_of_freedom")
    return Posterior(covariance_type, weight_type, np.asarray(arrays[key("weight_concentration")]),
                     np.asarray(arrays[key("mean_precision")]), np.asarray(arrays[key("means")]),
                     np.asarray(arrays[dof]) if dof in arrays else None,
                     np.asarray(arrays[key("covariances")]))
