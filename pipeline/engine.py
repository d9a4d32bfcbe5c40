"""Engines run ``map_reduce(kernel, chunks)``: a kernel on every chunk, reduced in chunk order.

This in-process engine is the reference every other engine must match bit for bit: results are
merged left to right in chunk order with float64 accumulators. The Dask engine (feature-store issue)
implements the same interface on a ``distributed.Client``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from vbcore.errors import ConfigError

R = TypeVar("R", bound="Mergeable")


class Mergeable(Protocol):
    def merge(self: R, other: R) -> R: ...


def row_slices(n_rows: int, chunk_rows: int) -> Iterator[slice]:
    """Consecutive row ranges of at most ``chunk_rows`` rows."""
    if int(chunk_rows) != chunk_rows or chunk_rows < 1:
        raise ConfigError(f"chunk_rows must be an integer >= 1, got {chunk_rows!r}")
    for start in range(0, n_rows, int(chunk_rows)):
        yield slice(start, min(start + int(chunk_rows), n_rows))


def reduce_in_order(results: Sequence[R]) -> R:
    """Left fold of ``merge`` in the given (chunk) order."""
    if not results:
        raise ValueError("nothing to reduce: there are no chunks")
    out = results[0]
    for r in results[1:]:
        out = out.merge(r)
    return out


class LocalEngine:
    """Runs kernels in this process over an in-memory list of chunks."""

    name = "local"

    def map(self, kernel: Callable[..., Any], chunks: Sequence[Any], *args: Any) -> list[Any]:
        return [kernel(c, *args) for c in chunks]

    def map_reduce(self, kernel: Callable[..., R], chunks: Sequence[Any], *args: Any) -> R:
        return reduce_in_order(self.map(kernel, chunks, *args))


def split_rows(x: np.ndarray, chunk_rows: int) -> list[np.ndarray]:
    return [x[s] for s in row_slices(x.shape[0], chunk_rows)]
