"""Stochastic variational inference (Hoffman et al. 2013) for the truncated DP
mixture with a known isotropic variance: the baseline of Lim & Jiang 2024 Table 3.

The local step: the VB E-step on a minibatch (Kuusela et al. 2009 eq. 35,
:func:`vbcore.kernels.estep.vbem_kernel`).
The global step moves the natural parameters of q(v) and q(mu) towards the "intermediate" posterior
``lambda_hat`` that the minibatch statistics would give if the whole data set looked like the
minibatch (statistics scaled by N/M): ``lambda <- (1 - rho_t) lambda + rho_t lambda_hat`` with
``rho_t = (t + tau)^-kappa`` (Robbins-Monro: ``kappa`` in (0.5, 1]). For ``q(v_k) = Beta(a_k, b_k)``
the natural parameters are ``(a_k - 1, b_k - 1)``; for ``q(mu_k) = N(m_k, sigma^2 / beta_k I)`` they
are ``(beta_k m_k / sigma^2, -beta_k / (2 sigma^2))``: both are affine in ``(a, b)`` and
``(beta, beta m)``, which is what is blended.
"""

from __future__ import annotations

import numpy as np

from vbcore.model.mstep import m_step
from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats


def step_size(t: int, tau: float, kappa: float) -> float:
    """``rho_t = (t + tau)^-kappa`` for iteration ``t >= 1``."""
    return float((t + tau) ** -kappa)


def svi_update(post: Posterior, minibatch: SuffStats, prior: Prior, n_total: float, rho: float) -> Posterior:
    """One SVI global step from the statistics of a minibatch (soft responsibilities)."""
    scaled = scale_to(minibatch, n_total)
    hat = m_step(scaled, prior)
    beta = (1.0 - rho) * post.mean_precision + rho * hat.mean_precision
    beta_m = ((1.0 - rho) * post.mean_precision[:, None] * post.means
              + rho * hat.mean_precision[:, None] * hat.means)
    wc = (1.0 - rho) * post.weight_concentration + rho * hat.weight_concentration
    return Posterior(covariance_type=post.covariance_type, weight_type=post.weight_type,
                     weight_concentration=wc, mean_precision=beta, means=beta_m / beta[:, None],
                     degrees_of_freedom=None, covariances=post.covariances.copy())


def scale_to(minibatch: SuffStats, n_total: float) -> SuffStats:
    """A minibatch's statistics scaled to stand for data of total weight ``n_total`` (the row count
    of unweighted data): by ``n_total`` over the minibatch's own total weight."""
    scale = n_total / (max(minibatch.n_rows, 1) if minibatch.weight is None else minibatch.weight)
    if not np.isfinite(scale):  # a minibatch of zero-weight rows says nothing: no step
        scale = 0.0
    return SuffStats(nk=minibatch.nk * scale, mean=minibatch.mean, scatter=minibatch.scatter * scale,
                     sum_rlogr=minibatch.sum_rlogr * scale, n_rows=int(round(n_total)), shift=minibatch.shift,
                     weight=None if minibatch.weight is None else float(n_total))


def minibatch_vbem_kernel(chunk, rows, params):  # type: ignore[no-untyped-def]
    """The VB E-step and statistics (Kuusela et al. 2009 eqs. 30-36) of some rows of a chunk (a minibatch).

    Parameters
    ----------
    chunk : Chunk
    rows : int array of shape (m,)
        Positions inside the chunk.
    params : EStepParams
    """
    from vbcore.kernels.estep import Chunk, array_namespace, vbem_kernel

    xp = array_namespace(chunk.x)
    idx = xp.asarray(np.asarray(rows, dtype=np.int64))
    x = xp.take(chunk.x, idx, axis=0)
    feats = (xp.take(chunk.feats, idx, axis=0) if chunk.feats is not None
             else xp.concat((x * x, x), axis=1))
    w = None if chunk.w is None else xp.take(chunk.w, idx, axis=0)
    return vbem_kernel(Chunk(x=x, feats=feats, shift=chunk.shift, w=w), params)
