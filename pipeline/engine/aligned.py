"""Aligned arrays for the kernels: the same bits whatever byte offset a message put an array at.

An array that crossed the network (a Dask worker's chunk fetched from another worker, a pass's
parameters, a result gathered on the driver) is rebuilt on the bytes of the message that carried
it, at whatever offset its frame had there: a float32 array may start at an address that is not a
multiple of 4, a float64 one of 8 (``ndarray.flags.aligned`` False). NumPy's ``matmul`` sends only
aligned arrays to BLAS and computes the others in a loop of its own, which sums in another order:
``block.T @ z`` of an unaligned float32 block differs from the aligned block's in the last bits.
So the Dask engine's bits depended on which worker ran a task and on the layout of the messages
(the randomized projection pass with chunks kept on the workers, after other tests had run in the
process). :func:`aligned` copies the unaligned arrays a kernel is given (rarely any: a copy costs
one pass over the array) so that every product goes to BLAS, on either engine.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

#: dataclass and tuple levels searched for arrays (a MoveParams holds an EStepParams holding arrays)
DEPTH = 3


def aligned(value: Any, depth: int = DEPTH) -> Any:
    """``value`` with every NumPy array it holds aligned: itself, a dataclass's fields, a tuple's
    items, ``depth`` levels down; unaligned arrays are copied, everything else is returned as it is
    (the same object when nothing needed a copy)."""
    if isinstance(value, np.ndarray):
        return value if value.flags.aligned else value.copy()
    if depth <= 0:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name, None)
            new = aligned(old, depth - 1) if f.init else old
            if new is not old:
                changed[f.name] = new
        return dataclasses.replace(value, **changed) if changed else value
    if type(value) is tuple:
        items = tuple(aligned(v, depth - 1) for v in value)
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value
