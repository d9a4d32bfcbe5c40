"""The array backends a chunk kernel runs on: NumPy on the host, or CuPy on a CUDA device.

The kernels are written once against the array API (``vbcore.kernels.estep.array_namespace``);
what differs between the backends is where a chunk's rows live (:func:`on_backend`) and how many of
the in-process engine's chunks may start together (:func:`first_chunk_alone`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vbcore.errors import ConfigError

ARRAY_BACKENDS = ("numpy", "cupy")


def check_backend(array_backend: str) -> None:
    """Refuse an unknown backend, or 'cupy' where CuPy cannot be imported (one line, no traceback)."""
    if array_backend not in ARRAY_BACKENDS:
        raise ConfigError(f"array_backend must be one of {ARRAY_BACKENDS}, got {array_backend!r}")
    if array_backend == "cupy":
        try:
            import cupy  # noqa: F401
        except Exception as exc:  # ImportError, or CUDA libraries failing to load
            raise ConfigError(
                "array_backend 'cupy' needs CuPy and a CUDA device: pip install 'vbcluster[gpu]' "
                f"({type(exc).__name__}: {exc})"
            ) from None


def on_backend(array_backend: str, prep: Callable[..., Any], rows: Any, *args: Any) -> Any:
    """Move a chunk's rows to the array backend (CuPy: device memory) before preparing it."""
    if array_backend == "cupy":
        import cupy

        rows = cupy.asarray(rows)
    return prep(rows, *args)


def first_chunk_alone(array_backend: str) -> bool:
    """Whether the in-process engine prepares, and runs a pass on, its first chunk before the others
    start: on a device backend.

    CuPy compiles each elementwise and reduction kernel on its first use in a process, and every
    thread that asks for a kernel still being compiled compiles it again. On an H100 machine with
    16 threads, the first move round of a SUN397-shaped fit (K = 1000) spent over 60 s compiling the
    same kernels in up to 14 threads (scripts/gpu_profile.sh, docs/benchmarks.md "GPU"); a first
    chunk run alone compiles each kernel once, and the other chunks find them compiled. The results
    do not change: chunks are independent and reduced in chunk order.
    """
    return array_backend != "numpy"
