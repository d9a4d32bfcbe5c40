"""Merges for the hard-assignment learners (MM, SGA, SGA+M, SGA+F) and the judge of their merges
(Hughes & Sudderth 2013 moves on the exact bound of the point learners' hard statistics).

The learner owns its merges (:class:`PointMerges`: the :class:`HardMoves` schedule and the
:class:`Judge`, ``self.merges``) and calls them; :class:`MergingPointLearner` is the base of the point
learners with merges (MM and the SGA learners), which adds the merges' checkpoint state and
convergence rule to :class:`pipeline.fit.learners.point.base.DPPointLearner`'s."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from pipeline.fit.learners.base import FitContext
from pipeline.fit.learners.moves import move_interval, parse_moves
from pipeline.fit.learners.point.base import DPPointLearner
from pipeline.fit.learners.point.soft_judge import soft_merges
from pipeline.fit.learners.point.state import HardMovesState, PointState
from vbcore.kernels.sga_stats import DPPoint
from vbcore.model.empirical import empirical_update
from vbcore.model.mstep import m_step
from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior, default_prior
from vbcore.model.stats import SuffStats
from vbcore.moves.exact import apply_merges, total_elbo
from vbcore.moves.hard import merge_points, nearest_pairs, select_hard_merges

#: empirical-Bayes steps on ``beta0`` for a judging prior at most (:meth:`Judge.tune`)
TUNE_STEPS = 50


#: the soft check of a round's merges: ``soft(pairs, prior) -> (accepted pairs, gain)``
SoftJudge = Callable[[np.ndarray, Prior], tuple[np.ndarray, float]]


class HardMoves:
    """Merges for the hard-assignment learners (MM, SGA, SGA+M, SGA+F), accepted when the exact ELBO
    of all rows rises (:func:`vbcore.moves.hard.select_hard_merges`): the hard statistics of a full
    pass (MM's own pass; one extra pass on a round for the SGA learners), pairs among each cluster's
    ``move_neighbours`` nearest point means, at most ``move_pairs`` of them tried. Rounds as for
    :class:`Moves` (every ``move_every`` iterations, and one more before the fit may converge).

    Neither a minibatch nor the MAP bound judges a merge: on a minibatch a cluster with no rows in it
    reads as free to give up, and ``ln p(x, z, mu, v)`` has no Occam term for the means, so it kept
    classes split (docs/algorithms.md, "Model selection in the DP point learners")."""

    def __init__(self, learner: str, opts: Mapping[str, Any]) -> None:
        self.kinds = parse_moves(learner, opts["moves"], int(opts.get("candidates", 0)))
        self.opts = dict(opts)
        self.pending, self.force = True, False
        self.last_round: dict[str, float] = {}

    def due(self, iteration: int) -> bool:
        return bool(self.kinds) and (self.force or iteration % int(self.opts["move_every"]) == 0)

    def select(self, stats: SuffStats, means: np.ndarray, prior: Prior,
               soft: SoftJudge | None = None) -> np.ndarray:
        """Disjoint pairs of clusters to merge, from the hard statistics of all rows; with ``soft``
        (``soft(pairs, prior) -> (accepted, gain)``, :func:`soft_merges`), only when the hard
        statistics accept one, the pairs are chosen again on the soft bound."""
        pairs = nearest_pairs(means, int(self.opts["move_neighbours"]))
        acc, gain = select_hard_merges(stats, pairs, prior, int(self.opts["move_pairs"]))
        if acc.shape[0] and soft is not None:
            acc, gain = soft(pairs, prior)
        self.pending, self.force = bool(acc.shape[0]), False
        self.last_round = {"merges": int(acc.shape[0]), "gain": gain}
        return acc

    def converged(self, base: bool) -> bool:
        if not (self.kinds and base):
            return base
        if self.pending:
            self.force = True
            return False
        return True

    def to_state(self) -> HardMovesState | None:
        return HardMovesState(self.pending, self.force) if self.kinds else None

    def load(self, state: HardMovesState | None) -> None:
        if self.kinds and state is not None:
            self.pending, self.force = bool(state.pending), bool(state.force)


def partition_prior(ctx: FitContext) -> Prior:
    """The prior of the bound that judges a DP point learner's merges and births (``judge='diag'``): the
    pipeline's default model -- diagonal covariances, the empirical defaults of
    :func:`vbcore.model.priors.default_prior` from the data's moments -- with the learner's own weight
    prior. Its exact ELBO at one-hot q(Z) (:func:`partition_bound`) scores a partition of the rows with
    per-cluster, per-dimension variances, where the learner's fixed isotropic ``sigma^2`` makes every
    class of real features worth many clusters (docs/algorithms.md, "Model selection in the DP point
    learners")."""
    m, own = ctx.moments, ctx.prior
    return default_prior(covariance_type="diag", weight_type=own.weight_type, n_components=own.n_components,
                         data_mean=m.raw_mean()[0], data_covariance=m.data_covariance(),
                         weight_concentration=own.weight_concentration, mean=own.mean, defaults="empirical",
                         n_rows=float(m.total_weight))


def partition_bound(stats: SuffStats, prior: Prior) -> float:
    """The exact ELBO of the one-hot q(Z) summarised by ``stats`` (hard statistics of all rows) under
    ``prior``, at its optimal q(theta): the bound :func:`vbcore.moves.hard.select_hard_merges` changes."""
    return total_elbo(stats, prior, 0.0)


class Judge:
    """Which prior's exact ELBO judges a DP learner's merges and births (learner option ``judge``): the
    learner's own (``own``), or :func:`partition_prior` (``diag``) with ``beta0`` at its empirical-Bayes
    value for the partition being judged from (:meth:`tune`), as VB EM re-estimates it."""

    def __init__(self, opts: Mapping[str, Any]) -> None:
        self.own = opts.get("judge", "own") == "own"
        self.soft = opts.get("judge", "own") == "diag"  # merges verified at soft responsibilities
        self._base: Prior | None = None

    def tune(self, ctx: FitContext, stats: SuffStats) -> Prior:
        """The judging prior for partitions compared against the one ``stats`` summarise (hard
        statistics of all rows): the learner's own, or :func:`partition_prior` with ``beta0`` at the
        maximum of that partition's bound (:func:`vbcore.model.empirical.empirical_update` alternated
        with the M-step, ``TUNE_STEPS`` at most). A fixed ``beta0`` ties each mean to ``m0`` at the
        scale of its cluster's own spread, which on well separated classes paid for a merge of two of
        them (planted 2-D classes: 5 clusters for 6 with ``beta0 = 1``)."""
        if self.own:
            return ctx.prior
        if self._base is None:
            self._base = partition_prior(ctx)
        prior = self._base
        for _ in range(TUNE_STEPS):
            new = empirical_update(prior, m_step(stats, prior, 0.0))
            done = abs(new.mean_precision - prior.mean_precision) <= 1e-6 * prior.mean_precision
            prior = new
            if done:
                break
        return prior




class PointMerges:
    """The merges of one DP point learner (``learner.merges``): the round schedule (:class:`HardMoves`,
    ``move_every`` from :func:`pipeline.fit.learners.moves.move_interval`) and the bound that judges
    them and the births (:class:`Judge`, option ``judge``)."""

    def __init__(self, ctx: FitContext, learner: str, opts: Mapping[str, Any]) -> None:
        self.ctx = ctx
        self.schedule = HardMoves(learner, {**opts, "move_every": move_interval(opts, ctx.n_rows)})
        self.judge = Judge(opts)

    def merge(self, iteration: int, point: DPPoint,
              stats: SuffStats) -> tuple[DPPoint, np.ndarray, np.ndarray, SuffStats] | None:
        """On a round, the merges of ``point``'s clusters the exact ELBO of all rows accepts
        (``stats``: the hard statistics of all rows under ``point``): the merged point (means
        count-weighted, weights summed), its counts, the order of the clusters kept and the
        statistics after the merges; None when it is no round or nothing is merged."""
        if not self.schedule.due(iteration):
            return None
        soft = None
        if self.judge.soft:
            def soft(pairs: np.ndarray, prior: Prior) -> tuple[np.ndarray, float]:
                return soft_merges(self.ctx, stats, pairs, prior, int(self.schedule.opts["move_pairs"]))
        acc = self.schedule.select(stats, point.means, self.judge.tune(self.ctx, stats), soft)
        if acc.shape[0] == 0:
            return None
        means, sticks, counts, keep = merge_points(point.means, point.sticks, stats.nk, acc)
        return DPPoint(means, sticks), counts, keep, apply_merges(stats, acc, np.zeros(acc.shape[0]))


class MergingPointLearner(DPPointLearner):
    """A DP point learner with merges (MM and the SGA learners): owns :class:`PointMerges`
    (``self.merges``), applies them in its step (:meth:`apply_moves`), judges births on the bound the
    merges are judged on (:meth:`judged_bound`) and adds the merges' checkpoint state and convergence
    rule to its own."""

    def __init__(self, ctx: FitContext, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(ctx, options)
        self.merges = PointMerges(ctx, self.name, self.opts)

    def judged_bound(self, point: DPPoint, stats: SuffStats) -> float:
        """The bound a birth is judged on: the learner's exact ELBO at ``point`` (``judge='own'``) or
        :func:`partition_bound` of its hard statistics ``stats`` with ``beta0`` tuned on them
        (:meth:`Judge.tune`): each partition compared at its own best ``beta0``. (One ``beta0`` for
        all, tuned on the current point, refused every birth from one cluster: there the best
        ``beta0`` pins the mean to ``m0``, where any child's mean is improbable.)"""
        if self.merges.judge.own:
            return float(self.bound_of(point, stats)[1].total)
        return partition_bound(stats, self.merges.judge.tune(self.ctx, stats))

    def apply_moves(self, iteration: int, stats: SuffStats) -> SuffStats:
        """On a round: merge clusters of the point (:meth:`PointMerges.merge`); ``stats`` are the hard
        statistics of all rows under the current point (MM's pass; the SGA learners spend one more
        full pass on a round). Returns the statistics after the merges."""
        assert self.point is not None
        merged = self.merges.merge(iteration, self.point, stats)
        if merged is None:
            return stats
        self.point, self.counts, keep, stats = merged
        self._reorder(keep)
        self.post = self.posterior()
        return stats

    def converged(self, history: list[float], tol: float) -> bool:
        return self.merges.schedule.converged(super().converged(history, tol))

    def own_state(self) -> PointState:
        return replace(super().own_state(), hard_moves=self.merges.schedule.to_state())

    def load(self, post: Posterior, state: PointState) -> None:
        super().load(post, state)
        self.merges.schedule.load(state.hard_moves)
