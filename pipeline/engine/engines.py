"""Engines run kernels over the chunks of a row source and reduce the results.

One interface, two engines, one result:

* ``prepare(source, prep, *args)`` turns every chunk into a prepared object once (for VB EM: rows
  shifted and ``[x*x, x]`` cached), kept in memory (``persist``) or rebuilt from the source in
  every pass (streaming, when the data does not fit);
* ``map(kernel, handles, *args)`` runs ``kernel(prepared_chunk, *args)`` on every chunk and returns
  the results in chunk order; the ``args`` (the small global state) are sent once per pass;
* ``map_reduce(kernel, handles, *args)`` reduces those results with ``merge`` over a **fixed
  pairwise tree** of chunk indices ((0,1), (2,3), ... then pairs of pairs). Both engines use the same
  tree and float64 accumulators, so they give bitwise-identical results, and on Dask the merges run
  on the workers (only the final K x D statistics travel to the driver);
* ``map_keep(kernel, handles, states, *args)`` runs ``kernel(chunk, state, *args) -> (new_state,
  result)`` and keeps every ``new_state`` where its chunk was processed (objects in-process, futures on
  Dask) while the results are reduced as in ``map_reduce`` (or, with ``combine``, summed once on the
  driver in chunk order: a minibatch's sparse sums): per-chunk learner state (NCG's logits
  and search direction) never travels to the driver. ``fetch_states`` gathers it (checkpoints) and
  ``place_states`` puts gathered state back (resume).

**The same bits whatever the threads.** OpenBLAS splits a large GEMM differently for different thread
counts, so its last bits depend on them. Every kernel therefore runs with one BLAS thread -- in
process inside :func:`one_blas_thread` (held by the driver for the whole pass), on a Dask worker
pinned for the worker's life (:func:`pin_one_blas_thread`) -- and the engines parallelise over chunks
instead: the in-process engine with a pool of ``threads`` threads (NumPy releases the GIL in its
GEMMs), a Dask cluster with its workers x threads. Chunk results are reduced over the fixed tree in
chunk order, so a pass depends only on the data, the state and the chunking -- not on the BLAS
threads, the pool's threads, nor how many workers there are; nor on the byte offset at which an
array arrived from another process (:mod:`pipeline.engine.aligned`).
"""

from __future__ import annotations

import functools
import operator
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from pipeline.engine.aligned import aligned
from pipeline.engine.backends import ARRAY_BACKENDS, check_backend, first_chunk_alone, on_backend
from pipeline.engine.blas import default_threads, one_blas_thread, pin_one_blas_thread
from pipeline.engine.dask_sizes import register_sizes
from pipeline.engine.pool import fold_in_pool, in_pool
from pipeline.engine.sources import chunk_weights, load_prepared, prep_weighted
from pipeline.engine.tree import tree_pairs, tree_reduce
from vbcore.errors import ConfigError

__all__ = ["DaskEngine", "LocalEngine", "default_threads", "make_engine", "one_blas_thread",
           "pin_one_blas_thread", "tree_pairs", "tree_reduce"]

R = TypeVar("R", bound="Mergeable")

PERSIST_MODES = ("auto", "always", "never")
register_sizes()


class Mergeable(Protocol):
    """A per-chunk result that merges pairwise. One that may hold device arrays also has
    ``on_host()`` (``vbcore.kernels.estep.KernelResult``): ``map_reduce`` merges such results where
    they live and returns the reduced one on the host (:func:`on_host`)."""

    def merge(self: R, other: R) -> R: ...


def on_host(result: Any) -> Any:
    """``result.on_host()`` where the result has it (device arrays copied to the host once), else the
    result itself."""
    convert = getattr(result, "on_host", None)
    return result if convert is None else convert()


def row_slices(n_rows: int, chunk_rows: int) -> Iterator[slice]:
    """Consecutive row ranges of at most ``chunk_rows`` rows."""
    if int(chunk_rows) != chunk_rows or chunk_rows < 1:
        raise ConfigError(f"chunk_rows must be an integer >= 1, got {chunk_rows!r}")
    for start in range(0, n_rows, int(chunk_rows)):
        yield slice(start, min(start + int(chunk_rows), n_rows))


def split_rows(x: np.ndarray, chunk_rows: int) -> list[np.ndarray]:
    return [x[s] for s in row_slices(x.shape[0], chunk_rows)]


def _merge(a: R, b: R) -> R:
    return a.merge(b)


def _merge_owned(a: Any, b: Any) -> Any:
    """``a.merge_owned(b)`` (into ``a``'s buffers, same bits) where it exists: local results only."""
    return getattr(a, "merge_owned", a.merge)(b)


@dataclass(frozen=True)
class Lazy:
    """A chunk that is loaded and prepared inside every pass (streaming)."""

    source: Any
    index: int
    prep: Callable[..., Any]
    args: tuple[Any, ...]

    def get(self) -> Any:
        return load_prepared(self.source, self.index, self.prep, *self.args)


def _materialise(handle: Any) -> Any:
    if isinstance(handle, Lazy):
        return handle.get()
    if isinstance(handle, tuple) and handle and handle[0] == "prep-rows":
        # ("prep-rows", rows, prep, args): the rows are a task's result; Dask resolved the future
        _, rows, prep, args, *w = handle
        return prep_weighted(prep, aligned(rows), w[0] if w else None, *aligned(args))
    return handle


def _apply(kernel: Callable[..., Any], handle: Any, *args: Any) -> Any:
    chunk = aligned(_materialise(handle))  # (a chunk or parameters from another worker: any offset)
    with one_blas_thread():
        return kernel(chunk, *aligned(args))


def _apply_item(kernel: Callable[..., Any], handle: Any, item: Any, *args: Any) -> Any:
    chunk = aligned(_materialise(handle))
    with one_blas_thread():
        return kernel(chunk, aligned(item), *aligned(args))


def _apply_pinned(kernel: Callable[..., Any], handle: Any, *args: Any) -> Any:
    """:func:`_apply` on a Dask worker: BLAS pinned to one thread for the worker's life."""
    pin_one_blas_thread()
    return _apply(kernel, handle, *args)


def _apply_item_pinned(kernel: Callable[..., Any], handle: Any, item: Any, *args: Any) -> Any:
    pin_one_blas_thread()
    return _apply_item(kernel, handle, item, *args)


def _prep_pinned(prep: Callable[..., Any], rows: Any, *args: Any) -> Any:
    """``prep`` on a Dask worker with BLAS pinned to one thread (a projection's GEMM)."""
    pin_one_blas_thread()
    return prep(aligned(rows), *aligned(args))


def _identity(value: Any) -> Any:
    return value


def streamed(prep: Callable[..., Any]) -> Callable[..., Any]:
    """The variant of ``prep`` for chunks rebuilt in every pass (``prep.streamed``: for VB EM's
    :func:`vbcore.kernels.estep.prepare_chunk`, no ``[x*x, x]`` cache; the same bits), else ``prep``."""
    return getattr(prep, "streamed", prep)


def prepared_nbytes(source: Any, expansion: float) -> float:
    return float(source.n_rows) * source.n_features * np.dtype(source.dtype).itemsize * expansion


class LocalEngine:
    """Runs kernels in this process, ``threads`` chunks at a time, each with one BLAS thread.

    Parameters
    ----------
    persist : {'always', 'auto', 'never'}
    memory_limit : float
        Bytes; ``persist='auto'`` keeps prepared chunks when they take at most half of it.
    array_backend : {'numpy', 'cupy'}
    threads : int, optional
        Chunks processed at once (default: the cores this process may use). The result does not
        depend on it (see the module's docstring); one chunk is one thread's work, so a source with
        fewer chunks than threads leaves some threads idle. On a device backend the first chunk of
        each pass (and of the preparation) runs alone first
        (:func:`pipeline.engine.backends.first_chunk_alone`).
    """

    name = "local"

    def __init__(self, persist: str = "always", memory_limit: float = 4e9,
                 array_backend: str = "numpy", threads: int | None = None) -> None:
        if persist not in PERSIST_MODES:
            raise ConfigError(f"persist must be one of {PERSIST_MODES}, got {persist!r}")
        check_backend(array_backend)
        if threads is not None and (isinstance(threads, bool) or int(threads) != threads or threads < 1):
            raise ConfigError(f"threads must be an integer >= 1, got {threads!r}")
        self.persist = persist
        self.memory_limit = memory_limit
        self.array_backend = array_backend
        self.threads = default_threads() if threads is None else int(threads)

    def prepare(self, source: Any, prep: Callable[..., Any], *args: Any, expansion: float = 1.0,
                persist: str | None = None) -> list[Any]:
        """Prepared chunks (``prep(rows, *args)``), kept or rebuilt in every pass; ``expansion`` is
        the prepared size over the source's; ``persist`` overrides the engine's mode for this call
        (``'never'``: a pass that reads the data once)."""
        mode = self.persist if persist is None else persist
        keep = mode == "always" or (
            mode == "auto" and prepared_nbytes(source, expansion) <= 0.5 * self.memory_limit
        )
        prep = prep if keep else streamed(prep)
        if self.array_backend != "numpy":
            prep = functools.partial(on_backend, self.array_backend, prep)
        n = len(source.chunk_slices())
        if not keep:
            return [Lazy(source, i, prep, args) for i in range(n)]
        # load and prepare a few chunks at a time: decompression and the shift release the GIL, so
        # a store's chunks decode on every core (results in chunk order; chunks are independent);
        # one BLAS thread, as in a pass (a projection's GEMM gives the bits of every engine)
        workers = max(1, min(n, os.cpu_count() or 1, 4))
        with one_blas_thread():
            calls = [functools.partial(load_prepared, source, i, prep, *args) for i in range(n)]
            return in_pool(calls, workers, first_chunk_alone(self.array_backend), "vbcluster-load")

    @staticmethod
    def _calls(kernel: Callable[..., Any], handles: Sequence[Any], args: tuple[Any, ...],
               per_chunk: Sequence[Any] | None) -> list[Callable[[], Any]]:
        if per_chunk is None:
            return [functools.partial(_apply, kernel, h, *args) for h in handles]
        return [functools.partial(_apply_item, kernel, h, item, *args)
                for h, item in zip(handles, per_chunk, strict=True)]

    def map(self, kernel: Callable[..., Any], handles: Sequence[Any], *args: Any,
            per_chunk: Sequence[Any] | None = None) -> list[Any]:
        """``kernel(chunk, *args)``, or ``kernel(chunk, per_chunk[i], *args)``, for every chunk; the
        results in chunk order."""
        calls = self._calls(kernel, handles, args, per_chunk)
        workers = min(self.threads, len(calls))
        with one_blas_thread():  # held for the whole pass: the kernels' own entries only count
            return in_pool(calls, workers, first_chunk_alone(self.array_backend), "vbcluster-pass")

    def map_reduce(self, kernel: Callable[..., R], handles: Sequence[Any], *args: Any,
                   per_chunk: Sequence[Any] | None = None) -> R:
        """:meth:`map`'s results reduced over the fixed tree, each merged as soon as the tree allows."""
        calls = self._calls(kernel, handles, args, per_chunk)
        if not calls:
            raise ValueError("nothing to reduce: there are no chunks")
        with one_blas_thread():
            first = first_chunk_alone(self.array_backend)
            return on_host(fold_in_pool(calls, min(self.threads, len(calls)), first, "vbcluster-pass",
                                        _merge_owned))

    def map_keep(self, kernel: Callable[..., tuple[Any, R]], handles: Sequence[Any], states: Sequence[Any],
                 *args: Any, combine: Callable[[list[R]], R] | None = None) -> tuple[list[Any], R]:
        """``kernel(chunk, state, *args) -> (new_state, result)`` on every chunk: the new states (in
        chunk order) and the results reduced over the fixed tree, or ``combine``d on the driver in
        chunk order (for results whose pairwise merges rewrite growing unions: a minibatch's)."""
        pairs = self.map(kernel, handles, *args, per_chunk=states)
        res = [p[1] for p in pairs]
        return [p[0] for p in pairs], tree_reduce(res, _merge_owned) if combine is None else combine(res)

    def reduce_states(self, states: Sequence[Any]) -> Any:
        """Kept results (memoized statistics) reduced over the fixed tree: :meth:`map_reduce`'s bits."""
        return tree_reduce(list(states), _merge)  # never merge_owned: the states stay kept

    def fetch_states(self, states: Sequence[Any], convert: Callable[[Any], Any] | None = None) -> list[Any]:
        """The per-chunk states (``convert`` applied to each, where it lives), in chunk order."""
        return [s if convert is None else convert(s) for s in states]

    def place_states(self, states: Sequence[Any], handles: Sequence[Any]) -> list[Any]:
        """Per-chunk states ready for ``map_keep`` (in-process: as they are)."""
        return list(states)

    def release(self, handles: Sequence[Any]) -> None:
        """Drop prepared chunks (nothing to do in-process)."""

    def close(self) -> None:
        """Nothing to shut down."""


class DaskEngine:
    """Runs kernels on a ``distributed.Client``, next to the data.

    Prepared chunks are persisted in worker memory when they fit (``persist='auto'``: at most half
    of the workers' total memory limit), otherwise every pass loads them from the source on the
    workers (Zarr stores are read by the workers themselves; in-memory arrays are sent once, as
    tasks that Dask can rerun). ``contiguous`` (default) asks Dask to keep contiguous ranges of
    chunks on each worker, so that most merges of the fixed tree are local (a hint; it never
    changes the result).
    """

    name = "dask"

    def __init__(self, client: Any, persist: str = "auto", owns_client: bool = False,
                 cluster: Any = None, array_backend: str = "numpy", contiguous: bool = True) -> None:
        if persist not in PERSIST_MODES:
            raise ConfigError(f"persist must be one of {PERSIST_MODES}, got {persist!r}")
        if array_backend not in ARRAY_BACKENDS:  # CuPy is checked on the workers, where it runs
            raise ConfigError(f"array_backend must be one of {ARRAY_BACKENDS}, got {array_backend!r}")
        self.array_backend = array_backend
        self.contiguous = contiguous
        self.client = client
        self.persist = persist
        self.owns_client = owns_client
        self.cluster = cluster
        self.code_checked = False  # the cluster runs this driver's code (checked on first prepare)

    def _worker_memory(self) -> float:
        workers = self.client.scheduler_info(n_workers=-1)["workers"].values()
        limits = [w.get("memory_limit") or 0 for w in workers]
        return float(sum(limits)) if all(limits) else float("inf")

    def prepare(self, source: Any, prep: Callable[..., Any], *args: Any, expansion: float = 1.0,
                persist: str | None = None) -> list[Any]:
        """Prepared chunks on the workers, each with a lineage Dask can replay when its worker dies
        (``persist`` overrides the engine's mode for this call, as :meth:`LocalEngine.prepare`).

        * store: every task carries the (small) source and reads its chunk;
        * in-memory array: every chunk's rows are the payload of a task (they travel to the
          scheduler with it, as a scatter's do, and stay there while the fit holds the chunk), so a
          chunk lost with a worker is rebuilt from them -- scattered data had no lineage;
        * dask array: its blocks are computed on the cluster from the array's own graph.
        """
        from pipeline.engine.codecheck import check_cluster_code
        from pipeline.engine.sources import ArraySource, DaskArraySource, StoreSource

        if not self.code_checked:
            check_cluster_code(self.client)
            self.code_checked = True
        mode = self.persist if persist is None else persist
        keep = mode == "always" or (
            mode == "auto" and prepared_nbytes(source, expansion) <= 0.5 * self._worker_memory()
        )
        prep = prep if keep else streamed(prep)
        if self.array_backend != "numpy":
            prep = functools.partial(on_backend, self.array_backend, prep)
        prep = functools.partial(_prep_pinned, prep)  # one BLAS thread, as the kernels
        n = len(source.chunk_slices())
        c = self.client
        place = self._placement(n)
        ws = [None if isinstance(source, StoreSource) else chunk_weights(source, i) for i in range(n)]
        if isinstance(source, ArraySource):
            raw = self._tasks([source.load(i) for i in range(n)], place)
            if not keep:
                return [("prep-rows", f, prep, args, w) for f, w in zip(raw, ws, strict=True)]
            return self._each(prep_weighted, [(prep, f, w, *args) for f, w in zip(raw, ws, strict=True)],
                              place)
        if not keep:  # every task carries the source and loads its chunk itself
            return [Lazy(source, i, prep, args) for i in range(n)]
        if isinstance(source, DaskArraySource):
            raw = c.compute(source.block_tasks())
            return self._each(prep_weighted, [(prep, f, w, *args) for f, w in zip(raw, ws, strict=True)],
                              place)
        # a store source is a path and a few numbers: each task carries a copy (lineage of a lost chunk)
        return self._each(load_prepared, [(source, i, prep, *args) for i in range(n)], place)

    def _placement(self, n: int) -> list[list[str] | None]:
        """Where chunk ``i`` should live: contiguous ranges of chunks per worker (in address order),
        so the lower levels of the fixed reduction tree merge on one worker and only about one
        result per worker crosses the network. A hint only (``allow_other_workers``): a lost
        chunk is rebuilt anywhere, and the bits never depend on where a task ran."""
        workers = sorted(self.client.scheduler_info(n_workers=-1)["workers"]) if self.contiguous else []
        if not workers:
            return [None] * n
        return [[workers[i * len(workers) // n]] for i in range(n)]

    def _each(self, func: Callable[..., Any], calls: Sequence[tuple[Any, ...]],
              place: Sequence[list[str] | None]) -> list[Any]:
        return [self.client.submit(func, *call, workers=w, allow_other_workers=w is not None, pure=False)
                for call, w in zip(calls, place, strict=True)]

    def _tasks(self, values: Sequence[Any], place: Sequence[list[str] | None] | None = None) -> list[Any]:
        """One task per value that returns it: the value travels in the task, and Dask reruns the
        task when the worker holding its result dies (scattered data has no lineage)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
            return self._each(_identity, [(v,) for v in values], place or [None] * len(values))

    def _broadcast(self, args: tuple[Any, ...]) -> list[Any]:
        # Each piece of state is one task that returns it (see _tasks), so Dask recomputes it when
        # the worker holding it dies; scatter(broadcast=True) also waited forever for a worker that
        # died while the data was replicated. The scheduler keeps the state until the pass is done,
        # knowingly: no "large graph" advice for states over 10 MB.
        return self._tasks(args)

    def _submit(self, kernel: Callable[..., Any], handles: Sequence[Any], args: tuple[Any, ...],
                per_chunk: Sequence[Any] | None) -> list[Any]:
        n = len(handles)
        futs = self._broadcast(args)
        rest = [[f] * n for f in futs]
        if per_chunk is None:
            return self.client.map(_apply_pinned, [kernel] * n, list(handles), *rest, pure=False)
        return self.client.map(_apply_item_pinned, [kernel] * n, list(handles), list(per_chunk), *rest,
                               pure=False)

    def map(self, kernel: Callable[..., Any], handles: Sequence[Any], *args: Any,
            per_chunk: Sequence[Any] | None = None) -> list[Any]:
        return [aligned(r) for r in self.client.gather(self._submit(kernel, handles, args, per_chunk))]

    def map_reduce(self, kernel: Callable[..., R], handles: Sequence[Any], *args: Any,
                   per_chunk: Sequence[Any] | None = None) -> R:
        parts = self._submit(kernel, handles, args, per_chunk)
        root = tree_reduce(parts, lambda a, b: self.client.submit(_merge, a, b, pure=False))
        if self.array_backend != "numpy":  # to the host on the worker: the driver may have no device
            root = self.client.submit(on_host, root, pure=False)
        return aligned(root.result())  # (the driver's products too: see pipeline.engine.aligned)

    def map_keep(self, kernel: Callable[..., tuple[Any, R]], handles: Sequence[Any], states: Sequence[Any],
                 *args: Any, combine: Callable[[list[R]], R] | None = None) -> tuple[list[Any], R]:
        """As :meth:`LocalEngine.map_keep`; the new states are futures that stay on the worker that
        computed them (next to a persisted chunk), the results merge on the workers (``combine``:
        gathered and combined on the driver).

        Per-chunk state has no lineage beyond the pass that made it: a worker lost between passes
        loses its chunks' states (resume from a checkpoint), unlike the prepared chunks themselves.
        """
        n = len(handles)
        pairs = self._submit(kernel, handles, args, states)
        new_states = self.client.map(operator.getitem, pairs, [0] * n, pure=False)
        results = self.client.map(operator.getitem, pairs, [1] * n, pure=False)
        if combine is not None:
            return new_states, combine([aligned(r) for r in self.client.gather(results)])
        root = tree_reduce(results, lambda a, b: self.client.submit(_merge, a, b, pure=False))
        return new_states, aligned(root.result())

    def reduce_states(self, states: Sequence[Any]) -> Any:
        """As :meth:`LocalEngine.reduce_states`; the merges run on the workers holding the states."""
        return aligned(tree_reduce(list(states), lambda a, b: self.client.submit(_merge, a, b,
                                                                                 pure=False)).result())

    def fetch_states(self, states: Sequence[Any], convert: Callable[[Any], Any] | None = None) -> list[Any]:
        """Gather per-chunk states to the driver (for a checkpoint); ``convert`` (for example device
        to host) runs on the workers first."""
        if convert is not None:
            states = self.client.map(convert, list(states), pure=False)
        return [aligned(s) for s in self.client.gather(list(states))]

    def place_states(self, states: Sequence[Any], handles: Sequence[Any]) -> list[Any]:
        """Send gathered per-chunk states, each to the worker holding its chunk when it is persisted
        (elsewhere Dask moves it on first use), as tasks that return them: a state lost with its
        worker is sent again from the scheduler's copy (see :meth:`_tasks`)."""
        where = self.client.who_has([h for h in handles if hasattr(h, "key")]) if handles else {}
        out = []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
            for state, h in zip(states, handles, strict=True):
                workers = list(where.get(h.key, ())) if hasattr(h, "key") else []
                out.append(self.client.submit(_identity, state, workers=workers or None,
                                              allow_other_workers=bool(workers), pure=False))
        return out

    def release(self, handles: Sequence[Any]) -> None:
        futures = [h for h in handles if hasattr(h, "release")]
        futures += [h[1] for h in handles if isinstance(h, tuple) and hasattr(h[1], "release")]
        if futures:
            self.client.cancel(futures)

    def close(self) -> None:
        if self.owns_client:
            self.client.close()
            if self.cluster is not None:
                self.cluster.close()


def make_engine(engine: Any, persist: str = "auto") -> LocalEngine | DaskEngine:
    """'local' | a LocalEngine/DaskEngine | a distributed.Client | 'tcp://host:port' | a YAML config."""
    if isinstance(engine, (LocalEngine, DaskEngine)):
        return engine
    if engine is None or engine == "local":
        from pipeline.engine.memory import memory_budget

        # 'auto': prepared chunks kept when they take at most half of this machine's memory
        return LocalEngine(persist=persist, memory_limit=memory_budget())
    if type(engine).__name__ == "Client" and hasattr(engine, "scheduler_info"):
        return DaskEngine(engine, persist=persist)
    if isinstance(engine, str) and "://" in engine:
        from distributed import Client

        return DaskEngine(Client(engine), persist=persist, owns_client=True)
    if isinstance(engine, str) and engine.endswith((".yaml", ".yml")):
        from pipeline.engine.cluster import load_cluster_config

        cfg = load_cluster_config(engine)
        cluster = cfg.make_cluster()
        from distributed import Client

        client = Client(cfg.address) if cluster is None else Client(cluster)
        return DaskEngine(client, persist=cfg.persist if persist == "auto" else persist,
                          owns_client=True, cluster=cluster, array_backend=cfg.array_backend)
    raise ConfigError(
        "engine must be 'local', a distributed.Client, a scheduler address 'tcp://host:port' or a "
        f"cluster config file (.yaml), got {engine!r}"
    )
