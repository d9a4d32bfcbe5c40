"""Point-estimate learners of the truncated Dirichlet-process mixture with a known isotropic variance
(Lim & Jiang 2024, sections 2-4): MAP assignments, minibatch gradients, SGA / SGA+M / SGA+F steps, the MM
update, pruning and the bound. The point, the MAP kernel of eq. 19, the hard statistics and the
seeding are in :mod:`vbcore.kernels.sga_stats`.

Model (Lim & Jiang 2024, eq. 1, with ``lambda0`` = our ``mean_precision`` beta0)::

    x_n | z_n = k ~ N(mu_k, sigma^2 I),   mu_k ~ N(m0, sigma^2 / lambda0 I),
    v_k ~ Beta(1, a0),                     pi_k = v_k prod_{l<k} (1 - v_l).

The global state is a :class:`~vbcore.kernels.sga_stats.DPPoint`: ``E[mu_k]`` (K, D) and ``E[v_k]`` (K,).
Everything that reads data is one chunk kernel, :func:`~vbcore.kernels.sga_stats.hard_kernel`: the MAP
assignment of eq. 19 as one float32 ``(n x D) @ (D x K)`` GEMM per 2,048-row block, then the hard
statistics of the assigned rows (``n_k``, per-cluster mean and per-dimension centred scatter)
accumulated in float64. From these statistics alone follow the minibatch gradients (eqs. 14, 16,
18), their empirical Fisher (eq. 11), the curvatures (eqs. 20, 21), the MM update and the bound
(eqs. 22-29). No N x K x D array exists.

Choices where Lim & Jiang 2024 is ambiguous (docs/algorithms.md, "SGA learners", has the reasoning):

* the averaged gradient (eq. 14) is the gradient of ``J = (1/N) ln p(x, z, mu, v)`` estimated from a
  minibatch of M rows: data terms averaged over the minibatch, prior terms (eqs. 16, 18) divided by
  N (the paper's literal eq. 14 would count the prior once per row);
* SGA / SGA+M step the means in units of sigma (``Delta mu = eta sigma^2 g``);
* SGA+F divides by the empirical Fisher (eq. 11) floored at the curvature of eqs. 20-21, which keeps
  the step at most ``eta`` times the Newton step where a dimension has no spread in the minibatch;
* a stick step that would leave (0, 1) goes half-way to the boundary instead;
* a cluster is pruned when ``E[v_k] < THR`` (section 4.5) for a THR the user sets; by default when
  its mixture weight ``pi_k`` is under a tenth of the largest weight at the start
  (``PRUNE_RELATIVE``, fixed for the fit by the learner). MM's weights are ``pi_k = n_k / (N + a0)``
  for every ``a0``, so the default is a share of the largest cluster's rows, whatever ``a0``; a
  relative rule on the sticks themselves is not (with ``a0 = 1`` the last stick is 1 and a tenth of it
  pruned every cluster but one); no fixed THR suits 10 and 400 classes alike (measured,
  docs/decisions.md); with any THR > 0 MM drops the clusters left without rows (MAP stick 0);
* the default rule spares a cluster that holds a row and whose mean is far from every other mean
  (:func:`separated`): the threshold is a share of the largest cluster, and a small class far from
  the rest is a cluster the bound wants however small it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vbcore.kernels.init import sq_dists
from vbcore.kernels.sga_stats import STICK_EPS, DPPoint, log_stick_weights
from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats

SGA_METHODS = ("sga", "sga-m", "sga-f")


# ---- eqs. 14, 16, 18, 20, 21, 11: gradients, curvatures, empirical Fisher -------------------------
@dataclass(frozen=True)
class Gradients:
    """Minibatch-averaged gradient of ``J = (1/N) ln p(x, z, mu, v)`` and its second moments.

    Attributes
    ----------
    mu, fisher_mu : arrays of shape (K, D)
        ``g(mu)`` (eqs. 14, 16) and the empirical Fisher ``(1/M) sum_n (grad_n)^2`` (eq. 11).
    curv_mu : array of shape (K,)
        ``-d^2 J / d mu_kd^2`` (eq. 20, averaged): ``n_k / (M sigma^2) + lambda0 / (N sigma^2)``.
    v, fisher_v, curv_v : arrays of shape (K,)
        The same for the sticks (eqs. 14, 18, 11, 21).
    """

    mu: np.ndarray
    fisher_mu: np.ndarray
    curv_mu: np.ndarray
    v: np.ndarray
    fisher_v: np.ndarray
    curv_v: np.ndarray


def gradients(stats: SuffStats, point: DPPoint, prior: Prior, sigma2: float, n_total: float,
              a0: float) -> Gradients:
    """Gradients of the minibatch objective from the minibatch's hard statistics.

    With M rows, ``n_k`` of them in cluster k, ``tau_k = sum_{j>k} n_j / M``, ``e = (a0 - 1) / N``::

        J_B = (1/M) sum_n sum_k z_nk [-|x_n - mu_k|^2 / (2 sigma^2) + ln v_k] + t_nk ln(1 - v_k)
              + (1/N) sum_k [-lambda0 |mu_k - m0|^2 / (2 sigma^2) + (a0 - 1) ln(1 - v_k)]

    (``t_nk = sum_{j>k} z_nj``), so ``g(mu_k) = n_k (xbar_k - mu_k) / (M sigma^2) - lambda0 (mu_k -
    m0) / (N sigma^2)`` (eq. 16) and ``g(v_k) = pi_k / v_k - (tau_k + e) / (1 - v_k)`` with
    ``pi_k = n_k / M`` (eq. 18). The per-row gradients are those summands; their mean squares
    (eq. 11) follow from the centred scatter because z is one-hot.
    """
    # M: the minibatch's rows, or their total weight (weighted rows; a minibatch of zero weight adds 0)
    m_rows = max(int(stats.n_rows), 1) if stats.weight is None else max(float(stats.weight), 1e-300)
    n = float(n_total)
    lam0 = prior.mean_precision
    nk = stats.nk
    nkc = nk[:, None]
    mu = point.means - stats.shift[None, :]
    # the K x D terms in place, in the order of the formulas above (one temporary at a time: these
    # run on the driver every minibatch, ~4x fewer passes over K x D than the plain expressions)
    delta = np.subtract(stats.mean, mu)  # xbar_k - mu_k
    delta[nk <= 0] = 0.0
    c = mu
    c -= (prior.mean - stats.shift)[None, :]
    c *= lam0
    c /= n * sigma2  # the prior part, per row
    g_mu = nkc * delta
    g_mu /= m_rows * sigma2
    g_mu -= c
    # sum_n z (x - mu)^2 = S_k + n_k delta^2, sum_n z (x - mu) = n_k delta
    f_mu = np.square(delta)
    f_mu *= nkc
    f_mu += stats.scatter
    f_mu /= sigma2**2
    t = 2.0 * c
    t *= nkc
    t *= delta
    t /= sigma2
    f_mu -= t
    f_mu /= m_rows
    np.square(c, out=t)
    f_mu += t
    curv_mu = nk / (m_rows * sigma2) + lam0 / (n * sigma2)

    v = np.clip(point.sticks, STICK_EPS, 1.0 - STICK_EPS)
    pi = nk / m_rows
    tau = np.concatenate((np.cumsum(nk[::-1])[-2::-1], [0.0])) / m_rows
    e = (a0 - 1.0) / n
    g_v = pi / v - (tau + e) / (1.0 - v)
    # grad_n = z/v - (t + e)/(1 - v); z t = 0, z^2 = z, t^2 = t
    f_v = pi / v**2 + (tau * (1.0 + 2.0 * e) + e * e) / (1.0 - v) ** 2 - 2.0 * pi * e / (v * (1.0 - v))
    curv_v = pi / v**2 + (tau + e) / (1.0 - v) ** 2
    return Gradients(g_mu, f_mu, curv_mu, g_v, np.maximum(f_v, 0.0), curv_v)


def minibatch_objective(x: np.ndarray, labels: np.ndarray, point: DPPoint, prior: Prior,
                        sigma2: float, n_total: int, a0: float) -> float:
    """``J_B`` of :func:`gradients` evaluated directly (float64 reference for tests)."""
    x = np.asarray(x, dtype=np.float64)
    m_rows = x.shape[0]
    k = point.n_components
    z = np.zeros((m_rows, k))
    z[np.arange(m_rows), labels] = 1.0
    t = np.cumsum(z[:, ::-1], axis=1)[:, ::-1] - z  # t_nk = sum_{j>k} z_nj
    sq = ((x[:, None, :] - point.means[None]) ** 2).sum(-1)
    v = point.sticks
    data = (z * (-sq / (2 * sigma2) + np.log(v)[None]) + t * np.log1p(-v)[None]).sum() / m_rows
    pri = (-prior.mean_precision * ((point.means - prior.mean) ** 2).sum(1) / (2 * sigma2)
           + (a0 - 1.0) * np.log1p(-v)).sum() / n_total
    return float(data + pri)


# ---- eqs. 8, 9, 15, 17: the steps --------------------------------------------------------------
@dataclass(frozen=True)
class Velocity:
    """Momentum ``gamma`` of eq. 8 for the means (K, D) and the sticks (K,)."""

    mu: np.ndarray
    v: np.ndarray

    @staticmethod
    def zeros(k: int, d: int) -> Velocity:
        return Velocity(np.zeros((k, d)), np.zeros(k))

    def take(self, order: np.ndarray) -> Velocity:
        return Velocity(self.mu[order], self.v[order])


def _inside(v: np.ndarray, step: np.ndarray) -> np.ndarray:
    """A stick step that would leave (0, 1) goes half-way to the boundary instead."""
    new = v + step
    step = np.where(new <= 0.0, -0.5 * v, step)
    return np.where(new >= 1.0, 0.5 * (1.0 - v), step)


def sga_step(point: DPPoint, grad: Gradients, *, method: str, eta: float, sigma2: float,
             velocity: Velocity | None = None, alpha: float = 0.9) -> tuple[DPPoint, Velocity]:
    """One update of the means and sticks.

    * ``sga`` (eqs. 15, 17): ``mu += eta sigma^2 g(mu)``, ``v += eta g(v)``;
    * ``sga-m`` (eq. 8): ``gamma = alpha gamma + eta P g``, ``theta += gamma`` (P as for sga);
    * ``sga-f`` (eqs. 9-11): ``theta += eta g / max(F, C)``, F the empirical Fisher (eq. 11) and C
      the curvature of eqs. 20-21, elementwise.

    Returns the new point and the velocity (the step taken, for sga-m; zeros otherwise).
    """
    if method == "sga-f":
        s_mu = eta * grad.mu / np.maximum(grad.fisher_mu, grad.curv_mu[:, None])
        den = np.maximum(grad.fisher_v, grad.curv_v)  # 0 only where g(v) is 0 too (a0 = 1, no rows after k)
        s_v = eta * np.divide(grad.v, den, out=np.zeros_like(den), where=den > 0)
    elif method in ("sga", "sga-m"):
        s_mu = eta * sigma2 * grad.mu
        s_v = eta * grad.v
        if method == "sga-m":
            if velocity is None:
                velocity = Velocity.zeros(*point.means.shape)
            s_mu = alpha * velocity.mu + s_mu
            s_v = alpha * velocity.v + s_v
    else:
        raise ValueError(f"method must be one of {SGA_METHODS}, got {method!r}")
    s_v = _inside(point.sticks, s_v)
    new = DPPoint(point.means + s_mu, np.clip(point.sticks + s_v, STICK_EPS, 1.0 - STICK_EPS))
    vel = Velocity(s_mu, s_v) if method == "sga-m" else Velocity.zeros(*point.means.shape)
    return new, vel


# ---- MM (Lim & Jiang 2024, ref. [28]; He, "GMMs by mean field VI"): MAP of every factor from all rows
def mm_update(stats: SuffStats, prior: Prior, a0: float) -> DPPoint:
    """``mu_k = (lambda0 m0 + n_k xbar_k) / (lambda0 + n_k)``; ``v_k`` = mode of
    ``Beta(1 + n_k, a0 + n_{>k})`` = ``n_k / (n_k + n_{>k} + a0 - 1)``."""
    nk = stats.nk
    lam0 = prior.mean_precision
    means = (lam0 * prior.mean[None, :] + nk[:, None] * stats.raw_mean()) / (lam0 + nk)[:, None]
    return DPPoint(means, mm_sticks(nk, a0))


def mm_sticks(nk: np.ndarray, a0: float) -> np.ndarray:
    """The sticks of :func:`mm_update` alone (K values, no K x D work)."""
    tail = np.concatenate((np.cumsum(nk[::-1])[-2::-1], [0.0]))
    denom = np.maximum(nk + tail + a0 - 1.0, nk)
    sticks = np.where(denom > 0, nk / np.where(denom > 0, denom, 1.0), 0.0)
    return np.clip(sticks, 0.0, 1.0 - STICK_EPS)


# ---- section 4.5: pruning and re-ordering ----------------------------------------------------------
def prune_order(sticks: np.ndarray, threshold: float, on: str = "sticks",
                support: np.ndarray | None = None, spare: np.ndarray | None = None) -> np.ndarray:
    """Indices of the clusters kept, by descending mixture weight ``pi_k = v_k prod_{l<k} (1 - v_l)``
    (stable): those with ``E[v_k] >= threshold`` (``on="sticks"``, section 4.5's rule) or with
    ``pi_k >= threshold`` (``on="weights"``, the default rule, :func:`default_threshold`); with
    ``support`` (weights the data give the clusters, e.g. the shares of a minibatch's counts), a
    cluster is kept when either its weight or its support reaches the threshold; ``spare`` (a
    boolean mask) keeps clusters whatever their weight. At least one cluster (the largest stick) is
    always kept. Use :func:`reorder` to move a point to this order:
    its sticks must be re-derived."""
    if on not in ("sticks", "weights"):
        raise ValueError(f"prune_order: on must be 'sticks' or 'weights', got {on!r}")
    weights = log_stick_weights(sticks)
    values = sticks if on == "sticks" else np.exp(weights)
    if support is not None:
        values = np.maximum(values, support)
    kept = values >= threshold
    keep = np.flatnonzero(kept if spare is None else kept | np.asarray(spare, dtype=bool))
    if keep.size == 0:
        keep = np.array([int(np.argmax(sticks))])
    return keep[np.argsort(-weights[keep], kind="stable")]


def reorder(point: DPPoint, order: np.ndarray) -> DPPoint:
    """The clusters ``order`` of ``point`` (kept and permuted) with the same mixture weights.

    A stick is a fraction of what the earlier sticks leave, so permuting the sticks themselves would
    change every weight (with ``a0 = 1`` MM's last stick is 1; moved first it would take all the
    weight). The new sticks are ``v'_j = pi'_j / (1 - sum_{i<j} pi'_i)`` of the permuted weights
    ``pi' = pi[order]``; the weight of dropped clusters stays with the remainder of the stick."""
    return DPPoint(point.means[order], sticks_of_weights(np.exp(log_stick_weights(point.sticks))[order]))


def sticks_of_weights(pi: np.ndarray) -> np.ndarray:
    """The sticks ``v_j = pi_j / (1 - sum_{i<j} pi_i)`` whose mixture weights are ``pi`` (in that
    order; weights summing to less than 1 leave the remainder of the stick), clipped into (0, 1)."""
    pi = np.asarray(pi, dtype=np.float64)
    left = 1.0 - np.concatenate(([0.0], np.cumsum(pi)[:-1]))
    return np.clip(pi / np.maximum(left, STICK_EPS), STICK_EPS, 1.0 - STICK_EPS)


#: the default threshold as a fraction of the largest mixture weight (measured: docs/decisions.md)
PRUNE_RELATIVE = 0.1


#: a cluster the default threshold would prune is spared when its mean is at least this far from
#: every other cluster's mean: ``min_j |mu_k - mu_j|^2 / (D sigma^2)``. Chosen from measurements
#: (docs/decisions.md): the point learners' clusters on the Fashion-MNIST EfficientNet-Lite0
#: features are at most 4.9 from their nearest (5.4 on 128 principal components) at any pruning, and
#: its class means at most 7.2 from any other; planted classes 3-6 deviations apart per dimension lie
#: 18-72 apart. Two equal groups 16 apart make one component whose rows spread ``1 + 16 / 4 = 5``
#: times ``sigma^2`` per dimension, wider than any single class of those features (4.2)
SEPARATE_NEAREST = 16.0


def separated(means: np.ndarray, which: np.ndarray, sigma2: float) -> np.ndarray:
    """Whether each cluster ``which`` (indices into ``means``, K x D) has its mean at least
    :data:`SEPARATE_NEAREST` from every other mean, in squared distance per dimension over
    ``sigma2``. One ``len(which) x K`` GEMM."""
    which = np.asarray(which, dtype=np.int64)
    means = np.asarray(means, dtype=np.float64)
    if which.size == 0 or means.shape[0] < 2:
        return np.zeros(which.size, dtype=bool)
    d2 = sq_dists(means[which], means)
    d2[np.arange(which.size), which] = np.inf
    return np.min(d2, axis=1) >= SEPARATE_NEAREST * means.shape[1] * float(sigma2)


def default_threshold(sticks: np.ndarray) -> float:
    """The default threshold on the mixture weights ``pi_k`` of the sticks ``E[v_k]``
    (``prune_order(..., on="weights")``): ``PRUNE_RELATIVE`` times the largest weight (see the module
    docstring). 0 for no sticks."""
    return PRUNE_RELATIVE * float(np.exp(np.max(log_stick_weights(sticks)))) if np.size(sticks) else 0.0


# ---- eqs. 22-29: the bounds --------------------------------------------------------------------------
@dataclass(frozen=True)
class MapBound:
    """``ln p(x, z, mu, v)`` at the point estimates, by the terms of Lim & Jiang 2024, eqs. 23-26, with all
    constants (the paper drops them and the ``1/sigma^2``). The entropy of a one-hot q(z) (eq. 27)
    is 0."""

    log_lik: float  # eq. 23
    log_prior_mu: float  # eq. 24
    log_p_z: float  # eq. 25
    log_prior_v: float  # eq. 26

    @property
    def total(self) -> float:
        return self.log_lik + self.log_prior_mu + self.log_p_z + self.log_prior_v


def map_bound(stats: SuffStats, point: DPPoint, prior: Prior, sigma2: float, a0: float,
              scale: float = 1.0) -> MapBound:
    """:class:`MapBound` from hard statistics; ``scale`` multiplies the data terms (``N/M`` for a
    minibatch estimate)."""
    d = point.means.shape[1]
    nk = stats.nk
    mu = point.means - stats.shift[None, :]
    sq = stats.scatter.sum(1) + nk * ((stats.mean - mu) ** 2).sum(1)  # sum_n z_nk |x_n - mu_k|^2
    log_lik = scale * float(np.sum(-0.5 * nk * d * np.log(2 * np.pi * sigma2) - 0.5 * sq / sigma2))
    lam0 = prior.mean_precision
    k = point.n_components
    log_mu = float(-0.5 * k * d * np.log(2 * np.pi * sigma2 / lam0)
                   - 0.5 * lam0 * np.sum((point.means - prior.mean) ** 2) / sigma2)
    log_z = scale * float(np.sum(nk * log_stick_weights(point.sticks)))
    v = np.clip(point.sticks, STICK_EPS, 1.0 - STICK_EPS)
    log_v = float(np.sum(np.log(a0) + (a0 - 1.0) * np.log1p(-v)))
    return MapBound(log_lik, log_mu, log_z, log_v)


def point_posterior(point: DPPoint, counts: np.ndarray, prior: Prior, sigma2: float,
                    a0: float) -> Posterior:
    """A proper variational posterior around the point estimates, so the exact ELBO of
    :func:`vbcore.model.elbo.elbo_terms` applies (and compares with VB EM's):

    ``q(mu_k) = N(E[mu_k], sigma^2 / (lambda0 + n_k) I)`` (the spread the Gaussian posterior of
    ``n_k`` rows has) and ``q(v_k) = Beta(1 + n_k, b_k)`` with ``b_k`` chosen so that its mean is
    ``E[v_k]`` (``a_k - 1 = n_k`` as for the VB stick posterior, so counts read the same way).
    ``counts`` are the (estimated) rows per cluster.
    """
    counts = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)
    v = np.clip(point.sticks, STICK_EPS, 1.0 - STICK_EPS)
    a = 1.0 + counts
    wc = np.vstack((a, a * (1.0 - v) / v))
    k = point.n_components
    return Posterior(covariance_type="fixed", weight_type="dirichlet_process", weight_concentration=wc,
                     mean_precision=prior.mean_precision + counts, means=point.means.copy(),
                     degrees_of_freedom=None, covariances=np.full(k, float(sigma2)))


__all__ = ["PRUNE_RELATIVE", "SEPARATE_NEAREST", "SGA_METHODS", "Gradients", "MapBound", "Velocity",
           "default_threshold", "gradients", "map_bound", "minibatch_objective", "mm_sticks", "mm_update",
           "point_posterior", "prune_order", "reorder", "separated", "sga_step", "sticks_of_weights"]
