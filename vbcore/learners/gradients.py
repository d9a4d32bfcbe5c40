"""Gradients of the exact ELBO in the softmax logits and the means (Kuusela et al. 2009 eqs. 47-53).

The gradient learners (GD, CG, NG, NCG) optimise the cost ``C = -ELBO`` (Kuusela et al. 2009 eq. 42) over

* the softmax logits ``gamma_nk`` of the responsibilities, ``r_nk = exp(gamma_nk) / sum_l exp(gamma_nl)``
  (eq. 47), with ``gamma_nK`` held fixed (K-1 free coordinates per sample), and
* the means ``m_k`` of ``q(mu_k | Lambda_k)``,

with every other variational parameter at its VB update given those two (:func:`conditional_update`).
The objective is therefore the function ``f(gamma, m) = ELBO(R(gamma), m, theta*(R, m))`` that
``vbcore.model.elbo.elbo_terms`` evaluates, and because ``theta*`` is the exact optimum of the ELBO given
``(R, m)``, the envelope theorem makes eqs. 48-51 its exact gradients (docs/algorithms.md).

Representation: per chunk we keep ``ln r_nk`` (the logits normalised so that ``logsumexp = 0``) as an
(n, K) array, so eq. 53 becomes ``ln r' = ln r + dgamma - logsumexp(ln r + dgamma)`` and no
responsibility underflows. Gradients and search directions are (n, K) arrays whose last column is 0
(``gamma_nK`` is not a coordinate). Per-chunk work is elementwise on (n, K) arrays plus the GEMMs of
``vbcore.kernels.estep`` (the E-step's ``ln rho`` and the statistics); no N x K x D array is built; data of
dtype float32 stays float32 and every sum across rows is accumulated in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vbcore.kernels.estep import (
    Chunk,
    EStepParams,
    array_namespace,
    chunk_statistics,
    log_rho,
    normalise,
    to_numpy,
    weigh,
)
from vbcore.model.mstep import weight_posterior
from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats

Array = Any


# ---- global (driver-side) part: the other parameters and the means ---------------------------------
def conditional_update(stats: SuffStats, prior: Prior, means: np.ndarray,
                       reg_covar: float = 0.0) -> Posterior:
    """The VB update of every parameter but the means, given q(Z) and the means ``m_k``.

    ``alpha_k``, ``beta_k = beta0 + N_k`` and ``nu_k = nu0 + N_k`` are those of eqs. 37-39 (they do
    not depend on ``m_k``). The precision posterior is the optimum of the ELBO for the given means:

        W_k^-1 = W0^-1 + N_k S_k + N_k (xbar_k - m_k)(xbar_k - m_k)^T + beta0 (m_k - m0)(m_k - m0)^T

    (its diagonal, or mean diagonal, for diag and spherical). With ``m_k`` at eq. 40 this is exactly
    eq. 41; for other ``m_k`` it is the value that makes eqs. 48-51 the exact gradient of the ELBO
    (eq. 41 itself is optimal only at eq. 40's means). ``reg_covar`` adds ``N_k reg_covar`` to the
    diagonal as in :func:`vbcore.model.mstep.m_step`.

    Parameters
    ----------
    stats : SuffStats
        Reduced statistics of q(Z) (means relative to ``stats.shift``).
    prior : Prior
    means : array of shape (n_components, n_features)
        ``m_k`` in the data's own coordinates.
    reg_covar : float
    """
    nk = stats.nk
    beta = prior.mean_precision + nk  # eq. 38
    means = np.asarray(means, dtype=np.float64)
    ms = means - stats.shift  # shifted coordinates, like stats.mean
    m0s = prior.mean - stats.shift
    dx = stats.mean - ms  # xbar_k - m_k (xbar = 0 where N_k = 0, and then N_k dx = 0)
    d0 = ms - m0s  # m_k - m0
    beta0 = prior.mean_precision
    ct = prior.covariance_type
    nu: np.ndarray | None
    if ct == "fixed":
        assert prior.fixed_variance is not None
        covariances = np.full(nk.shape, prior.fixed_variance)
        nu = None
    else:
        nu = prior.degrees_of_freedom + nk  # eq. 39
        d = prior.n_features
        cov0 = np.asarray(prior.covariance)
        if ct == "full":
            winv = (
                cov0[None]
                + stats.scatter
                + reg_covar * nk[:, None, None] * np.eye(d)[None]
                + nk[:, None, None] * dx[:, :, None] * dx[:, None, :]
                + beta0 * d0[:, :, None] * d0[:, None, :]
            )
            winv = 0.5 * (winv + winv.transpose(0, 2, 1))
            covariances = winv / nu[:, None, None]
        elif ct == "diag":
            rate2 = cov0[None] + stats.scatter + reg_covar * nk[:, None] + nk[:, None] * dx**2 + beta0 * d0**2
            covariances = rate2 / nu[:, None]
        else:  # spherical
            rate2 = (cov0 + (stats.scatter.sum(1) + nk * (dx**2).sum(1) + beta0 * (d0**2).sum(1)) / d
                     + reg_covar * nk)
            covariances = rate2 / nu
    return Posterior(
        covariance_type=ct,
        weight_type=prior.weight_type,
        weight_concentration=weight_posterior(nk, prior),  # eq. 37 (or the sticks)
        mean_precision=beta,
        means=means,
        degrees_of_freedom=nu,
        covariances=covariances,
    )


def precision_times(post: Posterior, v: np.ndarray) -> np.ndarray:
    """``E[Lambda_k] v_k`` (= ``nu_k W_k v_k``) for (K, D) vectors."""
    if post.covariance_type == "full":
        u = post.precisions_cholesky  # E[Lambda_k] = U_k U_k^T
        return np.einsum("kde,kfe,kf->kd", u, u, v)
    return post.precision_diagonal() * v


def _mean_residual(stats: SuffStats, post: Posterior, prior: Prior) -> np.ndarray:
    """``N_k (m_k - xbar_k) + beta0 (m_k - m0)``, (K, D)."""
    ms = post.means - stats.shift
    return stats.nk[:, None] * (ms - stats.mean) + prior.mean_precision * (ms - (prior.mean - stats.shift))


def mean_gradient(stats: SuffStats, post: Posterior, prior: Prior) -> np.ndarray:
    """``dC/dm_k = nu_k W_k (N_k (m_k - xbar_k) + beta0 (m_k - m0))`` (Kuusela et al. 2009 eq. 48), (K, D).

    ``C = -ELBO``; ``post`` must be :func:`conditional_update` of ``stats`` (or eq. 41: ``W_k`` does
    not depend on ``m_k`` in either, so this is the exact partial derivative in both cases).
    """
    return precision_times(post, _mean_residual(stats, post, prior))


def mean_metric(post: Posterior) -> np.ndarray:
    """The Fisher blocks ``A_k = beta_k nu_k W_k = beta_k E[Lambda_k]`` of the means, (K, D, D)."""
    d = post.n_features
    if post.covariance_type == "full":
        u = post.precisions_cholesky
        prec = np.einsum("kij,klj->kil", u, u)
    else:
        prec = post.precision_diagonal()[:, :, None] * np.eye(d)[None]
    return post.mean_precision[:, None, None] * prec


def mean_natural_gradient(stats: SuffStats, post: Posterior, prior: Prior) -> np.ndarray:
    """``A_k^-1 dC/dm_k = (N_k (m_k - xbar_k) + beta0 (m_k - m0)) / beta_k``, shape (K, D).

    A natural-gradient step of length 1 from any ``m`` lands on eq. 40 (Kuusela et al. 2009 sec. IV-C).
    """
    return _mean_residual(stats, post, prior) / post.mean_precision[:, None]


# ---- per-chunk part: the logits ------------------------------------------------------------------
def log_softmax(z: Array) -> tuple[Array, Array, Array]:
    """``ln r`` (rows normalised in the log domain), ``r`` and ``sum_k r ln r`` per row, of logits z."""
    xp = array_namespace(z)
    r, log_norm, rlogr = normalise(z)
    return z - xp.reshape(log_norm, (-1, 1)), r, rlogr


def logit_gradient(log_r: Array, log_rho_: Array, natural: bool) -> tuple[Array, Array]:
    """The gradient of C in the free logits (eqs. 49-51) and the search-space gradient ``h``.

    With ``c_nk = ln r_nk - ln rho_nk`` (``ln rho`` of eq. 36, so ``E_nk = r_nk c_nk`` of eq. 50 up to
    a per-row constant that cancels in eq. 49),

        g_nk = E_nk - r_nk F_n = r_nk (c_nk - sum_l r_nl c_nl),   k < K     (eqs. 49, 51)

    and ``h = g`` (Euclidean) or the natural gradient ``h = B_n^-1 g_n`` with
    ``B_n = diag(r_n) - r_n r_n^T`` on the K-1 free coordinates. By Sherman-Morrison
    ``B_n^-1 = diag(1/r_n) + 1 1^T / r_nK``, which gives ``h_nk = c_nk - c_nK``: no division at all.
    Both are returned as (n, K) arrays whose last column is 0.

    Parameters
    ----------
    log_r : array of shape (n, K)
        Normalised log responsibilities.
    log_rho_ : array of shape (n, K)
        Unnormalised log responsibilities of the current q(theta) (eq. 36), same dtype.
    natural : bool
    """
    xp = array_namespace(log_r)
    r = xp.exp(log_r)
    c = log_r - log_rho_
    k = c.shape[1]
    free = xp.concat((xp.ones((k - 1,), dtype=c.dtype), xp.zeros((1,), dtype=c.dtype)))
    cbar = xp.sum(r * c, axis=1, keepdims=True)
    g = r * (c - cbar) * free  # eq. 49 with F_n of eq. 51; gamma_nK is not free
    h = (c - c[:, k - 1 : k]) if natural else g
    return g, h


def direction(h: Array, p_prev: Array | None, beta: float) -> Array:
    """``p = -h + beta p_prev`` (Kuusela et al. 2009 eqs. 8, 16; Honkela et al. 2007 eq. 20)."""
    if p_prev is None or beta == 0.0:
        return -h
    return beta * p_prev - h


def vdot64(a: Array, b: Array) -> float:
    """``sum a * b`` over all elements with a float64 accumulator."""
    xp = array_namespace(a)
    return float(to_numpy(xp.sum(a * b, dtype=xp.float64)))


@dataclass(frozen=True)
class GradSums:
    """Inner products over the logit coordinates of some rows (float64; merged in chunk order).

    ``gg = g.g``, ``gh = g.h`` (for the natural gradient the squared Riemannian norm, eq. 17),
    ``g_hprev = g.h_{t-1}`` and ``g_pprev = g.p_{t-1}`` (for Polak-Ribiere, eq. 18, and the
    directional derivative), with ``g`` the current gradient of C.
    """

    gg: float
    gh: float
    g_hprev: float
    g_pprev: float

    def merge(self, other: GradSums) -> GradSums:
        return GradSums(self.gg + other.gg, self.gh + other.gh, self.g_hprev + other.g_hprev,
                        self.g_pprev + other.g_pprev)


@dataclass(frozen=True)
class LogitState:
    """What a chunk keeps between passes: its logits, last gradient and last search direction.

    Attributes
    ----------
    log_r : array of shape (n, K)
        ``ln r_nk``, normalised (the logits gamma of eq. 47 up to a per-row constant).
    h : array of shape (n, K) or None
        The (natural) gradient at ``log_r``; None before the first gradient pass.
    p : array of shape (n, K) or None
        The last search direction; None before the first step.
    """

    log_r: Array
    h: Array | None = None
    p: Array | None = None


def logit_init_kernel(chunk: Chunk, params: EStepParams) -> tuple[LogitState, SuffStats]:
    """Start from a posterior: ``ln r`` of its VB E-step (eqs. 35-36), and their statistics."""
    log_r, r, rlogr = log_softmax(log_rho(chunk, params))
    return LogitState(log_r), chunk_statistics(chunk, r, rlogr)


def logit_gradient_kernel(chunk: Chunk, state: LogitState, params: EStepParams, lam: float, beta: float,
                          natural: bool) -> tuple[LogitState, GradSums]:
    """Take the accepted step ``lam`` along ``p = -h + beta p_prev`` (eq. 53; ``lam = 0``: none),
    then the gradient at the new point under ``params`` (the q(theta) there), and its inner products.
    """
    log_r, p = state.log_r, state.p
    if state.h is not None and lam != 0.0:
        p = direction(state.h, state.p, beta)
        log_r = log_softmax(log_r + lam * p)[0]  # eq. 53 in the log domain
    g, h = logit_gradient(log_r, log_rho(chunk, params), natural)
    # weighted rows: row n stands for w_n copies with the same logits, so its direction is one copy's
    # and its inner products count w_n times (the same steps as the repeated rows)
    gw = weigh(chunk, 0, g)[0]
    sums = GradSums(
        gg=vdot64(gw, g),
        gh=vdot64(gw, h),
        g_hprev=0.0 if state.h is None else vdot64(gw, state.h),
        g_pprev=0.0 if p is None else vdot64(gw, p),
    )
    return LogitState(log_r, h, p), sums


def logit_trial_kernel(chunk: Chunk, state: LogitState, lam: float, beta: float) -> SuffStats:
    """Statistics of the responsibilities ``lam`` along ``p = -h + beta p_prev`` (eq. 53): one
    line-search evaluation. The chunk's state is unchanged."""
    assert state.h is not None
    _, r, rlogr = log_softmax(state.log_r + lam * direction(state.h, state.p, beta))
    return chunk_statistics(chunk, r, rlogr)
