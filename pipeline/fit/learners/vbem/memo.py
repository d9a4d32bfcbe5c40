"""Memoized statistics (Hughes & Sudderth 2013, memoized VB) in the VB EM learner: option ``memo``.

``VBMixture(learner_options={"memo": 0.1})`` or ``vbcluster fit S -o memo=0.1`` keeps every chunk's
last sufficient statistics (its :class:`~vbcore.kernels.estep.KernelResult`) next to the chunk on the engine
(``engine.map_keep``, as the truncated E-step keeps its candidate sets) and in the checkpoints. An
iteration visits some chunks only -- every chunk without statistics first (new rows after an append),
then the ones whose responsibilities moved most when last visited, ``ceil(memo x chunks)`` in all --
and the global statistics are the reduction of every chunk's kept statistics over the engines'
fixed tree (:meth:`reduce_states`): the exact sum, the same bits as a full pass over the same
responsibilities, whatever the visiting order. ``memo=1`` visits every chunk (full passes that keep
their statistics, so a later fit can start from them); ``0`` (the default) keeps none.

The bound is exact at every iteration: it is the ELBO of q(Z) = each chunk's responsibilities from its
last visit with the q(theta) of the M-step from their statistics (the ELBO reads q(Z) through the
statistics only), and it never decreases (a visit maximises the chunk's q(Z) for the current q(theta),
the M-step q(theta) for the new statistics). A chunk not visited for ``ceil(1 / memo)`` iterations,
or not yet by this fit, is visited next, so every chunk is refreshed at least that often. The fit
converges (:meth:`MemoStats.converged`, option ``memo_stop``) when the last iteration's gain per unit
of the weight it visited, over the weight it stands for, is below ``tol`` per row (``gain``, the
default: a refresh's cost follows the new rows) or when the bound rose by less than ``tol`` per row
over the last lap (``lap``: the iterations since the oldest last visit of any chunk).

Births and merge/delete moves (the pipeline's defaults) run as without ``memo``: a birth proposal's
passes visit every chunk through :meth:`MemoStats.run` (a refused proposal restores the kept
statistics of before: :meth:`MemoStats.restore`), a move round keeps each chunk's regular statistics
and its share of the round (:meth:`MemoStats.run_moves`; a later round they serve visits only the
chunks without one and a regular share: :mod:`pipeline.fit.learners.vbem.memo_round`), and a round that
accepts a move applies its choice to each chunk's regular statistics and share of the round
(:meth:`MemoStats.replay`: merges and deletions act on each component's sums, so the chunks' results
are the statistics of the accepted q(Z) on their rows; before issue 52 they were invalidated and the
next iteration visited every chunk, as a birth's merge-back that merges still does).
``memo=1`` is plain VB EM's trajectory bit for bit, births and moves included. The learner's
convergence test combines the lap test with the moves' and growth's.

Warm starts (``vbcluster fit GROWN --warm-from R1``, a scheduled refresh, ``VBMixture`` with
``warm_start``): the statistics of chunks whose content key (the store's chunk checksums, a CRC-32 of
in-memory rows) matches a kept one are adopted, so after an append only the new chunks (and the old
last, partly filled one) lack statistics and are visited first.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.engine.engines import tree_reduce
from pipeline.fit.learners.base import FitContext, restart_lineage
from pipeline.fit.learners.options import Opt, Options
from pipeline.fit.learners.vbem.memo_round import RoundMemo, part_of, stack_stats, unstack_stats
from vbcore.errors import ConfigError
from vbcore.kernels.estep import EStepParams, KernelResult, vbem_kernel
from vbcore.moves.estep_pass import MoveParams, MoveResult, move_kernel

_PREFIX = "memo."
#: the kept round shares' arrays (:class:`pipeline.fit.learners.vbem.memo_round.RoundMemo`)
_ROUND = _PREFIX + "round."


#: learner option ``memo_stop``: when a memoized fit has converged (:meth:`MemoStats.converged`)
STOP_RULES = ("gain", "lap")
#: the random stream ordering the adopted chunks' first visits: ``ctx.rng(ORDER_TAG)``
ORDER_TAG = 2_813


#: VB EM's memoized statistics' options (:class:`MemoStats`)
MEMO_OPTIONS = Options({
    "memo": Opt(0.0, "The share of chunks an iteration visits, their statistics memoized (Hughes & "
                "Sudderth 2013).", low=0, high=1, special={0: "no memoized statistics"},
                resolved="memo > 0 sets an unset candidates (-1) to 0 and scales move_every by "
                "ceil(1 / memo) (VBEM.__init__)."),
    "memo_stop": Opt("gain", "When a memoized fit has converged: gain (the gain of what an iteration "
                     "visited) or lap (a whole lap of visits).", choices=STOP_RULES),
})


def memo_kernel(chunk: Any, old: KernelResult | None,
                params: EStepParams) -> tuple[KernelResult, tuple[float, float]]:
    """A visit: the chunk's VB EM statistics (:func:`vbcore.kernels.estep.vbem_kernel`), kept as its new
    state, how far its responsibilities moved since the last visit (``sum_k |dN_k|`` per unit of
    weight; infinite on the first visit) and its weight."""
    new = vbem_kernel(chunk, params)
    return new, (_movement(old, new), float(new.stats.total_weight))


def memo_move_kernel(chunk: Any, old: KernelResult | None,
                     params: MoveParams) -> tuple[KernelResult, tuple[MoveResult, float]]:
    """A move round's visit (:func:`vbcore.moves.estep_pass.move_kernel`): its regular statistics kept as the
    chunk's new state (no spread of ``ln sum rho``: VB EM reads none), the round's result and the
    movement."""
    res = move_kernel(chunk, params)
    new = KernelResult(res.stats, res.log_norm)
    return new, (res, _movement(old, new))


def _movement(old: KernelResult | None, new: KernelResult) -> float:
    """``sum_k |dN_k|`` per unit of weight since the last visit (infinite without one)."""
    if old is None or old.stats.nk.shape != new.stats.nk.shape:
        return math.inf
    w = new.stats.total_weight
    return float(np.sum(np.abs(new.stats.nk - old.stats.nk)) / w) if w > 0 else 0.0


def take_memo(memo: KernelResult | None, order: np.ndarray) -> KernelResult | None:
    """A kept result's components ``order`` (pruning, re-ordering)."""
    return None if memo is None else KernelResult(memo.stats.take(order), memo.log_norm, memo.log_norm_m2)


def chunk_keys(source: Any) -> list[str]:
    """A content key per chunk: the store's features (and weights) chunk CRC-32Cs, or a CRC-32 of
    in-memory rows (and weights); '' where the content cannot be named cheaply (dask arrays)."""
    n = len(source.chunk_slices())
    crcs = getattr(source, "crcs", None)
    if crcs is not None:
        wcrcs = getattr(source, "wcrcs", None) or [b""] * n
        return [c.hex() + w.hex() for c, w in zip(crcs, wcrcs, strict=True)]
    if type(source).__name__ != "ArraySource":
        return [""] * n
    keys = []
    for i in range(n):
        key = zlib.crc32(np.ascontiguousarray(source.load(i)).tobytes())
        w = source.load_weights(i)
        key = key if w is None else zlib.crc32(np.ascontiguousarray(w).tobytes(), key)
        keys.append(f"{source.chunk_slices()[i].stop - source.chunk_slices()[i].start}:{key:08x}")
    return keys


class MemoStats:
    """The kept statistics of one fit: per-chunk states on the engine, per-chunk movement and last
    visit on the driver (see the module docstring)."""

    def __init__(self, ctx: FitContext, share: float, stop: str = "gain") -> None:
        self.ctx = ctx
        self.share = float(share)
        self.stop = stop
        n = len(ctx.handles)
        #: ties of the visiting order (adopted chunks' first visits) broken at random, not by position
        self.tiebreak = ctx.rng(ORDER_TAG).permutation(n)
        #: the weight the last :meth:`run` visited (0: it was not a full pass but visited a chunk
        #: without statistics, whose new rows the bound's change is mostly about); whether it did
        self.last_weight, self.absorbed = 0.0, False
        #: the weight whose full pass the last run's gain per unit weight stands for (:meth:`converged`)
        self.stands_for = ctx.n_weight
        #: each chunk's weight, where known (kept statistics, a visit)
        self.weight = np.full(n, np.nan)
        self.states: list[Any] = [None] * n
        self.have = np.zeros(n, dtype=bool)  # chunks with kept statistics
        self.moved = np.full(n, np.inf)  # movement at the last visit
        self.visited = np.zeros(n, dtype=np.int64)  # iteration of the last visit (0: never)
        #: chunks this fit started without kept statistics (a refresh's new rows): the worst-rows
        #: birth check reads only these (:mod:`pipeline.fit.learners.outliers`)
        self.fresh = np.ones(n, dtype=bool)
        self.keys = chunk_keys(ctx.source)
        self.k = -1  # components of the kept statistics (-1: not known yet)
        #: each chunk's share of the last move round (:mod:`pipeline.fit.learners.vbem.memo_round`)
        self.rounds = RoundMemo(n)
        self.last_full = True  # whether the last run or round visited every chunk

    def choose(self, iteration: int) -> np.ndarray:
        """The chunks this iteration visits, ascending: those without statistics, then the ones not
        visited for ``ceil(1/share)`` iterations or never by this fit (adopted), then by descending
        movement (ties: a seeded random order, so the adopted chunks an iteration visits are a
        sample of them wherever the store's rows are sorted)."""
        n = self.have.size
        budget = max(1, math.ceil(self.share * n))
        stale = (self.visited == 0) | (iteration - self.visited >= math.ceil(1.0 / self.share))
        rank = np.where(~self.have, 0, np.where(stale, 1, 2))
        order = np.lexsort((self.tiebreak, -self.moved, rank))
        new = int(np.sum(~self.have))
        return np.sort(order[: max(budget, new)])

    def run(self, post_params: EStepParams, iteration: int, visit: np.ndarray | None = None) -> KernelResult:
        """Visit the chosen chunks (or ``visit``) with ``post_params``; the global statistics."""
        ctx = self.ctx
        idx = self.choose(iteration) if visit is None else np.asarray(visit, dtype=np.int64)
        handles = [ctx.handles[i] for i in idx]
        kept, parts = ctx.engine.map_keep(memo_kernel, handles, [self.states[i] for i in idx], post_params,
                                          combine=list)
        full, new = idx.size == self.have.size, not bool(self.have[idx].all())
        first = not full and not new and bool(np.all(self.visited[idx] == 0))
        for i, s, (m, w) in zip(idx.tolist(), kept, parts, strict=True):
            self.states[i], self.moved[i], self.visited[i], self.weight[i] = s, float(m), iteration, w
        self.have[idx] = True
        self.rounds.forget(idx.tolist())
        self.last_full = full
        # a full pass: plain VB EM's test, the same bits
        self.last_weight = ctx.n_weight if full else 0.0 if new else math.fsum(w for _, w in parts)
        self.stands_for = self._first_visits_weight() if first else ctx.n_weight
        self.absorbed = new and not full  # chunks without statistics visited beside kept ones
        return self.total()

    def _first_visits_weight(self) -> float:
        """After a run that visited only chunks this fit had not visited (adopted ones, in a seeded
        random order): the weight its gain per unit weight stands for -- its own and that of the chunks
        still not visited, a sample of which it was (the store's weight where one is not known)."""
        pending = self.visited == 0
        if np.isnan(self.weight[pending]).any():
            return self.ctx.n_weight
        return self.last_weight + math.fsum(self.weight[pending].tolist())

    def run_moves(self, params: MoveParams, iteration: int) -> MoveResult:
        """A move round, keeping each chunk's regular statistics and its share of the round
        (:class:`~pipeline.fit.learners.vbem.memo_round.RoundMemo`). Where the kept shares serve the round's
        proposal, it visits the chunks without one and those a regular iteration would visit, and
        takes the others' kept shares; otherwise every chunk. The result: the regular statistics
        reduced as :meth:`total`, the extras over the same fixed tree (a full pass gives a
        ``map_reduce``'s bits). If the round accepts a move, the learner replays its choice on the
        kept statistics (:meth:`replay`); if not, they are the round's q(Z)."""
        ctx, n = self.ctx, self.have.size
        k = int(params.estep.const.shape[0])
        served, maps = self.rounds.lookup(params, k)
        if served and self.have.all():
            idx = np.union1d(self.rounds.missing(maps), self.choose(iteration)).astype(np.int64)
        else:
            idx, maps = np.arange(n), None
        kept, parts = ctx.engine.map_keep(memo_move_kernel, [ctx.handles[i] for i in idx],
                                          [self.states[i] for i in idx], params, combine=list)
        for i, s, (r, m) in zip(idx.tolist(), kept, parts, strict=True):
            self.states[i], self.moved[i], self.visited[i] = s, float(m), iteration
            self.weight[i] = float(r.stats.total_weight)
        self.have[idx] = True
        self.last_full, self.absorbed, self.stands_for = idx.size == n, False, ctx.n_weight
        self.last_weight = ctx.n_weight if self.last_full else math.fsum(
            float(r.stats.total_weight) for r, _ in parts)
        shares = self.rounds.serve(params, k, maps, {c: part_of(r) for c, (r, _) in zip(idx.tolist(), parts,
                                                                                       strict=True)})
        regular, extra = self.total(), tree_reduce(shares)
        return MoveResult(regular.stats, regular.log_norm, extra.h, extra.alt, extra.alt_h)

    def converged(self, history: list[float], tol: float, n_weight: float, now: int) -> bool:
        """Whether the fit has converged, by the rule ``memo_stop``. ``history[-1]`` is the bound after
        iteration ``now``; earlier entries, the iterations before (a warm start's previous bound may
        precede them). Every chunk must hold statistics (the new rows are in the bound).

        * ``gain`` (default): the last iteration visited no chunk without statistics (unless it
          visited every chunk), and its gain per unit of the weight *it visited*, times the weight
          that gain stands for, is less than ``tol`` times the store's weight: an estimate of what
          a full pass would gain now, tested as plain VB EM tests a pass. Where the iteration
          visited only chunks this fit had not visited yet (adopted ones, in a seeded random order:
          a sample of them), its gain stands for its own rows and those still not visited (the
          ones this fit has visited saw nearly the current q(theta)); otherwise for the whole
          store (the gain per visited weight itself below ``tol``). So a refresh after an append
          ends when the new rows are absorbed and refreshing the old rows not yet visited would no
          longer pay: its cost follows the new rows and how far they move the clusters, not the
          store; the bound is exact either way.
        * ``lap``: the bound rose by less than ``tol`` per unit of weight over the last *lap*, the
          iterations since the oldest last visit of any chunk, so every row's q(z) was refreshed
          within them: a full pass's test; a refresh ends only after every old chunk was visited
          under the new posterior (about two laps after an append that moves every cluster).

        With ``memo=1`` (every chunk each iteration) both are plain VB EM's test."""
        if self.have.size == 0 or not self.have.all():
            return False
        if self.stop == "gain":
            if len(history) < 2 or self.last_weight <= 0:
                return False
            gain = abs(history[-1] - history[-2]) / self.last_weight
            return gain * (self.stands_for / n_weight) < tol  # (a factor of exactly 1: the same test)
        oldest = int(self.visited.min())
        before = len(history) - 1 - (now - oldest + 1)  # the bound before the lap's first iteration
        if oldest < 2 or before < 0:
            return False
        return abs(history[-1] - history[before]) / n_weight < tol

    def total(self) -> KernelResult:
        """Every chunk's kept statistics reduced over the fixed tree (all chunks must have them)."""
        if not self.have.all():
            raise ConfigError("memoized statistics: a chunk has not been visited yet")
        total = self.ctx.engine.reduce_states(self.states)
        self.k = total.stats.n_components
        return total

    def invalidate(self) -> None:
        """An iteration outside :meth:`run` (a move round's pass, a birth proposal) set q(Z) and the
        components: no kept state describes them, so every chunk is visited next (a full pass that
        keeps its statistics)."""
        self.states = [None] * self.have.size
        self.have[:] = False
        self.moved[:] = np.inf
        self.k = -1
        self.rounds.clear()

    def replay(self, apply: Any) -> None:
        """A move round accepted moves: each chunk's kept statistics become ``apply(stats, h, alt,
        alt_h)`` of its regular statistics and its share of the round (:meth:`pipeline.fit.learners.moves.
        Moves.replay`), the statistics of the accepted q(Z) on its rows, so no pass revisits every
        chunk. Where a chunk lacks either, every chunk is visited next (:meth:`invalidate`)."""
        shares = [s for s in self.rounds.parts if s is not None]
        if not self.have.all() or len(shares) < len(self.rounds.parts):
            self.invalidate()
            return
        parts = self.ctx.engine.fetch_states(self.states)
        new = [KernelResult(apply(p.stats, s.h, s.alt, s.alt_h), p.log_norm, p.log_norm_m2)
               for p, s in zip(parts, shares, strict=True)]
        self.states = list(self.ctx.engine.place_states(new, self.ctx.handles))
        self.k = new[0].stats.n_components if new else -1
        self.rounds.clear()

    def snapshot(self) -> tuple[Any, ...]:
        """The kept states and bookkeeping, for :meth:`restore` (references: nothing is copied off
        the engine)."""
        return (list(self.states), self.have.copy(), self.moved.copy(), self.visited.copy(), self.k,
                self.rounds.snapshot())

    def restore(self, snap: tuple[Any, ...]) -> None:
        """Back to a :meth:`snapshot` (a refused birth proposal leaves q(Z) and q(theta) as they were)."""
        states, have, moved, visited, self.k, rounds = snap
        self.rounds.restore(rounds)
        self.states, self.have, self.moved = list(states), have.copy(), moved.copy()
        self.visited = visited.copy()

    def relabel(self, order: np.ndarray) -> None:
        """The components became ``order`` (old indices, new order): every kept state follows."""
        order = np.asarray(order, dtype=np.int64)
        self.rounds.relabel(order)
        if not self.have.any() or (order.size == self.k and np.array_equal(order, np.arange(self.k))):
            return
        self.k = order.size  # (rare: gathered, taken and placed back where the chunks live)
        parts = [take_memo(p, order) for p in self.ctx.engine.fetch_states(self.states)]
        self.states = list(self.ctx.engine.place_states(parts, self.ctx.handles))

    # ---- checkpoints and warm starts -----------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Every kept result stacked over the chunks (chunks without one are zero and flagged), the
        driver's bookkeeping and the chunk keys."""
        parts = self.ctx.engine.fetch_states(self.states)
        self.states = restart_lineage(self.ctx, self.states, parts)
        out = {_PREFIX + "have": self.have, _PREFIX + "moved": self.moved, _PREFIX + "visited": self.visited,
               _PREFIX + "fresh": self.fresh, _PREFIX + "keys": np.asarray(self.keys, dtype=str),
               _PREFIX + "weight": self.weight, _PREFIX + "last": self._last()}
        out.update(self.rounds.state(_ROUND))
        out.update(stack_stats([None if p is None else p.stats for p in parts], _PREFIX))
        for name in ("log_norm", "log_norm_m2"):
            out[_PREFIX + name] = np.asarray([0.0 if p is None else float(getattr(p, name)) for p in parts])
        return out

    def _last(self) -> np.ndarray:
        """What the last run or round measured, which :meth:`converged` reads after an iteration that
        visits nothing (a refused birth proposal made without a pass): a checkpoint keeps it, so a
        fit resumed there converges where the uninterrupted one does."""
        return np.asarray([self.last_weight, self.stands_for, float(self.absorbed), float(self.last_full)])

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Resume: the kept results and bookkeeping of :meth:`state` (the same bits)."""
        self.have = np.asarray(arrays[_PREFIX + "have"], dtype=bool).copy()
        self.moved = np.asarray(arrays[_PREFIX + "moved"], dtype=np.float64).copy()
        self.visited = np.asarray(arrays[_PREFIX + "visited"], dtype=np.int64).copy()
        self.fresh = np.asarray(arrays.get(_PREFIX + "fresh", np.ones(self.have.size)), dtype=bool).copy()
        parts = _results(arrays, range(self.have.size), self.have)
        self.states = list(self.ctx.engine.place_states(parts, self.ctx.handles))
        self.weight = _weights(parts)
        self.k = next((p.stats.n_components for p in parts if p is not None), -1)
        self.rounds.load(arrays, _ROUND, list(range(self.have.size)))
        if _PREFIX + "last" in arrays:  # (checkpoints of vbcluster before issue 53 keep neither)
            self.weight = np.asarray(arrays[_PREFIX + "weight"], dtype=np.float64).copy()
            last_weight, self.stands_for, absorbed, full = (float(v) for v in arrays[_PREFIX + "last"])
            self.last_weight, self.absorbed, self.last_full = last_weight, bool(absorbed), bool(full)

    def adopt(self, arrays: Mapping[str, np.ndarray], n_components: int) -> int:
        """Warm start: take the kept results of a previous fit (its :meth:`state`) for every chunk
        whose key matches and whose shift and number of components are this fit's. Returns the
        number of chunks adopted."""
        if _PREFIX + "nk" not in arrays or arrays[_PREFIX + "nk"].shape[1] != n_components:
            return 0
        if not np.array_equal(arrays[_PREFIX + "shift"], self.ctx.shift):
            return 0
        old = {str(k): i for i, k in enumerate(arrays[_PREFIX + "keys"].tolist())
               if k and bool(arrays[_PREFIX + "have"][i])}
        src = [old.get(k, -1) if k else -1 for k in self.keys]
        take = np.asarray([j >= 0 for j in src], dtype=bool)
        parts = _results(arrays, src, take)
        self.states = list(self.ctx.engine.place_states(parts, self.ctx.handles))
        self.have, self.fresh, self.weight = take.copy(), ~take, _weights(parts)
        self.moved = np.where(take, 0.0, np.inf)
        self.visited = np.zeros(take.size, dtype=np.int64)
        self.rounds.load(arrays, _ROUND, src)
        return int(take.sum())


def kept_total(arrays: Mapping[str, np.ndarray]) -> KernelResult:
    """The kept results of :meth:`MemoStats.state` (every chunk must have one) reduced over the fixed
    tree: the global statistics of the fit's last iteration, the bits of :meth:`MemoStats.total`."""
    have = np.asarray(arrays[_PREFIX + "have"], dtype=bool)
    if have.size == 0 or not have.all():
        raise ConfigError("memoized statistics: a chunk has not been visited yet")
    return tree_reduce(_results(arrays, range(have.size), have))


def _weights(parts: list[KernelResult | None]) -> np.ndarray:
    """Each kept result's weight (NaN where none)."""
    return np.asarray([np.nan if p is None else float(p.stats.total_weight) for p in parts])


def _results(arrays: Mapping[str, np.ndarray], rows: Any, present: np.ndarray) -> list[KernelResult | None]:
    """The kept results of rows ``rows`` of the stacked arrays (None where not ``present``; all None
    after a move round that accepted a move: a checkpoint then keeps no statistics)."""
    stats = unstack_stats(arrays, _PREFIX, rows, present)
    return [None if s is None else KernelResult(s, float(arrays[_PREFIX + "log_norm"][j]),
                                                float(arrays[_PREFIX + "log_norm_m2"][j]))
            for j, s in zip(rows, stats, strict=True)]
