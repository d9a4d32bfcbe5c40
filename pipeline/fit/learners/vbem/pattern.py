"""VB EM accelerated by pattern search (Kuusela et al. 2009 sec. II-A; Honkela et al. 2003).

Plain VB EM cycles, and every ``every``-th iteration a line search along the change of q(theta) over
the last cycle (in the coordinates of :mod:`vbcore.learners.pattern`). Each point ``theta`` on the line is
scored by ``L(theta) = ELBO(q(Z) from the E-step of theta, theta)``: one E-step pass. A point is
accepted only if it beats the current posterior's ``L``, and the iteration's M-step then starts from
that point's E-step, so the reported ELBO never decreases (docs/algorithms.md has the exact rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.fit.learners import register
from pipeline.fit.learners.base import FitContext, Learner
from pipeline.fit.learners.gradient.learners import CONVERGENCE_OPTIONS, seed000_converged
from pipeline.fit.learners.options import Opt, Rule, declare
from pipeline.fit.learners.state import LearnerState
from pipeline.fit.learners.vbem.learner import vbem_pass
from vbcore.errors import NumericalError
from vbcore.learners.pattern import PatternLine
from vbcore.model.elbo import ElboTerms, elbo_terms
from vbcore.model.mstep import m_step
from vbcore.model.posterior import Posterior
from vbcore.model.stats import SuffStats

_POST_FIELDS = ("weight_concentration", "mean_precision", "means", "degrees_of_freedom", "covariances")


def parabola_peak(lam1: float, l_minus: float, l0: float, l1: float, max_step: float) -> float:
    """Second trial of the pattern line search, from ``L(-1) = l_minus``, ``L(0) = l0``, ``L(lam1) = l1``.

    The parabola through the three points; if it is concave, its peak clipped to
    ``[lam1/10, min(4 lam1, max_step)]``; otherwise ``min(4 lam1, max_step)`` when ``l1 > l0`` (keep
    going) and ``lam1/4`` when not (shorter).
    """
    # L(lam) = l0 + b lam + a lam^2 through (-1, l_minus), (lam1, l1)
    a = ((l1 - l0) / lam1 + (l_minus - l0)) / (lam1 + 1.0)
    b = (l1 - l0) / lam1 - a * lam1
    hi = min(4.0 * lam1, max_step)
    if a < 0:
        return float(min(max(-b / (2.0 * a), 0.1 * lam1), hi))
    return hi if l1 > l0 else 0.25 * lam1


def _valid(post: Posterior) -> bool:
    """Finite parameters inside their domains (what the ELBO's special functions accept)."""
    values = [getattr(post, f) for f in _POST_FIELDS]
    if not all(np.all(np.isfinite(v)) for v in values if v is not None):
        return False
    ok = bool(np.all(post.weight_concentration > 0) and np.all(post.mean_precision > 0))
    nu = post.degrees_of_freedom
    if nu is not None:
        wishart = post.covariance_type in ("full", "tied")
        ok = ok and bool(np.all(nu > (post.n_features - 1 if wishart else 0)))
    return ok


@dataclass
class PatternState(LearnerState):
    """Pattern search's state beyond the posterior (checkpointed as a whole)."""

    prev: Posterior | None = None  # q(theta) before the last VB EM cycle
    l_prev: float = 0.0  # L(prev): the ELBO of prev with its own E-step
    cycles: int = 0  # iterations since start
    lam: float = 1.0  # the next trial step (the last accepted one)
    accepted: int = 0  # pattern steps accepted / tried (diagnostics)
    tried: int = 0


@register("vbem-ps")
class PatternSearchVBEM(Learner):
    """VB EM with a pattern-search line search every ``every`` iterations."""

    family = "vbem"
    state_type = PatternState
    options = declare({
        "every": Opt(3, "A pattern search on every this-many-th iteration (the others are plain VB EM).",
                     low=1, typed=False),
        "step": Opt(1.0, "First trial step (in units of the last cycle's change); then the last accepted."),
        "max_step": Opt(64.0, "Longest trial step."),
    }, CONVERGENCE_OPTIONS, rules=[Rule(
        ("step", "max_step"), lambda o, _: not 0 < o["step"] <= o["max_step"],
        "learner options of {learner!r} need 0 < step <= max_step, got step={step!r}, "
        "max_step={max_step!r}")])

    def __init__(self, ctx: FitContext, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(ctx, options)
        self._clear()

    def _clear(self) -> None:
        self.s = PatternState(lam=float(self.opts["step"]))

    def start(self, post: Posterior) -> None:
        super().start(post)
        self._clear()

    def _score(self, post: Posterior) -> tuple[SuffStats, float]:
        stats = vbem_pass(self.ctx, post).stats
        return stats, elbo_terms(stats, post, self.ctx.prior).total

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        assert self.post is not None, "start() first"
        ctx = self.ctx
        cur = self.post
        stats, l_cur = self._score(cur)  # the ordinary VB EM E-step
        base, l_base = cur, l_cur
        self.s.cycles += 1
        if self.s.prev is not None and self.s.cycles % int(self.opts["every"]) == 0:
            self.s.tried += 1
            lam1 = self.s.lam
            best = (l_cur, 0.0, stats, cur)
            line = PatternLine(self.s.prev, cur)
            trial1 = self._trial(line, lam1)
            if trial1 is not None:
                best = max(best, (trial1[1], lam1, trial1[0], trial1[2]), key=lambda t: t[0])
                lam2 = parabola_peak(lam1, self.s.l_prev, l_cur, trial1[1], float(self.opts["max_step"]))
            else:
                lam2 = 0.25 * lam1
            trial2 = self._trial(line, lam2)
            if trial2 is not None:
                best = max(best, (trial2[1], lam2, trial2[0], trial2[2]), key=lambda t: t[0])
            if best[1] > 0 and best[0] > l_cur:  # accept only an improvement of L
                l_base, self.s.lam, stats, base = best[0], best[1], best[2], best[3]
                self.s.accepted += 1
            else:
                self.s.lam = float(self.opts["step"])
        self.s.prev, self.s.l_prev = base, l_base
        self.post = m_step(stats, ctx.prior, ctx.reg_covar)
        return self.post, elbo_terms(stats, self.post, ctx.prior)

    def _trial(self, line: PatternLine, lam: float) -> tuple[SuffStats, float, Posterior] | None:
        """Score the point ``lam`` along the line, or None (no pass) when it is not a valid posterior:
        a long step can overflow, or underflow ``exp(xi)`` so that ``nu_k = D - 1`` (Wishart) or a
        concentration, ``beta_k`` or ``nu_k`` (Gamma) becomes 0."""
        try:
            with np.errstate(over="raise", invalid="raise"):
                post = line.at(lam)
        except (NumericalError, FloatingPointError, ValueError, np.linalg.LinAlgError):
            return None
        if not _valid(post):
            return None
        with np.errstate(all="ignore"):  # an extreme but valid point may score -inf/NaN: rejected
            try:
                stats, value = self._score(post)
            except (NumericalError, ValueError, FloatingPointError):
                return None
        return (stats, value, post) if np.isfinite(value) else None

    def converged(self, history: list[float], tol: float) -> bool:
        if self.opts["convergence"] == "seed000":
            return seed000_converged(history, float(self.opts["eps"]), self.ctx.n_weight)
        return super().converged(history, tol)

    def own_state(self) -> PatternState:
        return self.s

    def load(self, post: Posterior, state: PatternState) -> None:
        self.post, self.s = post, state
