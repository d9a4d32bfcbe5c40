"""The feature store: a Zarr v3 group with ``features`` (float32, rows chunked, compressed) and
optional ``labels`` (int64), ``ids`` (int64 or strings) and ``weights`` (float64 row weights, >= 0).

Group attributes: ``format``, ``schema_version``, ``n_rows``, ``n_features``, ``chunk_rows``,
``source``, ``extractor``, ``extractor_params``, ``normalize`` (the row normalisation every append
applies, :mod:`vbcore.data.normalize`; ``'none'`` when absent), ``fingerprint`` (a sha256 chained over
every append), ``appends`` (one record per append; ingest adds the ``source_fingerprint``),
``created`` and ``checksums`` (``crc32c``). Every chunk
ends with its CRC-32C; :attr:`FeatureStore.fingerprint` of such a store derives from the chunk
checksums, found when it is opened (see :mod:`pipeline.store.integrity`).

**Atomic appends** (local stores). An append is a transaction with an undo journal:

1. the metadata files (``zarr.json``) and the rows of the last, partly filled chunk of every array
   are copied into ``STORE.append-journal.tmp/`` beside the store, which is then renamed to
   ``STORE.append-journal/`` (the rename is the start of the transaction);
2. the arrays are resized and the new rows written, batch by batch (memory stays bounded);
3. the group attributes are updated, and the journal is renamed away and deleted (the commit).

**One writer at a time.** An append (and an overwrite or an upgrade of the store) holds the
store's **append lock**, the file ``.NAME.lock`` beside the store (:class:`AppendLock`, the run lock's
mechanism: pid, host, the process's start time and boot id, published whole by ``link``). A second
writer is refused in one line naming the holder; a lock whose process is gone (no such pid, another
process under that pid, a reboot) is stale and taken over, so a crashed writer never blocks the store.
The writer re-reads the store's metadata once it holds the lock, so two appends that opened the store
together never write over each other's rows.

A killed append leaves its journal; it is rolled back (metadata restored, chunks beyond the old
extent deleted, the partial chunk's old rows rewritten) by the next writer, or by any open with write
access, under the append lock and **only when the journal's writer is gone**. A ``.tmp`` journal (a
kill before the transaction started) or a ``.done`` one (a kill in the commit, after which the store
already holds the new rows) is removed the same way. An open that finds the journal of a *live*
append never touches it: it is refused in one line (``an append ... is in progress``), since the
store is half-written until the append commits; an open during the ``.tmp`` or ``.done`` stage reads
the consistent store. Opening with ``mode='r+'`` also removes the temporaries of killed ingests beside
the store whose writer is gone (:mod:`pipeline.files.leftovers`). A reader without write access that finds
a dead append's journal is refused with a clear message. Stores opened through an fsspec URL are
readable; appends need a local path.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from pipeline.files import leftovers
from pipeline.store import CHUNK_ROWS, integrity, journal
from pipeline.store.journal import AppendLock, journal_paths
from vbcore.data.limits import check_magnitude
from vbcore.data.normalize import check_normalization, normalize_rows
from vbcore.data.validation import check_finite, check_layout, check_weights, row_is_finite
from vbcore.errors import ConfigError, InputError, StoreError

FORMAT = "vbcluster-feature-store"
SCHEMA_VERSION = 1
ARRAYS = ("features", "labels", "ids", "weights")


def _arr(group: zarr.Group, name: str) -> zarr.Array:
    """A member array of the store's group (typed)."""
    a = group[name]
    if not isinstance(a, zarr.Array):
        raise StoreError(f"'{name}' in the store is a group, not an array")
    return a


def _is_url(path: str) -> bool:
    return "://" in str(path)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def check_rows(X: Any, n_features: int | None, where: str, first_row: int = 0,
               on_nonfinite: str = "raise", normalize: str = "none") -> tuple[np.ndarray, np.ndarray | None]:
    """Validate a batch of rows for a store: 2-D, numeric, finite, the store's width.

    Returns the rows as float32, normalised by ``normalize`` (:func:`vbcore.data.normalize.normalize_rows`,
    in float64 from the source's values) and, when ``on_nonfinite='drop'``, the boolean mask of kept
    rows (None when nothing was dropped). ``where`` and ``first_row`` make messages point at the source.
    """
    arr = np.asarray(X)
    check_layout(arr.shape, arr.dtype, where, min_rows=0)
    if n_features is not None and arr.shape[1] != n_features:
        raise InputError(
            f"{where}: rows have {arr.shape[1]} features but the store has {n_features}"
        )
    check_magnitude(arr, where, first_row)  # |x| too large for float32 sums, as the source has it
    finite = row_is_finite(arr)  # the source's values (a float32 cast keeps them finite: see above)
    kept = None
    if not finite.all():
        if on_nonfinite != "drop":
            check_finite(arr, where, first_row=first_row,
                         hint="clean the source or ingest with --drop-nonfinite")
            raise AssertionError("unreachable: a row is not finite")  # pragma: no cover
        arr, kept = arr[finite], finite
    if normalize != "none":
        return normalize_rows(arr, normalize, dtype=np.float32), kept
    return np.ascontiguousarray(arr, dtype=np.float32), kept


@dataclass
class FeatureStore:
    """A handle on a feature store (see the module docstring for the layout)."""

    path: str
    group: zarr.Group
    writable: bool
    scan: integrity.Scan | None = field(default=None, repr=False)  # chunk files found at open
    _lock: AppendLock | None = field(default=None, repr=False, compare=False)  # held by writing()

    # ---- creation and opening -------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        n_features: int,
        *,
        chunk_rows: int = CHUNK_ROWS,
        labels: bool = False,
        ids: str | None = None,
        weights: bool = False,
        source: str = "",
        extractor: str | None = None,
        extractor_params: dict[str, Any] | None = None,
        compression_level: int = 1,
        overwrite: bool = False,
        normalize: str = "none",
        codec: str = integrity.FEATURE_CODEC,
    ) -> FeatureStore:
        """Create an empty store. ``ids`` is None, 'int' or 'str'; ``weights``: a row weight array;
        ``normalize``: the row normalisation every append applies (:mod:`vbcore.data.normalize`);
        ``codec``: the features' compressor (:data:`pipeline.store.integrity.FEATURE_CODECS`; the
        other arrays use zstd at ``compression_level``, as do ``codec='zstd'`` features)."""
        path = str(path)
        normalize = check_normalization(normalize)
        if int(n_features) < 1:
            raise StoreError(f"{path}: n_features must be >= 1, got {n_features}")
        if int(chunk_rows) < 1:
            raise StoreError(f"{path}: chunk_rows must be >= 1, got {chunk_rows}")
        if ids not in (None, "int", "str"):
            raise StoreError(f"{path}: ids must be None, 'int' or 'str', got {ids!r}")
        if not _is_url(path) and Path(path).exists() and any(Path(path).iterdir()) and not overwrite:
            raise StoreError(f"{path} already exists and is not empty; pass --overwrite (overwrite=True) "
                             "to replace it")
        group = zarr.open_group(path, mode="w")
        if codec not in integrity.FEATURE_CODECS:
            raise StoreError(f"{path}: codec must be one of {integrity.FEATURE_CODECS}, got {codec!r}")
        comp = integrity.compressors(compression_level)  # zstd + a CRC-32C per chunk
        fcomp = comp if codec == "zstd" else integrity.compressors(compression_level, codec)
        # write_empty_chunks: skip zarr's scan of every chunk for all-fill values (a third of the
        # write time on ReLU features, measured in bench/bench_ingest.py)
        cfg: Any = {"write_empty_chunks": True}
        group.create_array("features", shape=(0, n_features), chunks=(chunk_rows, n_features),
                           dtype="float32", compressors=fcomp, config=cfg)
        if labels:
            group.create_array("labels", shape=(0,), chunks=(chunk_rows,), dtype="int64",
                               compressors=comp, config=cfg)
        if weights:
            group.create_array("weights", shape=(0,), chunks=(chunk_rows,), dtype="float64",
                               compressors=comp, config=cfg)
        if ids is not None:
            group.create_array("ids", shape=(0,), chunks=(chunk_rows,),
                               dtype="int64" if ids == "int" else str, compressors=comp, config=cfg)
        seed = hashlib.sha256(f"{FORMAT}/{SCHEMA_VERSION}/{n_features}".encode()).hexdigest()
        group.attrs.update({
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "n_rows": 0,
            "n_features": int(n_features),
            "chunk_rows": int(chunk_rows),
            "source": source,
            "extractor": extractor,
            "extractor_params": extractor_params or {},
            "normalize": normalize,
            "fingerprint": seed,
            "appends": [],
            "created": _now(),
            "checksums": integrity.CHECKSUM,
        })
        return cls(path, group, True)

    @classmethod
    def open(cls, path: str | os.PathLike[str], mode: str = "r") -> FeatureStore:
        """Open and validate a store. ``mode='r+'`` allows appends (and rolls back a killed one)."""
        path = str(path)
        if mode not in ("r", "r+"):
            raise StoreError(f"mode must be 'r' or 'r+', got {mode!r}")
        if not _is_url(path):
            p = Path(path)
            integrity.recover_upgrade(path)
            if not p.exists():
                raise StoreError(f"{path}: no such feature store (the path does not exist)")
            if not (p / "zarr.json").is_file():
                raise StoreError(f"{path} is not a feature store (no zarr.json: not a Zarr v3 group)")
            writable = mode == "r+" or os.access(path, os.W_OK)
            if any(j.exists() for j in journal_paths(p)):
                journal.settle(p, writable)
            if mode == "r+":
                leftovers.clean(p)  # temporaries of killed ingests beside the store
            integrity.check_metadata(path)  # a truncated zarr.json is named, not a Zarr traceback
        try:
            group = zarr.open_group(path, mode="r+" if mode == "r+" else "r")
        except Exception as exc:  # zarr raises several types for a non-group
            raise StoreError(f"{path} is not a feature store ({type(exc).__name__}: {exc})") from None
        store = cls(path, group, mode == "r+")
        try:
            store._validate()
            store.scan = integrity.scan(path, group, store.n_rows)  # every chunk present; fingerprint
        except StoreError:
            if not _is_url(path) and journal.journal_path(path).exists():  # an append began meanwhile
                raise AppendLock(path).describe() from None
            raise
        return store

    @contextlib.contextmanager
    def writing(self) -> Iterator[FeatureStore]:
        """Hold the store's append lock (re-entrant on this handle): the metadata is re-read once it
        is held and a dead writer's journal rolled back, so what this handle then reads and writes is
        the store as it is, with no other writer."""
        if self._lock is not None:
            yield self
            return
        lock = AppendLock(self.path).acquire()
        self._lock = lock
        try:
            root = Path(self.path)
            if any(j.exists() for j in journal_paths(root)):
                journal.rollback(root)  # its writer is gone: we hold the lock
            self.group = zarr.open_group(self.path, mode="r+")
            self._validate()
            yield self
        finally:
            self._lock = None
            lock.release()

    def _validate(self) -> None:
        a = dict(self.group.attrs)
        if a.get("format") != FORMAT:
            raise StoreError(f"{self.path} is a Zarr group but not a vbcluster feature store "
                             f"(attribute 'format' is {a.get('format')!r})")
        version = a.get("schema_version")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written with store schema version {version!r}; this vbcluster "
                f"reads versions <= {SCHEMA_VERSION}: upgrade vbcluster"
            )
        missing = [k for k in ("n_rows", "n_features", "chunk_rows", "fingerprint") if k not in a]
        if missing:
            raise StoreError(f"{self.path}: store attributes are missing {missing}")
        integrity.check_attributes(self.path, a)
        if "features" not in self.group.array_keys():
            raise StoreError(f"{self.path}: the store has no 'features' array")
        f = self.features
        n = int(a["n_rows"])  # type: ignore[arg-type]
        if f.ndim != 2 or f.shape[1] != a["n_features"] or f.shape[0] != n:
            raise StoreError(f"{self.path}: 'features' has shape {f.shape}, attributes say "
                             f"({n}, {a['n_features']})")
        for name in ("labels", "ids", "weights"):
            if name in self.group.array_keys() and _arr(self.group, name).shape != (n,):
                shape = _arr(self.group, name).shape
                raise StoreError(f"{self.path}: '{name}' has shape {shape}, expected ({n},)")

    # ---- properties -------------------------------------------------------------------------
    @property
    def attrs(self) -> dict[str, Any]:
        return dict(self.group.attrs)

    @property
    def features(self) -> zarr.Array:
        return _arr(self.group, "features")

    @property
    def n_rows(self) -> int:
        return int(self.group.attrs["n_rows"])  # type: ignore[arg-type]

    @property
    def n_features(self) -> int:
        return int(self.group.attrs["n_features"])  # type: ignore[arg-type]

    @property
    def chunk_rows(self) -> int:
        return int(self.group.attrs["chunk_rows"])  # type: ignore[arg-type]

    @property
    def fingerprint(self) -> str:
        """The content fingerprint: derived from every chunk's CRC-32C (checksummed stores), else the
        sha256 chained over the appends (stores of an older vbcluster)."""
        if self.scan is not None and self.scan.fingerprint is not None:
            return self.scan.fingerprint
        return str(self.group.attrs["fingerprint"])

    @property
    def normalize(self) -> str:
        """The row normalisation every append applies (``'none'`` for stores written before it was
        recorded)."""
        try:
            where = f"{self.path}: attribute 'normalize'"
            return check_normalization(self.group.attrs.get("normalize"), where)
        except ConfigError as exc:  # damaged metadata, not a setting
            raise StoreError(f"{exc}; restore the store or re-ingest its source") from None

    @property
    def has_labels(self) -> bool:
        return "labels" in self.group.array_keys()

    @property
    def has_ids(self) -> bool:
        return "ids" in self.group.array_keys()

    def chunk_slices(self) -> list[slice]:
        """Row ranges of the store's chunks, in order."""
        n, c = self.n_rows, self.chunk_rows
        return [slice(s, min(s + c, n)) for s in range(0, n, c)]

    def read(self, rows: slice | None = None) -> np.ndarray:
        """Feature rows (float32); a missing or corrupt chunk fails naming it."""
        rows = rows or slice(0, self.n_rows)
        return np.asarray(integrity.read_rows(self.path, self.group, "features", rows, self.n_rows),
                          dtype=np.float32)

    def read_labels(self, rows: slice | None = None) -> np.ndarray | None:
        return self._read_side("labels", rows)

    def read_ids(self, rows: slice | None = None) -> np.ndarray | None:
        return self._read_side("ids", rows)

    def read_weights(self, rows: slice | None = None) -> np.ndarray | None:
        """Row weights (float64), or None for a store without them."""
        return self._read_side("weights", rows)

    def _read_side(self, name: str, rows: slice | None) -> np.ndarray | None:
        """Rows of the array ``name`` (labels, ids, weights), or None when the store has none."""
        if name not in self.group.array_keys():
            return None
        return integrity.read_rows(self.path, self.group, name, rows or slice(0, self.n_rows), self.n_rows)

    # ---- appends ----------------------------------------------------------------------------
    def append(self, X: Any, labels: Any = None, ids: Any = None, *, weights: Any = None, source: str = "",
               on_nonfinite: str = "raise") -> int:
        """Append one batch of rows atomically; returns the number of rows written."""
        return self.append_batches([(X, labels, ids, weights)], source=source, on_nonfinite=on_nonfinite)

    def append_batches(self, batches: Iterable[tuple[Any, ...]], *, source: str = "",
                       on_nonfinite: str = "raise", record: dict[str, Any] | None = None) -> int:
        """Append batches ``(X, labels, ids[, weights])`` as ONE atomic transaction, streaming (only one
        batch is in memory at a time). Returns the number of rows written; with
        ``on_nonfinite='drop'`` rows with NaN/inf are skipped and counted in the append record;
        ``record`` adds entries to it (ingest's ``source_fingerprint``). The rows are normalised by
        the store's :attr:`normalize` (recorded at creation) before they are written."""
        if not self.writable:
            raise StoreError(f"{self.path} is open read-only; open it with mode='r+' to append")
        if _is_url(self.path):
            raise StoreError(f"{self.path}: appends need a local store path")
        if on_nonfinite not in ("raise", "drop"):
            raise StoreError(f"on_nonfinite must be 'raise' or 'drop', got {on_nonfinite!r}")
        # every chunk is written, also one of fill values (all-zero labels): a chunk file that is
        # not there reads as a deleted chunk (pipeline.store.integrity); ingest sets the same for speed
        with self.writing(), zarr.config.set({"array.write_empty_chunks": True}):
            return self._append_locked(batches, source, on_nonfinite, record)

    def _append_locked(self, batches: Iterable[tuple[Any, Any, Any]], source: str, on_nonfinite: str,
                       record: dict[str, Any] | None) -> int:
        root = Path(self.path)
        old_n = self.n_rows
        fp = str(self.group.attrs["fingerprint"])  # the chain over appends (kept for old readers)
        normalize = self.normalize
        journal.begin(root, self.group, old_n, self.chunk_rows)
        written = dropped = 0
        where = source or "appended rows"
        try:
            for X, labels, ids, *more in batches:
                rows, kept = check_rows(X, self.n_features, where, first_row=written + dropped,
                                        on_nonfinite=on_nonfinite, normalize=normalize)
                n_in = rows.shape[0] if kept is None else kept.shape[0]
                lab = self._check_side("labels", labels, n_in, kept, where)
                idv = self._check_side("ids", ids, n_in, kept, where)
                wts = self._check_side("weights", more[0] if more else None, n_in, kept, where,
                                       written + dropped)
                dropped += 0 if kept is None else int((~kept).sum())
                if rows.shape[0] == 0:
                    continue
                start, stop = old_n + written, old_n + written + rows.shape[0]
                self.features.resize((stop, self.n_features))
                self.features[start:stop] = rows
                h = hashlib.sha256(fp.encode())
                h.update(rows.tobytes())
                if lab is not None:
                    _arr(self.group, "labels").resize((stop,))
                    _arr(self.group, "labels")[start:stop] = lab
                    h.update(lab.tobytes())
                if idv is not None:
                    _arr(self.group, "ids").resize((stop,))
                    _arr(self.group, "ids")[start:stop] = idv
                    h.update("\x00".join(map(str, idv.tolist())).encode())
                if wts is not None:
                    _arr(self.group, "weights").resize((stop,))
                    _arr(self.group, "weights")[start:stop] = wts
                    h.update(wts.tobytes())
                fp = h.hexdigest()
                written += rows.shape[0]
            appends = list(self.group.attrs.get("appends", []))  # type: ignore[arg-type]
            appends.append({"rows": written, "dropped_nonfinite": dropped, "source": source,
                            "time": _now(), **(record or {})})
            done: dict[str, Any] = {"n_rows": old_n + written, "fingerprint": fp, "appends": appends}
            with warnings.catch_warnings():  # (an unchecksummed store warned at open already)
                warnings.simplefilter("ignore", integrity.StoreIntegrityWarning)
                crcs = integrity.scan(self.path, self.group, old_n + written).crcs
            if crcs:  # each chunk's CRC at its position: swapped chunk files are noticed
                done[integrity.POSITIONS] = integrity.position_record(crcs)
            self.group.attrs.update(done)
        except BaseException as exc:
            journal.rollback(root)
            self.group = zarr.open_group(self.path, mode="r+")
            if isinstance(exc, OSError) and exc.filename is None:  # disk full: name the store
                raise OSError(exc.errno, f"{exc.strerror or exc} (appending to the store; rolled back)",
                              self.path) from exc
            raise
        journal.commit(root)
        self.scan = integrity.scan(self.path, self.group, self.n_rows)
        return written

    def _check_side(self, name: str, values: Any, n_in: int, kept: np.ndarray | None,
                    where: str, first_row: int = 0) -> np.ndarray | None:
        present = name in self.group.array_keys()
        if values is None:
            if present:
                raise InputError(f"{where}: the store has '{name}'; pass them for every batch")
            return None
        if not present:
            raise InputError(f"{where}: the store was created without '{name}'")
        if name == "weights":
            w = check_weights(values, n_in, f"{where}: weights", first_row=first_row,
                              n_features=self.n_features)
            return w if kept is None else w[kept]
        arr = np.asarray(values)
        if arr.ndim != 1 or arr.shape[0] != n_in:
            raise InputError(f"{where}: {name} has length {arr.shape[0] if arr.ndim else 0} "
                             f"but there are {n_in} rows")
        if name == "labels":
            if arr.dtype.kind not in "biu":
                if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
                    arr = arr.astype(np.int64)
                else:
                    raise InputError(f"{where}: labels must be integers, got dtype {arr.dtype}")
            arr = arr.astype(np.int64)
        elif _arr(self.group, "ids").dtype.kind in "iu":
            arr = arr.astype(np.int64)
        else:
            arr = arr.astype(str)
        return arr if kept is None else arr[kept]
