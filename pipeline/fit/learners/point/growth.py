"""Births for the DP point learners (SGA, SGA+M, SGA+F): a truncation that does not decide the answer.

The point learners prune (Lim & Jiang 2024's threshold rule) and merge (:class:`pipeline.fit.learners.
moves.HardMoves`), so a fit started above the truth shrinks to it; this module lets one started below
it grow, in the spirit of VB EM's births (:mod:`pipeline.fit.learners.growth`, whose machinery it uses:
the seeded sample of rows, the held-out bimodality test, the 2-means split, :class:`Growth`'s rules):

1. **When**: every ``grow_every`` iterations (the minibatch estimate never converges, so the check
   has its own schedule), at the iteration after an accepted birth (growth from far below takes one
   check per doubling), and where the learner's bound is exact (``elbo='full'``) also when it has
   converged (the next iteration checks). The check asks :meth:`Growth.wants` with the counts the
   learner holds: a saturated truncation below the limit doubles; one the threshold or the merges
   have shrunk is filled.
2. **What**: :func:`pipeline.fit.learners.growth.split_proposals` with ``gated=True`` whether the
   truncation doubles or fills: only components the held-out test calls two groups, or that spread
   about their mean far more than one component of the fixed-covariance model does
   (:func:`pipeline.fit.learners.growth.spread_ratio` above ``SPREAD_SPLIT``; widest first), are split (hard
   assignments never join the halves of a split Gaussian again, which VB EM's soft ones do, so an
   ungated doubling of single Gaussians would only waste its passes before the bound refuses it). The
   parent takes one half's mean, a child the other's, each half the parent's weight
   (:func:`split_point`). When no component passes, or the bound refuses the splits, one more pass
   gathers the worst-explained rows as VB EM's births do
   (:func:`pipeline.fit.learners.outliers.outlier_births`) and proposes a child at each tight group
   of them far from its cluster, weighing ``OUTLIER_MIN_ROWS`` rows taken from that cluster
   (:func:`outlier_point`): a class of a few dozen rows that the minibatches rarely show. Nothing
   proposed, or all refused: the growth ends.
3. **Judged on the exact bound of all rows**: the proposal and the current point are each refined by
   ``grow_iters`` full-data MM steps (MAP assignments of all rows, :func:`vbcore.learners.sga.mm_update`, the
   learner's threshold rule; :meth:`PointGrowth.refine`), and the proposal is accepted only when
   its exact ELBO (:func:`vbcore.model.elbo.elbo_terms` of its hard statistics, one more full pass) exceeds
   both the current point's and the refined current point's by more than ``tol`` per unit of weight
   (a check with a proposal: ``2 grow_iters + 3`` passes, the sample's gather included).
   Accepted: the learner goes on from the refined proposal (momentum restarts at zero; the default
   threshold may only fall: to a tenth of the proposal's largest weight, and to ``BIRTH_SHARE`` of its
   smallest split weight, set before the refinement, so the rule prunes no child the bound has not
   judged; started below the truth, the threshold of the start's largest cluster, which holds several
   classes, is about one class's weight) with the larger truncation,
   and that iteration reports the proposal's exact bound. Refused: the point, counts, threshold and
   momentum are untouched (the fit's bits are those of a fit without growth) and the growth ends.

Growth is on where ``ctx.grow`` (the pipeline's default) and the weights are a DP, and off with the
candidate MAP search (``candidates`` > 0). The draw is ``ctx.rng(GROW_TAG, iteration)``, so both
engines and a resumed fit propose the same births; the growth state is in the checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pipeline.fit.learners.base import FitContext
from pipeline.fit.learners.growth import SPREAD_SPLIT, Growth, n_used, split_proposals
from pipeline.fit.learners.options import Opt, Options
from pipeline.fit.learners.outliers import OUTLIER_MIN_ROWS, outlier_births
from pipeline.fit.learners.point.moves import MergingPointLearner
from vbcore.kernels.estep import estep_params
from vbcore.kernels.sga_stats import DPPoint, log_stick_weights, take_stats
from vbcore.learners.sga import default_threshold, mm_sticks, mm_update, sticks_of_weights
from vbcore.model.elbo import ElboTerms
from vbcore.model.stats import SuffStats

#: the growth options of the point learners: full-data MM steps a proposal (and the point it would
#: replace) gets before the bound judges it, and the iterations between two checks
POINT_GROW_OPTIONS = Options({
    "grow_iters": Opt(3, "Full-data MM steps a birth proposal (and the point it would replace) gets "
                      "before the exact bound judges it.", low=1),
    "grow_every": Opt(20, "Iterations between two birth checks (with grow and DP weights).", low=1),
})
#: a birth proposal lowers the threshold rule's THR to this share of its smallest split weight (each
#: half of a parent), so the rule does not prune a child before the bound has judged it, nor after
BIRTH_SHARE = 0.5


def split_point(point: DPPoint, parents: np.ndarray, kept: np.ndarray, children: np.ndarray,
                shift: np.ndarray) -> DPPoint:
    """``point`` with each parent's mean moved to ``kept`` and a child per row of ``children`` (both
    shifted, as :func:`pipeline.fit.learners.growth.split_proposals` gives them) appended; parent and
    child each take half the parent's mixture weight (the other weights are unchanged)."""
    pi = np.exp(log_stick_weights(point.sticks))
    pi[parents] = pi[parents] / 2.0
    means = np.concatenate((point.means, children + shift))
    means[parents] = kept + shift
    return DPPoint(means, sticks_of_weights(np.concatenate((pi, pi[parents]))))


def outlier_point(point: DPPoint, parents: np.ndarray, children: np.ndarray, shift: np.ndarray,
                  n_weight: float) -> DPPoint:
    """``point`` with a child at each row of ``children`` (shifted group means of the worst-explained
    rows, :func:`pipeline.fit.learners.outliers.outlier_births`) appended, each weighing
    ``OUTLIER_MIN_ROWS`` rows taken from its parent (``parents``); the other weights are unchanged."""
    pi = np.exp(log_stick_weights(point.sticks))
    w = np.full(parents.size, min(OUTLIER_MIN_ROWS / max(float(n_weight), 1.0), 1.0))
    np.subtract.at(pi, parents, w)
    pi[parents] = np.maximum(pi[parents], w)  # (a parent keeps at least what its child takes)
    means = np.concatenate((point.means, children + shift))
    return DPPoint(means, sticks_of_weights(np.concatenate((pi, w))))


@dataclass(frozen=True)
class Birth:
    """An accepted birth proposal: the refined point, the hard statistics of all rows under it, its
    exact bound and the new truncation."""

    point: DPPoint
    stats: SuffStats
    terms: ElboTerms
    truncation: int


class PointGrowth:
    """Births of a DP point learner (the SGA learners own one: ``learner.births``). The learner calls
    :meth:`check` at the end of its step with itself (the point, its passes, threshold rule and judged
    bound) and adopts an accepted :class:`Birth`, then calls :meth:`accept`; it adds :attr:`growth`'s
    convergence rule, checkpoint state and ``truncation`` entry to its own."""

    def __init__(self, ctx: FitContext, opts: Mapping[str, Any], searching: bool) -> None:
        self.ctx = ctx
        self.every = int(opts["grow_every"])
        #: the truncation's growth (:class:`pipeline.fit.learners.growth.Growth`; off with the candidate
        #: MAP search, ``searching``)
        self.growth = Growth.of(ctx, int(opts["grow_iters"]), not searching)

    def check(self, learner: MergingPointLearner, iteration: int) -> Birth | None:
        """At a check (every ``grow_every`` iterations, or after a converged exact bound): propose and
        judge births; the accepted proposal, or None (nothing proposed or refused: the learner's state
        is untouched)."""
        g = self.growth
        due = g.pending or iteration % self.every == 0
        if not (g.enabled and not g.refused and due):
            return None
        assert learner.post is not None and learner.point is not None
        if not g.wants(n_used(learner.post), learner.point.n_components):
            return None
        g.pending = False
        born = self.try_births(learner, iteration)
        g.refused = born is None
        return born

    def accept(self, truncation: int) -> None:
        """After the learner adopted an accepted birth: the truncation ``truncation`` (the prior's too);
        the next iteration checks again (the refined proposal is settled enough)."""
        g = self.growth
        g.truncation, g.grown = truncation, g.grown + 1
        self.ctx.prior = replace(self.ctx.prior, n_components=truncation)
        g.pending = True

    def try_births(self, learner: MergingPointLearner, iteration: int) -> Birth | None:
        """The birth proposal towards :meth:`Growth.next_truncation`, accepted on the exact bound:
        the gated splits, then, when they are refused or there are none, children at the groups of
        the worst-explained rows (:func:`pipeline.fit.learners.outliers.outlier_births`, one more
        pass), as VB EM's births."""
        ctx, point, post = self.ctx, learner.point, learner.post
        assert point is not None and post is not None
        k = self.growth.next_truncation()
        births = k - point.n_components
        parents, kept, children = split_proposals(ctx, post, births, iteration, gated=True)
        current: list[float] = []  # the current point's bound and its refined one's (computed once)
        if parents.size:
            proposal = split_point(point, parents, kept, children, ctx.shift)
            born = np.exp(log_stick_weights(proposal.sticks))[parents]
            if (judged := self.judge(learner, proposal, float(born.min()), current)) is not None:
                return Birth(*judged, k)
        groups = outlier_births(ctx, estep_params(post, ctx.shift), point.means - ctx.shift,
                                SPREAD_SPLIT)[:births]
        if not groups:
            return None
        proposal = outlier_point(point, np.asarray([c[1] for c in groups], dtype=np.int64),
                                 np.asarray([c[2] for c in groups]), ctx.shift, ctx.n_weight)
        judged = self.judge(learner, proposal, float(np.exp(log_stick_weights(proposal.sticks))[-1]), current)
        return None if judged is None else Birth(*judged, k)

    def judge(self, learner: MergingPointLearner, proposal: DPPoint, smallest: float,
              current: list[float]) -> tuple[DPPoint, SuffStats, ElboTerms] | None:
        """The refined proposal, its statistics and exact bound when that beats the current point's
        and its refined one's (``current``, filled on the first call) by more than ``min_gain``; None:
        refused, the threshold as it was. The threshold may not prune a child (of weight
        ``smallest`` or more) before the bound has judged it."""
        assert learner.point is not None
        if not current:
            refined, refined_stats, first = self.refine(learner, learner.point)  # first: the point's pass
            current += [learner.judged_bound(learner.point, first),
                        learner.judged_bound(refined, refined_stats)]
        old_thr = learner.thr
        if old_thr is not None:
            learner.thr = min(old_thr, default_threshold(proposal.sticks), BIRTH_SHARE * smallest)
        point, stats, _ = self.refine(learner, proposal)
        if learner.judged_bound(point, stats) <= max(current) + self.growth.min_gain:
            learner.thr = old_thr
            return None
        return point, stats, learner.bound_of(point, stats)[1]

    def refine(self, learner: MergingPointLearner, point: DPPoint) -> tuple[DPPoint, SuffStats, SuffStats]:
        """``grow_iters`` (at least 1) full-data MM steps from ``point`` (MAP assignments of all rows, the
        learner's threshold rule, re-ordering by count, :func:`vbcore.learners.sga.mm_update`): the refined
        point, the hard statistics of all rows under it (one more pass: ``grow_iters + 1`` passes), and
        those under ``point`` itself (the first step's)."""
        first = None
        for _ in range(self.growth.iters):
            stats = learner.hard_pass(point)
            first = stats if first is None else first
            keep = learner.prune_kept(mm_sticks(stats.nk, learner.a0), stats.nk, stats.mean)
            order = keep[np.argsort(-stats.nk[keep], kind="stable")]
            point = mm_update(take_stats(stats, order), self.ctx.prior, learner.a0)
        assert first is not None, "grow_iters >= 1"
        return point, learner.hard_pass(point), first
