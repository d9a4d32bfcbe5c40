"""A move round on memoized statistics: each chunk's share of the last round, kept.

A move round's pass (:func:`vbcore.moves.estep_pass.move_kernel`) returns, per chunk, the regular statistics
and three extras: the merge pairs' entropy changes ``h``, the statistics of the delete proposal's
q(Z) (``alt``) and its pairs' ``alt_h``. With memoized statistics (:mod:`pipeline.fit.learners.vbem.memo`) the
regular statistics are kept per chunk; this module keeps the extras too (on the driver, where the
round's results arrive), together with the proposal they answer (the deleted components and the
pairs, in the current indexing).

The next round whose proposal they serve -- the same delete set and pairs among the kept ones; a
round with no proposal is always served -- visits only the chunks without a kept share (visited by a
regular iteration since, or new) and the ones a regular iteration would visit, and takes the others'
kept shares (Hughes & Sudderth 2013 keep each batch's merge entropies the same way). The round is
still exact: its q(Z) is every chunk's kept one (the regular statistics' responsibilities), and the
extras of a chunk not visited were computed from those very responsibilities. So a refresh after an
append, whose round proposes what the previous fit's last round refused, no longer pays a full pass
for it. A relabelling that is not a permutation of the components (pruning, a birth, an accepted
move) forgets the kept shares; the next round is then a full pass, as without them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vbcore.model.stats import SuffStats
from vbcore.moves.estep_pass import MoveParams, MoveResult
from vbcore.moves.exact import reindex_pairs

#: SuffStats array fields stacked over the chunks (:func:`stack_stats`)
STATS_FIELDS = ("nk", "mean", "scatter")
_EMPTY = np.zeros((0, 2), dtype=np.int64)


def stack_stats(parts: Sequence[SuffStats | None], prefix: str) -> dict[str, np.ndarray]:
    """Per-chunk statistics stacked over the chunks under ``prefix`` (zeros where None; nothing at
    all when every one is None): the arrays of a checkpoint."""
    ref = next((p for p in parts if p is not None), None)
    if ref is None:
        return {}
    out = {prefix + name: np.stack([np.zeros_like(getattr(ref, name)) if p is None else getattr(p, name)
                                    for p in parts]) for name in STATS_FIELDS}
    for name, get in (("sum_rlogr", lambda p: p.sum_rlogr), ("n_rows", lambda p: p.n_rows),
                      ("weight", lambda p: np.nan if p.weight is None else p.weight)):
        out[prefix + name] = np.asarray([0.0 if p is None else float(get(p)) for p in parts])
    out[prefix + "shift"] = ref.shift
    out[prefix + "pooled"] = np.asarray(ref.pooled)
    return out


def unstack_stats(arrays: Mapping[str, np.ndarray], prefix: str, rows: Sequence[int],
                  present: np.ndarray) -> list[SuffStats | None]:
    """The statistics of rows ``rows`` of :func:`stack_stats`'s arrays (None where not ``present``)."""
    if not np.any(present):
        return [None] * len(present)
    shift, pooled = arrays[prefix + "shift"], bool(arrays[prefix + "pooled"])
    out: list[SuffStats | None] = []
    for j, ok in zip(rows, present, strict=True):
        if not ok:
            out.append(None)
            continue
        w = float(arrays[prefix + "weight"][j])
        out.append(SuffStats(nk=arrays[prefix + "nk"][j].copy(), mean=arrays[prefix + "mean"][j].copy(),
                             scatter=arrays[prefix + "scatter"][j].copy(),
                             sum_rlogr=float(arrays[prefix + "sum_rlogr"][j]),
                             n_rows=int(arrays[prefix + "n_rows"][j]), shift=shift, pooled=pooled,
                             weight=None if math.isnan(w) else w))
    return out


@dataclass(frozen=True)
class RoundPart:
    """A chunk's share of a round beyond its regular statistics (a :class:`MoveResult` without them)."""

    h: np.ndarray
    alt: SuffStats | None
    alt_h: np.ndarray

    def merge(self, other: RoundPart) -> RoundPart:
        alt = None if self.alt is None or other.alt is None else self.alt.merge(other.alt)
        return RoundPart(self.h + other.h, alt, self.alt_h + other.alt_h)


def part_of(res: MoveResult) -> RoundPart:
    return RoundPart(res.h, res.alt, res.alt_h)


def _deleted(params: MoveParams, k: int) -> np.ndarray:
    if params.keep is None:
        return np.zeros(0, dtype=np.int64)
    return np.setdiff1d(np.arange(k), np.asarray(params.keep, dtype=np.int64))


def _positions(pairs: np.ndarray) -> dict[tuple[int, int], int]:
    """Row of each (unordered) pair."""
    return {(min(a, b), max(a, b)): i for i, (a, b) in enumerate(np.asarray(pairs).reshape(-1, 2).tolist())}


def _gather(table: dict[tuple[int, int], int], pairs: np.ndarray) -> np.ndarray | None:
    rows = [table.get((min(a, b), max(a, b))) for a, b in np.asarray(pairs).reshape(-1, 2).tolist()]
    return None if any(r is None for r in rows) else np.asarray(rows, dtype=np.int64)


#: (rows of the kept ``h`` for the proposal's pairs, rows of the kept ``alt_h`` for its kept pairs);
#: None: no proposal (every chunk is served with empty extras)
Maps = tuple[np.ndarray, np.ndarray] | None


class RoundMemo:
    """The kept round shares of one memoized fit (see the module docstring)."""

    def __init__(self, n_chunks: int) -> None:
        self.parts: list[RoundPart | None] = [None] * n_chunks
        self.deletes = np.zeros(0, dtype=np.int64)
        self.pairs = _EMPTY
        self.k = -1  # components of the round the shares answer (-1: none kept)

    def lookup(self, params: MoveParams, k: int) -> tuple[bool, Maps]:
        """Whether the kept shares serve the round ``params`` for ``k`` components, and how."""
        if params.keep is None and params.pairs.shape[0] == 0:
            return True, None
        if k != self.k or not np.array_equal(_deleted(params, k), self.deletes):
            return False, None
        hi = _gather(_positions(self.pairs), params.pairs)
        if hi is None:
            return False, None
        ai = np.zeros(0, dtype=np.int64)
        if params.keep is not None:
            keep = np.asarray(params.keep, dtype=np.int64)
            found = _gather(_positions(reindex_pairs(self.pairs, keep, k)), params.keep_pairs)
            if found is None:
                return False, None
            ai = found
        return True, (hi, ai)

    def missing(self, maps: Maps) -> np.ndarray:
        """The chunks the round must visit to be served (those without a kept share)."""
        if maps is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero([p is None for p in self.parts])

    def serve(self, params: MoveParams, k: int, maps: Maps,
              fresh: Mapping[int, RoundPart]) -> list[RoundPart]:
        """Every chunk's share of the round ``params``: ``fresh`` where visited, the kept one (its
        rows for this proposal) elsewhere; kept as the shares of this round."""
        empty = RoundPart(np.zeros(params.pairs.shape[0]), None, np.zeros(params.keep_pairs.shape[0]))
        out = []
        for c, old in enumerate(self.parts):
            if c in fresh:
                out.append(fresh[c])
            elif maps is None:
                out.append(empty)
            else:
                assert old is not None, "a chunk without a kept share is visited"
                out.append(RoundPart(old.h[maps[0]], old.alt, old.alt_h[maps[1]]))
        self.parts = list(out)
        self.deletes, self.pairs, self.k = _deleted(params, k), np.asarray(params.pairs).reshape(-1, 2), k
        return out

    def forget(self, chunks: Sequence[int]) -> None:
        """The chunks' regular statistics changed (a regular visit): their shares no longer match."""
        for c in chunks:
            self.parts[int(c)] = None

    def clear(self) -> None:
        self.parts = [None] * len(self.parts)
        self.deletes, self.pairs, self.k = np.zeros(0, dtype=np.int64), _EMPTY, -1

    def relabel(self, order: np.ndarray) -> None:
        """The components became ``order`` (old indices, new order): a permutation carries the shares
        over (the delete proposal's statistics re-ordered to the new kept components); anything else
        forgets them."""
        k = self.k
        if k < 0 or np.array_equal(order, np.arange(k)):
            return
        if order.size != k or not np.array_equal(np.sort(order), np.arange(k)):
            self.clear()
            return
        inv = np.argsort(order)
        deletes = np.sort(inv[self.deletes])
        keep_old = np.setdiff1d(np.arange(k), self.deletes)
        keep_new = np.setdiff1d(np.arange(k), deletes)
        pos = np.full(k, -1, dtype=np.int64)
        pos[keep_old] = np.arange(keep_old.size)
        take = pos[order[keep_new]]
        self.parts = [None if p is None else RoundPart(p.h, None if p.alt is None else p.alt.take(take),
                                                       p.alt_h) for p in self.parts]
        self.deletes, self.pairs = deletes, inv[self.pairs]

    # -- checkpoints and warm starts ---------------------------------------------------------------
    def snapshot(self) -> tuple[Any, ...]:
        return list(self.parts), self.deletes, self.pairs, self.k

    def restore(self, snap: tuple[Any, ...]) -> None:
        parts, self.deletes, self.pairs, self.k = snap
        self.parts = list(parts)

    def state(self, prefix: str) -> dict[str, np.ndarray]:
        have = np.asarray([p is not None for p in self.parts], dtype=bool)
        out = {prefix + "have": have, prefix + "k": np.asarray(self.k), prefix + "deletes": self.deletes,
               prefix + "pairs": self.pairs}
        if not have.any():
            return out
        ref = next(p for p in self.parts if p is not None)
        for name in ("h", "alt_h"):
            zero = np.zeros_like(getattr(ref, name))
            out[prefix + name] = np.stack([zero if p is None else getattr(p, name) for p in self.parts])
        out.update(stack_stats([None if p is None else p.alt for p in self.parts], prefix + "alt."))
        return out

    def load(self, arrays: Mapping[str, np.ndarray], prefix: str, src: Sequence[int]) -> None:
        """The shares of :meth:`state`'s arrays, row ``src[c]`` for chunk ``c`` (-1: none)."""
        self.clear()
        if prefix + "have" not in arrays:  # (a checkpoint of a version without kept shares)
            return
        have = np.asarray(arrays[prefix + "have"], dtype=bool)
        take = np.asarray([j >= 0 and bool(have[j]) for j in src], dtype=bool)
        if not take.any():
            return
        rows = [max(j, 0) for j in src]
        alts = unstack_stats(arrays, prefix + "alt.", rows, take) if prefix + "alt.nk" in arrays \
            else [None] * len(rows)
        h, alt_h = arrays[prefix + "h"], arrays[prefix + "alt_h"]
        self.parts = [RoundPart(h[j].copy(), a, alt_h[j].copy()) if ok else None
                      for j, ok, a in zip(rows, take, alts, strict=True)]
        self.k = int(arrays[prefix + "k"])
        self.deletes = np.asarray(arrays[prefix + "deletes"], dtype=np.int64).reshape(-1)
        self.pairs = np.asarray(arrays[prefix + "pairs"], dtype=np.int64).reshape(-1, 2)
