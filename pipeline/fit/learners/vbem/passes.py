"""VB EM's passes, chosen once when the learner starts (issue 54; the anchor: dask's chunk/combine/
aggregate reductions, where the reduction is an object picked once, not a branch taken every step).

A pass is an object with one method, ``run(post, iteration) -> Passed``: the statistics of one E-step
over the rows from ``post``. :func:`choose_pass` picks it from the learner's options:

* :class:`PlainPass` -- the exact E-step over every chunk (:func:`vbem_pass`);
* :class:`RelaxedPass` -- the same, first tried from the over-relaxed q(theta) (``accelerate``,
  :mod:`pipeline.fit.learners.vbem.overrelax`);
* :class:`TruncatedPass` -- the truncated E-step over candidate clusters (``candidates``,
  :mod:`pipeline.fit.learners.truncated`);
* :class:`MemoPass` -- memoized statistics, a share of the chunks visited (``memo``,
  :mod:`pipeline.fit.learners.vbem.memo`);

and, where the fit has moves (``moves``, :mod:`pipeline.fit.learners.moves`), wrapped by a move round
(:class:`MoveRound`, :class:`TruncatedMoveRound`) that runs the round's pass instead on the iterations
the move schedule says are due. Each object calls the engine and does its arithmetic in the order the
one ``VBEM.step`` did before (the bits are the contract).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.fit.learners.base import FitContext
from pipeline.fit.learners.growth import Growth
from pipeline.fit.learners.moves import Moves
from pipeline.fit.learners.truncated import TruncatedEStep
from pipeline.fit.learners.vbem.memo import MemoStats
from pipeline.fit.learners.vbem.overrelax import OverRelax
from vbcore.kernels.estep import KernelResult, estep_params, vbem_pass_kernel
from vbcore.model.elbo import elbo_terms
from vbcore.model.mstep import m_step
from vbcore.model.posterior import Posterior
from vbcore.model.stats import SuffStats


def vbem_pass(ctx: FitContext, post: Posterior) -> KernelResult:
    """One E-step + statistics pass with responsibilities from ``post``."""
    return ctx.engine.map_reduce(vbem_pass_kernel, ctx.handles, estep_params(post, ctx.shift))


@dataclass(frozen=True)
class Passed:
    """What one pass gives the M-step: the statistics; ``full_round``: a move round that was a full
    pass (VB EM's memoized convergence test follows it); ``relabelling``: (kept, moved) of a truncated
    move round, for the candidate sets (:meth:`pipeline.fit.learners.truncated.TruncatedLearner.
    relabel_components`)."""

    stats: SuffStats
    full_round: bool = False
    relabelling: tuple[np.ndarray, np.ndarray] | None = None


class Pass(Protocol):
    def run(self, post: Posterior, iteration: int) -> Passed: ...


class PlainPass:
    """The exact E-step over every chunk."""

    def __init__(self, ctx: FitContext) -> None:
        self.ctx = ctx

    def run(self, post: Posterior, iteration: int) -> Passed:
        return Passed(vbem_pass(self.ctx, post).stats)


class RelaxedPass:
    """A pass from the current q(theta), or first from the over-relaxed one (``accelerate``), kept when
    its bound beats the last reported one (``growth.last``)."""

    def __init__(self, ctx: FitContext, relax: OverRelax, growth: Growth) -> None:
        self.ctx, self.relax, self.growth = ctx, relax, growth

    def run(self, post: Posterior, iteration: int) -> Passed:
        ctx, relax = self.ctx, self.relax
        trial = relax.proposal(ctx.prior, ctx.reg_covar)
        kept = None
        if trial is not None and self.growth.last is not None:
            stats = vbem_pass(ctx, trial).stats
            kept = elbo_terms(stats, m_step(stats, ctx.prior, ctx.reg_covar), ctx.prior).total \
                > self.growth.last.total
            if kept:
                relax.push(stats, True)
                return Passed(stats)
        stats = vbem_pass(ctx, post).stats
        relax.push(stats, False if kept is False else None)
        return Passed(stats)


class TruncatedPass:
    """The truncated E-step (no over-relaxation: its statistics are not the exact pass's)."""

    def __init__(self, truncated: TruncatedEStep, relax: OverRelax) -> None:
        self.truncated, self.relax = truncated, relax

    def run(self, post: Posterior, iteration: int) -> Passed:
        self.relax.reset()
        return Passed(self.truncated.run(post, iteration).stats)


class MemoPass:
    """Memoized statistics: this iteration's share of the chunks visited, the others' kept; new rows
    beside adopted statistics make the next iteration a move round."""

    def __init__(self, ctx: FitContext, memo: MemoStats, moves: Moves, relax: OverRelax) -> None:
        self.ctx, self.memo, self.moves, self.relax = ctx, memo, moves, relax

    def run(self, post: Posterior, iteration: int) -> Passed:
        self.relax.reset()
        stats = self.memo.run(estep_params(post, self.ctx.shift), iteration).stats
        if self.memo.absorbed:  # new rows beside adopted statistics: the round comes now
            self.moves.round_next()
        return Passed(stats)


class MoveRound:
    """A move round of the exact E-step (or of memoized statistics, ``memo``) on the iterations the
    schedule says are due, ``inner`` on the others."""

    def __init__(self, inner: Pass, ctx: FitContext, moves: Moves, relax: OverRelax,
                 memo: MemoStats | None) -> None:
        self.inner, self.ctx, self.moves, self.relax, self.memo = inner, ctx, moves, relax, memo

    def run(self, post: Posterior, iteration: int) -> Passed:
        if not self.moves.due(iteration):
            return self.inner.run(post, iteration)
        memo, moves, relax = self.memo, self.moves, self.relax
        if memo is not None:
            relax.reset()
        stats = moves.run(self.ctx, post, None if memo is None else
                          lambda params: memo.run_moves(params, iteration))
        moved = bool(moves.last_round["merges"] or moves.last_round["deleted"])
        if memo is not None and moved:
            memo.replay(moves.replay)  # each chunk keeps the accepted moves' q(Z) on its rows
        # (a round on kept shares visits some chunks: the memoized convergence test follows it)
        full = memo is None or memo.last_full
        if moved:
            relax.reset()
        elif memo is None:  # a round that moved nothing is a plain pass
            relax.push(stats, None)
        return Passed(stats, full_round=full)


class TruncatedMoveRound:
    """A move round of the truncated E-step (the round is the truncated pass itself,
    :meth:`pipeline.fit.learners.moves.Moves.truncated_request`) on the iterations the schedule says
    are due, ``inner`` on the others."""

    def __init__(self, inner: TruncatedPass, ctx: FitContext, moves: Moves) -> None:
        self.inner, self.ctx, self.moves = inner, ctx, moves

    def run(self, post: Posterior, iteration: int) -> Passed:
        if not self.moves.due(iteration):
            return self.inner.run(post, iteration)
        self.inner.relax.reset()
        request = self.moves.truncated_request(post.n_components)
        stats = self.moves.choose_truncated(self.ctx, self.inner.truncated.run(post, iteration, request))
        return Passed(stats, relabelling=self.moves.relabelling)


def choose_pass(ctx: FitContext, truncated: TruncatedEStep | None, memo: MemoStats | None, moves: Moves,
                relax: OverRelax, growth: Growth) -> Pass:
    """The pass of a VB EM fit, chosen once (the options do not change during a fit): the truncated
    E-step, memoized statistics, the over-relaxed or the plain exact pass, each wrapped by a move
    round where the fit has moves."""
    if truncated is not None:
        trunc = TruncatedPass(truncated, relax)
        return TruncatedMoveRound(trunc, ctx, moves) if moves.active else trunc
    inner: Pass
    if memo is not None:
        inner = MemoPass(ctx, memo, moves, relax)
    elif relax.on:
        inner = RelaxedPass(ctx, relax, growth)
    else:
        inner = PlainPass(ctx)
    return MoveRound(inner, ctx, moves, relax, memo) if moves.active else inner
