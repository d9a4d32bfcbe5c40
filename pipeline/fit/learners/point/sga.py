"""SGA, SGA+M and SGA+F for the DP mixture (Lim & Jiang 2024 sections 3-4, Algorithm 1).

Each iteration draws a minibatch (``ctx.rng(iteration)``), computes its MAP assignments and hard
statistics next to the data (one pass over the chunks that hold its rows), and updates the means and
sticks from the minibatch-averaged gradients (eqs. 14, 16, 18): a constant step (``sga``, eqs. 15,
17), momentum (``sga-m``, eq. 8) or the empirical-Fisher step (``sga-f``, eqs. 9-11); then prunes
clusters with ``E[v_k]`` under the threshold and re-orders by descending ``E[v_k]`` (section 4.5).

The ELBO reported per iteration is, by default (``elbo='minibatch'``), the minibatch estimate of
the exact ELBO (data terms scaled by N/M, assignments from the iteration's E-step) of the
distribution *entering* the iteration: the minibatch is new to it, so the estimate is unbiased,
while the distribution after the step was fitted to those rows and would read optimistically (by
7% of the bound for SVI on MIT67-shaped data, docs/algorithms.md). ``elbo='full'`` spends one more
full pass per iteration for the exact value of the distribution after the step.

With ``ctx.grow`` (the pipeline's default) and DP weights the truncation also grows by births checked
every ``grow_every`` iterations and accepted on the exact bound of all rows
(:mod:`pipeline.fit.learners.point.growth`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from pipeline.fit.learners import register
from pipeline.fit.learners.base import FitContext
from pipeline.fit.learners.growth import n_used
from pipeline.fit.learners.moves import POINT_MOVE_OPTIONS
from pipeline.fit.learners.options import Opt, Options, declare
from pipeline.fit.learners.point.base import PRUNE_THRESHOLD
from pipeline.fit.learners.point.growth import POINT_GROW_OPTIONS, Birth, PointGrowth
from pipeline.fit.learners.point.moves import MergingPointLearner
from pipeline.fit.learners.point.state import PointState
from pipeline.fit.learners.sampling import minibatch, minibatch_weight
from pipeline.fit.learners.truncated import MAP_SEARCH_OPTIONS
from vbcore.kernels.sga_stats import map_params, row_bound, scale_stats
from vbcore.learners.sga import Velocity, gradients, sga_step
from vbcore.model.elbo import ElboTerms, elbo_terms, minibatch_standard_error
from vbcore.model.posterior import Posterior

ELBO_MODES = ("minibatch", "full")
#: consecutive rows per slice of a minibatch (option ``minibatch_slice``,
#: :func:`pipeline.fit.learners.sampling.draw_slices`); 0 (the default) is "auto"
#: (:func:`pipeline.fit.learners.sampling.auto_slice`): slices of 32 on stores of at least 250 minibatches'
#: rows (1M at 4,000), single rows below. Slices (a power of two, so they stay inside the store's
#: 8,192-row chunks) read a chunk per slice instead of nearly every chunk per step (16M rows streamed:
#: 0.6 s a step with 32 against 5 s with 1; 1M in memory: fewer, larger chunk tasks, sga-f 0.29 ->
#: 0.19 of VB EM's time), but small stores keep single rows: the ingest keeps the source's order, and
#: on stores sorted by class slices lose small classes (slices of 32 lost those tests/test_growth_point.py
#: plants at the end of its data; slices of 256 took sga-f's NMI from 0.444 to 0.322; docs/benchmarks.md)
MINIBATCH_SLICE = 0


#: the options every minibatch learner (sga, sga-m, sga-f, svi) shares
MINIBATCH_OPTIONS = Options({
    "minibatch": Opt(4000, "Rows per iteration.", low=1),
    "minibatch_slice": Opt(MINIBATCH_SLICE, "Consecutive rows per slice of a minibatch.", low=0,
                           special={0: "auto"}),
    "elbo": Opt("minibatch", "The bound reported per iteration: minibatch (an unbiased estimate from the "
                "iteration's minibatch) or full (exact, one more full pass).", choices=ELBO_MODES),
})
ETA = Opt(0.1, "Step size (Lim & Jiang 2024 Algorithm 1, step 3.i).", low=1e-3, high=1e-1)


class _SGA(MergingPointLearner):
    method = "sga"
    grows = True  # births checked on the bound (pipeline.fit.learners.point.growth)
    options = declare({"eta": ETA, **MINIBATCH_OPTIONS.only("minibatch", "minibatch_slice"),
                       **PRUNE_THRESHOLD, "elbo": MINIBATCH_OPTIONS.decls["elbo"]},
                      POINT_MOVE_OPTIONS, MAP_SEARCH_OPTIONS,  # merges: pipeline.fit.learners.moves
                      POINT_GROW_OPTIONS)  # births: pipeline.fit.learners.point.growth

    def __init__(self, ctx: FitContext, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(ctx, options)
        #: births (pipeline.fit.learners.point.growth)
        self.births = PointGrowth(ctx, self.opts, searching=self.search is not None)
        self.se: float | None = None
        self.velocity: Velocity | None = None

    def _reorder(self, order: np.ndarray) -> None:
        super()._reorder(order)  # the candidate search's stored candidates
        if self.velocity is not None:
            self.velocity = self.velocity.take(order)

    def start(self, post: Posterior) -> None:
        if not (self.point is not None and post is self.post):
            self.velocity = Velocity.zeros(*post.means.shape)
        super().start(post)

    def initialise(self) -> Posterior:
        self.velocity = None
        post = super().initialise()
        assert self.point is not None
        self.velocity = Velocity.zeros(*self.point.means.shape)
        return post

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        assert self.point is not None and self.post is not None, "start() first"
        n = self.ctx.n_weight
        self._iteration = iteration
        if self.merges.schedule.due(iteration):  # merges are judged on all rows: one more full pass
            self.apply_moves(iteration, self.hard_pass(self.point))
        handles, rows, m = minibatch(self.ctx, iteration, int(self.opts["minibatch"]),
                                   int(self.opts["minibatch_slice"]))
        estimate = self.opts["elbo"] == "minibatch"
        spread = None
        if estimate and self.search is None:
            # each row's share of the bound of the distribution entering the step is summed with
            # its spread in the same pass, for the estimate's standard error
            bound = row_bound(self.point, self.sigma2, self.post, self.ctx.shift)
            params = map_params(self.point, self.sigma2, self.ctx.shift, self.ctx.source.dtype, bound=bound)
            raw = self.minibatch_pass(params, handles, rows)
            stats, spread = raw.to_stats(), raw.bound[1]
        else:  # exact bounds, or the candidate search (which does not sum the rows' shares)
            stats = self.hard_pass(self.point, handles, rows)
        mw = minibatch_weight(stats, m)  # its rows, or their total weight
        grad = gradients(stats, self.point, self.ctx.prior, self.sigma2, n, self.a0)
        new, vel = sga_step(self.point, grad, method=self.method, eta=float(self.opts["eta"]),
                            sigma2=self.sigma2, velocity=self.velocity,
                            alpha=float(self.opts.get("alpha", 0.9)))
        self.velocity = vel
        counts = stats.nk * (n / mw)
        terms = None
        self.se = None
        if estimate:
            # the distribution entering this step has not seen this minibatch: its bound estimated
            # here is unbiased (the stepped one was fitted to these rows and reads optimistically)
            terms = elbo_terms(scale_stats(stats, n / mw), self.post, self.ctx.prior)
            if spread is not None:
                self.se = minibatch_standard_error(n, mw, spread)
        self._set(new, counts)
        if terms is None:
            terms = self.exact_terms()
        self.post = self.posterior()
        born = self.births.check(self, iteration)  # births (pipeline.fit.learners.point.growth)
        if born is not None:
            self.adopt_birth(born)
            terms, self.se = born.terms, None
        return self.post, terms

    def adopt_birth(self, born: Birth) -> None:
        """Go on from an accepted birth's refined point with its truncation."""
        self.point, self.counts = born.point, born.stats.nk.copy()
        self.velocity = Velocity.zeros(*born.point.means.shape)  # the children have no momentum
        self.post = self.posterior()
        self.births.accept(born.truncation)
        self.merges.schedule.pending = True  # a merge round before an exact fit may converge

    def bound_kind(self) -> str:
        return "minibatch estimate" if self.opts["elbo"] == "minibatch" else "exact"

    def bound_se(self) -> float | None:
        return self.se

    def final_terms(self) -> ElboTerms | None:
        if self.bound_kind() == "exact":
            return None
        return self.exact_terms()  # one full MAP pass; the counts and posterior follow it

    def start_warm(self, post: Posterior) -> None:
        """A warm start continues with a truncation ``post`` does not saturate, as VB EM's
        (:meth:`pipeline.fit.learners.growth.Growth.warm`)."""
        self.births.growth.warm(self.ctx, post.n_components)
        super().start_warm(post)

    def converged(self, history: list[float], tol: float) -> bool:
        growth = self.births.growth
        growth.min_gain = tol * self.ctx.n_weight
        done = super().converged(history, tol)
        assert self.post is not None and self.point is not None
        return done and not growth.wants(n_used(self.post), self.point.n_components)

    def truncation_info(self, used: int) -> dict[str, Any]:
        if not self.births.growth.enabled:
            return super().truncation_info(used)
        return self.births.growth.info(used)

    def own_state(self) -> PointState:
        out = replace(super().own_state(), growth=self.births.growth.to_state())
        if self.method == "sga-m" and self.velocity is not None:  # (the others' is zeros)
            out = replace(out, velocity=self.velocity)
        return out

    def load(self, post: Posterior, state: PointState) -> None:
        self.births.growth.load(state.growth)
        self.ctx.prior = replace(self.ctx.prior, n_components=self.births.growth.truncation)
        super().load(post, state)
        k, d = post.means.shape
        v = state.velocity
        self.velocity = Velocity(np.asarray(v.mu), np.asarray(v.v)) if v is not None else Velocity.zeros(k, d)


@register("sga")
class SGA(_SGA):
    """Constant step size (Lim & Jiang 2024 section 3.1)."""

    method = "sga"


@register("sga-m")
class SGAMomentum(_SGA):
    """Momentum (Lim & Jiang 2024 section 3.2, eq. 8)."""

    method = "sga-m"
    options = _SGA.options.with_({"alpha": Opt(0.9, "Momentum (Lim & Jiang 2024 eq. 8).", low=0, high=1)})


@register("sga-f")
class SGAFisher(_SGA):
    """Empirical-Fisher adaptive step size (Lim & Jiang 2024 section 3.3, eqs. 9-11)."""

    method = "sga-f"
