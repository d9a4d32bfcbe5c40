"""Dask's ``sizeof`` for the dataclasses the engines move (chunk statistics, prepared chunks, state)."""

from __future__ import annotations

import sys
from typing import Any


def register_sizes() -> None:
    """Teach Dask the size of dataclass results (chunk statistics, prepared chunks, learner state).

    Dask's ``sizeof`` falls back to ``sys.getsizeof`` for objects it does not know: a 65 MB K x D
    ``SuffStats`` counted as ~56 bytes, so its memory limits, spilling, transfer counters and the
    choice of where a merge runs ignored the arrays inside. Registered for ``object``, it sums the
    fields of dataclasses and falls back to ``sys.getsizeof`` for anything else, as Dask's default
    does. Runs where pipeline.engine.engines is imported: the driver, and every worker on its first kernel.
    """
    try:
        from dask.sizeof import sizeof
    except ImportError:  # the in-process engine does not need Dask
        return
    import dataclasses

    @sizeof.register(object)
    def _sizeof_object(o: Any) -> int:
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return 64 + sum(int(sizeof(getattr(o, f.name))) for f in dataclasses.fields(o))
        return int(sys.getsizeof(o))
