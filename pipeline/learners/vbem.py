"""VB EM (Kuusela et al. 2009 eqs. 35-41): one E-step pass over the chunks, then the M-step on the driver."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.learners import register
from pipeline.learners.base import Learner
from pipeline.learners.moves import MOVE_OPTIONS, Moves, check_move_options
from vbcore.elbo import ElboTerms, elbo_terms
from vbcore.errors import ConfigError
from vbcore.kernels import KernelResult, estep_params, vbem_kernel
from vbcore.mstep import m_step
from vbcore.posterior import Posterior


def vbem_pass(ctx, post: Posterior) -> KernelResult:  # type: ignore[no-untyped-def]
    """One E-step + statistics pass with responsibilities from ``post``."""
    return ctx.engine.map_reduce(vbem_kernel, ctx.handles, estep_params(post, ctx.shift))


@register("vbem")
class VBEM(Learner):
    """Variational Bayesian EM: q(Z) from the current q(theta), then q(theta) from q(Z).

    The ELBO reported after iteration t is that of (q(Z) from the E-step, q(theta) from the M-step
    that followed), which never decreases for ``reg_covar = 0`` (Bishop 2006 sec. 10.2)."""

    #: DP pruning (issue 6): components whose expected count N_k falls under ``prune_below`` rows are
    #: dropped after the M-step (the bound moves by about N_k nats); ``reorder`` sorts the sticks by
    #: descending N_k before the M-step (which never lowers the bound, Lim & Jiang 2024 section 4.5;
    #: off by default, so the trajectory stays scikit-learn's)
    options = {"prune_below": 1e-6, "reorder": False, **MOVE_OPTIONS}  # moves: pipeline.learners.moves

    @classmethod
    def check_options(cls, opts: dict[str, Any]) -> None:
        check_move_options(cls.name, opts)

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        super().check_spec(spec)
        if spec.covariance == "tied" and spec.learner_options.get("moves", "none") != "none":
            raise ConfigError(f"learner option 'moves' of {cls.name!r} does not support covariance 'tied' "
                              "(its shared precision depends on K); use moves=none")

    def __init__(self, ctx, options=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, options)
        self.moves = Moves(self.name, self.opts)

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        assert self.post is not None, "start() first"
        moving = self.moves.due(iteration)
        stats = self.moves.run(self.ctx, self.post) if moving else vbem_pass(self.ctx, self.post).stats
        dp = self.ctx.weight_type == "dirichlet_process"
        if dp and self.opts["reorder"]:
            stats = stats.take(np.argsort(-stats.nk, kind="stable"))
        self.post = m_step(stats, self.ctx.prior, self.ctx.reg_covar)
        terms = elbo_terms(stats, self.post, self.ctx.prior)
        # 'tied' keeps all K: its shared q(Lambda) depends on K (nu = nu0 + N/K), so dropping one
        # component would change every other's posterior (docs/algorithms.md)
        prune = dp and self.ctx.covariance_type != "tied"
        keep = stats.nk >= float(self.opts["prune_below"]) if prune else None
        if keep is not None:
            self.post = prune_components(self.post, keep)
        self.moves.observe(iteration, stats, keep, self.post, self.ctx.prior, self.ctx.reg_covar)
        return self.post, terms

    def converged(self, history: list[float], tol: float) -> bool:
        return self.moves.converged(super().converged(history, tol))

    def state(self) -> dict[str, np.ndarray]:
        return self.moves.state()

    def load_state(self, post: Posterior, state: Mapping[str, np.ndarray]) -> None:
        super().load_state(post, state)
        self.moves.load_state(state)


def prune_components(post: Posterior, keep: np.ndarray) -> Posterior:
    """The posterior of the components ``keep`` (a mask; the largest is kept if none is)."""
    if keep.all():
        return post
    idx = np.flatnonzero(keep) if keep.any() else np.array([int(np.argmax(post.weight_concentration[0]))])
    nu = None if post.degrees_of_freedom is None else post.degrees_of_freedom[idx]
    return Posterior(post.covariance_type, post.weight_type, post.weight_concentration[..., idx],
                     post.mean_precision[idx], post.means[idx], nu, post.covariances[idx],
                     post.precisions_cholesky[idx])
