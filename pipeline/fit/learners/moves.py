"""Merge and delete moves inside VB EM and the hard-assignment learners (Hughes & Sudderth 2013).

Learner options: ``moves`` (``none``, ``merge``, ``delete``, ``merge,delete``), ``move_every`` (a
round every this many iterations, and one more whenever the ELBO has converged since the last accepted
move: a fit converges only when a round found nothing), ``move_pairs`` / ``move_neighbours`` (merge
pairs per round, among each component's nearest neighbours), ``delete_share`` / ``delete_max`` (the
delete proposal). VB EM: a round's E-step pass (:func:`vbcore.moves.estep_pass.move_kernel`) returns the
regular statistics, the pairs' entropy changes and the delete proposal's statistics; the driver keeps
whichever of (regular, + merges, delete + merges) has the highest exact ELBO, so the history stays
monotone, with no random draw. With the truncated E-step the round is the truncated pass itself
(:meth:`Moves.truncated_request`); 'tied' is covered by :func:`vbcore.moves.exact.merge_gain_bound`.
docs/algorithms.md has the details.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.fit.learners.options import Grammar, Opt, Options
from pipeline.fit.learners.state import LearnerState
from vbcore.errors import ConfigError
from vbcore.kernels.estep import estep_params
from vbcore.kernels.sga_stats import take_stats
from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats
from vbcore.moves.estep_pass import MoveParams, move_kernel
from vbcore.moves.exact import (
    apply_merges,
    delete_candidates,
    expand_stats,
    propose_pairs,
    reindex_pairs,
    removes_components,
    select_merges,
    total_elbo,
)
from vbcore.moves.hard import nearest_pairs
from vbcore.moves.truncated import TruncMoveRequest

if TYPE_CHECKING:
    from pipeline.fit.learners.point.moves import Judge

MOVE_KINDS = ("merge", "delete")


def moves_grammar(kinds: tuple[str, ...] = MOVE_KINDS) -> Grammar:
    """The values of option ``moves``: ``'none'``, ``'auto'`` or a comma-separated subset of ``kinds``
    (:func:`parse_moves`, which reads them)."""
    subsets = f"'none' or a comma-separated subset of {MOVE_KINDS}"
    merges = "'none' or 'merge' (hard-assignment learners have no delete move)"

    def broken(value: str) -> str:
        try:
            found = parse_moves("", value)
        except ConfigError:
            return subsets
        return "" if found <= set(kinds) else merges

    return Grammar(("'auto', " + subsets) if kinds == MOVE_KINDS else "'auto', " + merges, broken)


#: the move options every learner with moves accepts, and their defaults
MOVE_OPTIONS = Options({
    "moves": Opt("none", "Merge/delete moves on the exact bound: none, auto, or a comma-separated subset "
                 "of merge, delete.", grammar=moves_grammar()),
    "move_every": Opt(4, "Iterations between two move rounds (one more whenever the bound has converged "
                      "since the last accepted move).", low=1),
    "move_pairs": Opt(256, "Merge pairs tried per round.", low=1),
    "move_neighbours": Opt(8, "Each component's nearest neighbours among which merge pairs are proposed.",
                           low=1),
    "delete_share": Opt(0.1, "The delete proposal: components holding at most this share of the rows.",
                        low=0, high=1, low_open=True),
    "delete_max": Opt(32, "The delete proposal: at most this many components at once.", low=1),
})
#: the move options of the DP point learners and SVI (merges only; 'auto': on unless the candidate MAP
#: search is, issue 26; ``move_every`` 0: :func:`move_interval`'s rows-seen schedule, issue 52)
HARD_MOVE_OPTIONS = Options({
    "moves": Opt("auto", "Merges on the exact bound: auto (merge, unless candidates > 0), none or merge "
                 "(no delete move).", grammar=moves_grammar(("merge",)),
                 resolved="'auto' by parse_moves where the moves are built (HardMoves, SVI's Moves)."),
    "move_every": Opt(0, "Iterations between two merge rounds; auto: 4 iterations or an epoch of "
                      "minibatches, whichever is longer.", low=1, special={0: "auto"},
                      resolved="0 by move_interval when the learner builds its moves."),
    **MOVE_OPTIONS.only("move_pairs", "move_neighbours")})
#: learner option ``judge`` of the DP point learners: the exact bound their merges and births are judged
#: on -- ``diag`` (the default): the pipeline's default model's (:func:`partition_prior`), births on their
#: hard assignments, and a merge the hard assignments accept only when the same model's bound at soft
#: responsibilities accepts it too (:func:`soft_merges`, issue 51); ``diag-hard``: merges on the hard
#: assignments alone (the default before issue 51); ``own``: the learner's own (the fixed isotropic
#: covariance)
JUDGES = ("diag", "diag-hard", "own")
#: empirical-Bayes steps on ``beta0`` for a judging prior at most (:meth:`Judge.tune`)
TUNE_STEPS = 50
#: the move options of the DP point learners (MM, SGA, SGA+M, SGA+F) and SVI
POINT_MOVE_OPTIONS = HARD_MOVE_OPTIONS.with_({"judge": Opt(
    "diag", "The bound merges and births are judged on: diag (the default model's, merges checked at "
    "soft responsibilities), diag-hard (hard assignments alone) or own (the fixed isotropic covariance).",
    choices=JUDGES)})
_EMPTY = np.zeros((0, 2), dtype=np.int64)


def parse_moves(learner: str, value: str, candidates: int = 0) -> frozenset[str]:
    """``'none'``, a comma-separated subset of :data:`MOVE_KINDS`, or ``'auto'`` (the DP point
    learners' and SVI's default): merges, unless the candidate MAP search is on (``candidates`` > 0),
    which cannot be combined with moves yet."""
    text = str(value).strip().lower()
    if text == "auto":
        return frozenset() if candidates > 0 else frozenset({"merge"})
    if text in ("none", ""):
        return frozenset()
    kinds = frozenset(p.strip() for p in text.split(","))
    if not kinds <= set(MOVE_KINDS):
        raise ConfigError(f"learner option 'moves' of {learner!r} must be 'none' or a comma-separated "
                          f"subset of {MOVE_KINDS}, got {value!r}")
    return kinds


def move_interval(opts: Mapping[str, Any], n_rows: int) -> int:
    """Iterations between two merge rounds of a DP point learner or SVI: ``move_every`` where set (>= 1),
    by default (0) 4 iterations or an epoch of minibatches (``ceil(N / minibatch)``), whichever is
    longer. A round is a full pass (three where :func:`soft_merges` checks); every 4 minibatches it was
    what a step cost at 1M rows and more (docs/benchmarks.md, issue 52). MM (a pass an iteration) keeps 4."""
    every = int(opts["move_every"])
    if every > 0:
        return every
    size = opts.get("minibatch")
    epoch = 1 if size is None else -(-int(n_rows) // max(1, int(size)))
    return max(int(MOVE_OPTIONS["move_every"]), epoch)


class Moves:
    """The move schedule and proposals of one fit (held by the learner).

    State (checkpointed through the learner's ``state()``): the proposals for the next pass and
    three counters, so a resumed fit makes the same moves."""

    def __init__(self, learner: str, opts: Mapping[str, Any]) -> None:
        self.kinds = parse_moves(learner, opts["moves"], int(opts.get("candidates", 0)))
        self.opts = dict(opts)
        self.pairs = _EMPTY
        self.deletes = np.zeros(0, dtype=np.int64)
        self.pending = True  # no round has been tried since the last accepted move (or the start)
        self.force = False  # the next iteration is a round (the ELBO converged with pending moves)
        self.delete_limit = int(opts["delete_max"])
        self._last: tuple[SuffStats, Posterior] | None = None
        #: what the last round did: merges accepted, components deleted, exact ELBO gain
        self.last_round: dict[str, float] = {}
        self.accepted = _EMPTY
        #: (kept, moved) of the last round, old indices (see :func:`_relabelling`)
        self.relabelling: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), _EMPTY)
        #: the last round's choice (0 regular, 1 merges, 2 delete and merges; pairs, rows, keep, K, remove)
        self.choice: tuple[Any, ...] = (0, _EMPTY, np.zeros(0, np.int64), None, 0, True)

    @property
    def active(self) -> bool:
        return bool(self.kinds)

    def due(self, iteration: int) -> bool:
        return self.active and (self.force or iteration % int(self.opts["move_every"]) == 0)

    # -- proposals -------------------------------------------------------------------------------
    def observe(self, iteration: int, stats: SuffStats, keep: np.ndarray | None, post: Posterior,
                prior: Any, reg_covar: float) -> None:
        """After an iteration: ``stats`` of its pass, ``keep`` the mask of components the learner kept
        (None: all), ``post`` the posterior the next pass uses. Proposes when the next is a round."""
        if not self.active:
            return
        kept: SuffStats | None = stats
        if keep is not None:
            kept = take_stats(stats, np.flatnonzero(keep)) if keep.any() else None
        self._last = None if kept is None or kept.nk.shape[0] != post.n_components else (kept, post)
        self._prior, self._reg = prior, reg_covar
        if self.due(iteration + 1):
            self._propose()
        else:
            self.pairs, self.deletes = _EMPTY, np.zeros(0, dtype=np.int64)

    def restart(self, iteration: int, stats: SuffStats, keep: np.ndarray | None, post: Posterior,
                prior: Any, reg_covar: float) -> None:
        """After the components changed outside the moves (VB EM's births): forget the proposals,
        observe the new iteration, and try a round again before the fit may converge."""
        self.pairs, self.deletes, self.pending, self.force = _EMPTY, np.zeros(0, dtype=np.int64), True, False
        self.observe(iteration, stats, keep, post, prior, reg_covar)

    def _propose(self) -> None:
        self.pairs, self.deletes = _EMPTY, np.zeros(0, dtype=np.int64)
        if self._last is None:
            return
        stats, post = self._last
        if "merge" in self.kinds:
            self.pairs = propose_pairs(stats, post, self._prior, self._reg, int(self.opts["move_neighbours"]),
                                       int(self.opts["move_pairs"]))
        if "delete" in self.kinds:
            # below the pruning threshold a component has nothing to move ('tied' keeps such components)
            floor = float(self.opts.get("prune_below", 0.0))
            share = float(self.opts["delete_share"])
            self.deletes = delete_candidates(stats.nk, share, self.delete_limit, floor)

    def propose_nearest(self, means: np.ndarray) -> None:
        """Propose merging each component with its ``move_neighbours`` nearest means (SVI's round, whose
        minibatch steps keep no statistics of all rows to propose from)."""
        self.pairs = nearest_pairs(means, int(self.opts["move_neighbours"]))

    def round_next(self) -> None:
        """Make the next iteration a round if one is pending (VB EM's memoized refresh: right after
        the new rows are absorbed. Where the previous fit's last round proposed the same moves, its
        kept shares serve the round (:mod:`pipeline.fit.learners.vbem.memo_round`) and it visits the new rows
        and a regular iteration's share; otherwise its full pass doubles as the visit of every old
        row under the new posterior, instead of a lap of visits followed by a round at convergence)."""
        if self.active and self.pending:
            self.force = True

    def converged(self, base: bool) -> bool:
        """The learner's rule ``base``, held back once when moves may still raise the ELBO."""
        if not (self.active and base):
            return base
        if self.pending:
            self.force = True
            self._propose()
            return False
        return True

    # -- the round -------------------------------------------------------------------------------
    def _prepare(self, k: int) -> tuple[np.ndarray | None, np.ndarray]:
        """The proposals for a posterior of ``k`` components: (kept by the delete proposal or None,
        the merge pairs in its indexing)."""
        self.pairs = self.pairs[(self.pairs < k).all(axis=1)]  # proposals are for this posterior's K
        self.deletes = self.deletes[self.deletes < k]
        keep = np.setdiff1d(np.arange(k), self.deletes) if self.deletes.size else None
        return keep, (_EMPTY if keep is None else reindex_pairs(self.pairs, keep, k))

    def run(self, ctx: Any, post: Posterior, pass_: Any = None, judge: Judge | None = None) -> SuffStats:
        """One move round: the E-step pass with the move quantities, then the best exact ELBO.
        ``pass_(params)``: the pass (default: ``map_reduce`` of :func:`vbcore.moves.estep_pass.move_kernel`;
        VB EM's memoized statistics keep each chunk's regular statistics); ``judge``: whose prior's exact
        ELBO chooses (default ``ctx.prior``; SVI's :class:`Judge`, tuned on the pass's statistics)."""
        keep, keep_pairs = self._prepare(post.n_components)
        params = MoveParams(estep_params(post, ctx.shift), self.pairs, keep, keep_pairs)
        res = ctx.engine.map_reduce(move_kernel, ctx.handles, params) if pass_ is None else pass_(params)
        prior = None if judge is None else judge.tune(ctx, res.stats)
        return self.choose(ctx, res.stats, res.h, res.alt, res.alt_h, keep, keep_pairs, prior)

    def truncated_request(self, k: int) -> TruncMoveRequest:
        """The hook of a truncated pass that is a move round (:mod:`vbcore.moves.truncated`)."""
        keep, keep_pairs = self._prepare(k)
        return TruncMoveRequest(self.pairs, keep, keep_pairs)

    def choose_truncated(self, ctx: Any, result: Any) -> SuffStats:
        """The round's choice from a truncated pass run with :meth:`truncated_request`'s hook; a delete
        proposal that leaves a row without a kept candidate is not a truncated q and is dropped."""
        extra = result.extra
        keep, keep_pairs = self._prepare(result.stats.nk.shape[0])
        alt = extra.alt if extra.orphans == 0 else None
        return self.choose(ctx, result.stats, extra.h, alt, extra.alt_h, keep, keep_pairs)

    def choose(self, ctx: Any, stats: SuffStats, h: np.ndarray, alt: SuffStats | None, alt_h: np.ndarray,
               keep: np.ndarray | None, keep_pairs: np.ndarray, prior: Prior | None = None) -> SuffStats:
        """Keep whichever of (regular, regular + merges, delete + merges) has the highest exact ELBO
        (under ``prior``, default ``ctx.prior``). Sets :attr:`relabelling` (kept components, moved
        ones) for the truncated E-step's state."""
        prior, reg = ctx.prior if prior is None else prior, ctx.reg_covar
        k = stats.nk.shape[0]
        remove = removes_components(prior)
        base = total_elbo(stats, prior, reg)
        options = [(base, stats, _EMPTY, 0)]  # (exact ELBO, statistics, merged pairs, deleted)
        acc, gain = select_merges(stats, self.pairs, h, prior, reg)
        if acc.shape[0]:
            options.append((base + gain, apply_merges(stats, acc, h[_rows(self.pairs, acc)], remove), acc, 0))
        alt_pairs = _EMPTY
        if alt is not None and keep is not None:
            alt = alt if remove else expand_stats(alt, keep, k)
            alt_pairs = keep_pairs if remove else keep[keep_pairs]
            acc2, _ = select_merges(alt, alt_pairs, alt_h, prior, reg)
            alt = apply_merges(alt, acc2, alt_h[_rows(alt_pairs, acc2)], remove)
            options.append((total_elbo(alt, prior, reg), alt, acc2, int(self.deletes.size)))
        best = max(range(len(options)), key=lambda i: (options[i][0], -i))
        value, chosen, accepted, deleted = options[best]
        if best and not total_elbo(chosen, prior, reg) > base:  # re-verified on the chosen statistics
            value, chosen, accepted, deleted, best = (*options[0], 0)
        #: how to apply the choice to one chunk's share of the round (:meth:`replay`)
        self.choice = (best if best < 2 else 2, accepted,
                       _rows(self.pairs if best == 1 else alt_pairs, accepted), keep, k, remove)
        if keep is not None:
            self.delete_limit = int(self.opts["delete_max"]) if deleted else max(1, self.delete_limit // 2)
        self.pending = bool(accepted.shape[0] or deleted)
        self.force = False
        #: the merged pairs of the last round (indices after its deletions, for the DP) and a summary
        self.accepted = accepted
        self.relabelling = _relabelling(k, accepted, self.deletes if deleted else None, keep, remove)
        self.last_round = {"merges": int(accepted.shape[0]), "deleted": deleted, "gain": value - base}
        return chosen

    def replay(self, stats: SuffStats, h: np.ndarray, alt: SuffStats | None, alt_h: np.ndarray) -> SuffStats:
        """The last round's choice (:meth:`choose`) applied to a part of its pass: one chunk's regular
        statistics and extras; the parts' results sum to the chosen statistics (VB EM's memo keeps them)."""
        kind, accepted, rows, keep, k, remove = self.choice
        if kind == 0:
            return stats
        if kind == 1:
            return apply_merges(stats, accepted, h[rows], remove)
        assert alt is not None and keep is not None
        return apply_merges(alt if remove else expand_stats(alt, keep, k), accepted, alt_h[rows], remove)

    # -- checkpoints -----------------------------------------------------------------------------
    def to_state(self) -> MovesState | None:
        if not self.active:
            return None
        return MovesState(self.pairs, self.deletes, self.pending, self.force, self.delete_limit)

    def load(self, state: MovesState | None) -> None:
        if not self.active or state is None:
            return
        self.pairs = np.asarray(state.pairs, dtype=np.int64).reshape(-1, 2)
        self.deletes = np.asarray(state.deletes, dtype=np.int64).reshape(-1)
        self.pending, self.force = bool(state.pending), bool(state.force)
        self.delete_limit = int(state.delete_limit)


@dataclass
class MovesState(LearnerState):
    """:class:`Moves`' record in a checkpoint: the next round's pairs and deletions, and its flags."""

    pairs: np.ndarray
    deletes: np.ndarray
    pending: bool
    force: bool
    delete_limit: int


def merge_back(ctx: Any, post: Posterior, pairs: np.ndarray, pass_: Any = None) -> tuple[SuffStats, int]:
    """One E-step pass under ``post`` merging back the splits ``pairs`` (parent, child) whose merge
    raises the exact ELBO (VB EM's births): the pass's statistics with those merges applied
    (:func:`vbcore.moves.exact.select_merges`) and how many; ``pass_(params)`` as :meth:`Moves.run`'s."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    params = MoveParams(estep_params(post, ctx.shift), pairs, None, _EMPTY)
    res = ctx.engine.map_reduce(move_kernel, ctx.handles, params) if pass_ is None else pass_(params)
    acc, _ = select_merges(res.stats, pairs, res.h, ctx.prior, ctx.reg_covar)
    if not acc.shape[0]:
        return res.stats, 0
    merged = apply_merges(res.stats, acc, res.h[_rows(pairs, acc)], removes_components(ctx.prior))
    return merged, int(acc.shape[0])


def _relabelling(k: int, accepted: np.ndarray, deleted: np.ndarray | None, keep: np.ndarray | None,
                 remove: bool) -> tuple[np.ndarray, np.ndarray]:
    """(kept, moved) of a round in the old indexing (:meth:`pipeline.fit.learners.truncated.TruncatedEStep.
    relabel`): merged b -> a, deleted -> -1; ``accepted`` is in the indexing after the deletion when
    components are removed."""
    acc = np.asarray(accepted, dtype=np.int64).reshape(-1, 2)
    moved = [np.zeros((0, 2), np.int64)]
    survivors = np.arange(k)
    if deleted is not None:
        assert keep is not None
        moved.append(np.stack((deleted, np.full(deleted.size, -1)), axis=1))
        if remove:
            survivors, acc = keep, keep[acc]
    moved.append(acc[:, ::-1])
    kept = np.setdiff1d(survivors, acc[:, 1]) if remove else np.arange(k)
    return kept, np.concatenate(moved).astype(np.int64)


def _rows(pairs: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Positions of the ``chosen`` pairs among ``pairs``."""
    lookup = {tuple(p): i for i, p in enumerate(np.asarray(pairs).tolist())}
    return np.asarray([lookup[tuple(p)] for p in np.asarray(chosen).tolist()], dtype=np.int64)
