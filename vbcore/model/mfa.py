"""The low-rank-plus-diagonal family: a variational Bayesian mixture of factor analysers
(Ghahramani & Beal 2000), with an exact bound that compares with the Gaussian families'
(:mod:`vbcore.model.elbo`).

The model (rows ``y_n`` of D dimensions, shifted like every chunk of a fit), component ``k`` of rank q::

    z_n ~ Cat(pi),  pi ~ Dir(alpha0) or truncated DP(alpha0)       (the Gaussian families' weights)
    x_n ~ N(0, I_q)                                                 (factors)
    y_n | z_n = k, x_n ~ N(L_k [x_n; 1], Psi)                       (L_k = [Lambda_k, mu_k], D x (q+1))
    row d of L_k ~ N([0, ..., 0, m0_d], Psi_d Omega_k^-1),  Omega_k = diag(nu_k1, ..., nu_kq, beta0)

``Psi`` is one diagonal noise shared by the components: a dimension that is (nearly) constant, such as
the exact zeros of ReLU features, then gives every cluster the same likelihood instead of rewarding
clusters for shrinking their own variance along it. The prior of the rows of ``L_k`` is scaled by
``Psi_d`` (conjugate, as the Gaussian-Wishart prior scales the mean's covariance by the precision), so
``q(L_k)`` has row covariances ``Psi_d A_k^-1`` with one (q+1) x (q+1) ``A_k`` per component. The
variational posterior is ``q(pi) q(L) prod_n q(z_n) q(x_n | z_n)`` (Ghahramani & Beal 2000, sec. 3);
``Psi``, the ARD precisions ``nu_kj`` and ``beta0`` are point estimates that maximise the bound (type-II,
as ``--priors bound`` chooses the Gaussian families' prior strength), so the bound is a bound on
``ln p(Y | Psi, nu, beta0, alpha0)`` and keeps every constant. With q = 0 the model is a mixture of
Gaussians with the shared diagonal covariance ``Psi`` and, for one component under Dirichlet weights,
the bound is the exact log evidence (tests/test_mfa.py).

Everything here is a pure function of arrays: :func:`estep` summarises one chunk (``Y @ W``, one GEMM
of the chunk by the stacked ``Psi^-1 E[L_k]``, and ``Y^T R``, one GEMM back; never an N x K x D array),
:func:`m_step` and :func:`elbo` work on the reduced :class:`MfaStats`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.special import logsumexp

from vbcore.model.elbo import ElboTerms, kl_beta, kl_dirichlet
from vbcore.model.posterior import LOG_2PI, expected_log_weights

#: hyperparameters are kept in (HYPER_MIN, HYPER_MAX) (nu, beta0 of vanishing columns grow without end)
HYPER_MIN, HYPER_MAX = 1e-8, 1e8


@dataclass(frozen=True)
class MfaPrior:
    """The fixed part of the prior: weights and the mean's centre (``nu``, ``beta0``, ``Psi`` live in
    :class:`MfaPosterior`, since the bound moves them).

    Attributes
    ----------
    weight_type : {'dirichlet_distribution', 'dirichlet_process'}
    weight_concentration : float
        ``alpha0``.
    mean : array of shape (n_features,)
        ``m0`` (shifted coordinates).
    psi_floor : float
        Lower limit of ``Psi_d`` (a constant dimension would make the bound unbounded).
    """

    weight_type: str
    weight_concentration: float
    mean: np.ndarray
    psi_floor: float


@dataclass(frozen=True)
class MfaPosterior:
    """q(pi) q(L) and the point hyperparameters.

    Attributes
    ----------
    weight_concentration : array of shape (K,) or (2, K)
    weight_type : str
    loadings : array of shape (K, D, q + 1)
        ``E[L_k]``; column q is the mean ``mu_k``.
    precision : array of shape (K, q + 1, q + 1)
        ``A_k``: row d of ``L_k`` has covariance ``Psi_d A_k^-1``.
    noise : array of shape (D,)
        ``Psi``.
    ard : array of shape (K, q)
        ``nu_kj``.
    mean_precision : float
        ``beta0``.
    """

    weight_concentration: np.ndarray
    weight_type: str
    loadings: np.ndarray
    precision: np.ndarray
    noise: np.ndarray
    ard: np.ndarray
    mean_precision: float

    @property
    def n_components(self) -> int:
        return int(self.loadings.shape[0])

    @property
    def rank(self) -> int:
        return int(self.loadings.shape[2]) - 1

    @property
    def means(self) -> np.ndarray:
        return self.loadings[:, :, -1]

    def omega(self) -> np.ndarray:
        """``Omega_k`` diagonals, shape (K, q + 1)."""
        k = self.n_components
        return np.concatenate((self.ard, np.full((k, 1), self.mean_precision)), axis=1)

    def second_moment(self) -> np.ndarray:
        """``G_k = E[L_k^T Psi^-1 L_k] = M_k^T Psi^-1 M_k + D A_k^-1``, shape (K, q + 1, q + 1)."""
        m = self.loadings
        d = m.shape[1]
        g = np.einsum("kdi,kdj->kij", m / self.noise[None, :, None], m)
        return g + d * np.linalg.inv(self.precision)


@dataclass(frozen=True)
class MfaStats:
    """What the E-step of some rows leaves (additive over chunks: :meth:`merge`).

    Attributes
    ----------
    nk : (K,) ``sum_n w_n r_nk``
    xx : (K, q+1, q+1) ``sum_n w_n r_nk E[x~ x~^T]``, ``x~ = [x; 1]``
    yx : (K, D, q+1) ``sum_n w_n r_nk y_n E[x~]^T``
    yy : (D,) ``sum_n w_n y_n^2``
    sum_rlogr : ``sum_n w_n sum_k r_nk ln r_nk``
    entropy_x : ``sum_n w_n sum_k r_nk H[q(x_n | k)]``
    overlap : (K, K) ``sum_n w_n r_nk r_nl`` (which components share rows: merge candidates), or None
    """

    nk: np.ndarray
    xx: np.ndarray
    yx: np.ndarray
    yy: np.ndarray
    sum_rlogr: float
    entropy_x: float
    overlap: np.ndarray | None = None

    def merge(self, other: MfaStats) -> MfaStats:
        both = None if self.overlap is None or other.overlap is None else self.overlap + other.overlap
        return MfaStats(self.nk + other.nk, self.xx + other.xx, self.yx + other.yx, self.yy + other.yy,
                        self.sum_rlogr + other.sum_rlogr, self.entropy_x + other.entropy_x, both)

    @property
    def total(self) -> float:
        return float(self.nk.sum())


def _factor_posterior(post: MfaPosterior) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``G_k``, ``P_k^-1 = (I + G_k[:q, :q])^-1`` (the covariance of q(x | k)) and ``ln |P_k|``."""
    g = post.second_moment()
    q = post.rank
    p = np.eye(q)[None] + g[:, :q, :q]
    chol = np.linalg.cholesky(p)
    log_det = 2.0 * np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(1)
    return g, np.linalg.inv(p), log_det


def stacked_operand(post: MfaPosterior, dtype: type = np.float32) -> np.ndarray:
    """``W`` of shape (D, K (q + 1)): column block k is ``Psi^-1 E[L_k]``, so ``Y @ W`` is every
    ``E[L_k]^T Psi^-1 y_n`` at once."""
    m = post.loadings / post.noise[None, :, None]
    k, d, q1 = m.shape
    return np.ascontiguousarray(m.transpose(1, 0, 2).reshape(d, k * q1), dtype=dtype)


def estep(y: np.ndarray, post: MfaPosterior, weights: np.ndarray | None = None,
          operand: np.ndarray | None = None) -> tuple[MfaStats, np.ndarray, np.ndarray]:
    """q(z_n) q(x_n | z_n) of rows ``y`` (n, D) given ``post``; returns their statistics, the
    responsibilities (n, K) and each row's share of the bound ``ln sum_k rho_nk`` (n,).

    ``ln rho_nk = E ln pi_k + max_{q(x|k)} (E[ln p(y_n, x | k, L)] + H[q(x | k)])``, which in closed form
    is ``-D/2 ln 2pi - 1/2 sum ln Psi - 1/2 y^T Psi^-1 y + b_kq - 1/2 G_kqq + 1/2 h^T P_k^-1 h
    - 1/2 ln |P_k|`` with ``b_k = E[L_k]^T Psi^-1 y`` and ``h = b_k[:q] - G_k[:q, q]``
    (Ghahramani & Beal 2000 sec. 3, with the mean as the loadings' extra column). ``operand`` is
    :func:`stacked_operand` (float32 by default: the chunk's GEMMs ``Y W``, ``Y^T R~`` and the squares'
    sums in its dtype, everything after in float64; the driver sums the chunks in float64).
    """
    k, d, q1 = post.loadings.shape
    q = q1 - 1
    g, p_inv, log_det_p = _factor_posterior(post)
    w_op = stacked_operand(post) if operand is None else operand
    dt = w_op.dtype
    y_op = y.astype(dt, copy=False)
    b = np.asarray(y_op @ w_op, dtype=np.float64).reshape(-1, k, q1)
    sq = y_op * y_op
    y_psi_y = np.asarray(sq @ (1.0 / post.noise).astype(dt), dtype=np.float64)
    h = b[:, :, :q] - g[None, :, :q, q]
    mx = np.einsum("nkj,kij->nki", h, p_inv)  # E[x_n | k]
    const = -0.5 * d * LOG_2PI - 0.5 * np.log(post.noise).sum() - 0.5 * g[:, q, q] - 0.5 * log_det_p
    log_rho = (expected_log_weights(post.weight_concentration, post.weight_type) + const)[None, :] \
        + b[:, :, q] + 0.5 * np.einsum("nki,nki->nk", h, mx) - 0.5 * y_psi_y[:, None]
    log_norm = logsumexp(log_rho, axis=1)
    resp = np.exp(log_rho - log_norm[:, None])
    wr = resp if weights is None else resp * np.asarray(weights, dtype=np.float64)[:, None]
    w = np.ones(y.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    nk = wr.sum(0)
    ex = np.concatenate((mx, np.ones(mx.shape[:2] + (1,))), axis=2)  # E[x~_n | k]
    xx = np.matmul((wr[:, :, None] * ex).transpose(1, 2, 0), ex.transpose(1, 0, 2))
    xx[:, :q, :q] += nk[:, None, None] * p_inv
    yx = np.asarray(y_op.T @ (wr[:, :, None] * ex).reshape(-1, k * q1).astype(dt), dtype=np.float64)
    yx = yx.reshape(d, k, q1).transpose(1, 0, 2)
    safe = np.where(resp > 0, resp, 1.0)
    ent_k = 0.5 * q * (1.0 + LOG_2PI) - 0.5 * log_det_p  # H[q(x | k)]
    stats = MfaStats(nk, xx, np.ascontiguousarray(yx), np.asarray(w.astype(dt) @ sq, dtype=np.float64),
                     float(np.sum(wr * np.log(safe))), float(nk @ ent_k), wr.T @ resp)
    return stats, resp, log_norm


def dequantized(stats: MfaStats, variance: float | np.ndarray) -> MfaStats:
    """The statistics of the rows dequantized by noise ``u`` of ``variance`` per feature (uniform on a
    cell of width ``eps``: ``eps^2 / 12``), in expectation over ``u`` with q(z, x) held: ``yy + N
    variance``. The rows enter the bound only through ``N(y | L x~, Psi)``; its terms linear in ``u``
    vanish (``E[u] = 0``, so ``yx`` is unchanged), and ``E[u^T Psi^-1 u]`` adds ``variance / Psi`` per row
    and feature. So :func:`elbo` of these statistics is the bound of the dequantized rows with q(z, x)
    held, ``E_u ELBO(y + u) = ELBO(y) - N/2 sum_d variance_d / Psi_d`` (:func:`held_penalty`), and
    :func:`m_step` of them its maximiser (``Psi`` gets ``+ variance``, as ``reg_covar`` adds to the
    Gaussian families' covariances; q(L) and the hyperparameters are unchanged); the E-step is the
    same (the penalty does not depend on q(z, x)), so VB EM on them never decreases this bound."""
    var = np.broadcast_to(np.asarray(variance, dtype=np.float64), stats.yy.shape)
    if not np.any(var):
        return stats
    return replace(stats, yy=stats.yy + stats.total * var)


def held_penalty(noise: np.ndarray, n_rows: float, variance: float | np.ndarray) -> float:
    """``N/2 sum_d variance_d / Psi_d``: what the bound of ``n_rows`` rows dequantized at ``variance``
    (per feature) loses against the plain bound with q(z, x) held (:func:`dequantized`)."""
    var = np.broadcast_to(np.asarray(variance, dtype=np.float64), np.shape(noise))
    return 0.5 * float(n_rows) * float(np.sum(var / np.asarray(noise, dtype=np.float64)))


def resolution_penalty(post: MfaPosterior, nk: np.ndarray, variance: float | np.ndarray) -> float:
    """``1/2 sum_k N_k Tr(H_k C)``, ``C = diag(variance)``: what the bound of rows dequantized at
    ``variance`` loses against the plain bound with q(z) held and q(x | z) the optimum for each
    dequantized row. ``ln rho_nk`` (:func:`estep`) is quadratic in the row with Hessian ``-H_k``,
    ``H_k = Psi^-1 - Psi^-1 M_k P_k^-1 M_k^T Psi^-1`` (``M_k`` the factor columns of ``E[L_k]``): the
    component's marginal precision (Woodbury), as the Gaussian families pay ``E[Lambda_k]``
    (:func:`vbcore.model.projected.resolution_penalty`). At most :func:`held_penalty` (q(x | z) held), by
    ``1/2 sum_k N_k Tr(Psi^-1 M_k P_k^-1 M_k^T Psi^-1 C)``."""
    var = np.broadcast_to(np.asarray(variance, dtype=np.float64), post.noise.shape)
    _, p_inv, _ = _factor_posterior(post)
    w = post.loadings[:, :, :post.rank] / post.noise[None, :, None]  # Psi^-1 M_k
    gain = np.einsum("kdi,kij,kdj,d->k", w, p_inv, w, var)
    return 0.5 * float(np.asarray(nk, dtype=np.float64) @ (float(np.sum(var / post.noise)) - gain))


def _update_loadings(stats: MfaStats, post: MfaPosterior, prior: MfaPrior) -> MfaPosterior:
    """Optimal q(L) given q(x, z): ``A_k = Omega_k + sum r E[x~ x~^T]``,
    ``E[L_k] = (M0 Omega_k + sum r y E[x~]^T) A_k^-1`` (Ghahramani & Beal 2000 sec. 3, with the
    prior scaled by ``Psi``)."""
    omega = post.omega()
    a = stats.xx + np.einsum("ki,ij->kij", omega, np.eye(omega.shape[1]))
    rhs = stats.yx.copy()
    rhs[:, :, -1] += omega[:, -1][:, None] * prior.mean[None, :]
    m = np.einsum("kdi,kij->kdj", rhs, np.linalg.inv(a))  # A_k symmetric: row d is A_k^-1 rhs_kd
    return replace(post, loadings=m, precision=0.5 * (a + a.transpose(0, 2, 1)))


def _offsets(post: MfaPosterior, prior: MfaPrior) -> np.ndarray:
    """``E[L_k] - M0`` (K, D, q + 1)."""
    diff = post.loadings.copy()
    diff[:, :, -1] -= prior.mean[None, :]
    return diff


def _update_ard(post: MfaPosterior, prior: MfaPrior, free_mean_precision: bool) -> MfaPosterior:
    """``nu_kj = D / (D (A_k^-1)_jj + sum_d E[L_kdj]^2 / Psi_d)`` and the like for the shared
    ``beta0`` (the maximisers of the bound's KL(q(L) || p(L)) in them)."""
    d = post.loadings.shape[1]
    a_inv = np.linalg.inv(post.precision)
    spread = np.einsum("kdj,d->kj", _offsets(post, prior) ** 2, 1.0 / post.noise)
    denom = d * np.diagonal(a_inv, axis1=1, axis2=2) + spread
    ard = np.clip(d / denom[:, :-1], HYPER_MIN, HYPER_MAX)
    beta0 = post.mean_precision
    if free_mean_precision:
        beta0 = float(np.clip(denom.shape[0] * d / denom[:, -1].sum(), HYPER_MIN, HYPER_MAX))
    return replace(post, ard=ard, mean_precision=beta0)


def _update_noise(stats: MfaStats, post: MfaPosterior, prior: MfaPrior) -> MfaPosterior:
    """``Psi_d = (1/N) [sum_n y_nd^2 - 2 sum_k mu_kd^T c_kd + sum_k mu_kd^T T_k mu_kd
    + sum_k (mu_kd - m0_d)^T Omega_k (mu_kd - m0_d)]`` (``mu_kd`` row d of ``E[L_k]``), floored."""
    m = post.loadings
    resid = stats.yy - 2.0 * np.einsum("kdi,kdi->d", m, stats.yx) \
        + np.einsum("kdi,kij,kdj->d", m, stats.xx, m) \
        + np.einsum("kdi,ki,kdi->d", _offsets(post, prior), post.omega(), _offsets(post, prior))
    return replace(post, noise=np.maximum(resid / max(stats.total, 1e-300), prior.psi_floor))


def weight_posterior(nk: np.ndarray, prior: MfaPrior) -> np.ndarray:
    """``alpha0 + N_k`` or the DP's stick posteriors (as :func:`vbcore.model.mstep.weight_posterior`)."""
    if prior.weight_type == "dirichlet_distribution":
        return prior.weight_concentration + nk
    tail = np.concatenate((np.cumsum(nk[::-1])[-2::-1], [0.0]))
    return np.vstack((1.0 + nk, prior.weight_concentration + tail))


def m_step(stats: MfaStats, post: MfaPosterior, prior: MfaPrior, *, ard: bool = True,
           free_mean_precision: bool = True, noise: bool = True) -> MfaPosterior:
    """q(pi), q(L), then the hyperparameters ``nu`` (and ``beta0``), then ``Psi``: each the maximiser of
    the bound given the others, so the bound of (stats, result) is at least that of (stats, post)."""
    out = replace(post, weight_concentration=weight_posterior(stats.nk, prior))
    out = _update_loadings(stats, out, prior)
    if ard or free_mean_precision:
        out = _update_ard(out, prior, free_mean_precision)
        if not ard:
            out = replace(out, ard=post.ard)
    return _update_noise(stats, out, prior) if noise else out


def kl_loadings(post: MfaPosterior, prior: MfaPrior) -> np.ndarray:
    """``KL(q(L_k) || p(L_k))`` per component: ``D/2 [Tr(Omega_k A_k^-1) - (q+1) + ln|A_k| - ln|Omega_k|]
    + 1/2 sum_d (mu_kd - m0_d)^T Omega_k (mu_kd - m0_d) / Psi_d`` (the ``Psi_d`` of both covariances
    cancel in the log determinants)."""
    d, q1 = post.loadings.shape[1], post.loadings.shape[2]
    omega = post.omega()
    a_inv = np.linalg.inv(post.precision)
    _, log_det_a = np.linalg.slogdet(post.precision)
    trace = np.einsum("ki,kii->k", omega, a_inv)
    diff = _offsets(post, prior)
    quad = np.einsum("kdi,ki,kdi,d->k", diff, omega, diff, 1.0 / post.noise)
    return 0.5 * d * (trace - q1 + log_det_a - np.log(omega).sum(1)) + 0.5 * quad


def elbo(stats: MfaStats, post: MfaPosterior, prior: MfaPrior) -> ElboTerms:
    """The exact bound of (q(z, x) summarised by ``stats``, ``post``), under the names of
    :class:`vbcore.model.elbo.ElboTerms`: ``log_likelihood`` holds ``E[ln p(Y | X, Z, L)] + E[ln p(X)]
    + H[q(X | Z)]``, ``kl_components`` the loadings' KL."""
    q = post.rank
    d = post.loadings.shape[1]
    g = post.second_moment()
    n = stats.total
    m = post.loadings
    quad = stats.yy @ (1.0 / post.noise) - 2.0 * np.einsum("kdi,kdi,d->", m, stats.yx, 1.0 / post.noise) \
        + np.einsum("kij,kji->", g, stats.xx)
    log_lik = -0.5 * n * (d * LOG_2PI + np.log(post.noise).sum()) - 0.5 * quad
    log_px = -0.5 * n * q * LOG_2PI - 0.5 * np.einsum("kii->", stats.xx[:, :q, :q])
    e_log_pi = expected_log_weights(post.weight_concentration, post.weight_type)
    kl_z = stats.sum_rlogr - float(stats.nk @ e_log_pi)
    wc = post.weight_concentration
    if post.weight_type == "dirichlet_distribution":
        kl_w = kl_dirichlet(wc, np.full_like(wc, prior.weight_concentration))
    else:
        kl_w = float(np.sum(kl_beta(wc[0], wc[1], 1.0, prior.weight_concentration)))
    return ElboTerms(float(log_lik + log_px + stats.entropy_x), float(kl_z), float(kl_w),
                     float(kl_loadings(post, prior).sum()))


def initial_posterior(y: np.ndarray, labels: np.ndarray, n_components: int, rank: int, prior: MfaPrior,
                      seed: int | None = None) -> MfaPosterior:
    """A starting q(L): component k's mean and its ``rank`` leading principal directions (scaled by
    their standard deviations beyond the noise) from the rows ``y`` labelled k; ``Psi`` the mean
    within-cluster variance per dimension; ``nu = 1``, ``beta0 = 1``. A component without rows starts
    at the data mean with random small loadings drawn from ``seed``."""
    y = np.asarray(y, dtype=np.float64)
    n, d = y.shape
    rng = np.random.default_rng(seed)
    resid = np.zeros(d)
    load = np.zeros((n_components, d, rank + 1))
    for k in range(n_components):
        rows = y[labels == k]
        if rows.shape[0] == 0:
            load[k, :, -1] = prior.mean
            load[k, :, :rank] = 1e-3 * rng.standard_normal((d, rank))
            continue
        mu = rows.mean(0)
        load[k, :, -1] = mu
        c = rows - mu
        resid += (c * c).sum(0)
        if rank and rows.shape[0] > 1:
            _, s, vt = np.linalg.svd(c, full_matrices=False)
            r = min(rank, vt.shape[0])
            load[k, :, :r] = (vt[:r] * (s[:r] / np.sqrt(rows.shape[0]))[:, None]).T
    noise = np.maximum(resid / n, prior.psi_floor)
    nk = np.bincount(labels, minlength=n_components).astype(np.float64)
    prec = np.einsum("k,ij->kij", nk + 1.0, np.eye(rank + 1))
    return MfaPosterior(weight_posterior(nk, prior), prior.weight_type, load,
                        prec, noise, np.ones((n_components, rank)), 1.0)


def merge_candidates(stats: MfaStats, limit: int) -> list[tuple[int, int]]:
    """Pairs (k, l), k < l, of components that share rows, most shared first
    (``overlap_kl / sqrt(overlap_kk overlap_ll)``, ties in index order), at most ``limit``."""
    assert stats.overlap is not None
    c = stats.overlap
    diag = np.sqrt(np.maximum(np.diagonal(c), 1e-300))
    score = c / diag[:, None] / diag[None, :]
    iu = np.triu_indices(c.shape[0], 1)
    order = np.argsort(-score[iu], kind="stable")[:limit]
    return [(int(iu[0][i]), int(iu[1][i])) for i in order if score[iu[0][i], iu[1][i]] > 0.0]


def merge_proposal(stats: MfaStats, post: MfaPosterior, prior: MfaPrior, k: int, l: int) -> MfaPosterior:
    """A posterior of K - 1 components with component ``l`` folded into ``k`` (a proposal: its bound
    is judged after an iteration). The merged component matches the two's mixture in mean and in the
    covariance beyond the noise, ``p Lambda_k Lambda_k^T + p' Lambda_l Lambda_l^T + p p' (mu_k - mu_l)
    (mu_k - mu_l)^T`` (``p = N_k / (N_k + N_l)``), at rank q: its leading directions in the noise's
    metric, from a thin SVD of ``Psi^-1/2`` times the D x (2q + 1) factor of that sum."""
    keep = np.array([j for j in range(post.n_components) if j != l])
    q = post.rank
    nk, nl = stats.nk[k], stats.nk[l]
    p = nk / max(nk + nl, 1e-300)
    lk, ll = post.loadings[k], post.loadings[l]
    mu = p * lk[:, -1] + (1.0 - p) * ll[:, -1]
    factor = np.concatenate((np.sqrt(p) * lk[:, :q], np.sqrt(1.0 - p) * ll[:, :q],
                             np.sqrt(p * (1.0 - p)) * (lk[:, -1:] - ll[:, -1:])), axis=1)
    root = np.sqrt(post.noise)[:, None]
    u, sv, _ = np.linalg.svd(factor / root, full_matrices=False)
    load = post.loadings.copy()
    load[k, :, :q] = root * (u[:, :q] * sv[:q])
    load[k, :, -1] = mu
    nks = stats.nk.copy()
    nks[k] += nl
    prec = post.precision.copy()
    prec[k] = np.eye(q + 1) * (nks[k] + 1.0)
    ard = post.ard.copy()
    ard[k] = np.minimum(post.ard[k], post.ard[l])
    nks = nks[keep]
    return replace(post, weight_concentration=weight_posterior(nks, prior), loadings=load[keep],
                   precision=prec[keep], ard=ard[keep])
