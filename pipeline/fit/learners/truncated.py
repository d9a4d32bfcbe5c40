"""The truncated E-step in the VB EM learner (issue 15): options ``candidates`` and ``neighbours``.

``VBMixture(learner_options={"candidates": 8})`` or ``vbcluster fit S -o candidates=8 -o neighbours=16``
replaces VB EM's exact E-step over all K clusters by :func:`vbcore.kernels.truncated.truncated_kernel` over
``C' = candidates`` clusters per row (Forster & Lücke 2018; Hirschberger et al. 2022). ``0`` keeps
the exact E-step.

State: every chunk's candidate sets (C' indices and weights per row) stay with the chunk on the engine
(``engine.map_keep``, as NCG's logits); the driver keeps the neighbour lists (K x G), the pivots
of the first pass and the pending relabelling of pruned or re-ordered components. All of it is
checkpointed (:meth:`TruncatedEStep.state`), so a resumed fit repeats the same bits, on either engine.

First candidate sets (option ``first_search``): by default the first pass scores every cluster (one
exact E-step, O(N K D), then O(N |S| D) per iteration); ``'pivots'`` scores only ``ceil(sqrt(K G))``
clusters drawn from the fit's seed and keeps their best C' (O(N sqrt(K G) D)), which is cheaper but
measured to leave rows stuck far from their best cluster on unstructured data (docs/algorithms.md).
The first neighbour lists come from the posterior's means (O(K^2 D) on the driver); the search then
moves through the neighbour lists every iteration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from pipeline.engine.blas import one_blas_thread
from pipeline.fit.learners.base import FitContext, Learner, restart_lineage
from pipeline.fit.learners.options import Opt, Options, Rule
from vbcore.errors import ConfigError
from vbcore.kernels.estep import estep_params
from vbcore.kernels.sga_stats import DPPoint, HardStats, map_params
from vbcore.kernels.truncated import (
    RANDOM_TAG,
    CandidateState,
    TruncResult,
    compose_remaps,
    initial_neighbours,
    pivot_clusters,
    relabel_neighbours,
    truncated_kernel,
    truncated_params,
    update_neighbours,
)
from vbcore.kernels.truncated_map import (
    MapSearchResult,
    map_initial_neighbours,
    map_search_kernel,
    map_search_params,
)
from vbcore.model.posterior import Posterior

#: ``candidates=-1`` turns the truncated E-step on (C' = 3) from K = 300 components for the diagonal
#: families: measured on the SUN397-shaped store (108,754 x 4096, nu0 = 64, same start), 3.4x per
#: iteration at K = 300 and 2.9x at K = 1000 with the same NMI and the bound within 0.002%, but only
#: 1.3x at K = 100 (docs/benchmarks.md); 'full' was not measured at scale, 'tied' gains 1.1-1.6x
#: (its x U and x^T x products are the exact E-step's too; docs/algorithms.md), so neither is on by default
AUTO_MIN_COMPONENTS = 300
#: the covariance types the truncated E-step supports (all of VB EM's)
TRUNCATED_COVARIANCES = ("full", "tied", "diag", "spherical", "fixed")
AUTO_CANDIDATES = 3
AUTO_COVARIANCES = ("diag", "spherical", "fixed")


def auto_candidates(n_components: int, covariance_type: str, array_backend: str = "numpy") -> int:
    """C' of ``candidates=-1``: :data:`AUTO_CANDIDATES` for K >= :data:`AUTO_MIN_COMPONENTS` in
    :data:`AUTO_COVARIANCES` on NumPy, else 0 (the exact E-step). On a GPU (CuPy) the exact E-step is
    the faster: on an H100 at SUN397 shape, K = 1000, 4.2 s per iteration truncated (C' = 3) against
    1.5 s exact, median of 5 (docs/benchmarks.md, "GPU")."""
    on = n_components >= AUTO_MIN_COMPONENTS and covariance_type in AUTO_COVARIANCES
    return AUTO_CANDIDATES if on and array_backend == "numpy" else 0
#: how the first pass finds the first candidate sets: 'all' scores every cluster (one exact E-step,
#: O(N K D)); 'pivots' scores ceil(sqrt(K G)) clusters drawn from the seed (O(N sqrt(K G) D)), which
#: can leave rows far from their best cluster for many iterations (docs/algorithms.md)
FIRST_SEARCH = ("all", "pivots")
#: a block's search space: the neighbour lists of its rows' best clusters ('best'), or of all their
#: candidates ('all', Forster & Lücke 2018); both add the previous candidates and the random clusters
SEARCH = ("best", "all")

#: the learner options of the truncated E-step and their defaults (0 candidates: the exact E-step;
#: -1, the default: :data:`AUTO_CANDIDATES` where :func:`auto_candidates` says, else the exact one)
TRUNCATED_OPTIONS = Options({
    "candidates": Opt(-1, "C': candidate clusters per row of the truncated E-step (Forster & Lücke 2018).",
                      low=-1, special={-1: "automatic", 0: "the exact E-step"},
                      resolved="-1 by auto_candidates when the learner is built (truncated_e_step), so the "
                      "fit reports the C' it used."),
    "neighbours": Opt(8, "G: neighbours per cluster the candidate search moves through.", low=1),
    "random_clusters": Opt(1, "Clusters drawn at random per row and iteration beside the neighbours.", low=0),
    "first_search": Opt("all", "How the first pass finds candidates: all (one exact E-step) or pivots "
                        "(ceil(sqrt(K G)) clusters drawn from the seed).", choices=FIRST_SEARCH),
    "search": Opt("best", "A block's search space: the neighbours of its rows' best clusters (best) or of "
                  "all their candidates (all).", choices=SEARCH),
    "block_rows": Opt(64, "Rows per block of the candidate search.", low=1),
})

_PREFIX = "trunc_"


def _host(state: CandidateState) -> CandidateState:
    return state


def one_thread_kernel(chunk: Any, state: CandidateState, params: Any) -> tuple[CandidateState, TruncResult]:
    """:func:`vbcore.kernels.truncated.truncated_kernel` with one BLAS thread. Its GEMMs are small (a block of
    rows against its search set): a multi-threaded BLAS spent 10-50x longer starting and syncing
    its threads than computing them (measured on a loaded 2-core machine). The shared, reference-counted
    limit of :func:`pipeline.engine.blas.one_blas_thread` (the engines' own): a ``threadpool_limits`` per
    call scanned the loaded libraries each time (~4 ms a chunk) and restored the default under the
    other threads' GEMMs."""
    with one_blas_thread():
        return truncated_kernel(chunk, state, params)


class TruncatedEStep:
    """The truncated E-step passes of one fit and their state (see the module docstring)."""

    def __init__(self, ctx: Any, opts: Mapping[str, Any]) -> None:
        self.ctx = ctx
        self.candidates = int(opts["candidates"])
        self.n_neighbours = int(opts["neighbours"])
        self.n_random = int(opts["random_clusters"])
        self.first_search = str(opts["first_search"])
        self.search = str(opts["search"])
        self.block_rows = int(opts["block_rows"])
        self.states: list[Any] = []
        self.neighbours = np.zeros((0, self.n_neighbours), dtype=np.int32)
        self.pivots = np.zeros(0, dtype=np.int64)
        self.remap: np.ndarray | None = None
        #: (row, cluster) log-responsibilities evaluated by the last pass (the exact E-step: N K)
        self.evaluations = 0

    def _starts(self) -> list[int]:
        return list(self.ctx.chunk_starts) or [s.start for s in self.ctx.source.chunk_slices()]

    def start(self, post: Posterior) -> None:
        """Forget the candidate sets; neighbour lists from ``post``'s means; draw the pivots."""
        self.close()
        ctx = self.ctx
        k = post.n_components
        self.states = [CandidateState(s) for s in self._starts()]
        self.neighbours = initial_neighbours(post.means, estep_params(post, ctx.shift), ctx.shift,
                                             ctx.covariance_type, self.n_neighbours)
        self.pivots = (np.arange(k) if self.first_search == "all" else
                       pivot_clusters(k, self.candidates, self.n_neighbours, ctx.rng(RANDOM_TAG, 0)))
        self.remap = None

    def run(self, post: Posterior, iteration: int, hook: Any = None) -> TruncResult:
        """One pass: new candidate sets (kept on the engine), their statistics; new neighbour lists.
        ``hook``: extra per-chunk quantities (:attr:`vbcore.kernels.truncated.TruncParams.hook`, e.g.
        moves)."""
        ctx = self.ctx
        params = truncated_params(estep_params(post, ctx.shift), self.neighbours, self.candidates,
                                  self.n_random, ctx.seed, iteration, self.pivots, self.remap,
                                  self.search, self.block_rows, ctx.source.dtype)
        if hook is not None:
            params = replace(params, hook=hook)
        self.states, result = ctx.engine.map_keep(one_thread_kernel, ctx.handles, self.states, params)
        self.remap = None
        self.evaluations = result.evaluations
        self.neighbours = update_neighbours(result.scores, self.neighbours)
        return result

    def relabel(self, kept: np.ndarray, moved: np.ndarray | None = None) -> None:
        """The components were reduced to ``kept`` (old indices of the new ones, in new order).
        ``moved`` (M, 2) old indices ``(j, t)``: the candidates j of the rows become t (a merge of j
        into t), or are dropped where t is -1 (a delete), whether or not j is kept."""
        kept = np.asarray(kept, dtype=np.int64)
        moved = np.zeros((0, 2), np.int64) if moved is None else np.asarray(moved, np.int64).reshape(-1, 2)
        same = kept.size == self.neighbours.shape[0] and np.array_equal(kept, np.arange(kept.size))
        if same and moved.shape[0] == 0:
            return
        self.neighbours, remap = relabel_neighbours(self.neighbours, kept)
        remap[moved[:, 0]] = np.where(moved[:, 1] >= 0, remap[np.maximum(moved[:, 1], 0)], -1)
        self.remap = compose_remaps(self.remap, remap)
        pivots = remap[self.pivots]
        self.pivots = pivots[pivots >= 0] if np.any(pivots >= 0) else np.arange(1)

    # ---- checkpoints ---------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Candidate sets gathered in row order, neighbour lists, pivots and pending relabelling; on a
        Dask cluster the gathered sets go back as new tasks, so a dead worker's sets are rebuilt from
        this checkpoint (:func:`pipeline.fit.learners.base.restart_lineage`)."""
        parts = self.ctx.engine.fetch_states(self.states, _host)
        self.states = restart_lineage(self.ctx, self.states, parts)
        out: dict[str, np.ndarray] = {
            _PREFIX + "neighbours": self.neighbours, _PREFIX + "pivots": self.pivots,
            _PREFIX + "remap": np.zeros(0, np.int32) if self.remap is None else self.remap}
        if all(p.idx is not None for p in parts):
            out[_PREFIX + "idx"] = np.concatenate([p.idx for p in parts])
            out[_PREFIX + "resp"] = np.concatenate([p.resp for p in parts])
        return out

    def load_state(self, post: Posterior, state: Mapping[str, np.ndarray]) -> None:
        """Resume from :meth:`state`; a checkpoint without it (another learner, the exact E-step)
        starts afresh from ``post``."""
        if _PREFIX + "neighbours" not in state:
            self.start(post)
            return
        self.close()
        starts = self._starts()
        self.neighbours = np.asarray(state[_PREFIX + "neighbours"], dtype=np.int32)
        self.pivots = np.asarray(state[_PREFIX + "pivots"], dtype=np.int64)
        remap = np.asarray(state[_PREFIX + "remap"], dtype=np.int32)
        self.remap = remap if remap.size else None
        if _PREFIX + "idx" in state:
            idx, resp = state[_PREFIX + "idx"], state[_PREFIX + "resp"]
            per_chunk = [CandidateState(s.start, np.asarray(idx[s], dtype=np.int32),
                                        np.asarray(resp[s], dtype=np.float32))
                         for s in self.ctx.source.chunk_slices()]
        else:
            per_chunk = [CandidateState(s) for s in starts]
        self.states = self.ctx.engine.place_states(per_chunk, self.ctx.handles)

    def adopt(self, state: Mapping[str, np.ndarray], take: np.ndarray) -> None:
        """Warm start: the candidate sets of a previous fit's :meth:`state` for the chunks ``take``
        (their rows unchanged), with its pending relabelling (its sets are in the indexing of its last
        pass, the warm posterior in its final one); the other chunks search from the pivots."""
        if _PREFIX + "idx" not in state or not np.any(take):
            return
        idx, resp = state[_PREFIX + "idx"], state[_PREFIX + "resp"]
        parts = [CandidateState(s.start, np.asarray(idx[s], dtype=np.int32), np.asarray(resp[s], dtype=np.float32))
                 if ok and s.stop <= idx.shape[0] else CandidateState(s.start)
                 for s, ok in zip(self.ctx.source.chunk_slices(), take, strict=True)]
        self.close()
        self.states = self.ctx.engine.place_states(parts, self.ctx.handles)
        remap = np.asarray(state[_PREFIX + "remap"], dtype=np.int32)
        self.remap = remap if remap.size else None

    def close(self) -> None:
        if self.states:
            self.ctx.engine.release([s for s in self.states if hasattr(s, "release")])
        self.states = []


def truncated_e_step(name: str, ctx: Any, opts: dict[str, Any]) -> TruncatedEStep | None:
    """The truncated E-step of a learner with :data:`TRUNCATED_OPTIONS`, or None for the exact one.
    ``candidates=-1`` is resolved here, in ``opts`` (so the fit reports the C' it used)."""
    if int(opts["candidates"]) < 0:
        opts["candidates"] = auto_candidates(int(ctx.prior.n_components), ctx.covariance_type,
                                             getattr(ctx.engine, "array_backend", "numpy"))
    if int(opts["candidates"]) == 0:
        return None
    if ctx.covariance_type not in TRUNCATED_COVARIANCES:
        raise ConfigError(f"learner option 'candidates' of {name!r} does not support covariance_type "
                          f"{ctx.covariance_type!r} yet; use candidates=0")
    return TruncatedEStep(ctx, opts)


#: the options of the MAP learners' candidate search (0 candidates: the exact argmax over all K);
#: ``extra_steps``: searches more for rows that start from the pivots (never visited, or pruned)
#: ``first_search``: how a row without candidates starts: 'all' (its exact argmax over all K, the
#: default) or 'pivots' (ceil(sqrt(K G)) clusters from the seed, then ``extra_steps`` more searches:
#: cheaper, but measured to find the exact label for only 35-53% of fresh rows, docs/benchmarks.md)
MAP_SEARCH_OPTIONS = Options({
    "candidates": Opt(0, "Candidate clusters per row searched for the MAP label.", low=0,
                      special={0: "the exact argmax over all K"}),
    "neighbours": Opt(16, TRUNCATED_OPTIONS.decls["neighbours"].help, low=1),
    "random_clusters": TRUNCATED_OPTIONS.decls["random_clusters"],
    "block_rows": TRUNCATED_OPTIONS.decls["block_rows"],
    "extra_steps": Opt(1, "More searches for rows that start from the pivots (never visited, or pruned).",
                       low=0),
    "first_search": Opt("all", "How a row without candidates starts: all (its exact argmax over all K) or "
                        "pivots (ceil(sqrt(K G)) clusters from the seed, then extra_steps more searches).",
                        choices=FIRST_SEARCH),
}, rules=[Rule(("candidates", "moves"), lambda o, _: int(o["candidates"]) > 0
               and o.get("moves", "none") not in ("none", "auto"),
               "learner options 'candidates' and 'moves' of {learner!r} cannot be combined yet; use "
               "candidates=0 or moves=none")])


def one_thread_map_kernel(chunk: Any, state: CandidateState, params: Any) -> tuple[CandidateState, Any]:
    """:func:`vbcore.kernels.truncated_map.map_search_kernel` with one BLAS thread (small GEMMs)."""
    with one_blas_thread():
        return map_search_kernel(chunk, state, params)


class MapSearch(TruncatedEStep):
    """The candidate MAP search of a hard-assignment learner (:mod:`vbcore.kernels.truncated_map`): the
    per-chunk candidates on the engine, neighbour lists, pivots and relabelling of
    :class:`TruncatedEStep` (so the same checkpoints and relabelling)."""

    def __init__(self, ctx: Any, opts: Mapping[str, Any]) -> None:
        super().__init__(ctx, {**TRUNCATED_OPTIONS, **opts})
        self.extra_steps = int(opts["extra_steps"])
        self.sigma2 = float(ctx.prior.fixed_variance)

    def start_point(self, point: DPPoint) -> None:
        """Forget the candidates; neighbour lists from the point's means; draw the pivots."""
        self.close()
        ctx = self.ctx
        k = point.n_components
        mp = map_params(point, self.sigma2, ctx.shift)
        self.neighbours = map_initial_neighbours(mp.weights, mp.const, point.means - ctx.shift[None, :],
                                                 self.n_neighbours)
        self.pivots = (np.arange(k) if self.first_search == "all" else
                       pivot_clusters(k, self.candidates, self.n_neighbours, ctx.rng(RANDOM_TAG, 0)))
        self.states = [CandidateState(s) for s in self._starts()]
        self.remap = None

    def relabel(self, kept: np.ndarray, moved: np.ndarray | None = None) -> None:
        """As :meth:`TruncatedEStep.relabel`; before the first start there is nothing to relabel."""
        kept = np.asarray(kept, dtype=np.int64)
        if self.neighbours.shape[0] == 0 or (kept.size and int(kept.max()) >= self.neighbours.shape[0]):
            return  # :meth:`hard_pass` restarts the search when the sizes disagree
        super().relabel(kept, moved)

    def start(self, post: Posterior) -> None:
        """From a posterior (a resume without search state): its means and expected sticks."""
        a, b = post.weight_concentration
        self.start_point(DPPoint(post.means, a / (a + b)))

    def hard_pass(self, point: DPPoint, iteration: int, rows: dict[int, np.ndarray] | None) -> HardStats:
        """MAP labels of ``rows`` (chunk start -> positions; None: all rows) and their statistics."""
        ctx = self.ctx
        if self.neighbours.shape[0] != point.n_components or self.pivots.max() >= point.n_components:
            self.start_point(point)  # not told of a change of the components: start afresh
        mp = map_params(point, self.sigma2, ctx.shift, ctx.source.dtype)
        params = map_search_params(mp.weights, mp.const, self.neighbours, self.candidates, self.n_random,
                                   ctx.seed, iteration, self.pivots, rows, self.remap, self.extra_steps,
                                   self.block_rows)
        self.states, result = ctx.engine.map_keep(one_thread_map_kernel, ctx.handles, self.states, params,
                                                  combine=None if rows is None else MapSearchResult.combine)
        self.remap = None
        self.evaluations = result.evaluations
        self.neighbours = update_neighbours(result.scores, self.neighbours)
        return result.hard

    def state(self) -> dict[str, np.ndarray]:
        """As :meth:`TruncatedEStep.state`; chunks never visited store -1 candidates."""
        parts = self.ctx.engine.fetch_states(self.states, _host)
        if any(p.idx is None for p in parts) and not all(p.idx is None for p in parts):
            slices = self.ctx.source.chunk_slices()
            c = self.candidates
            parts = [p if p.idx is not None else
                     CandidateState(p.start, np.full((s.stop - s.start, c), -1, np.int32),
                                    np.zeros((s.stop - s.start, c), np.float32))
                     for p, s in zip(parts, slices, strict=True)]
            self.states = self.ctx.engine.place_states(parts, self.ctx.handles)
        return super().state()


def map_search(name: str, ctx: Any, opts: Mapping[str, Any]) -> MapSearch | None:
    """The candidate MAP search of a learner with :data:`MAP_SEARCH_OPTIONS`, or None (exact)."""
    return MapSearch(ctx, opts) if int(opts["candidates"]) > 0 else None


class TruncatedLearner(Learner):
    """A learner with :data:`TRUNCATED_OPTIONS`: ``self.truncated`` is its :class:`TruncatedEStep`
    (None for the exact E-step), started, checkpointed and closed with the learner. A subclass calls
    ``self.truncated.run(post, iteration)`` for its E-step and :meth:`relabel_components` when it
    prunes or re-orders components."""

    def __init__(self, ctx: FitContext, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(ctx, options)
        self.truncated = truncated_e_step(self.name, ctx, self.opts)  # resolves candidates=-1 in opts

    def start(self, post: Posterior) -> None:
        super().start(post)
        if self.truncated is not None:
            self.truncated.start(post)

    def relabel_components(self, kept: np.ndarray, moved: np.ndarray | None = None) -> None:
        """The components are now ``kept`` (old indices, in their new order); ``moved`` as
        :meth:`TruncatedEStep.relabel` (merges and deletes)."""
        if self.truncated is not None:
            self.truncated.relabel(kept, moved)

    def cache_arrays(self) -> dict[str, np.ndarray]:
        out = super().cache_arrays()
        if self.truncated is not None:  # the candidate sets (cache: they live with the chunks)
            out.update(self.truncated.state())
        return out

    def load_cache(self, post: Posterior, arrays: Mapping[str, np.ndarray]) -> None:
        super().load_cache(post, arrays)
        if self.truncated is not None:
            self.truncated.load_state(post, arrays)

    def close(self) -> None:
        if self.truncated is not None:
            self.truncated.close()
        super().close()
