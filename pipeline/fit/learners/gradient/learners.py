"""Gradient learners on the VB EM model: GD, CG, NG, NCG (Kuusela et al. 2009; Honkela et al. 2007).

The cost ``C = -ELBO`` is minimised over the softmax logits of the responsibilities (eq. 47, K-1 free
per sample) and the means ``m_k``; every other parameter takes its VB update given those
(:func:`vbcore.learners.gradients.conditional_update`), so each iteration reports the exact ELBO of
:func:`vbcore.model.elbo.elbo_terms`, the same function VB EM reports.

=====  ======================  =======================================================
name   search space gradient   direction
=====  ======================  =======================================================
gd     Euclidean ``g``         ``p = -g``                                  (eq. 15 with G = I)
cg     Euclidean ``g``         Polak-Ribiere ``p = -g + beta p_prev``      (eqs. 8, 9)
ng     natural ``G^-1 g``      ``p = -G^-1 g``                             (eq. 15)
ncg    natural ``G^-1 g``      Riemannian Polak-Ribiere                    (eqs. 16-18)
=====  ======================  =======================================================

``G`` is the block-diagonal Fisher metric: ``A_k = beta_k nu_k W_k`` for the means and
``B_n = diag(r_n) - r_n r_n^T`` for the logits (applied in closed form). ``beta < 0`` resets the
direction to ``-h``. The step length comes from the quadratic-interpolation line search of
docs/algorithms.md, which accepts only steps that lower C, so the ELBO never decreases.

Engine passes per iteration: one gradient pass (which also applies the previous accepted step to the
per-chunk logits, eq. 53) and one pass per line-search evaluation (usually two). Per-chunk logits,
gradient and last direction stay on the workers (``engine.map_keep``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.fit.learners import register
from pipeline.fit.learners.base import FitContext, Learner, restart_lineage
from pipeline.fit.learners.options import Opt, Options
from pipeline.fit.learners.state import LearnerState
from vbcore.kernels.estep import Chunk, estep_params, to_host
from vbcore.learners.gradients import (
    GradSums,
    LogitState,
    conditional_update,
    logit_gradient_kernel,
    logit_init_kernel,
    logit_trial_kernel,
    mean_gradient,
    mean_natural_gradient,
)
from vbcore.model.elbo import ElboTerms, elbo_terms
from vbcore.model.posterior import Posterior
from vbcore.model.stats import SuffStats

CONVERGENCE_RULES = ("tol", "seed000")


def seed000_converged(history: list[float], eps: float, n_rows: float) -> bool:
    """Kuusela et al. 2009 sec. V: ``C_{k-1} - C_k < eps N`` on two iterations in a row (``C = -ELBO``)."""
    if len(history) < 3:
        return False
    return all(history[-i] - history[-i - 1] < eps * n_rows for i in (1, 2))


#: the convergence options of the gradient learners and pattern search (``vbem-ps``)
CONVERGENCE_OPTIONS = Options({
    "convergence": Opt("tol", "tol: |dELBO|/N < tol (the estimator's); seed000: C_{k-1} - C_k < eps N on two "
                       "iterations in a row (Kuusela et al. 2009 sec. V).", choices=CONVERGENCE_RULES),
    "eps": Opt(1e-8, "eps of the seed000 rule.", low=0, low_open=True),
})


# ---- the line search -----------------------------------------------------------------------------
@dataclass(frozen=True)
class LineSearchResult:
    """The accepted step (0.0: none lowered the cost), its cost, and every (step, cost) tried."""

    step: float
    cost: float
    tried: list[tuple[float, float]]


def quadratic_line_search(phi: Any, cost0: float, slope0: float, trial: float,
                          max_evals: int) -> LineSearchResult:
    """Minimise ``phi(lam)`` along a descent direction by quadratic interpolation.

    ``phi(0) = cost0`` and ``phi'(0) = slope0 < 0`` are known. With a trial ``lam1`` and its cost
    ``phi1``, the parabola through ``(0, cost0)`` with slope ``slope0`` and through ``(lam1, phi1)``
    has curvature ``a = (phi1 - cost0 - slope0 lam1) / lam1^2`` and minimum ``lam_q = -slope0/(2a)``
    (clipped to ``[lam1/10, 10 lam1]``):

    1. if ``a <= 0`` and ``phi1 < cost0``: accept ``lam1`` (no curvature seen, a decrease);
    2. if ``phi1 < cost0`` and ``|lam_q - lam1| <= lam1/10``: accept ``lam1`` (the parabola agrees);
    3. otherwise evaluate ``phi(lam_q)``; if the better of ``lam1, lam_q`` lowers the cost, accept it;
       else (both failed, so ``lam_q <= lam1/2``) continue from ``lam1 = lam_q``;
    4. after ``max_evals`` evaluations without a decrease, return step 0.

    ``phi`` is called once per evaluation (one engine pass each).
    """
    lam1, phi1 = trial, phi(trial)
    tried = [(lam1, phi1)]
    while True:
        a = (phi1 - cost0 - slope0 * lam1) / (lam1 * lam1)
        if a > 0:
            lam_q = min(max(-slope0 / (2.0 * a), 0.1 * lam1), 10.0 * lam1)
        elif phi1 < cost0:
            return LineSearchResult(lam1, phi1, tried)
        else:  # rounding only: no curvature yet no decrease
            lam_q = 0.1 * lam1
        if phi1 < cost0 and abs(lam_q - lam1) <= 0.1 * lam1:
            return LineSearchResult(lam1, phi1, tried)
        if len(tried) >= max_evals:
            break
        phi_q = phi(lam_q)
        tried.append((lam_q, phi_q))
        best = min((phi1, lam1), (phi_q, lam_q))
        if best[0] < cost0:
            return LineSearchResult(best[1], best[0], tried)
        lam1, phi1 = lam_q, phi_q
    return LineSearchResult(0.0, cost0, tried)


# ---- state kept for checkpoints ---------------------------------------------------------------------
@dataclass
class GradientState(LearnerState):
    """The driver's state of gd/cg/ng/ncg (checkpointed as a whole; the per-chunk logits, gradient
    and direction live with their chunks and are gathered separately)."""

    stats: SuffStats | None  # q(Z) summarised at the current point
    terms: ElboTerms | None
    hm_prev: np.ndarray  # the means' part of h and p at the previous iteration, (K, D)
    pm_prev: np.ndarray
    lam_acc: float = 0.0  # the accepted step not yet applied to the per-chunk logits
    beta_acc: float = 0.0
    hg_prev: float = 0.0  # h.g at the previous point (eq. 18's denominator)
    lam_prev: float = 0.0  # previous accepted step and slope (initial trial step, N&W eq. 3.59)
    slope_prev: float = 0.0
    stalled: bool = False  # a line search along -h found no decrease: nothing left to gain
    have_grad: bool = False  # the per-chunk h is that of the current point (skip the gradient pass)
    reset: bool = True  # next direction is -h
    sums: GradSums = field(default_factory=lambda: GradSums(0.0, 0.0, 0.0, 0.0))


def _host_state(state: LogitState) -> LogitState:
    return LogitState(*(None if a is None else to_host(a) for a in (state.log_r, state.h, state.p)))


def _on_chunk(chunk: Chunk, state: LogitState) -> LogitState:
    """A state restored from a checkpoint, in the chunk's namespace and dtype."""
    from vbcore.kernels.estep import array_namespace

    xp = array_namespace(chunk.x)
    arrays = (state.log_r, state.h, state.p)
    return LogitState(*(None if a is None else xp.asarray(a, dtype=chunk.x.dtype) for a in arrays))


def _init_kernel(chunk: Chunk, state: Any, params: Any) -> tuple[LogitState, SuffStats]:
    return logit_init_kernel(chunk, params)


class _Nothing:
    """The reduction of passes that only move state."""

    def merge(self, other: Any) -> _Nothing:
        return self


def _device_kernel(chunk: Chunk, state: LogitState) -> tuple[LogitState, _Nothing]:
    return _on_chunk(chunk, state), _Nothing()


class GradientLearner(Learner):
    """Shared machinery of gd, cg, ng and ncg; subclasses set ``natural`` and ``conjugate``."""

    natural = False
    conjugate = False
    #: no 'tied': the gradients (vbcore/learners/gradients.py) are written for per-component precisions
    family = "gradient"
    state_type = GradientState
    covariance_types = ("full", "diag", "spherical", "fixed")
    options = CONVERGENCE_OPTIONS.with_({"line_search_evals": Opt(
        6, "Most cost evaluations (engine passes) per line search.", low=1, typed=False)})

    def __init__(self, ctx: FitContext, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(ctx, options)
        self.states: list[Any] = []
        self._reset_driver_state()

    def _reset_driver_state(self) -> None:
        k, d = self.ctx.prior.n_components, self.ctx.n_features
        self.s = GradientState(None, None, np.zeros((k, d)), np.zeros((k, d)))

    # ---- the interface ---------------------------------------------------------------------------
    def start(self, post: Posterior) -> None:
        """q(Z) from the VB E-step of ``post``; the means stay ``post.means``."""
        self.close()
        ctx = self.ctx
        n = len(ctx.handles)
        self.states, stats = ctx.engine.map_keep(_init_kernel, ctx.handles, [None] * n,
                                                 estep_params(post, ctx.shift))
        self._reset_driver_state()
        self._set_point(stats, post.means)

    def _point(self, stats: SuffStats, means: np.ndarray) -> tuple[SuffStats, Posterior, ElboTerms]:
        """q(Z) summarised by ``stats``, the means, and the other parameters at their VB update."""
        post = conditional_update(stats, self.ctx.prior, means, self.ctx.reg_covar)
        return stats, post, elbo_terms(stats, post, self.ctx.prior)

    def _set_point(self, stats: SuffStats, means: np.ndarray) -> None:
        self.s.stats, self.post, self.s.terms = self._point(stats, means)

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        assert self.post is not None and self.s.stats is not None and self.s.terms is not None, "start first"
        ctx, prior = self.ctx, self.ctx.prior
        if self.s.stalled:
            return self.post, self.s.terms
        if not self.s.have_grad:
            # gradient pass: apply the accepted step (eq. 53), then eqs. 48-51 at the new point
            self.states, self.s.sums = ctx.engine.map_keep(
                logit_gradient_kernel, ctx.handles, self.states, estep_params(self.post, ctx.shift),
                self.s.lam_acc, self.s.beta_acc, self.natural)
            self.s.have_grad = True
        sums = self.s.sums
        gm = mean_gradient(self.s.stats, self.post, prior)
        hm = mean_natural_gradient(self.s.stats, self.post, prior) if self.natural else gm
        gh = sums.gh + float(np.sum(gm * hm))  # squared Riemannian norm for natural (eq. 17)
        if not gh > 0:  # zero gradient: a stationary point
            self.s.stalled = True
            return self.post, self.s.terms
        beta = 0.0
        if self.conjugate and not self.s.reset and self.s.hg_prev > 0:
            # Polak-Ribiere with Riemannian inner products (eq. 18): (h_t - h_{t-1}).g_t / h_{t-1}.g_{t-1}
            g_hprev = sums.g_hprev + float(np.sum(gm * self.s.hm_prev))
            beta = max((gh - g_hprev) / self.s.hg_prev, 0.0)  # reset on negative beta
        slope = -gh
        if beta > 0:
            slope = -gh + beta * (sums.g_pprev + float(np.sum(gm * self.s.pm_prev)))
            if not slope < 0:  # not a descent direction: reset
                beta, slope = 0.0, -gh
        pm = -hm + beta * self.s.pm_prev if beta > 0 else -hm
        if self.s.reset or self.s.lam_prev == 0.0:
            trial = 1.0 if self.natural else 1.0 / np.sqrt(sums.gg + float(np.sum(gm * gm)))
        else:  # Nocedal & Wright eq. 3.59: the previous step's first-order change
            trial = min(self.s.lam_prev * self.s.slope_prev / slope, 10.0 * self.s.lam_prev)
        means = self.post.means
        cost0 = -self.s.terms.total
        cache: dict[float, tuple[SuffStats, Posterior, ElboTerms]] = {}

        def phi(lam: float) -> float:
            stats = ctx.engine.map_reduce(logit_trial_kernel, ctx.handles, lam, beta, per_chunk=self.states)
            cache[lam] = self._point(stats, means + lam * pm)
            return -cache[lam][2].total

        ls = quadratic_line_search(phi, cost0, slope, float(trial), int(self.opts["line_search_evals"]))
        self.s.hg_prev = gh
        self.s.hm_prev = hm
        if ls.step > 0:
            self.s.stats, self.post, self.s.terms = cache[ls.step]
            self.s.lam_acc, self.s.beta_acc = ls.step, beta
            self.s.lam_prev, self.s.slope_prev = ls.step, slope
            self.s.pm_prev = pm
            self.s.have_grad = False
            self.s.reset = False
        else:  # no decrease: the per-chunk state is unchanged; retry along -h, or stop if that was it
            self.s.stalled = beta == 0.0
            self.s.lam_acc = 0.0
            self.s.lam_prev = 0.0
            self.s.reset = True
        return self.post, self.s.terms

    def converged(self, history: list[float], tol: float) -> bool:
        if self.s.stalled:
            return True
        if self.opts["convergence"] == "seed000":
            return seed000_converged(history, float(self.opts["eps"]), self.ctx.n_weight)
        return super().converged(history, tol)

    # ---- checkpoints ---------------------------------------------------------------------------
    def own_state(self) -> GradientState:
        return self.s

    def load(self, post: Posterior, state: GradientState) -> None:
        self.post, self.s = post, state

    def cache_arrays(self) -> dict[str, np.ndarray]:
        """Per-chunk logits, gradient and direction gathered in row order."""
        assert self.s.stats is not None
        parts = self.ctx.engine.fetch_states(self.states, _host_state)
        self.states = restart_lineage(self.ctx, self.states, parts)
        out: dict[str, np.ndarray] = {}
        for name in ("log_r", "h", "p"):
            arrays = [getattr(part, name) for part in parts]
            if all(a is not None for a in arrays):
                out[f"chunk_{name}"] = np.concatenate(arrays)
        return out

    def load_cache(self, post: Posterior, state: Mapping[str, np.ndarray]) -> None:
        if "chunk_log_r" not in state:  # a checkpoint without the logits: start afresh from post
            self.start(post)
            return
        self.close()
        ctx = self.ctx
        slices = ctx.source.chunk_slices()
        per_chunk = [LogitState(*(state[f"chunk_{n}"][s] if f"chunk_{n}" in state else None
                                  for n in ("log_r", "h", "p"))) for s in slices]
        self.states = ctx.engine.place_states(per_chunk, ctx.handles)
        if getattr(ctx.engine, "array_backend", "numpy") != "numpy":  # host arrays to the device
            self.states, _ = ctx.engine.map_keep(_device_kernel, ctx.handles, self.states)

    def close(self) -> None:
        if self.states:
            self.ctx.engine.release(self.states)
        self.states = []


@register("gd")
class GD(GradientLearner):
    """Gradient descent along ``-g`` (Kuusela et al. 2009 sec. III-A)."""


@register("cg")
class CG(GradientLearner):
    """Polak-Ribiere conjugate gradient (Kuusela et al. 2009 sec. III-B, eqs. 8-9)."""

    conjugate = True


@register("ng")
class NG(GradientLearner):
    """Natural gradient descent with the block-diagonal Fisher metric (Kuusela et al. 2009 sec. III-C)."""

    natural = True


@register("ncg")
class NCG(GradientLearner):
    """Natural conjugate gradient (Kuusela et al. 2009 eqs. 16-18; Honkela et al. 2007 sec. 3.2.2)."""

    natural = True
    conjugate = True
