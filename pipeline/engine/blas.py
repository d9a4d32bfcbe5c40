"""One BLAS thread per kernel: the engines' rule for bits that do not depend on thread counts.

OpenBLAS sums a large GEMM in another order with another thread count. The in-process engine holds
:func:`one_blas_thread` for each pass and runs chunks on its own thread pool; a Dask worker pins one
BLAS thread for its life (:func:`pin_one_blas_thread`) before every kernel.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_BLAS = threading.Lock()
_blas_users = 0
_blas_limiter: Any = None


@functools.cache
def _blas_controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS limited to one thread (process-wide) while any caller is inside; the first to enter
    sets the limit, the last to leave restores the previous setting.

    threadpoolctl's limits are process-wide, so concurrent kernels (a thread pool in-process, a
    Dask worker with several threads) share one reference-counted limit instead of each setting and
    restoring their own (which would let one thread restore the default under another's GEMM).
    """
    global _blas_users, _blas_limiter
    with _BLAS:
        if _blas_users == 0:
            _blas_limiter = _blas_controller().limit(limits=1, user_api="blas")
        _blas_users += 1
    try:
        yield
    finally:
        with _BLAS:
            _blas_users -= 1
            if _blas_users == 0:
                _blas_limiter.restore_original_limits()
                _blas_limiter = None


_pinned_at = -1  # len(sys.modules) when BLAS was last pinned (-1: never)


def pin_one_blas_thread() -> None:
    """Limit BLAS to one thread in this process for good (a Dask worker, before each kernel).

    A worker process exists to run kernels, and Dask's nanny starts it with one BLAS thread by
    default; pinning makes that a guarantee whatever its environment (``OPENBLAS_NUM_THREADS``, a
    ``--no-nanny`` worker), without set/restore calls from the worker's concurrent task threads.
    Pinning again costs a few milliseconds (threadpoolctl scans the loaded libraries), so it is
    repeated only when modules were imported since the last time: a newly loaded BLAS (SciPy's
    OpenBLAS, loaded on first import) is then pinned too.
    """
    global _pinned_at
    if _pinned_at == len(sys.modules):
        return
    with _BLAS:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")  # not restored: the process keeps one thread
        _pinned_at = len(sys.modules)


def default_threads() -> int:
    """Threads of the in-process engine's pool: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def blas_libraries() -> list[str]:
    """The BLAS libraries loaded in this process, one line each: implementation, version, the kernel
    it chose for this CPU (OpenBLAS's core type) and its threads (benchmarks print it next to timings)."""
    from threadpoolctl import threadpool_info

    return [f"{i['internal_api']} {i.get('version')} kernel={i.get('architecture')} "
            f"threads={i['num_threads']} ({os.path.basename(i['filepath'])})"
            for i in threadpool_info() if i.get("user_api") == "blas"]
