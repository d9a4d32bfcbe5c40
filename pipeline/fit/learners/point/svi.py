"""SVI for the DP mixture (Hoffman et al. 2013; the baseline of Lim & Jiang 2024 Table 3).

Each iteration: the VB E-step on a minibatch drawn with ``ctx.rng(iteration)`` (next to the data),
then the natural-gradient step of the global parameters towards the posterior of the N/M-scaled
minibatch statistics with ``rho_t = (t + tau)^-kappa`` (:func:`vbcore.learners.svi.svi_update`), then pruning
by the threshold rule (Lim & Jiang 2024 section 4.5,
:meth:`pipeline.fit.learners.point.base.DPPointLearner.prune_kept`) and re-ordering by descending count.
Merges (``moves=merge``) are judged on a full pass: see :meth:`SVI.merge_round`.
The reported ELBO is the minibatch estimate (``elbo='minibatch'``) or exact (``elbo='full'``, one
more full pass).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from pipeline.fit.learners import register
from pipeline.fit.learners.base import FitContext
from pipeline.fit.learners.moves import (
    MOVE_OPTIONS,
    POINT_MOVE_OPTIONS,
    Moves,
    move_interval,
)
from pipeline.fit.learners.options import Opt, declare
from pipeline.fit.learners.point.base import PRUNE_THRESHOLD, DPPointLearner
from pipeline.fit.learners.point.moves import Judge
from pipeline.fit.learners.point.sga import MINIBATCH_OPTIONS
from pipeline.fit.learners.point.state import PointState
from pipeline.fit.learners.sampling import minibatch, minibatch_weight
from vbcore.errors import ConfigError
from vbcore.kernels.estep import estep_params, vbem_pass_kernel
from vbcore.kernels.sga_stats import scale_stats
from vbcore.learners.svi import minibatch_vbem_kernel, step_size, svi_update
from vbcore.model.elbo import ElboTerms, elbo_terms, minibatch_standard_error
from vbcore.model.mstep import m_step, weight_posterior
from vbcore.model.posterior import Posterior


@register("svi")
class SVI(DPPointLearner):
    """Stochastic variational inference: natural-gradient steps from minibatches (Hoffman et al. 2013)."""

    #: merges (``moves``, as the hard learners'): a round is one full VB E-step pass that also gathers
    #: the entropy changes of merging each cluster with its nearest neighbours; merges are kept when
    #: the exact ELBO of all rows rises (:class:`pipeline.fit.learners.moves.Moves`)
    options = declare({**MINIBATCH_OPTIONS.only("minibatch", "minibatch_slice"),
                       "tau": Opt(1.0, "Delay of the step sizes rho_t = (t + tau)^-kappa.", low=0),
                       "kappa": Opt(0.7, "Forgetting rate of rho_t = (t + tau)^-kappa.", low=0.5, high=1,
                                    low_open=True),
                       **PRUNE_THRESHOLD, "elbo": MINIBATCH_OPTIONS.decls["elbo"]},
                      POINT_MOVE_OPTIONS)

    def __init__(self, ctx: FitContext, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(ctx, options)
        self.vb: Posterior | None = None
        self.se: float | None = None
        self.moves = Moves(self.name, {**MOVE_OPTIONS, **self.opts,
                                       "move_every": move_interval(self.opts, ctx.n_rows)})
        self.judging = Judge(self.opts)

    def initialise(self) -> Posterior:
        super().initialise()  # k-means++ seeds and one full MAP pass
        assert self.point is not None
        wc = weight_posterior(self.counts, self.ctx.prior)  # the VB stick posterior of the counts
        self.vb = Posterior("fixed", "dirichlet_process", wc, self.ctx.prior.mean_precision + self.counts,
                            self.point.means.copy(), None, np.full(self.counts.shape, self.sigma2))
        return self.vb

    def start(self, post: Posterior) -> None:
        if post.covariance_type != "fixed" or post.weight_type != "dirichlet_process":
            raise ConfigError(f"learner {self.name!r} cannot start from a {post.covariance_type!r}/"
                              f"{post.weight_type!r} posterior")
        self.vb = self._prune(post)
        self.post = self.vb

    def load(self, post: Posterior, state: PointState) -> None:
        self.vb = post
        self.post = post
        self.moves.load(state.moves)
        self.thr = state.prune_threshold

    def own_state(self) -> PointState:
        return PointState(prune_threshold=self.thr, moves=self.moves.to_state())

    def cache_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def load_cache(self, post: Posterior, arrays: Mapping[str, np.ndarray]) -> None:
        pass

    def converged(self, history: list[float], tol: float) -> bool:
        return self.moves.converged(super().converged(history, tol))

    def _prune(self, post: Posterior) -> Posterior:
        """Drop the sticks with ``E[v_k] = a_k / (a_k + b_k)`` under the threshold (section 4.5) and
        re-order the rest by descending expected count."""
        a, b = post.weight_concentration
        keep = self.prune_kept(a / (a + b), a - 1.0, post.means)
        kept = post.take(keep[np.argsort(-a[keep], kind="stable")])  # by descending expected count
        # q(v_k) = Beta(1 + N_k, alpha0 + N_{>k}) with the running counts N_k = a_k - 1: the second
        # parameter is re-derived for the new order (permuting b with a would change every weight;
        # in an unchanged order it equals the running average SVI keeps, both blend with one rho_t);
        # the first stays a_k as taken (1 + (a_k - 1) need not be a_k in floating point)
        wc = weight_posterior(kept.weight_concentration[0] - 1.0, self.ctx.prior)
        wc[0] = kept.weight_concentration[0]
        return replace(kept, weight_concentration=wc)

    def bound_kind(self) -> str:
        return "minibatch estimate" if self.opts["elbo"] == "minibatch" else "exact"

    def bound_se(self) -> float | None:
        return self.se if self.bound_kind() != "exact" else None

    def final_terms(self) -> ElboTerms | None:
        if self.bound_kind() == "exact" or self.vb is None:
            return None
        params = estep_params(self.vb, self.ctx.shift)
        full = self.ctx.engine.map_reduce(vbem_pass_kernel, self.ctx.handles, params)
        return elbo_terms(full.stats, self.vb, self.ctx.prior)

    def merge_round(self) -> None:
        """One full VB E-step pass with the entropy changes of merging each cluster with its
        ``move_neighbours`` nearest means; accepted merges (the exact ELBO of all rows rises) give
        the full-data posterior of the merged statistics."""
        assert self.vb is not None
        self.moves.propose_nearest(self.vb.means)
        chosen = self.moves.run(self.ctx, self.vb, judge=self.judging)
        if self.moves.last_round["merges"]:
            self.vb = self._prune(m_step(chosen, self.ctx.prior, self.ctx.reg_covar))
            self.post = self.vb

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        assert self.vb is not None, "start() first"
        if self.moves.due(iteration):
            self.merge_round()
        n = self.ctx.n_weight
        handles, rows, m = minibatch(self.ctx, iteration, int(self.opts["minibatch"]),
                                   int(self.opts["minibatch_slice"]))
        params = estep_params(self.vb, self.ctx.shift)
        res = self.ctx.engine.map_reduce(minibatch_vbem_kernel, handles, params, per_chunk=rows)
        rho = step_size(iteration, float(self.opts["tau"]), float(self.opts["kappa"]))
        new = svi_update(self.vb, res.stats, self.ctx.prior, n, rho)
        mw = minibatch_weight(res.stats, m)  # its rows, or their total weight
        if self.opts["elbo"] == "minibatch":
            # unbiased: the posterior entering the step has not seen this minibatch
            # (pipeline.fit.learners.point.sga)
            terms = elbo_terms(scale_stats(res.stats, n / mw), self.vb, self.ctx.prior)
            self.se = minibatch_standard_error(n, mw, res.log_norm_m2)
            self.vb = self._prune(new)
        else:
            self.vb = self._prune(new)
            full = self.ctx.engine.map_reduce(vbem_pass_kernel, self.ctx.handles,
                                              estep_params(self.vb, self.ctx.shift))
            terms = elbo_terms(full.stats, self.vb, self.ctx.prior)
        self.post = self.vb
        return self.vb, terms
