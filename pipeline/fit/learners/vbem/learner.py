"""VB EM (Kuusela et al. 2009 eqs. 35-41): one E-step pass over the chunks, then the M-step on the driver.

Options beyond the plain algorithm: the truncated E-step over candidate clusters per row
(``candidates``, :mod:`pipeline.fit.learners.truncated`; Forster & Lücke 2018) and merge/delete moves on
the exact ELBO (``moves``, :mod:`pipeline.fit.learners.moves`; Hughes & Sudderth 2013). Both are off by
default; they combine (:mod:`vbcore.moves.truncated`). Memoized statistics (``memo``,
:mod:`pipeline.fit.learners.vbem.memo`) combine with the moves and births, not with the truncated E-step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pipeline.fit.learners import register
from pipeline.fit.learners.base import FitContext
from pipeline.fit.learners.growth import (
    Growth,
    GrowthState,
    n_used,
    pairs_after_pruning,
    propose_outliers,
    propose_splits,
)
from pipeline.fit.learners.moves import MOVE_OPTIONS, Moves, MovesState, merge_back, moves_grammar
from pipeline.fit.learners.options import Opt, Rule, declare
from pipeline.fit.learners.state import LearnerState
from pipeline.fit.learners.truncated import TRUNCATED_OPTIONS, TruncatedLearner
from pipeline.fit.learners.vbem.memo import MEMO_OPTIONS, MemoStats, chunk_keys
from pipeline.fit.learners.vbem.overrelax import OverRelax, RelaxState
from pipeline.fit.learners.vbem.passes import choose_pass, vbem_pass
from vbcore.kernels.estep import estep_params
from vbcore.model.elbo import ElboTerms, elbo_terms
from vbcore.model.empirical import empirical_update
from vbcore.model.mstep import m_step
from vbcore.model.posterior import Posterior
from vbcore.model.stats import SuffStats

#: values of VB EM's learner option ``grow_splits``
GROW_SPLITS = ("all", "gated")
#: VB EM's own options (the truncated E-step's, the moves' and the memo's are declared with them)
VBEM_OPTIONS = {
    "prune_below": Opt(1e-6, "DP pruning: components whose expected count N_k falls under this many rows "
                       "are dropped after the M-step."),
    "reorder": Opt(False, "Sort the sticks by descending N_k before the M-step (Lim & Jiang 2024 section "
                   "4.5)."),
    "grow_iters": Opt(5, "Iterations a birth proposal may take to beat the converged bound.", low=1),
    "grow_splits": Opt("all", "all (propose to split every component, keep each split where the exact "
                       "bound prefers it) or gated (split the components that look like two groups, "
                       "kept or refused together).", choices=GROW_SPLITS),
    "grow_tol": Opt(1e-2, "Grow once the bound changes by less than this per row, before it converges.",
                    low=0, special={0: "only at convergence"}),
}
#: VB EM's declarations of two move options: what its __init__ resolves
VBEM_MOVES = {
    "moves": Opt("auto", "Merge/delete moves on the exact bound: auto, none, or a comma-separated subset of "
                 "merge, delete.", grammar=moves_grammar(),
                 resolved="'auto' in VBEM.__init__: merge,delete where the truncation grows (grow, DP "
                 "weights) unless the truncated E-step runs on covariance 'tied', else none."),
    "move_every": replace(MOVE_OPTIONS.decls["move_every"], resolved="with memo > 0, VBEM.__init__ "
                          "multiplies it by ceil(1 / memo) for its moves (a lap of visits; the option "
                          "reported keeps the value given)."),
}
VBEM_RULES = [
    Rule(("memo", "candidates"), lambda o, _: o["memo"] > 0 and o["candidates"] > 0,
         "learner option 'memo' of {learner!r} keeps the exact E-step's statistics: it cannot be combined "
         "with 'candidates' > 0 yet"),
    Rule(("candidates", "moves"), lambda o, cov: cov == "tied" and int(o["candidates"]) > 0
         and o["moves"] not in ("none", "auto"),
         "learner options 'candidates' and 'moves' of {learner!r} cannot be combined for covariance 'tied' "
         "yet; use candidates=0 (the exact E-step) with moves"),
]
#: learner state without memoized statistics: the store's chunk keys (what a warm start compares
#: with its own, :meth:`VBEM.adopt`) and a warm start's chunks the previous fit did not have
CHUNK_KEYS, FRESH = "chunks.keys", "chunks.fresh"


@dataclass
class VBEMState(LearnerState):
    """VB EM's state beyond the posterior and prior: the growth's record, the moves' next round and the
    over-relaxation's (None where off). Memoized statistics and candidate sets are cache
    (:meth:`VBEM.cache_arrays`)."""

    growth: GrowthState
    moves: MovesState | None
    relax: RelaxState | None


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
    #: ``grow_iters``: iterations a birth proposal may take to beat the converged bound
    #: (:mod:`pipeline.fit.learners.growth`); ``grow_splits``: ``all`` (a round proposes to split every
    #: component, up to doubling K, and keeps each split only where the exact bound prefers it: a
    #: merge-back pass after the proposal's iterations) or ``gated`` (the splits of the components that
    #: look like two groups, kept or refused together); ``grow_tol``: a fit grows once its bound
    #: changes by less than this per row, before it converges (0: only at convergence). With
    #: ``priors='empirical'`` the free hyperparameters are re-estimated after every M-step
    #: (:mod:`vbcore.model.empirical`).
    #: ``moves='auto'``: merge and delete moves where the truncation grows (``grow``, the pipeline's
    #: default, so K also shrinks on the bound), none otherwise (scikit-learn's trajectory).
    options = declare(VBEM_OPTIONS, TRUNCATED_OPTIONS, MOVE_OPTIONS, VBEM_MOVES, MEMO_OPTIONS,
                      {"accelerate": Opt(False, "Over-relaxed passes (issue 51; vbem/overrelax.py).")},
                      rules=VBEM_RULES)
    empirical_bayes = True
    family = "vbem"
    grows = True
    passes_per_iteration = 1
    partial_fit = True
    state_type = VBEMState

    def __init__(self, ctx: FitContext, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        if float(options.get("memo", 0.0)) > 0 and int(options.get("candidates", -1)) == -1:
            options["candidates"] = 0  # memoized statistics are the exact E-step's
        super().__init__(ctx, options)
        if self.opts["moves"] == "auto":
            tied_trunc = ctx.covariance_type == "tied" and int(self.opts.get("candidates", 0)) > 0
            dp = ctx.weight_type == "dirichlet_process"
            self.opts["moves"] = "merge,delete" if ctx.grow and dp and not tied_trunc else "none"
        self.moves = Moves(self.name, self.opts)
        memo = float(self.opts["memo"])
        self.memo = MemoStats(ctx, memo, str(self.opts["memo_stop"])) if memo > 0 else None
        if self.memo is not None:  # move_every counts passes: a lap of visits is ceil(1 / memo) iterations
            self.moves.opts["move_every"] = int(self.opts["move_every"]) * math.ceil(1.0 / memo)
        self.growth = Growth.of(ctx, int(self.opts["grow_iters"]), ctx.covariance_type != "tied")
        self.growth.grow_tol = float(self.opts["grow_tol"])
        self.iteration = 0  # the last step's (the memoized convergence test's lap ends there)
        self.round = False  # the last step was a move round (a full pass)
        self.relax = OverRelax(bool(self.opts["accelerate"]))  # over-relaxed passes (issue 51)
        #: without memoized statistics, a warm start's chunks absent from the previous fit (None: all)
        self.fresh: np.ndarray | None = None
        #: the E-step pass, chosen once (:mod:`pipeline.fit.learners.vbem.passes`)
        self.pass_ = choose_pass(ctx, self.truncated, self.memo, self.moves, self.relax, self.growth)

    def start_warm(self, post: Posterior) -> None:
        """Begin from ``post``, a finished fit's, with a truncation it does not saturate
        (:meth:`pipeline.fit.learners.growth.Growth.warm_prior`)."""
        self.growth.warm(self.ctx, post.n_components)
        self.start(post)

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        assert self.post is not None, "start() first"
        self.iteration, self.round = iteration, False
        if self.growth.pending:
            self.relax.reset()
            return self.grow(iteration)
        passed = self.pass_.run(self.post, iteration)
        self.round = passed.full_round
        if passed.relabelling is not None:
            self.relabel_components(*passed.relabelling)
        stats = passed.stats
        if self.ctx.weight_type == "dirichlet_process" and self.opts["reorder"]:
            order = np.argsort(-stats.nk, kind="stable")
            stats = stats.take(order)
            self.relabel_components(order)
        terms, keep = self.update(stats)
        if keep is not None:
            self.relabel_components(kept_components(self.post, keep))
        if (keep is not None and not keep.all()) or self.opts["reorder"]:
            self.relax.reset()
        self.moves.observe(iteration, stats, keep, self.post, self.ctx.prior, self.ctx.reg_covar)
        return self.post, terms

    def update(self, stats: SuffStats) -> tuple[ElboTerms, np.ndarray | None]:
        """M-step, empirical Bayes (the prior's free hyperparameters), the exact bound, pruning:
        sets ``self.post`` and ``self.ctx.prior``; returns the bound and the kept mask (None: no pruning)."""
        ctx = self.ctx
        post = m_step(stats, ctx.prior, ctx.reg_covar)
        ctx.prior = empirical_update(ctx.prior, post)  # never lowers the bound of (stats, post)
        terms = elbo_terms(stats, post, ctx.prior)
        self.growth.last = terms
        # 'tied' keeps all K: its shared q(Lambda) depends on K (nu = nu0 + N/K), so dropping one
        # component would change every other's posterior (docs/algorithms.md)
        prune = ctx.weight_type == "dirichlet_process" and ctx.covariance_type != "tied"
        keep = stats.nk >= float(self.opts["prune_below"]) if prune else None
        self.post = post if keep is None else prune_components(post, keep)
        return terms, keep

    def grow(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        """Birth proposals, each accepted when, within ``grow_iters`` exact iterations (and, for
        ``grow_splits='all'``, the merge-back pass that keeps each split only where the bound prefers
        it), its bound beats the last one (:mod:`pipeline.fit.learners.growth`): the splits of every
        component up to doubling K (``all``) or those towards the doubled or filled truncation
        (``gated``); when a doubling (every component split) is refused, the splits of the
        components that look like two groups alone (a saturated fit may hold single classes, whose
        splits cost more than the merged ones' gain); then, when they are refused or there are
        none, the births from groups of the worst-explained rows
        (:func:`pipeline.fit.learners.growth.propose_outliers`). All refused, the fit keeps its
        posterior and bound (the history repeats its last value; the growth ends, or after an early
        round only the early rounds end)."""
        assert self.post is not None and self.growth.last is not None
        growth, ctx = self.growth, self.ctx
        growth.pending = False
        old_post, old_prior, last = self.post, ctx.prior, growth.last
        assert last is not None
        kept = None if self.memo is None else self.memo.snapshot()
        proposals = self._proposals(growth.next_truncation(), old_post, old_prior, iteration)
        for k_new, proposal, pairs in proposals:
            if proposal is not None:
                accepted = self._try(proposal, k_new, old_prior, last, iteration, kept, pairs)
                if accepted is not None:
                    return self.post, accepted
        ctx.prior, self.post, growth.last = old_prior, old_post, last
        growth.refuse()
        return old_post, last

    def _proposals(self, k: int, post: Posterior, prior: Any,
                   iteration: int) -> Iterator[tuple[int, Posterior | None, np.ndarray | None]]:
        """The birth proposals of :meth:`grow` in the order they are tried, made lazily (each costs a
        sample or a pass): ``(truncation, proposal or None, its splits to judge one by one or None)``.
        ``grow_splits='all'`` (with the exact E-step: the merge-back pass is a move pass of all rows)
        splits every component, up to doubling K, where the truncation
        doubles or the round is early, and judges every split proposal split by split; a fill at
        convergence splits only the components that look like two groups (a converged answer spends
        no round on single Gaussians)."""
        ctx, growth = self.ctx, self.growth
        judged = self.opts["grow_splits"] == "all" and self.truncated is None
        first: Posterior | None = None
        if judged and (growth.double or growth.early):
            k_all = min(growth.limit, max(k, 2 * post.n_components))
            if k_all > post.n_components:
                yield (k_all, *propose_splits(ctx, post, prior, k_all, iteration))
        if not (judged and growth.double):
            first, pairs = propose_splits(ctx, post, prior, k, iteration, gated=not growth.double)
            yield k, first, pairs if judged else None
        if growth.double:  # a refused doubling: the components that look like two groups alone
            gated, pairs = propose_splits(ctx, post, prior, k, iteration, gated=True)
            if judged or first is None or gated is None or gated.n_components != first.n_components:
                yield k, gated, pairs if judged else None  # (the doubling's own splits: not tried again)
        yield (*(propose_outliers(ctx, post, prior, growth.limit, self._fresh()) or (k, None)), None)

    def _fresh(self) -> np.ndarray | None:
        """The chunks the worst-rows check reads: all (None), or in a warm start that knows the
        previous fit's chunks (memoized statistics, or its chunk keys: :meth:`adopt`) the chunks it
        started without (a refresh's new rows: the old ones were checked by the fit it refreshes, and
        a pass over them would cost the refresh a full pass)."""
        if self.memo is not None:
            return np.flatnonzero(self.memo.fresh)
        return None if self.fresh is None else np.flatnonzero(self.fresh)

    def _try(self, proposal: Posterior, k: int, old_prior: Any, last: ElboTerms, iteration: int,
             kept: Any, pairs: np.ndarray | None = None) -> ElboTerms | None:
        """Up to ``grow_iters`` exact iterations from ``proposal`` (truncation ``k``), until one beats
        ``last`` by ``min_gain``; with ``pairs`` (its splits, parent and child) then one merge-back
        pass (:func:`pipeline.fit.learners.moves.merge_back`: every split the bound does not prefer
        is undone; none left, the proposal is refused, even where the fit's own iterations raised
        the bound). The bound of the result when it beats ``last`` (the proposal accepted), or None,
        with the posterior, prior and memoized statistics as before it."""
        growth, ctx, old_post = self.growth, self.ctx, self.post
        ctx.prior = replace(old_prior, n_components=k)
        self.post = proposal
        for _ in range(growth.iters):
            stats = self.full_pass(iteration)
            terms, keep = self.update(stats)
            if keep is not None:
                if self.memo is not None:
                    self.memo.relabel(kept_components(self.post, keep))
                if pairs is not None:
                    pairs = pairs_after_pruning(pairs, kept_components(self.post, keep), keep.size)
            if terms.total > last.total + growth.min_gain:
                break
        split = True  # (with pairs: a split survives the merge-back; else the proposal is refused)
        if pairs is not None:
            assert self.post is not None
            memo = self.memo
            stats, merged = merge_back(ctx, self.post, pairs, None if memo is None else
                                       lambda params: memo.run_moves(params, iteration))
            if memo is not None and merged:
                memo.invalidate()  # the merged q(Z) is no chunk's kept one
            terms, keep = self.update(stats)
            if keep is not None and memo is not None:
                memo.relabel(kept_components(self.post, keep))
            split = pairs.shape[0] > merged
        if split and terms.total > last.total + growth.min_gain:
            if pairs is not None:  # the truncation is what the bound kept: saturated, it doubles next
                assert self.post is not None
                k = self.post.n_components
                ctx.prior = replace(ctx.prior, n_components=k)
            growth.accepted(k)
            if self.truncated is not None:  # new candidate sets for the new components
                self.truncated.start(self.post)
            self.moves.restart(iteration, stats, keep, self.post, ctx.prior, ctx.reg_covar)
            return terms
        ctx.prior, self.post = old_prior, old_post
        if kept is not None and self.memo is not None:  # q(Z) and q(theta) as before the proposal
            self.memo.restore(kept)
        return None

    def full_pass(self, iteration: int) -> SuffStats:
        """A pass over every chunk (a birth proposal's): memoized statistics keep theirs."""
        assert self.post is not None
        if self.memo is None:
            return vbem_pass(self.ctx, self.post).stats
        every = np.arange(len(self.ctx.handles))
        return self.memo.run(estep_params(self.post, self.ctx.shift), iteration, visit=every).stats

    def converged(self, history: list[float], tol: float) -> bool:
        if self.memo is not None and not self.round:  # over the last lap of visits, per unit of weight
            base = self.memo.converged(history, tol, self.ctx.n_weight, self.iteration)
        else:  # (a move round is a full pass, whatever it did to the kept statistics)
            base = super().converged(history, tol)
        growth = self.growth
        if growth.early_refused:  # (the history repeats the bound of a fit that had not converged)
            growth.early_refused = False
            return False
        done = self.moves.converged(base)
        assert self.post is not None
        growth.min_gain = tol * self.ctx.n_weight
        used, k = n_used(self.post), self.post.n_components
        if not done:
            growth.wants_early(history, self.ctx.n_weight, used, k)
            return False
        growth.early = False
        return not growth.wants(used, k)

    def truncation_info(self, used: int) -> dict[str, Any]:
        return self.growth.info(used)

    def relabel_components(self, kept: np.ndarray, moved: np.ndarray | None = None) -> None:
        super().relabel_components(kept, moved)
        if self.memo is not None:
            self.memo.relabel(kept)

    def own_state(self) -> VBEMState:
        return VBEMState(self.growth.to_state(), self.moves.to_state(), self.relax.to_state())

    def load(self, post: Posterior, state: VBEMState) -> None:
        self.post = post
        self.moves.load(state.moves)
        self.growth.load(state.growth)
        self.ctx.prior = replace(self.ctx.prior, n_components=self.growth.truncation)
        self.relax.load(state.relax)

    def cache_arrays(self) -> dict[str, np.ndarray]:
        """The candidate sets, the memoized statistics, the chunk keys and fresh chunks."""
        out = super().cache_arrays()
        if self.memo is not None:
            out.update(self.memo.state())
        out.update(self._chunk_keys())
        if self.memo is None and self.fresh is not None:
            out[FRESH] = self.fresh
        return out

    def _chunk_keys(self) -> dict[str, np.ndarray]:
        """Without memoized statistics, a store's chunk keys (its CRC-32Cs: nothing is read)."""
        if self.memo is not None or getattr(self.ctx.source, "crcs", None) is None:
            return {}
        return {CHUNK_KEYS: np.asarray(chunk_keys(self.ctx.source), dtype=str)}

    def load_cache(self, post: Posterior, arrays: Mapping[str, np.ndarray]) -> None:
        super().load_cache(post, arrays)
        if self.memo is not None:
            self.memo.load_state(arrays)
        if self.memo is None and FRESH in arrays:
            self.fresh = np.asarray(arrays[FRESH], dtype=bool).copy()

    def keep_state(self) -> dict[str, np.ndarray]:
        if self.memo is None:  # a store's chunk keys (a warm start knows its new chunks), candidate sets
            keys = self._chunk_keys()
            return {**keys, **self.truncated.state()} if keys and self.truncated is not None else keys
        return self.memo.state()

    def adopt(self, state: Mapping[str, np.ndarray]) -> int:
        """Warm start: adopt the previous fit's memoized statistics (the chunks adopted); without
        them, note the chunks whose keys the previous fit did not have (its new rows) and, with the
        truncated E-step, take its candidate sets of the unchanged chunks (no exact first pass there)."""
        if self.memo is None:
            if CHUNK_KEYS in state and getattr(self.ctx.source, "crcs", None) is not None:
                old, keys = np.asarray(state[CHUNK_KEYS]).tolist(), chunk_keys(self.ctx.source)
                self.fresh = np.asarray([k not in set(old) for k in keys], dtype=bool)
                if self.truncated is not None:  # the same rows at the same place: their candidate sets
                    same = [i < len(old) and k == old[i] for i, k in enumerate(keys)]
                    self.truncated.adopt(state, np.asarray(same, dtype=bool))
            return 0
        if self.post is None:
            return 0
        return self.memo.adopt(state, self.post.n_components)


def prune_components(post: Posterior, keep: np.ndarray) -> Posterior:
    """The posterior of the components ``keep`` (a mask; the largest is kept if none is)."""
    if keep.all():
        return post
    return post.take(kept_components(post, keep))


def kept_components(post: Posterior, keep: np.ndarray) -> np.ndarray:
    """The indices :func:`prune_components` keeps."""
    return np.flatnonzero(keep) if keep.any() else np.array([int(np.argmax(post.weight_concentration[0]))])
