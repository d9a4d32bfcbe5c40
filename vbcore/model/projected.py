"""The bound of the original rows for a fit on projected rows, and the bound at a stated resolution.

**Projected fits** (issue 51). A mixture fitted to ``y = (x - m) W`` (``W`` the ``P`` leading
principal directions ``V``, divided by their standard deviations ``sqrt(lambda_j)`` when whitened)
models only ``P`` of the ``D`` dimensions of ``x``. To compare its bound with that of a fit of ``x``
itself, the rows are written in the orthonormal basis ``[V, V_perp]``: a rotation (Jacobian 1), then
the scaling of the ``P`` leading coordinates by ``1/sqrt(lambda_j)`` when whitened (log-Jacobian
``-1/2 sum_j ln lambda_j`` per row), and the ``D - P`` coordinates ``z = V_perp^T (x - m)`` that the
projection drops are modelled by one isotropic Gaussian ``N(0, s^2 I)``. Then

    ln p(x) = ln p_model(y) + ln |det dy/dx| + ln N(z | 0, s^2 I),

and with the mixture's ELBO for ``ln p_model(y)`` the sum is a lower bound on the log density of the
original rows. The complement's variance is the type-II maximum-likelihood one,
``s^2 = sum_n |z_n|^2 / (N (D - P))`` -- the mean of the dropped eigenvalues, probabilistic PCA's
``sigma^2`` (Tipping & Bishop 1999) -- and the projection (``m``, ``V``, ``lambda``) is likewise a
point estimate: the complement term is a (maximised) log-likelihood, not a variational bound, and
costs the projected fit ``(D - P) / 2 ln(N (D - P))``-order nats in all (not per row) against a
conjugate prior on ``s^2``, nothing at the sizes screened. ``|z_n|^2 = |(x_n - m) - V V^T (x_n - m)|^2``
is summed in float64 from the residual itself (not ``|x - m|^2 - |y|^2``, which cancels).

**Resolution** (uniform dequantization, Theis et al. 2016). A density on continuous
rows can put unbounded mass on data with no spread along a dimension (CNN features: ~69% exact
zeros): a component's precision there grows without end and so does its bound. The bound of the data
*at resolution* ``eps`` (per feature) is that of ``x + u``, ``u`` uniform on the cell
``[-eps/2, eps/2]^D``: ``ln P(cell) >= E_u ln p(x + u) + sum_d ln eps_d``. The ELBO is quadratic in the
row, so with ``q`` held, ``E_u ELBO(x + u) = ELBO(x) - 1/2 sum_k N_k Tr(E[Lambda_k] C)`` with ``C`` the
noise's covariance in the model's space (``diag(eps^2 / 12)`` unprojected, ``W^T diag(eps^2/12) W``
projected): a precision gains ``1/2 ln lambda`` per row but pays ``lambda eps^2 / 24``, so the bound no
longer rewards precision beyond ``~12 / eps^2``. The constant ``sum_d ln eps_d`` is the same for every
candidate of the same rows and is left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vbcore.model.elbo import trace_scatter
from vbcore.model.posterior import LOG_2PI, Posterior


@dataclass(frozen=True)
class Complement:
    """What the projection drops, summed over rows: ``sum_n |z_n|^2`` of ``dims = D - P`` dimensions,
    and the dequantization noise's variance there (``Tr(V_perp^T diag(eps^2/12) V_perp)`` per row)."""

    n_rows: float
    dims: int
    residual_sum: float
    noise: float = 0.0

    def variance(self) -> float:
        """The type-II maximum-likelihood ``s^2`` (of the dequantized rows when ``noise`` > 0)."""
        return (self.residual_sum / self.n_rows + self.noise) / self.dims

    def log_likelihood(self) -> float:
        """``sum_n E_u ln N(z_n + u | 0, s^2 I)`` at the maximising ``s^2`` (0 when nothing is dropped):
        ``-N (D - P) / 2 (ln(2 pi s^2) + 1)``."""
        if self.dims == 0:
            return 0.0
        return -0.5 * self.n_rows * self.dims * (LOG_2PI + np.log(self.variance()) + 1.0)


def complement_residuals(x: np.ndarray, mean: np.ndarray, components: np.ndarray) -> np.ndarray:
    """``|(x_n - m) - V V^T (x_n - m)|^2`` per row, float64 (``components`` = ``V``, orthonormal (D, P))."""
    xc = np.asarray(x, dtype=np.float64) - np.asarray(mean, dtype=np.float64)
    v = np.asarray(components, dtype=np.float64)
    r = xc - (xc @ v) @ v.T
    return np.einsum("nd,nd->n", r, r)


def complement(x: np.ndarray, mean: np.ndarray, components: np.ndarray,
               resolution: np.ndarray | None = None) -> Complement:
    """The :class:`Complement` of rows ``x`` under the projection ``(mean, components)``; ``resolution``
    (per feature ``eps_d``, or None) adds the dequantization noise's share in the complement."""
    d, p = np.asarray(components).shape
    noise = 0.0
    if resolution is not None:
        var = np.asarray(resolution, dtype=np.float64) ** 2 / 12.0
        v = np.asarray(components, dtype=np.float64)
        noise = float(var.sum() - np.einsum("dp,d,dp->", v, var, v))
    return Complement(float(x.shape[0]), d - p, float(complement_residuals(x, mean, components).sum()),
                      max(noise, 0.0))


def log_jacobian(variances: np.ndarray, whiten: bool) -> float:
    """``ln |det dy/dx|`` per row of the map onto ``(y, z)``: ``-1/2 sum_j ln lambda_j`` when whitened,
    else 0 (a rotation)."""
    return -0.5 * float(np.sum(np.log(np.asarray(variances, dtype=np.float64)))) if whiten else 0.0


def noise_covariance(resolution: np.ndarray, matrix: np.ndarray | None = None) -> np.ndarray:
    """The covariance of the dequantization noise ``u`` (``eps_d^2 / 12`` per feature) in the model's
    space: ``diag`` (D, D) unprojected, ``W^T diag W`` (P, P) through ``matrix`` = ``W``."""
    var = np.asarray(resolution, dtype=np.float64) ** 2 / 12.0
    if matrix is None:
        return np.diag(var)
    w = np.asarray(matrix, dtype=np.float64)
    return w.T @ (var[:, None] * w)


def resolution_penalty(post: Posterior, nk: np.ndarray, noise: np.ndarray) -> float:
    """``1/2 sum_k N_k Tr(E[Lambda_k] C)``: what the bound at resolution loses against the plain one
    (``noise`` = ``C``, (D, D) in the model's space; the diagonal families read its diagonal)."""
    nk = np.asarray(nk, dtype=np.float64)
    ct = post.covariance_type
    if ct in ("full",):
        scatter = nk[:, None, None] * noise[None, :, :]
    elif ct == "tied":
        scatter = (float(nk.sum()) * noise)[None, :, :]
    else:
        scatter = nk[:, None] * np.diagonal(noise)[None, :]
    return 0.5 * float(np.sum(trace_scatter(post, scatter)))


def soft_counts(post: Posterior, alpha0: float) -> np.ndarray:
    """``N_k`` from the weights' posterior (``alpha_k - alpha0``, or ``a_k - 1`` for the sticks)."""
    wc = post.weight_concentration
    return (wc[0] - 1.0) if post.weight_type == "dirichlet_process" else wc - alpha0
