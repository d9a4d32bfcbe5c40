"""The engines' fixed reduction tree: pairs of chunk positions, level by level, so that every engine
merges the same results in the same order and gives the same bits.

:func:`tree_reduce` reduces a list; :class:`TreeFold` folds results pushed in chunk order into the same
tree as they come, holding only the roots of the complete subtrees so far (at most ``log2 n + 1``):
the in-process engine merges a pass's chunk results as they are ready instead of holding all of
them (``pipeline.engine.engines.LocalEngine.map_reduce``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _merge(a: Any, b: Any) -> Any:
    return a.merge(b)


def tree_pairs(n: int) -> list[list[tuple[int, int] | int]]:
    """The fixed reduction tree: per level, pairs of positions to merge (or a lone position)."""
    levels: list[list[tuple[int, int] | int]] = []
    while n > 1:
        level: list[tuple[int, int] | int] = [(i, i + 1) for i in range(0, n - 1, 2)]
        if n % 2:
            level.append(n - 1)
        levels.append(level)
        n = len(level)
    return levels


def tree_reduce(results: Sequence[Any], merge: Callable[[Any, Any], Any] = _merge) -> Any:
    """Reduce with the fixed pairwise tree of :func:`tree_pairs` (``merge`` may return futures)."""
    if not results:
        raise ValueError("nothing to reduce: there are no chunks")
    items = list(results)
    for level in tree_pairs(len(items)):
        items = [merge(items[p[0]], items[p[1]]) if isinstance(p, tuple) else items[p] for p in level]
    return items[0]


class TreeFold:
    """:func:`tree_reduce` of items pushed one by one in order: ``push`` merges two complete subtrees
    of equal size as soon as the right one is complete (a binary counter), ``result`` merges what is
    left from the right. The same merges, with the same operands on each side, as :func:`tree_pairs`'s
    levels for any number of items (tests/test_engines.py checks every count up to 600)."""

    def __init__(self, merge: Callable[[Any, Any], Any] = _merge) -> None:
        self.merge = merge
        self.stack: list[tuple[int, Any]] = []  # (level, root of a complete subtree of 2**level items)

    def push(self, item: Any) -> None:
        level = 0
        while self.stack and self.stack[-1][0] == level:
            item = self.merge(self.stack.pop()[1], item)
            level += 1
        self.stack.append((level, item))

    def result(self) -> Any:
        if not self.stack:
            raise ValueError("nothing to reduce: there are no chunks")
        item = self.stack.pop()[1]
        while self.stack:
            item = self.merge(self.stack.pop()[1], item)
        return item


__all__ = ["TreeFold", "tree_pairs", "tree_reduce"]
