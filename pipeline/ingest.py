"""Ingest: stream a source into a feature store, chunk by chunk, atomically.

``ingest(source, out)`` reads ``source`` in batches of ``chunk_rows`` rows and hands a generator of
batches to :meth:`FeatureStore.append_batches` (one transaction), so memory stays at a few chunks
whatever the size of the source. A new store is built at a private sibling path ``OUT.tmp-<random>``
and renamed to ``OUT`` only once complete; ``append=True`` adds the rows to an existing store in one
atomic append instead.

Sources (the ``source`` string; see docs/ingest.md for every option):

==========================  ===================================================================
``PATH.npy``                memory-mapped; ``labels=``/``ids=`` name other .npy files
``PATH.npz``                option ``key=``; ``labels=``/``ids=`` name keys in the same file
``PATH.h5`` / ``.hdf5``     option ``dataset=``; ``labels=``/``ids=`` name datasets
``PATH.parquet`` / ``.csv`` numeric columns are features; ``labels=``/``ids=`` name columns
``DIR/``                    image files through a feature extractor; ``labels='folders'``
``digits``                  scikit-learn's bundled 8x8 digits (1,797 x 64, labels, ids)
``image:NAME``              a bundled scikit-image photo as 5-D pixels (r, g, b, row, col)
``synthetic``               a SUN397-fc7-shaped generator (options rows, dim, classes, seed)
==========================  ===================================================================
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import shutil
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from pipeline.extractors import FeatureExtractor, make_extractor
from pipeline.store import JOURNAL, FeatureStore
from vbcore.errors import ConfigError, InputError, StoreError

Batch = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]  # (features, labels, ids)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
FILE_SUFFIXES = (".npy", ".npz", ".h5", ".hdf5", ".parquet", ".csv")
MAX_IMAGE_PIXELS = 40_000  # default downsampling target of image:NAME


@dataclass(frozen=True)
class IngestReport:
    """What one ingest did."""

    path: str            # the store
    rows_written: int    # rows added by this ingest
    rows_dropped: int    # rows with NaN/inf skipped (drop_nonfinite=True)
    n_features: int
    source: str
    elapsed_s: float
    n_rows: int = 0      # rows in the store afterwards
    skipped_files: tuple[str, ...] = ()  # unreadable images skipped (skip_unreadable=True)


@dataclass
class _Plan:
    """A source opened and checked: its shape, what it carries, and how to read it.

    ``blocks(first, size)`` yields batches in source order; sources that can slice freely make the
    first batch ``first`` rows and the rest ``size`` rows, the others yield what they read (the
    batches are re-cut to that layout anyway).
    """

    n_features: int
    labels: bool
    ids: str | None
    blocks: Callable[[int, int], Iterator[Batch]]
    extractor: str | None = None
    extractor_params: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    close: Callable[[], None] = lambda: None


# ---- the entry point ----------------------------------------------------------------------------
def ingest(source: str, out: str | os.PathLike[str], *, chunk_rows: int = 8192, labels: str | None = None,
           ids: str | None = None, append: bool = False, drop_nonfinite: bool = False,
           overwrite: bool = False, compression_level: int = 1, batch_chunks: int = 1,
           progress: Callable[[int], None] | None = None, **options: Any) -> IngestReport:
    """Stream ``source`` into the feature store ``out``.

    Parameters
    ----------
    source : str
        A file path (.npy, .npz, .h5/.hdf5, .parquet, .csv), an image folder, ``'digits'``,
        ``'image:NAME'`` or ``'synthetic'``.
    out : path
        The store. It must not exist unless ``append`` (add rows to it) or ``overwrite`` (replace it,
        only once the new store is complete).
    chunk_rows : int
        Rows per store chunk and per batch read (a new store's chunking; an append follows the store's).
    labels, ids : str, optional
        Where labels / ids come from; the meaning depends on the source (a file, key, dataset or
        column name; ``'folders'`` for image folders).
    drop_nonfinite : bool
        Skip rows holding NaN/inf (counted in the report) instead of failing on the first one.
    compression_level : int
        zstd level of a new store's chunks.
    batch_chunks : int
        Store chunks per batch written. Zarr compresses the chunks of one batch in parallel threads,
        so 2 uses two cores; memory grows with it (about 3 x batch_chunks chunks).
    progress : callable, optional
        ``progress(rows)`` after each batch read from the source, with the number of rows in it.
    **options
        Source options (``key``, ``dataset``, ``ignore_columns``, ``delimiter``, ``extractor``,
        ``skip_unreadable``, ``batch_images``, ``downsample``, ``rows``, ``dim``, ``classes``,
        ``seed``, ...). Unknown options are an error.

    Returns
    -------
    IngestReport
    """
    t0 = time.perf_counter()
    out = Path(out)
    chunk_rows = _as_int("chunk_rows", chunk_rows, minimum=1)
    batch_chunks = _as_int("batch_chunks", batch_chunks, minimum=1)
    if append and overwrite:
        raise ConfigError("append=True and overwrite=True contradict each other; pass one of them")
    if append and not out.exists():
        raise StoreError(f"{out}: no feature store to append to; leave out append to create one")
    if not append and _occupied(out):
        if not overwrite:
            raise StoreError(f"{out} already exists; pass append=True to add rows to it or "
                             "overwrite=True to replace it")
        _check_replaceable(out)
    plan = _open_source(str(source), labels, ids, dict(options), chunk_rows)
    if progress is not None:
        plan.blocks = _counted(plan.blocks, progress)
    on_nonfinite = "drop" if drop_nonfinite else "raise"
    # Every chunk written here is full of rows, so zarr's per-chunk "is it all fill value?" scan (a
    # third of the write time on dense features) is wasted work: skip it.
    with contextlib.ExitStack() as stack:
        stack.enter_context(zarr.config.set({"array.write_empty_chunks": True}))
        stack.callback(plan.close)
        store, written = _write(plan, out, str(source), append, chunk_rows, batch_chunks, on_nonfinite,
                                compression_level)
    record = store.attrs["appends"][-1]
    return IngestReport(path=str(out), rows_written=int(written),
                        rows_dropped=int(record.get("dropped_nonfinite", 0)),
                        n_features=store.n_features, source=str(source),
                        elapsed_s=time.perf_counter() - t0, n_rows=store.n_rows,
                        skipped_files=tuple(plan.skipped))


def _write(plan: _Plan, out: Path, source: str, append: bool, chunk_rows: int, batch_chunks: int,
           on_nonfinite: str, compression_level: int) -> tuple[FeatureStore, int]:
    """Append the plan's rows to the store at ``out``, or build a new store and move it there."""
    if append:
        store = FeatureStore.open(out, "r+")
        size = store.chunk_rows * batch_chunks
        first = store.chunk_rows - store.n_rows % store.chunk_rows  # then whole chunks
        written = store.append_batches(_aligned(plan.blocks(first, size), first, size), source=source,
                                       on_nonfinite=on_nonfinite)
        return store, written
    tmp = out.with_name(f"{out.name}.tmp-{secrets.token_hex(4)}")
    try:
        store = FeatureStore.create(
            tmp, plan.n_features, chunk_rows=chunk_rows, labels=plan.labels, ids=plan.ids, source=source,
            extractor=plan.extractor, extractor_params=plan.extractor_params,
            compression_level=compression_level)
        size = chunk_rows * batch_chunks
        written = store.append_batches(_aligned(plan.blocks(size, size), size, size), source=source,
                                       on_nonfinite=on_nonfinite)
        _move_into_place(tmp, out)
    except BaseException:
        _remove_store(tmp)
        raise
    return FeatureStore.open(out, "r"), written


def _counted(blocks: Callable[[int, int], Iterator[Batch]],
             progress: Callable[[int], None]) -> Callable[[int, int], Iterator[Batch]]:
    """``blocks`` that reports the rows of each batch it yields."""
    def counted(first: int, size: int) -> Iterator[Batch]:
        for b in blocks(first, size):
            progress(int(b[0].shape[0]))
            yield b
    return counted


# ---- placing the store --------------------------------------------------------------------------
def _occupied(path: Path) -> bool:
    """True when ``path`` exists and is not an empty directory."""
    return path.exists() and not (path.is_dir() and not any(path.iterdir()))


def _check_replaceable(out: Path) -> None:
    """Refuse to overwrite anything but a feature store (or an empty directory)."""
    try:
        FeatureStore.open(out, "r")
    except StoreError:
        raise StoreError(f"{out} exists and is not a vbcluster feature store; refusing to replace it "
                         "(remove it yourself or choose another path)") from None


def _journal_paths(root: Path) -> list[Path]:
    return [root.parent / (root.name + JOURNAL + s) for s in ("", ".tmp", ".done")]


def _remove_store(root: Path) -> None:
    for p in (root, *_journal_paths(root)):
        shutil.rmtree(p, ignore_errors=True)


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the complete store ``tmp`` to ``out``; an old store there goes only after that."""
    old = None
    if out.exists():
        old = out.with_name(f"{out.name}.old-{secrets.token_hex(4)}")
        os.replace(out, old)
    for j in _journal_paths(out):  # an old store's interrupted-append journal must not touch the new one
        shutil.rmtree(j, ignore_errors=True)
    os.replace(tmp, out)
    if old is not None:
        _remove_store(old)


# ---- batching -----------------------------------------------------------------------------------
def _take(b: Batch, start: int, stop: int) -> Batch:
    return (b[0][start:stop], None if b[1] is None else b[1][start:stop],
            None if b[2] is None else b[2][start:stop])


def _concat(pieces: list[Batch]) -> Batch:
    if len(pieces) == 1:
        return pieces[0]
    X = np.concatenate([p[0] for p in pieces])
    lab = None if pieces[0][1] is None else np.concatenate([p[1] for p in pieces])  # type: ignore[misc]
    idv = None if pieces[0][2] is None else np.concatenate([p[2] for p in pieces])  # type: ignore[misc]
    return X, lab, idv


def _aligned(blocks: Iterator[Batch], first: int, size: int) -> Iterator[Batch]:
    """Re-cut ``blocks`` into batches of ``first``, then ``size`` rows (the last may be short), so
    every write fills whole store chunks. A block that already fits passes through uncopied."""
    want, have, pending = first, 0, []
    for block in blocks:
        n = len(block[0])
        off = 0
        while off < n:
            take = min(want - have, n - off)
            pending.append(block if (off == 0 and take == n) else _take(block, off, off + take))
            have, off = have + take, off + take
            if have == want:
                batch = _concat(pending)
                pending, have, want = [], 0, size
                yield batch
                del batch
        del block
    if pending:
        yield _concat(pending)


def _slices(n: int, first: int, size: int) -> Iterator[tuple[int, int]]:
    start, step = 0, first
    while start < n:
        yield start, min(start + step, n)
        start, step = start + step, size


# ---- options ------------------------------------------------------------------------------------
def _as_int(name: str, value: Any, minimum: int | None = None) -> int:
    try:
        v = int(value)
        if isinstance(value, float) and v != value:
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and v < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {v}")
    return v


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.lower() in ("1", "true", "yes", "on")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{name} must be true or false, got {value!r}")


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def _no_more(kind: str, options: dict[str, Any]) -> None:
    if options:
        raise ConfigError(f"unknown option(s) {sorted(options)} for a {kind} source; see docs/ingest.md")


def _no_side(kind: str, labels: str | None, ids: str | None) -> None:
    if labels is not None or ids is not None:
        raise ConfigError(f"the {kind} source brings its own labels and ids; leave labels and ids unset")


# ---- choosing the reader ------------------------------------------------------------------------
def _open_source(source: str, labels: str | None, ids: str | None, options: dict[str, Any],
                 chunk_rows: int) -> _Plan:
    if source == "digits":
        return _digits(labels, ids, options)
    if source == "synthetic":
        return _synthetic(labels, ids, options, chunk_rows)
    if source.startswith("image:"):
        return _image(source[len("image:"):], labels, ids, options)
    path = Path(source)
    if path.is_dir():
        return _image_folder(path, labels, ids, options)
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise ConfigError(
            f"unknown source {source!r}: expected a file ending in {', '.join(FILE_SUFFIXES)}, an image "
            "folder, 'digits', 'image:NAME' or 'synthetic'"
        )
    if not path.is_file():
        raise InputError(f"{source}: no such file")
    if suffix == ".npy":
        return _npy(path, labels, ids, options)
    if suffix == ".npz":
        return _npz(path, labels, ids, options)
    if suffix in (".h5", ".hdf5"):
        return _hdf5(path, labels, ids, options)
    if suffix == ".parquet":
        return _parquet(path, labels, ids, options)
    return _csv(path, labels, ids, options)


def _check_matrix(where: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if len(shape) != 2:
        raise InputError(f"{where}: features must be 2-D (n_rows, n_features), got shape {shape}")
    if dtype.kind not in "biuf":
        raise InputError(f"{where}: features must be numeric, got dtype {dtype}")
    if shape[1] < 1:
        raise InputError(f"{where}: features have no columns (shape {shape})")


def _check_side(where: str, what: str, shape: tuple[int, ...], n: int) -> None:
    if len(shape) != 1 or shape[0] != n:
        raise InputError(f"{where}: {what} must be 1-D with one value per row ({n}), got shape {shape}")


def _id_kind(dtype: np.dtype) -> str:
    return "int" if dtype.kind in "biu" else "str"


# ---- .npy ---------------------------------------------------------------------------------------
def _load_npy(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise InputError(f"{path}: no such file ({what})")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise InputError(f"{path}: cannot memory-map {what} ({exc})") from None


def _npy(path: Path, labels: str | None, ids: str | None, options: dict[str, Any]) -> _Plan:
    _no_more(".npy", options)
    X = _load_npy(path, "features")
    _check_matrix(str(path), X.shape, X.dtype)
    n = X.shape[0]
    lab = idv = None
    if labels is not None:
        lab = _load_npy(Path(labels), "labels")
        _check_side(str(path), f"labels {labels}", lab.shape, n)
    if ids is not None:
        idv = _load_npy(Path(ids), "ids")
        _check_side(str(path), f"ids {ids}", idv.shape, n)

    def blocks(first: int, size: int) -> Iterator[Batch]:
        for s, e in _slices(n, first, size):
            yield (np.array(X[s:e]), None if lab is None else np.array(lab[s:e]),  # cast by check_rows
                   None if idv is None else np.array(idv[s:e]))

    return _Plan(X.shape[1], lab is not None, None if idv is None else _id_kind(idv.dtype), blocks,
                 extractor_params={"file": path.name})


# ---- .npz ---------------------------------------------------------------------------------------
class _NpyMember:
    """One array of an .npz, read row block by row block from the (possibly deflated) zip stream."""

    def __init__(self, zf: zipfile.ZipFile, member: str) -> None:
        self.zf, self.member = zf, member
        with zf.open(member) as f:
            self.shape, self.fortran, self.dtype = self._header(f)

    @staticmethod
    def _header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        return tuple(shape), bool(fortran), np.dtype(dtype)

    def blocks(self, first: int, size: int) -> Iterator[np.ndarray]:
        if self.dtype.hasobject:
            raise InputError(f"{self.member}: object arrays cannot be ingested")
        with self.zf.open(self.member) as f:
            self._header(f)
            if self.fortran and len(self.shape) > 1:  # rows are not contiguous: read it whole
                whole = np.frombuffer(f.read(), dtype=self.dtype).reshape(self.shape, order="F")
                for s, e in _slices(self.shape[0], first, size):
                    yield whole[s:e]
                return
            row_items = int(np.prod(self.shape[1:], dtype=np.int64))
            for s, e in _slices(self.shape[0], first, size):
                nbytes = (e - s) * row_items * self.dtype.itemsize
                buf = bytearray(nbytes)
                view, got = memoryview(buf), 0
                while got < nbytes:
                    k = f.readinto(view[got:]) if hasattr(f, "readinto") else 0
                    if not k:
                        raise InputError(f"{self.member}: the array data ends early (truncated file?)")
                    got += k
                yield np.frombuffer(buf, dtype=self.dtype).reshape((e - s, *self.shape[1:]))


def _npz(path: Path, labels: str | None, ids: str | None, options: dict[str, Any]) -> _Plan:
    key = options.pop("key", None)
    _no_more(".npz", options)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise InputError(f"{path}: not an .npz file ({exc})") from None
    try:
        arrays = {m[:-4]: _NpyMember(zf, m) for m in zf.namelist() if m.endswith(".npy")}
        listing = ", ".join(f"{k} {a.shape}" for k, a in arrays.items())
        if key is None:
            two_d = [k for k, a in arrays.items() if len(a.shape) == 2]
            named = [k for k in ("X", "features") if k in two_d]
            if len(two_d) == 1:
                key = two_d[0]
            elif len(named) == 1:
                key = named[0]
            else:
                raise InputError(f"{path}: cannot tell which array holds the features (arrays: {listing}); "
                                 "pass key=NAME")
        if key not in arrays:
            raise InputError(f"{path}: no array {key!r} (arrays: {listing})")
        X = arrays[key]
        _check_matrix(f"{path}[{key}]", X.shape, X.dtype)
        n = X.shape[0]
        side: dict[str, _NpyMember | None] = {}
        for what, name in (("labels", labels), ("ids", ids)):
            if name is None:
                side[what] = None
                continue
            if name not in arrays:
                raise InputError(f"{path}: no array {name!r} for {what} (arrays: {listing})")
            _check_side(str(path), f"{what} {name!r}", arrays[name].shape, n)
            side[what] = arrays[name]
    except BaseException:
        zf.close()
        raise

    def blocks(first: int, size: int) -> Iterator[Batch]:
        lab_it = side["labels"].blocks(first, size) if side["labels"] else None
        ids_it = side["ids"].blocks(first, size) if side["ids"] else None
        for x in X.blocks(first, size):
            yield (x, None if lab_it is None else next(lab_it),  # cast (after its checks) by check_rows
                   None if ids_it is None else next(ids_it))

    ids_arr = side["ids"]
    return _Plan(X.shape[1], side["labels"] is not None, None if ids_arr is None else _id_kind(ids_arr.dtype),
                 blocks, extractor_params={"file": path.name, "key": key}, close=zf.close)


# ---- HDF5 ---------------------------------------------------------------------------------------
def _hdf5(path: Path, labels: str | None, ids: str | None, options: dict[str, Any]) -> _Plan:
    import h5py

    name = options.pop("dataset", None)
    _no_more("HDF5", options)
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"{path}: cannot open as HDF5 ({exc})") from None
    try:
        found: dict[str, Any] = {}

        def collect(name: str, obj: Any) -> None:  # visititems stops at a callback's first non-None
            if isinstance(obj, h5py.Dataset):
                found[name] = obj

        f.visititems(collect)
        listing = ", ".join(f"{n} {d.shape}" for n, d in found.items()) or "none"
        if name is None:
            two_d = [n for n, d in found.items() if d.ndim == 2]
            if len(two_d) != 1:
                raise InputError(f"{path}: cannot tell which dataset holds the features "
                                 f"(datasets: {listing}); pass dataset=NAME")
            name = two_d[0]
        name = str(name).strip("/")
        if name not in found:
            raise InputError(f"{path}: no dataset {name!r} (datasets: {listing})")
        X = found[name]
        _check_matrix(f"{path}[{name}]", X.shape, X.dtype)
        n = X.shape[0]
        side: dict[str, Any] = {}
        for what, dname in (("labels", labels), ("ids", ids)):
            if dname is None:
                side[what] = None
                continue
            dname = dname.strip("/")
            if dname not in found:
                raise InputError(f"{path}: no dataset {dname!r} for {what} (datasets: {listing})")
            _check_side(str(path), f"{what} {dname!r}", found[dname].shape, n)
            d = found[dname]
            side[what] = d.asstr() if h5py.check_string_dtype(d.dtype) else d
        id_kind = None
        if ids is not None:
            id_kind = "str" if h5py.check_string_dtype(found[ids.strip("/")].dtype) else _id_kind(
                found[ids.strip("/")].dtype)
    except BaseException:
        f.close()
        raise

    def blocks(first: int, size: int) -> Iterator[Batch]:
        for s, e in _slices(n, first, size):
            x = np.empty((e - s, X.shape[1]), dtype=np.float32)
            if e > s:
                X.read_direct(x, source_sel=np.s_[s:e])
            yield (x, None if side["labels"] is None else np.asarray(side["labels"][s:e]),
                   None if side["ids"] is None else np.asarray(side["ids"][s:e]))

    return _Plan(X.shape[1], labels is not None, id_kind, blocks,
                 extractor_params={"file": path.name, "dataset": name}, close=f.close)


# ---- Parquet and CSV ----------------------------------------------------------------------------
def _columns(where: str, schema: Any, labels: str | None, ids: str | None,
             ignore: list[str]) -> list[str]:
    """Feature columns of an Arrow schema; non-numeric ones that are not labels/ids/ignored fail."""
    import pyarrow as pa

    names = list(schema.names)
    for what, col in (("labels", labels), ("ids", ids)):
        if col is not None and col not in names:
            raise InputError(f"{where}: no column {col!r} for {what} (columns: {names})")
    unknown = [c for c in ignore if c not in names]
    if unknown:
        raise ConfigError(f"{where}: ignore_columns names unknown columns {unknown} (columns: {names})")
    if labels is not None:
        t = schema.field(labels).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
            raise InputError(f"{where}: label column {labels!r} has type {t}; labels must be integers "
                             "(encode class names as integers first)")

    def numeric(t: Any) -> bool:
        return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                    or pa.types.is_null(t) or pa.types.is_decimal(t))

    skip = {labels, ids, *ignore}
    bad = [c for c in names if c not in skip and not numeric(schema.field(c).type)]
    if bad:
        types = ", ".join(f"{c} ({schema.field(c).type})" for c in bad)
        raise InputError(f"{where}: non-numeric column(s) {types}; name them in ignore_columns=, or as "
                         "labels=/ids=")
    feats = [c for c in names if c not in skip]
    if not feats:
        raise InputError(f"{where}: no numeric feature columns (columns: {names})")
    return feats


def _arrow_batch(batch: Any, feats: list[str], labels: str | None, ids: str | None) -> Batch:
    import pyarrow as pa
    import pyarrow.compute as pc

    X = np.empty((batch.num_rows, len(feats)), dtype=np.float32)
    for j, c in enumerate(feats):
        col = batch.column(c)
        X[:, j] = pc.cast(col, pa.float32(), safe=False).to_numpy(zero_copy_only=False)
    lab = None
    if labels is not None:
        lab = batch.column(labels).to_numpy(zero_copy_only=False)
    idv = None
    if ids is not None:
        idv = batch.column(ids).to_numpy(zero_copy_only=False)
    return X, lab, idv


def _arrow_id_kind(schema: Any, ids: str | None) -> str | None:
    import pyarrow as pa

    if ids is None:
        return None
    return "int" if pa.types.is_integer(schema.field(ids).type) else "str"


def _parquet(path: Path, labels: str | None, ids: str | None, options: dict[str, Any]) -> _Plan:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ignore = _as_list(options.pop("ignore_columns", None))
    _no_more("Parquet", options)
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{path}: cannot read as Parquet ({exc})") from None
    schema = pf.schema_arrow
    try:
        feats = _columns(str(path), schema, labels, ids, ignore)
    except BaseException:
        pf.close()
        raise
    wanted = feats + [c for c in (labels, ids) if c is not None]

    def blocks(first: int, size: int) -> Iterator[Batch]:
        for batch in pf.iter_batches(batch_size=size, columns=wanted, use_threads=True):
            yield _arrow_batch(batch, feats, labels, ids)

    return _Plan(len(feats), labels is not None, _arrow_id_kind(schema, ids), blocks,
                 extractor_params={"file": path.name, "columns": feats}, close=pf.close)


def _csv(path: Path, labels: str | None, ids: str | None, options: dict[str, Any]) -> _Plan:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    ignore = _as_list(options.pop("ignore_columns", None))
    delimiter = str(options.pop("delimiter", ","))
    block_bytes = _as_int("block_bytes", options.pop("block_bytes", 16 << 20), minimum=1 << 10)
    _no_more("CSV", options)
    read = pcsv.ReadOptions(block_size=block_bytes)
    parse = pcsv.ParseOptions(delimiter=delimiter)
    try:  # the first block gives the column names and inferred types
        with pcsv.open_csv(path, read_options=read, parse_options=parse) as reader:
            schema = reader.schema
    except pa.ArrowInvalid as exc:
        raise InputError(f"{path}: cannot read as CSV ({exc})") from None
    feats = _columns(str(path), schema, labels, ids, ignore)
    # fix the types so that a later block cannot be inferred differently (ints, then a float)
    types = {c: pa.float64() for c in feats}
    if labels is not None:
        types[labels] = pa.float64() if pa.types.is_floating(schema.field(labels).type) else pa.int64()
    if ids is not None:
        types[ids] = pa.int64() if pa.types.is_integer(schema.field(ids).type) else pa.string()
    convert = pcsv.ConvertOptions(column_types=types, include_columns=feats + [c for c in (labels, ids) if c])

    def blocks(first: int, size: int) -> Iterator[Batch]:
        try:
            with pcsv.open_csv(path, read_options=read, parse_options=parse,
                               convert_options=convert) as reader:
                for batch in reader:
                    yield _arrow_batch(batch, feats, labels, ids)
        except pa.ArrowInvalid as exc:
            raise InputError(f"{path}: {exc}") from None

    return _Plan(len(feats), labels is not None, _arrow_id_kind(schema, ids), blocks,
                 extractor_params={"file": path.name, "columns": feats})


# ---- image folders ------------------------------------------------------------------------------
def _read_rgb(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        return np.asarray(im.convert("RGB"))


def _image_folder(root: Path, labels: str | None, ids: str | None, options: dict[str, Any]) -> _Plan:
    skip_unreadable = _as_bool("skip_unreadable", options.pop("skip_unreadable", False))
    batch_images = _as_int("batch_images", options.pop("batch_images", 16), minimum=1)
    spec = options.pop("extractor", None)
    names = ("size", "bins", "orientations", "pixels_per_cell", "cells_per_block", "weights", "arch",
             "layer", "input_size", "device")
    ext_opts = {k: options.pop(k) for k in names if k in options}
    for k in ("size", "bins", "orientations", "pixels_per_cell", "cells_per_block", "input_size"):
        if k in ext_opts:
            ext_opts[k] = _as_int(k, ext_opts[k], minimum=1)
    _no_more("image-folder", options)
    if ids is not None:
        raise ConfigError("an image folder's ids are the files' relative paths; leave ids unset")
    if labels not in (None, "folders"):
        raise ConfigError(f"an image folder takes labels='folders' (one class per sub-folder) or none, "
                          f"got {labels!r}")
    files = sorted((p.relative_to(root) for p in root.rglob("*")
                    if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
                    and not any(part.startswith(".") for part in p.relative_to(root).parts)),
                   key=lambda p: p.as_posix())
    if not files:
        raise InputError(f"{root}: no image files ({', '.join(IMAGE_SUFFIXES)}) in the folder or below")
    classes: list[str] = []
    if labels == "folders":
        top = [f for f in files if len(f.parts) < 2]
        if top:
            raise InputError(f"{root}: labels='folders' needs every image inside a class sub-folder, but "
                             f"{top[0].as_posix()} is not")
        classes = sorted({f.parts[0] for f in files})
    index = {c: i for i, c in enumerate(classes)}
    extractor: FeatureExtractor = make_extractor(spec, **ext_opts)
    skipped: list[str] = []

    def blocks(first: int, size: int) -> Iterator[Batch]:
        for s in range(0, len(files), batch_images):
            images, names_ok = [], []
            for rel in files[s:s + batch_images]:
                try:
                    images.append(_read_rgb(root / rel))
                except Exception as exc:  # noqa: BLE001 - PIL raises many types for a bad file
                    if not skip_unreadable:
                        raise InputError(f"{root / rel}: cannot read the image ({type(exc).__name__}: "
                                         f"{exc}); fix or remove it, or pass skip_unreadable=True") from None
                    skipped.append(rel.as_posix())
                    continue
                names_ok.append(rel)
            if not images:
                continue
            X = np.asarray(extractor(images))
            if X.shape != (len(images), extractor.n_features):
                raise InputError(f"extractor {extractor.name!r} returned shape {X.shape} for {len(images)} "
                                 f"images; expected ({len(images)}, {extractor.n_features})")
            lab = np.array([index[r.parts[0]] for r in names_ok], dtype=np.int64) if classes else None
            yield X, lab, np.array([r.as_posix() for r in names_ok], dtype=str)

    params = dict(extractor.params)
    if classes:
        params["classes"] = classes
    return _Plan(int(extractor.n_features), bool(classes), "str", blocks, extractor=extractor.name,
                 extractor_params=params, skipped=skipped)


# ---- built-in datasets --------------------------------------------------------------------------
def _digits(labels: str | None, ids: str | None, options: dict[str, Any]) -> _Plan:
    from sklearn.datasets import load_digits

    _no_more("digits", options)
    _no_side("digits", labels, ids)
    X, y = load_digits(return_X_y=True)

    def blocks(first: int, size: int) -> Iterator[Batch]:
        for s, e in _slices(len(X), first, size):
            yield X[s:e].astype(np.float32), y[s:e].astype(np.int64), np.arange(s, e, dtype=np.int64)

    return _Plan(X.shape[1], True, "int", blocks, extractor="sklearn.load_digits",
                 extractor_params={"dataset": "digits", "n_classes": 10})


# scikit-image sample photos shipped inside the wheel (skimage/data/), read from there directly so
# that no download (pooch) can ever start. Only names whose file is present are offered.
_SKIMAGE_FILES = {
    "astronaut": "astronaut.png", "brick": "brick.png", "camera": "camera.png", "cat": "chelsea.png",
    "cell": "cell.png", "chelsea": "chelsea.png", "clock": "clock_motion.png", "coffee": "coffee.png",
    "coins": "coins.png", "colorwheel": "color.png", "grass": "grass.png", "gravel": "gravel.png",
    "horse": "horse.png", "hubble_deep_field": "hubble_deep_field.jpg",
    "immunohistochemistry": "ihc.png", "logo": "logo.png", "microaneurysms": "microaneurysms.png",
    "moon": "moon.png", "page": "page.png", "retina": "retina.jpg", "rocket": "rocket.jpg",
    "text": "text.png",
}


def bundled_images() -> dict[str, Path]:
    """The ``image:NAME`` names available offline, with their files in the installed scikit-image."""
    import skimage.data

    base = Path(skimage.data.__file__).parent
    return {k: base / f for k, f in sorted(_SKIMAGE_FILES.items()) if (base / f).is_file()}


def _image(name: str, labels: str | None, ids: str | None, options: dict[str, Any]) -> _Plan:
    downsample = options.pop("downsample", None)
    _no_more("image:NAME", options)
    _no_side("image:NAME", labels, ids)
    available = bundled_images()
    if name not in available:
        raise ConfigError(f"unknown image {name!r}; bundled with the installed scikit-image (no download): "
                          f"{', '.join(available)}")
    img = _read_rgb(available[name])
    H, W = img.shape[:2]
    if downsample is None:
        stride = 1
        while math.ceil(H / stride) * math.ceil(W / stride) > MAX_IMAGE_PIXELS:
            stride += 1
    else:
        stride = _as_int("downsample", downsample, minimum=1)
    img = img[::stride, ::stride]
    h, w = img.shape[:2]
    n = h * w

    def scale(v: np.ndarray, top: int) -> np.ndarray:  # [0, top] -> [-1, 1]
        return np.zeros(v.shape) if top == 0 else v * (2.0 / top) - 1.0

    def blocks(first: int, size: int) -> Iterator[Batch]:
        flat = img.reshape(n, 3)
        for s, e in _slices(n, first, size):
            idx = np.arange(s, e, dtype=np.int64)
            X = np.empty((e - s, 5), dtype=np.float32)
            X[:, :3] = scale(flat[s:e].astype(np.float64), 255)
            X[:, 3] = scale((idx // w).astype(np.float64), h - 1)
            X[:, 4] = scale((idx % w).astype(np.float64), w - 1)
            yield X, None, idx

    params = {"image": name, "shape": [h, w], "original_shape": [H, W], "downsample": stride,
              "features": ["r", "g", "b", "row", "col"],
              "scaling": "colour c -> c/127.5 - 1; row i -> 2i/(h-1) - 1; col j -> 2j/(w-1) - 1",
              "ids": "pixel index i*w + j of the downsampled image"}
    return _Plan(5, False, "int", blocks, extractor="pixels-rgb-rowcol", extractor_params=params)


# ---- the synthetic SUN397-fc7 stand-in ----------------------------------------------------------
SYNTHETIC_DEFAULTS = {"rows": 108_754, "dim": 4096, "classes": 397, "seed": 0}
_RANK = 64              # rank of the class signal
_WITHIN = 0.6           # within-class spread in the latent space (class means have unit spread)
_NOISE = 0.6            # per-dimension noise before the ReLU
_ZERO_RANGE = (0.5, 0.8)  # per-dimension target fraction of zeros
_POWER = 0.5            # class sizes: min_rows + share proportional to rank**-_POWER
_MIN_ROWS = 20


def synthetic_class_sizes(rows: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    """Imbalanced class sizes summing to ``rows``: ``min(20, rows // classes)`` each plus the rest
    split in proportion to ``rank ** -0.5`` (largest remainder), ranks in a random class order."""
    base = min(_MIN_ROWS, rows // classes)
    weights = np.arange(1, classes + 1, dtype=np.float64) ** -_POWER
    share = (rows - base * classes) * weights / weights.sum()
    sizes = np.floor(share).astype(np.int64)
    rest = rows - base * classes - int(sizes.sum())
    sizes[np.argsort(-(share - sizes), kind="stable")[:rest]] += 1
    return base + sizes[rng.permutation(classes)]


def _synthetic(labels: str | None, ids: str | None, options: dict[str, Any], chunk_rows: int) -> _Plan:
    from scipy.special import ndtri

    cfg = {k: _as_int(k, options.pop(k, v), minimum=0 if k == "seed" else 1)
           for k, v in SYNTHETIC_DEFAULTS.items()}
    _no_more("synthetic", options)
    _no_side("synthetic", labels, ids)
    rows, dim, classes, seed = cfg["rows"], cfg["dim"], cfg["classes"], cfg["seed"]
    if rows < classes:
        raise ConfigError(f"synthetic: rows ({rows}) must be at least classes ({classes})")
    n_chunks = math.ceil(rows / chunk_rows)
    seeds = np.random.SeedSequence(seed).spawn(1 + n_chunks)  # [0]: the model, [1 + c]: chunk c
    rng = np.random.default_rng(seeds[0])
    sizes = synthetic_class_sizes(rows, classes, rng)
    y = rng.permutation(np.repeat(np.arange(classes, dtype=np.int32), sizes))
    rank = min(_RANK, dim)
    Z = rng.standard_normal((classes, rank)).astype(np.float32)             # class means (latent)
    B = (rng.standard_normal((rank, dim)) / np.sqrt(rank)).astype(np.float32)  # the low-rank map
    var = (1.0 + _WITHIN**2) * (B.astype(np.float64) ** 2).sum(axis=0) + _NOISE**2
    zero_frac = rng.uniform(*_ZERO_RANGE, size=dim)
    bias = (-np.sqrt(var) * ndtri(zero_frac)).astype(np.float32)  # P(pre-activation <= 0) = zero_frac
    gain = np.exp(0.5 * rng.standard_normal(dim)).astype(np.float32)        # per-dimension scale

    def chunk(c: int) -> Batch:
        s, e = c * chunk_rows, min((c + 1) * chunk_rows, rows)
        r = np.random.default_rng(seeds[1 + c])
        lab = y[s:e].astype(np.int64)
        H = Z[lab] + _WITHIN * r.standard_normal((e - s, rank), dtype=np.float32)
        X = r.standard_normal((e - s, dim), dtype=np.float32)
        X *= _NOISE
        for i in range(0, e - s, 1024):  # the GEMM in row blocks: no second chunk-sized temporary
            X[i:i + 1024] += H[i:i + 1024] @ B
        X += bias
        np.maximum(X, 0.0, out=X)
        X *= gain
        return X, lab, None

    def blocks(first: int, size: int) -> Iterator[Batch]:
        for c in range(n_chunks):  # generated on the chunk_rows grid whatever the store layout
            yield chunk(c)

    params = {**cfg, "chunk_rows": chunk_rows, "generator": "relu-low-rank-v1", "rank": rank,
              "within_class_std": _WITHIN, "noise_std": _NOISE, "zero_fraction_range": list(_ZERO_RANGE),
              "class_size_power": _POWER, "min_class_rows": min(_MIN_ROWS, rows // classes),
              "stands_in_for": "SUN397 VGG16 fc7 features (108,754 x 4096, 397 classes)"}
    return _Plan(dim, True, None, blocks, extractor="synthetic", extractor_params=params)
