"""Row sources: where a fit's rows come from, chunk by chunk.

A source has ``n_rows``, ``n_features``, ``dtype``, ``chunk_slices()``, ``load(i)`` (the rows of
chunk ``i`` as a NumPy array) and ``load_weights(i)`` (their float64 row weights, or None when the
rows are unweighted). Sources are small and picklable, so a Dask worker can load a chunk
next to the data (streaming from Zarr) instead of receiving it from the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vbcore.errors import InputError


class _ArrayRows:
    """Shape properties shared by the array-backed sources."""

    array: Any

    @property
    def n_rows(self) -> int:
        return int(self.array.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.array.shape[1])


@dataclass
class ArraySource(_ArrayRows):
    """An in-memory NumPy array cut into ``chunk_rows`` row chunks."""

    array: np.ndarray
    chunk_rows: int
    weights: np.ndarray | None = None  # validated float64 row weights (sample_weight), or None

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    def chunk_slices(self) -> list[slice]:
        n, c = self.n_rows, int(self.chunk_rows)
        return [slice(s, min(s + c, n)) for s in range(0, n, c)]

    def load(self, i: int) -> np.ndarray:
        return self.array[self.chunk_slices()[i]]

    def load_weights(self, i: int) -> np.ndarray | None:
        return None if self.weights is None else self.weights[self.chunk_slices()[i]]

    def describe(self) -> str:
        return f"array of shape {self.array.shape}"


@dataclass
class StoreSource:
    """A feature store on disk (or at an fsspec URL), read chunk by chunk with the store's chunking."""

    path: str
    n_rows: int = field(init=False)
    n_features: int = field(init=False)
    chunk_rows: int = field(init=False)
    fingerprint: str = field(init=False)
    crcs: list[bytes] | None = field(init=False, repr=False)  # features chunk CRC-32Cs found at open
    weighted: bool = field(init=False)  # the store has row weights
    wcrcs: list[bytes] | None = field(init=False, repr=False)  # weights chunk CRC-32Cs found at open
    label_crcs: list[bytes] | None = field(init=False, repr=False)  # the same for labels (None: none)
    has_labels: bool = field(init=False, repr=False)
    _open: dict[str, Any] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": {}}  # open arrays stay in their process

    def _array(self, name: str) -> Any:
        """The store array ``name``, opened once per process (parsing its metadata cost 0.12 s per
        GB of 8,192 x 256 chunks when every chunk read opened it; docs/benchmarks.md)."""
        arr = self._open.get(name)
        if arr is None:
            import zarr

            arr = self._open[name] = zarr.open_array(f"{self.path.rstrip('/')}/{name}", mode="r")
        return arr

    def __post_init__(self) -> None:
        from pipeline.store.features import FeatureStore

        self.path = str(self.path)
        s = FeatureStore.open(self.path)
        if s.n_rows < 1:
            raise InputError(f"{self.path}: the store is empty (0 rows); ingest rows first")
        self.n_rows, self.n_features = s.n_rows, s.n_features
        self.chunk_rows, self.fingerprint = s.chunk_rows, s.fingerprint
        self.crcs = s.scan.crcs.get("features") if s.scan is not None and s.scan.checksummed else None
        self.weighted = "weights" in s.group.array_keys()
        self.wcrcs = s.scan.crcs.get("weights") if s.scan is not None and s.scan.checksummed else None
        self.label_crcs = s.scan.crcs.get("labels") if s.scan is not None and s.scan.checksummed else None
        self.has_labels = s.has_labels

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def chunk_slices(self) -> list[slice]:
        n, c = self.n_rows, self.chunk_rows
        return [slice(s, min(s + c, n)) for s in range(0, n, c)]

    def load(self, i: int) -> np.ndarray:
        """Chunk ``i``, verified (present, the checksum seen at open, decodable) by the store."""
        from pipeline.store.integrity import read_chunk

        crc = self.crcs[i] if self.crcs is not None else None
        return np.asarray(read_chunk(self.path, "features", i, self.n_rows, crc, self._array("features")),
                          dtype=np.float32)

    def load_weights(self, i: int) -> np.ndarray | None:
        """The row weights of chunk ``i`` (verified as :meth:`load`), or None for an unweighted store."""
        from pipeline.store.integrity import read_chunk

        if not self.weighted:
            return None
        crc = self.wcrcs[i] if self.wcrcs is not None else None
        return np.asarray(read_chunk(self.path, "weights", i, self.n_rows, crc, self._array("weights")),
                          dtype=np.float64)

    def labels(self) -> np.ndarray | None:
        """The labels of the rows this source opened, chunk by chunk and verified like :meth:`load`
        (the store is not opened again: an append under way meanwhile does not matter)."""
        from pipeline.store.integrity import read_chunk

        if not self.has_labels:
            return None
        parts = [read_chunk(self.path, "labels", i, self.n_rows,
                            self.label_crcs[i] if self.label_crcs is not None else None)
                 for i in range(len(self.chunk_slices()))]
        return np.concatenate(parts)

    def all_weights(self) -> np.ndarray | None:
        """Every row's weight (float64, verified like :meth:`load_weights`), or None without weights."""
        if not self.weighted:
            return None
        return np.concatenate([np.asarray(self.load_weights(i)) for i in range(len(self.chunk_slices()))])

    def describe(self) -> str:
        return f"store {self.path} ({self.n_rows} x {self.n_features})"


@dataclass
class DaskArraySource(_ArrayRows):
    """A 2-D dask array; its row blocks are the chunks (columns must be one block)."""

    array: Any
    weights: np.ndarray | None = None  # validated float64 row weights (sample_weight), or None

    def __post_init__(self) -> None:
        if self.array.ndim != 2:
            raise InputError(f"X must be 2-D, got a {self.array.ndim}-D dask array")
        if len(self.array.chunks[1]) != 1:
            self.array = self.array.rechunk({1: -1})

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32 if self.array.dtype == np.float32 else np.float64)

    def chunk_slices(self) -> list[slice]:
        out, start = [], 0
        for c in self.array.chunks[0]:
            out.append(slice(start, start + c))
            start += c
        return out

    def load(self, i: int) -> np.ndarray:
        return np.asarray(self.array.blocks[i].compute(scheduler="sync"), dtype=self.dtype)

    def load_weights(self, i: int) -> np.ndarray | None:
        return None if self.weights is None else self.weights[self.chunk_slices()[i]]

    def block_tasks(self) -> list[Any]:
        """The row blocks as ``dask.delayed`` objects in the source's dtype, in row order: computed
        on a cluster, each keeps the array's graph as its lineage."""
        return list(self.array.astype(self.dtype).to_delayed().ravel())

    def describe(self) -> str:
        return f"dask array of shape {self.array.shape}"


def chunk_weights(source: Any, i: int) -> np.ndarray | None:
    """Chunk ``i``'s row weights (None: unweighted rows, or a source without weights)."""
    load = getattr(source, "load_weights", None)
    return None if load is None else load(i)


def prep_weighted(prep: Any, rows: Any, w: np.ndarray | None, *args: Any) -> Any:
    """``prep(rows, *args)`` with the rows' weights (:func:`vbcore.kernels.estep.weigh_chunk`; None: none)."""
    from vbcore.kernels.estep import weigh_chunk

    return weigh_chunk(prep(rows, *args), w)


def load_prepared(source: Any, i: int, prep: Any, *args: Any) -> Any:
    """Chunk ``i`` of ``source`` through ``prep``, with its row weights (:func:`prep_weighted`)."""
    return prep_weighted(prep, source.load(i), chunk_weights(source, i), *args)


def is_store_path(X: Any) -> bool:
    return isinstance(X, (str, Path)) or type(X).__name__ == "FeatureStore"


def is_dask_array(X: Any) -> bool:
    return type(X).__module__.startswith("dask.array") and hasattr(X, "chunks")
