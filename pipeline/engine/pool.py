"""The in-process engine's thread pool: calls run ``workers`` at a time, their results in call order
(:func:`in_pool`), or folded into the engines' fixed reduction tree as they come
(:func:`fold_in_pool`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipeline.engine.tree import TreeFold


def fold_in_pool(calls: Sequence[Callable[[], Any]], workers: int, first_alone: bool, prefix: str,
                 merge: Callable[[Any, Any], Any]) -> Any:
    """``tree_reduce([call() for call in calls], merge)`` -- the same tree, the same bits -- holding
    few results at once: the calls run ``workers`` at a time, at most ``2 workers`` ahead of the
    result being merged, and each result is folded in chunk order as soon as it is its turn
    (:class:`pipeline.engine.tree.TreeFold`). A pass over n chunks held all n results before its
    first merge (K x 2D float64 each: 65.5 MB at K = 1000, D = 4096)."""
    fold = TreeFold(merge)
    if workers <= 1 or len(calls) <= 1:
        for call in calls:
            fold.push(call())
        return fold.result()
    rest = calls
    if first_alone:
        fold.push(calls[0]())
        rest = calls[1:]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix) as pool:
        ahead = 2 * workers
        running: list[Any] = [pool.submit(call) for call in rest[:ahead]]
        for i in range(len(rest)):
            if i + ahead < len(rest):
                running.append(pool.submit(rest[i + ahead]))
            fold.push(running[i].result())
            running[i] = None  # the result is the fold's now
    return fold.result()


def in_pool(calls: Sequence[Callable[[], Any]], workers: int, first_alone: bool, prefix: str) -> list[Any]:
    """``call()`` of every call, results in order, ``workers`` at a time; ``first_alone``: the first
    one done before the others start (a device backend compiles its kernels once:
    :func:`pipeline.engine.backends.first_chunk_alone`)."""
    if workers <= 1:
        return [call() for call in calls]
    first = [calls[0]()] if first_alone and calls else []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix) as pool:
        return first + list(pool.map(lambda call: call(), calls[len(first):]))


__all__ = ["fold_in_pool", "in_pool"]
