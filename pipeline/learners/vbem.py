"""VB EM (Kuusela et al. 2009 eqs. 35-41): one E-step pass over the chunks, then the M-step on the driver.

Options beyond the plain algorithm: the truncated E-step over candidate clusters per row
(``candidates``, :mod:`pipeline.learners.truncated`; Forster & Lücke 2018) and merge/delete moves on
the exact ELBO (``moves``, :mod:`pipeline.learners.moves`; Hughes & Sudderth 2013). Both are off by
default; they combine (:mod:`vbcore.trunc_moves`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.learners import register
from pipeline.learners.memo import MemoStats, check_memo_option
from pipeline.learners.moves import MOVE_OPTIONS, Moves, check_move_options
from pipeline.learners.truncated import TRUNCATED_OPTIONS, TruncatedLearner, check_truncated_options
from vbcore.elbo import ElboTerms, elbo_terms
from vbcore.errors import ConfigError
from vbcore.kernels import KernelResult, estep_params, vbem_kernel
from vbcore.mstep import m_step
from vbcore.posterior import Posterior


def vbem_pass(ctx, post: Posterior) -> KernelResult:  # type: ignore[no-untyped-def]
    """One E-step + statistics pass with responsibilities from ``post``."""
    return ctx.engine.map_reduce(vbem_kernel, ctx.handles, estep_params(post, ctx.shift))


@register("vbem")
class VBEM(TruncatedLearner):
    """Variational Bayesian EM: q(Z) from the current q(theta), then q(theta) from q(Z).

    The ELBO reported after iteration t is that of (q(Z) from the E-step, q(theta) from the M-step
    that followed), which never decreases for ``reg_covar = 0`` (Bishop 2006 sec. 10.2)."""

    #: DP pruning (issue 6): components whose expected count N_k falls under ``prune_below`` rows are
    #: dropped after the M-step (the bound moves by about N_k nats); ``reorder`` sorts the sticks by
    #: descending N_k before the M-step (which never lowers the bound, Lim & Jiang 2024 section 4.5;
    #: off by default, so the trajectory stays scikit-learn's). ``candidates`` > 0: the truncated
    #: E-step; ``moves``: merge/delete moves.
    options = {"prune_below": 1e-6, "reorder": False, **TRUNCATED_OPTIONS, **MOVE_OPTIONS, "memo": 0.0}

    @classmethod
    def check_options(cls, opts: dict[str, Any]) -> None:
        check_truncated_options(cls.name, opts)
        check_move_options(cls.name, opts)
        check_memo_option(cls.name, opts["memo"])
        if opts["memo"] > 0 and (opts["candidates"] > 0 or opts["moves"] != "none"):
            raise ConfigError(f"learner option 'memo' of {cls.name!r} keeps the exact E-step's statistics: "
                              "it cannot be combined with 'candidates' > 0 or 'moves' yet")

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        super().check_spec(spec)
        opts = spec.learner_options  # every covariance type has the truncated E-step; not all its moves
        if (int(opts.get("candidates", 0)) > 0 and spec.covariance == "tied"
                and opts.get("moves", "none") != "none"):
            raise ConfigError(f"learner options 'candidates' and 'moves' of {cls.name!r} cannot be combined "
                              "for covariance 'tied' yet; use candidates=0 (the exact E-step) with moves")

    def __init__(self, ctx, options=None) -> None:  # type: ignore[no-untyped-def]
        options = dict(options or {})
        if float(options.get("memo", 0.0)) > 0 and int(options.get("candidates", -1)) == -1:
            options["candidates"] = 0  # memoized statistics are the exact E-step's
        super().__init__(ctx, options)
        self.moves = Moves(self.name, self.opts)
        memo = float(self.opts["memo"])
        self.memo = MemoStats(ctx, memo) if memo > 0 else None

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        assert self.post is not None, "start() first"
        trunc = self.truncated
        if trunc is not None and self.moves.due(iteration):
            k = self.post.n_components
            stats = self.moves.choose_truncated(self.ctx, trunc.run(self.post, iteration,
                                                                    self.moves.truncated_request(k)))
            self.relabel_components(*self.moves.relabelling)
        elif trunc is not None:
            stats = trunc.run(self.post, iteration).stats
        elif self.moves.due(iteration):
            stats = self.moves.run(self.ctx, self.post)
        elif self.memo is not None:
            stats = self.memo.run(estep_params(self.post, self.ctx.shift), iteration).stats
        else:
            stats = vbem_pass(self.ctx, self.post).stats
        dp = self.ctx.weight_type == "dirichlet_process"
        if dp and self.opts["reorder"]:
            order = np.argsort(-stats.nk, kind="stable")
            stats = stats.take(order)
            self.relabel_components(order)
        self.post = m_step(stats, self.ctx.prior, self.ctx.reg_covar)
        terms = elbo_terms(stats, self.post, self.ctx.prior)
        # 'tied' keeps all K: its shared q(Lambda) depends on K (nu = nu0 + N/K), so dropping one
        # component would change every other's posterior (docs/algorithms.md)
        prune = dp and self.ctx.covariance_type != "tied"
        keep = stats.nk >= float(self.opts["prune_below"]) if prune else None
        if keep is not None:
            self.relabel_components(kept_components(self.post, keep))
            self.post = prune_components(self.post, keep)
        self.moves.observe(iteration, stats, keep, self.post, self.ctx.prior, self.ctx.reg_covar)
        return self.post, terms

    def converged(self, history: list[float], tol: float) -> bool:
        if self.memo is not None:  # per unit of the visited rows' weight
            return self.memo.converged(history, tol, self.ctx.n_weight)
        return self.moves.converged(super().converged(history, tol))

    def relabel_components(self, kept: np.ndarray, moved: np.ndarray | None = None) -> None:
        super().relabel_components(kept, moved)
        if self.memo is not None:
            self.memo.relabel(kept)

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        out.update(self.moves.state())
        if self.memo is not None:
            out.update(self.memo.state())
        return out

    def load_state(self, post: Posterior, state: Mapping[str, np.ndarray]) -> None:
        super().load_state(post, state)
        self.moves.load_state(state)
        if self.memo is not None:
            self.memo.load_state(state)

    def keep_state(self) -> dict[str, np.ndarray]:
        return {} if self.memo is None else self.memo.state()

    def adopt(self, state: Mapping[str, np.ndarray]) -> int:
        if self.memo is None or self.post is None:
            return 0
        return self.memo.adopt(state, self.post.n_components)


def prune_components(post: Posterior, keep: np.ndarray) -> Posterior:
    """The posterior of the components ``keep`` (a mask; the largest is kept if none is)."""
    if keep.all():
        return post
    idx = kept_components(post, keep)
    nu = None if post.degrees_of_freedom is None else post.degrees_of_freedom[idx]
    return Posterior(post.covariance_type, post.weight_type, post.weight_concentration[..., idx],
                     post.mean_precision[idx], post.means[idx], nu, post.covariances[idx],
                     post.precisions_cholesky[idx])


def kept_components(post: Posterior, keep: np.ndarray) -> np.ndarray:
    """The indices :func:`prune_components` keeps."""
    return np.flatnonzero(keep) if keep.any() else np.array([int(np.argmax(post.weight_concentration[0]))])
