"""Where an array lives: the array-API namespace of NumPy, CuPy and other conforming arrays, and copies
to the host. The kernels (``vbcore.kernels``) compute in the namespace of their chunk's rows, and
the statistics (``vbcore.model.stats``) merge in the namespace of their arrays, so that a device
engine keeps its chunks' statistics on the device until the reduction's result crosses to the host
once a pass.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

Array = Any


def array_namespace(x: Array) -> Any:
    """The array-API namespace of ``x``: numpy for NumPy arrays, a standard-conforming view of cupy
    for CuPy arrays (CuPy 14 has no ``__array_namespace__`` and no ``vecdot``), else the array's own
    ``__array_namespace__()`` (array-api-strict and other conforming libraries)."""
    if isinstance(x, np.ndarray):
        return np
    if type(x).__module__.startswith("cupy"):
        return _cupy_namespace()
    if hasattr(x, "__array_namespace__"):
        return x.__array_namespace__()
    return np


@functools.cache
def _cupy_namespace() -> Any:
    import cupy

    ns = types.SimpleNamespace(**{k: getattr(cupy, k) for k in dir(cupy) if not k.startswith("_")})
    if not hasattr(cupy, "vecdot"):  # real inputs only, which is all the kernels use
        ns.vecdot = lambda a, b, /, *, axis=-1: cupy.sum(a * b, axis=axis)
    if not hasattr(cupy, "matrix_transpose"):
        ns.matrix_transpose = lambda a, /: cupy.swapaxes(a, -1, -2)
    if not hasattr(cupy, "concat"):
        ns.concat = lambda arrays, /, *, axis=0: cupy.concatenate(arrays, axis=axis)
    if not hasattr(cupy, "astype"):
        ns.astype = lambda a, dtype, /, *, copy=True: a.astype(dtype, copy=copy)
    return ns


def to_numpy(x: Array) -> np.ndarray:
    """Copy a (possibly device) array to a float64 NumPy array.

    NumPy arrays and scalars pass straight through ``np.asarray``; CuPy arrays are copied to the host
    with ``.get()``; any other array-API array (on the host) is imported with ``np.from_dlpack``,
    the standard's interchange route (``__array__`` is not part of the standard).
    """
    if isinstance(x, np.ndarray | np.generic):
        pass
    elif hasattr(x, "get"):  # CuPy
        x = x.get()
    elif hasattr(x, "__dlpack__"):
        x = np.from_dlpack(x)
    return np.asarray(x, dtype=np.float64)


def to_host(x: Array) -> np.ndarray:
    """Copy a (possibly device) array to a NumPy array of the same dtype (no float64 cast)."""
    if isinstance(x, np.ndarray | np.generic):
        return np.asarray(x)
    if hasattr(x, "get"):  # CuPy
        return np.asarray(x.get())
    return np.asarray(np.from_dlpack(x) if hasattr(x, "__dlpack__") else x)
