"""Shared machinery of the DP-mixture point learners (MM, SGA, SGA+M, SGA+F) and SVI (Lim & Jiang 2024).

* **Minibatches**: iteration t draws ``ceil(minibatch / minibatch_slice)`` distinct slices of
  ``minibatch_slice`` consecutive rows (aligned slots, drawn uniformly: every row equally likely) with
  ``ctx.rng(t)`` (so a resumed run draws the same rows; a chunk is read for a slice, not for the row
  or two a uniform row draw puts in nearly every chunk of a large store), groups them by chunk, and
  sends each chunk only its own row positions (``per_chunk``): the rows are gathered and processed
  next to the data, on the workers; only the sums of the clusters those rows fall in come back,
  combined once on the driver in chunk order (:meth:`vbcore.kernels.sga_stats.HardStats.combine`).
* **Initialisation** (Algorithm 1, step 3.iii): k-means++ seeds on a sample of rows gathered through
  the engine (drawn with ``ctx.rng(0, 1)``), then, on that sample (the algorithm's input is a
  minibatch): MAP assignments to the seeds, and the MM update of means and sticks from the sample's
  statistics scaled by N / M (one Lloyd step of k-means with the prior's shrinkage).
* **Defaults the estimator asks for**: ``a0 = N`` (Algorithm 1) and the fixed variance, by
  split-coordinate nearest neighbours on a sample (:mod:`vbcore.learners.sigma2`; it does not depend on K).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.fit.learners.base import FitContext, Learner
from pipeline.fit.learners.moves import parse_moves
from pipeline.fit.learners.options import Opt
from pipeline.fit.learners.point.state import PointState
from pipeline.fit.learners.sampling import chunk_bounds, gather_sample, kmeanspp
from pipeline.fit.learners.truncated import map_search
from vbcore.errors import ConfigError
from vbcore.kernels.estep import Chunk
from vbcore.kernels.sga_stats import (
    DPPoint,
    HardStats,
    MapParams,
    hard_kernel,
    log_stick_weights,
    map_params,
    scale_stats,
)
from vbcore.learners.sga import default_threshold, mm_update, point_posterior, prune_order, reorder, separated
from vbcore.learners.sigma2 import split_nn_variance
from vbcore.model.elbo import ElboTerms, elbo_terms
from vbcore.model.posterior import Posterior
from vbcore.model.stats import SuffStats

#: rows of the k-means++ sample: max(INIT_MIN_ROWS, INIT_ROWS_PER_CLUSTER * K), at most N
INIT_MIN_ROWS = 5000
INIT_ROWS_PER_CLUSTER = 10
#: the default threshold rule of a minibatch learner with merges (DPPointLearner.merges_judge) drops
#: the clusters holding fewer rows than this, by weight and by the data's counts
ROW_WORTH = 1.0
#: sample rows of the default sigma^2 (vbcore.learners.sigma2: an n x n neighbour search over <= 1024
#: coordinates)
SIGMA2_ROWS = 4000
#: learner option ``prune_threshold`` of the point learners (:meth:`DPPointLearner.prune_kept`)
PRUNE_THRESHOLD = {"prune_threshold": Opt(
    None, "THR of the threshold rule: clusters with E[v_k] < THR are pruned (Lim & Jiang 2024 section "
    "4.5); unset: a mixture weight of at least default_threshold of the start's, kept for the whole fit.",
    kind="float", low=0, high=1, high_open=True)}


def estimate_fixed_variance(sample: np.ndarray, n_components: int, random_state: Any) -> float:
    """Default ``sigma^2`` for ``x | z=k ~ N(mu_k, sigma^2 I)``, independent of K: split-coordinate
    nearest neighbours (:func:`vbcore.learners.sigma2.split_nn_variance`) on at most ``SIGMA2_ROWS`` distinct
    sample rows. ``n_components`` is not used (kept for the estimator's hook signature)."""
    del n_components  # the truncation is an upper bound; it must not set the scale (issue 6)
    seed = int(random_state) if isinstance(random_state, (int, np.integer)) else 0
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, 2)))
    size = min(sample.shape[0], SIGMA2_ROWS)
    x = sample[np.sort(rng.choice(sample.shape[0], size=size, replace=False))].astype(np.float32)
    x = x - x.mean(0, dtype=np.float64).astype(np.float32)
    var = split_nn_variance(np.unique(x, axis=0), rng)
    if not var > 0:
        var = float(np.mean(x.var(0, dtype=np.float64))) or 1.0
    return var


def default_weight_concentration(n_rows: float) -> float:
    """``a0 = N`` (Lim & Jiang 2024 Algorithm 1, step 3.i)."""
    return float(n_rows)


# ---- the point learners -------------------------------------------------------------------------
class DPPointLearner(Learner):
    """Base of MM and the SGA learners: state = :class:`~vbcore.learners.sga.DPPoint` plus estimated counts.

    The posterior handed to the estimator is :func:`vbcore.learners.sga.point_posterior` of the point, so the
    estimator's predictions, checkpoints and ELBO work as for VB EM; the exact sticks are kept in
    the learner state for bitwise resume."""

    @classmethod
    def estimate_fixed_variance(cls, sample: np.ndarray, n_components: int, seed: Any) -> float | None:
        return estimate_fixed_variance(sample, n_components, seed)

    sigma2_sample_rows = SIGMA2_ROWS  # rows the estimator gathers for estimate_fixed_variance
    family = "point"
    state_type = PointState
    @classmethod
    def default_weight_concentration(cls, n_rows: float) -> float | None:
        return default_weight_concentration(n_rows)

    default_covariance = "fixed"
    covariance_types = ("fixed",)  # a known isotropic variance (Lim & Jiang 2024, section 2)
    weight_types = ("dirichlet_process",)
    cache_squares = False  # minibatch kernels square only the rows they touch (Learner.cache_squares)

    def __init__(self, ctx: FitContext, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(ctx, options)
        #: the candidate search of the MAP labels (option ``candidates`` > 0), else None
        self.search = map_search(self.name, ctx, self.opts) if "candidates" in self.opts else None
        self._iteration = 0
        assert ctx.prior.fixed_variance is not None
        self.sigma2 = float(ctx.prior.fixed_variance)
        self.a0 = float(ctx.prior.weight_concentration)
        self.point: DPPoint | None = None
        self.counts = np.zeros(0)
        #: the default threshold, fixed at the first pruning (the initial weights): see prune_kept
        self.thr: float | None = None

    def prune_kept(self, sticks: np.ndarray, counts: np.ndarray | None = None,
                   means: np.ndarray | None = None) -> np.ndarray:
        """The clusters kept by the threshold rule (:func:`vbcore.learners.sga.prune_order`'s order). With the
        option ``prune_threshold`` set, Lim & Jiang 2024 section 4.5's rule ``E[v_k] >= THR``; by
        default a mixture weight of at least :func:`vbcore.learners.sga.default_threshold` of the first
        pruning
        (the start), kept for the whole fit (checkpointed): a threshold that followed the largest
        cluster as clusters go would prune again after every pruning (SGA+M's momentum inflated the
        largest cluster and took Fashion-MNIST from 36 clusters to 2, docs/decisions.md). ``counts``
        (the rows the data give each cluster, estimated from a minibatch) also keep a cluster under
        the default rule when their share ``n_k / (N + a0)`` (MM's weight of those counts) reaches the
        threshold: a stick step that overshoots does not prune a cluster that holds rows. With
        ``means`` and ``counts``, the default rule also spares a cluster holding a row's worth (by
        ``counts`` or by its weight) whose mean is far from every other
        (:func:`vbcore.learners.sga.separated`): a small class apart from the rest, which the bound
        wants and the births would only have to find again. A minibatch learner with merges drops only
        the clusters under a row's worth by default (:meth:`merges_judge`): the merges decide."""
        thr = self.opts.get("prune_threshold")
        if thr is not None:
            return prune_order(sticks, float(thr))
        support = None
        if counts is not None:
            counts = np.asarray(counts, dtype=np.float64)
            support = counts / (counts.sum() + self.a0)
        if self.merges_judge():
            # the merges, judged on the exact bound of all rows, decide which clusters go; the rule
            # drops only the clusters holding under a row's worth (by weight and by the data's counts)
            floor = ROW_WORTH / (float(self.ctx.n_weight) + self.a0)  # MM's weight n_k / (N + a0) of a row
            return prune_order(sticks, floor, on="weights", support=support)
        if self.thr is None:
            self.thr = default_threshold(sticks)
        keep = prune_order(sticks, self.thr, on="weights", support=support)
        if means is None or counts is None or keep.size == len(sticks):
            return keep
        # clusters holding a row's worth by the data's counts or by their weight (a minibatch may miss a
        # small cluster); empty ones, whose means say nothing, are left out
        worth = np.exp(log_stick_weights(sticks)) * float(self.ctx.n_weight)
        held = np.flatnonzero((counts >= 1.0) | (worth >= 1.0))
        below = np.flatnonzero(~np.isin(held, keep))
        spare = np.zeros(len(sticks), dtype=bool)
        spare[held[below[separated(np.asarray(means)[held], below, self.sigma2)]]] = True
        return keep if not spare.any() else prune_order(sticks, self.thr, on="weights", support=support,
                                                        spare=spare)

    def merges_judge(self) -> bool:
        """Whether the default threshold rule leaves the clusters to the merges (issue 52): a minibatch
        learner (``minibatch`` among its options) whose merges are on. The relative threshold of
        :func:`vbcore.learners.sga.default_threshold` assumes no class under a tenth of the largest;
        classes 10:1 apart (the synthetic stores' 100 classes, 0.52% to 5.4% of the rows) sit at it,
        and on 1,000,000 x 256 it pruned 46 of sga-f's 100 starting clusters at the start (on the
        sample's counts), then more as the minibatches' noise took classes of 0.5% under it: 42-43
        clusters, NMI 0.77, where the same model at the planted means labels with NMI 0.99.
        MM (no minibatch, a pass an iteration) keeps the relative rule."""
        if "minibatch" not in self.opts:
            return False
        return bool(parse_moves(self.name, self.opts["moves"], int(self.opts.get("candidates", 0))))


    # -- passes
    def hard_pass(self, point: DPPoint, handles: list[Any] | None = None,
                  rows: list[np.ndarray] | None = None) -> SuffStats:
        """MAP assignments (eq. 19) and hard statistics of all rows, or of a minibatch."""
        if self.search is not None:  # candidates: the same labels wherever the argmax is searched
            by_start = None
            if rows is not None:
                start_of = {id(h): int(s) for h, s in zip(self.ctx.handles, chunk_bounds(self.ctx)[:-1],
                                                           strict=False)}
                by_start = {start_of[id(h)]: r for h, r in zip(handles or [], rows, strict=True)}
            return self.search.hard_pass(point, self._iteration, by_start).to_stats()
        params = map_params(point, self.sigma2, self.ctx.shift, self.ctx.source.dtype)
        if rows is None:
            return self.ctx.engine.map_reduce(hard_kernel, self.ctx.handles, None, params).to_stats()
        return self.minibatch_pass(params, handles, rows).to_stats()

    def minibatch_pass(self, params: MapParams, handles: list[Any] | None,
                       rows: list[np.ndarray]) -> HardStats:
        """The hard statistics of a minibatch (``params.bound`` set: with its rows' bound sums)."""
        # a minibatch touches a few hundred clusters per chunk: one combine on the driver, in chunk
        # order, instead of a tree of merges of growing unions (HardStats.combine)
        return HardStats.combine(self.ctx.engine.map(hard_kernel, handles, params, per_chunk=rows))

    # -- initialisation (called by the estimator instead of its own k-means)
    def initialise(self) -> Posterior:
        """Algorithm 1, step 3.iii, on a sample: k-means++ seeds (drawn by the rows' weights), then MAP
        assignments of the sample's rows to the seeds (equal weights) and the MM update of means and
        sticks from the sample's statistics scaled by N / M (the algorithm's input is a minibatch; no
        full pass)."""
        k = int(self.ctx.prior.n_components)
        size = min(self.ctx.n_rows, max(INIT_MIN_ROWS, INIT_ROWS_PER_CLUSTER * k))
        sample, w = gather_sample(self.ctx, size, (0, 1))  # (rows of weight 0 left out)
        assert sample.shape[0] > 0, "the setup refuses data whose weights sum to 0"
        seed = int(self.ctx.rng(0, 3).integers(2**31 - 1))
        centres, _ = kmeanspp(sample, k, seed, w)  # seeds drawn by weight
        seeds = DPPoint(centres + self.ctx.shift[None, :], np.full(centres.shape[0], 0.5))
        stats = self._equal_weight_stats(seeds, sample, w)
        point = mm_update(stats, self.ctx.prior, self.a0)
        self._set(point, stats.nk)
        self.post = self.posterior()
        return self.post

    def _equal_weight_stats(self, seeds: DPPoint, sample: np.ndarray,
                            w: np.ndarray | None = None) -> SuffStats:
        """Hard statistics of the (shifted) sample rows, weighed by ``w`` (None: unweighted),
        assigned to the seeds with equal mixture weights (``ln pi_k`` would otherwise favour early
        seeds), scaled to the data's N (its rows' total weight)."""
        k = seeds.n_components
        # sticks giving pi_k = 1/k for all k: v_k = 1/(k - j) for the j-th (0-based) stick
        sticks = 1.0 / (k - np.arange(k, dtype=np.float64))
        sticks[-1] = 1.0 - 1e-12
        params = map_params(DPPoint(seeds.means, sticks), self.sigma2, self.ctx.shift, sample.dtype)
        chunk = Chunk(x=sample, feats=None, shift=self.ctx.shift, diagonal=True,
                      w=None if w is None else w.astype(sample.dtype))
        stats = hard_kernel(chunk, None, params).to_stats()
        return scale_stats(stats, self.ctx.n_weight / (sample.shape[0] if w is None else math.fsum(w)))

    # -- state
    def _set(self, point: DPPoint, counts: np.ndarray) -> None:
        order = self.prune_kept(point.sticks, counts, point.means)
        self.point = reorder(point, order)
        self.counts = np.asarray(counts, dtype=np.float64)[order]
        self._reorder(order)

    def _reorder(self, order: np.ndarray) -> None:
        """Subclasses re-order their own per-cluster state (momentum); the candidate search's stored
        candidates follow (here)."""
        if self.search is not None:
            self.search.relabel(order)

    def posterior(self) -> Posterior:
        assert self.point is not None
        return point_posterior(self.point, self.counts, self.ctx.prior, self.sigma2, self.a0)

    def start(self, post: Posterior) -> None:
        if self.point is not None and post is self.post:  # straight after initialise()
            if self.search is not None:
                self.search.start_point(self.point)
            return
        if post.covariance_type != "fixed" or post.weight_type != "dirichlet_process":
            raise ConfigError(f"learner {self.name!r} cannot start from a {post.covariance_type!r}/"
                              f"{post.weight_type!r} posterior")
        a, b = post.weight_concentration
        self._set(DPPoint(post.means.copy(), a / (a + b)), a - 1.0)
        self.post = self.posterior()
        if self.search is not None:
            assert self.point is not None
            self.search.start_point(self.point)

    def own_state(self) -> PointState:
        assert self.point is not None
        return PointState(self.point.sticks, self.counts, self.thr)

    def load(self, post: Posterior, state: PointState) -> None:
        assert state.sticks is not None and state.counts is not None
        self.point = DPPoint(post.means.copy(), np.asarray(state.sticks, dtype=np.float64))
        self.counts = np.asarray(state.counts, dtype=np.float64)
        self.thr = state.prune_threshold
        self.post = self.posterior()

    def cache_arrays(self) -> dict[str, np.ndarray]:
        return {} if self.search is None else self.search.state()  # the candidate sets

    def load_cache(self, post: Posterior, arrays: Mapping[str, np.ndarray]) -> None:
        if self.search is not None:
            self.search.load_state(post, arrays)

    def close(self) -> None:
        if self.search is not None:
            self.search.close()
        super().close()

    def exact_terms(self) -> ElboTerms:
        """The exact ELBO of the current distribution: one full pass for its MAP q(z)."""
        assert self.point is not None
        stats = self.hard_pass(self.point)
        self.counts = stats.nk.copy()
        self.post, terms = self.bound_of(self.point, stats)
        return terms

    def bound_of(self, point: DPPoint, stats: SuffStats) -> tuple[Posterior, ElboTerms]:
        """The distribution around ``point`` with the hard statistics ``stats`` of all rows, and its
        exact ELBO."""
        post = point_posterior(point, stats.nk, self.ctx.prior, self.sigma2, self.a0)
        return post, elbo_terms(stats, post, self.ctx.prior)

