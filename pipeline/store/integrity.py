"""Chunk integrity of feature stores: checksums, completeness, the content fingerprint, ``check``.

New stores append Zarr v3's ``crc32c`` codec to every array's codec chain (after zstd), so every
chunk file ends with the CRC-32C of its compressed bytes and Zarr verifies it on every read: a flipped
byte anywhere in a chunk (payload or zstd header) fails the read, and the error names the array, the
chunk and its row range. A store opened for reading is scanned once (one ``stat`` and a 4-byte read
per chunk file, no decoding): every chunk of ``features``, ``labels`` and ``ids`` must be present (a
deleted chunk would otherwise read as Zarr's fill value, zeros), and the content fingerprint is the
sha256 of every chunk's size and recorded CRC-32C, so any change of content made through Zarr changes
it. Every append records each chunk's CRC-32C at its position (attribute ``chunk_crcs``), and
``vbcluster check STORE`` decodes every chunk (a full verification) and requires each to hold the
CRC recorded for its position (chunk files swapped both verify on their own); ``--upgrade`` rewrites a
store written without checksums (by an older vbcluster) with them, atomically (a complete copy is
built beside the store and swapped in).

The fingerprint is only as strong as a 32-bit CRC per chunk against accidental change (a chance of
2**-32 per changed chunk to go unnoticed); it is not a defence against a deliberate forgery.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from pipeline.store.chunks import direct_decoder, read_whole_chunk
from vbcore.errors import StoreError

ARRAYS = ("features", "labels", "ids", "weights")
CHECKSUM = "crc32c"
POSITIONS = "chunk_crcs"  # store attribute: each chunk's CRC-32C at its position (position_record)
UPGRADE_TMP = ".upgrade-tmp"  # suffix of the copy an upgrade builds beside the store
UPGRADE_OLD = ".upgrade-old"  # suffix of the original while the copy is swapped in
COMPLETE = ".upgrade-complete"  # suffix of the marker file beside a finished upgrade copy


class StoreIntegrityWarning(UserWarning):
    """A store can be read but not verified (written without chunk checksums)."""


#: codecs of a new store's features (``FeatureStore.create(codec=...)``): decode speed, single thread,
#: on 8,192 x 256 ReLU chunks (docs/benchmarks.md, "Streamed passes"): zstd-1 1.02 s/GB (ratio
#: 2.41), Blosc lz4 0.35 s/GB (1.97), Blosc lz4hc 0.22 s/GB (2.31, but 11.5 s/GB to encode)
FEATURE_CODECS = ("lz4", "lz4hc", "zstd")
FEATURE_CODEC = "lz4"  # the default since issue 52; older stores keep theirs (Zarr's metadata names it)


def compressors(level: int, codec: str = "zstd") -> list[Any]:
    """The codec chain of new store arrays: a compressor, then a CRC-32C of the compressed bytes.
    ``codec``: zstd at ``level`` (labels, ids, weights; features before issue 52), or Blosc
    'lz4' (clevel 9) / 'lz4hc' (clevel 5), unshuffled (ReLU zeros are whole floats: a byte shuffle
    cost 30% of the ratio), one Blosc block per chunk."""
    if codec == "zstd":
        return [ZstdCodec(level=level), Crc32cCodec()]
    if codec not in FEATURE_CODECS:
        raise StoreError(f"codec must be one of {FEATURE_CODECS}, got {codec!r}")
    from zarr.codecs import BloscCodec

    cname: Any = codec  # one of Blosc's names (checked above)
    return [BloscCodec(cname=cname, clevel=9 if codec == "lz4" else 5, shuffle="noshuffle"), Crc32cCodec()]


def codec_of(arr: zarr.Array) -> str:
    """The compressor name of an array's chain in :data:`FEATURE_CODECS` terms (zstd when unknown)."""
    for c in arr.compressors:
        cname = getattr(c, "cname", None)
        if cname is not None:
            return str(getattr(cname, "value", cname))
    return "zstd"


def has_checksums(arr: zarr.Array) -> bool:
    """True when the array's chunks end with a CRC-32C (its codec chain has ``crc32c``)."""
    return any(isinstance(c, Crc32cCodec) for c in arr.compressors)


def chunk_key(arr: zarr.Array, i: int) -> str:
    """The key of row chunk ``i`` inside the array (``c/3/0`` for features, ``c/3`` for 1-D)."""
    meta = arr.metadata
    if not hasattr(meta, "chunk_key_encoding"):  # Zarr v2 metadata: stores are v3 groups (checked)
        raise StoreError(f"array {arr.path!r} is Zarr v2; feature stores are Zarr v3")
    return str(meta.chunk_key_encoding.encode_chunk_key((i,) + (0,) * (arr.ndim - 1)))


def _is_url(path: str) -> bool:
    return "://" in path


def _rows(i: int, chunk_rows: int, n_rows: int) -> str:
    return f"rows {i * chunk_rows}-{min((i + 1) * chunk_rows, n_rows) - 1}"


def _where(path: str, name: str, arr: zarr.Array, i: int, n_rows: int) -> str:
    return f"{path}: '{name}' chunk {name}/{chunk_key(arr, i)} ({_rows(i, arr.chunks[0], n_rows)})"


def _trailer(path: str, name: str, key: str) -> tuple[int, bytes] | None:
    """(size, last 4 bytes) of a chunk file, or None when the file does not exist."""
    if _is_url(path):
        import fsspec

        fs, root = fsspec.core.url_to_fs(path)
        full = f"{root.rstrip('/')}/{name}/{key}"
        try:
            size = int(fs.size(full))
            return size, bytes(fs.cat_file(full, start=max(size - 4, 0)))
        except FileNotFoundError:
            return None
    try:
        with open(os.path.join(path, name, key), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(size - 4, 0))
            return size, f.read(4)
    except FileNotFoundError:
        return None


def check_metadata(path: str) -> None:
    """Parse the store's Zarr metadata files (group and arrays) before Zarr does: a truncated or
    damaged ``zarr.json`` is one error naming the file, not a traceback from deep inside Zarr."""
    import json

    if _is_url(path):
        return
    for rel in ("zarr.json", *(f"{n}/zarr.json" for n in ARRAYS)):
        f = Path(path) / rel
        if not f.exists():
            continue
        try:
            body = json.loads(f.read_bytes())
        except (OSError, ValueError) as exc:
            raise StoreError(f"{f}: unreadable Zarr metadata ({type(exc).__name__}: {str(exc)[:120]}); "
                             "the file is truncated or damaged: restore the store or re-ingest its source"
                             ) from None
        if not isinstance(body, dict) or "node_type" not in body:
            raise StoreError(f"{f}: not Zarr v3 metadata (no 'node_type'); restore the store or re-ingest "
                             "its source")


def check_input_file(source: str) -> None:
    """Refuse an empty (0-byte) source file by name (NumPy and others fail on it with EOFError)."""
    from vbcore.errors import InputError

    p = Path(source)
    if "://" not in source and p.is_file() and p.stat().st_size == 0:
        raise InputError(f"{source}: the file is empty (0 bytes); it was not written completely")


def check_attributes(path: str, attrs: dict[str, Any]) -> None:
    """The store's size attributes are non-negative integers (``n_rows="abc"`` is refused by name)."""
    for key, low in (("n_rows", 0), ("n_features", 1), ("chunk_rows", 1)):
        v = attrs.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise StoreError(f"{path}/zarr.json: attribute {key!r} must be an integer >= {low}, got {v!r}; "
                             "the store's metadata is damaged: restore the store or re-ingest its source")


@dataclass
class Scan:
    """What one pass over a store's chunk files found."""

    checksummed: bool
    fingerprint: str | None  # None for stores without checksums
    crcs: dict[str, list[bytes]]  # array -> each chunk's recorded CRC-32C (checksummed stores)
    n_bytes: int


def position_record(crcs: dict[str, list[bytes]]) -> dict[str, str]:
    """The ``chunk_crcs`` attribute: per array, the CRC-32C of every chunk in row order (hex, 8
    characters per chunk). A chunk's CRC covers its bytes only, so two chunk files swapped would both
    verify; compared with this record, each chunk must also be the one written at its position."""
    return {name: b"".join(v).hex() for name, v in crcs.items()}


def _check_positions(path: str, group: zarr.Group, crcs: dict[str, list[bytes]], n_rows: int) -> None:
    """Each chunk's CRC-32C against the ``chunk_crcs`` recorded at the last write (stores written
    before the record existed have none: nothing to compare)."""
    record = group.attrs.get(POSITIONS)
    if not isinstance(record, dict):
        return
    for name, found in crcs.items():
        want = bytes.fromhex(str(record.get(name, "")))
        arr = group[name]
        assert isinstance(arr, zarr.Array)
        for i in range(len(found)):
            if want[4 * i:4 * i + 4] != found[i]:
                where = [j for j in range(len(found)) if want[4 * j:4 * j + 4] == found[i] and j != i]
                moved = f"; it holds what was written as chunk {where[0]}" if where else ""
                raise StoreError(f"{_where(path, name, arr, i, n_rows)} is not the chunk vbcluster wrote at "
                                 f"that position (its CRC-32C differs from the one recorded{moved}): chunk "
                                 "files were swapped, replaced or changed outside vbcluster; restore the "
                                 "store from a backup or re-ingest its source")


def scan(path: str, group: zarr.Group, n_rows: int) -> Scan:
    """Check that every chunk of every store array is present; derive the content fingerprint.

    Raises :class:`StoreError` naming the array, chunk and row range of the first missing chunk.
    Warns (:class:`StoreIntegrityWarning`) when the store has no checksums. (Whether each chunk is
    the one written at its position is :func:`check`'s question: an open only derives the
    fingerprint, which a swap changes, so a store changed through Zarr stays readable.)
    """
    names = [n for n in ARRAYS if n in group.array_keys()]
    arrays = {n: group[n] for n in names}
    checksummed = all(has_checksums(a) for a in arrays.values())  # type: ignore[arg-type]
    h = hashlib.sha256(f"vbcluster-chunks/1/{n_rows}".encode())
    crcs: dict[str, list[bytes]] = {}
    total = 0
    for name, arr in arrays.items():
        assert isinstance(arr, zarr.Array)
        h.update(f"/{name}/{arr.dtype}/{arr.shape}/{arr.chunks}".encode())
        crcs[name] = []
        n_chunks = -(-n_rows // arr.chunks[0]) if n_rows else 0
        for i in range(n_chunks):
            found = _trailer(path, name, chunk_key(arr, i))
            if found is None:
                raise missing(path, name, arr, i, n_rows)
            size, crc = found
            total += size
            h.update(size.to_bytes(8, "little") + crc)
            crcs[name].append(crc)
    if not checksummed:  # (stacklevel 1: one place, so the default filter shows it once per store)
        warnings.warn(f"{path} has no chunk checksums (written by an older vbcluster): corrupted chunks "
                      f"cannot be detected; run `vbcluster check {path} --upgrade` to add them",
                      StoreIntegrityWarning, stacklevel=1)
    return Scan(checksummed, h.hexdigest() if checksummed else None,
                crcs if checksummed else {}, total)


def read_rows(path: str, group: zarr.Group, name: str, rows: slice, n_rows: int) -> np.ndarray:
    """``group[name][rows]``, with a missing or corrupt chunk reported by array, chunk and rows."""
    arr = group[name]
    assert isinstance(arr, zarr.Array)
    c = arr.chunks[0]
    start, stop, _ = rows.indices(n_rows)
    first, last = start // c, (max(stop, start + 1) - 1) // c
    for i in range(first, min(last, -(-n_rows // c) - 1) + 1):
        if stop > start and _trailer(path, name, chunk_key(arr, i)) is None:
            raise missing(path, name, arr, i, n_rows)
    try:
        return np.asarray(arr[rows])
    except Exception as exc:  # zarr raises ValueError, RuntimeError, zstd errors ...
        for i in range(first, last + 1):
            try:
                arr[i * c:min((i + 1) * c, n_rows)]
            except Exception as inner:
                raise corrupt(path, name, arr, i, n_rows, inner) from None
        raise corrupt(path, name, arr, first, n_rows, exc) from None


def read_chunk(path: str, name: str, i: int, n_rows: int, expected_crc: bytes | None = None,
               arr: zarr.Array | None = None) -> np.ndarray:
    """Row chunk ``i`` of one store array, verified: present, CRC-32C as recorded at open, decodable
    (``arr``: the array already open, as :class:`pipeline.engine.sources.StoreSource` keeps it)."""
    arr = zarr.open_array(f"{path.rstrip('/')}/{name}", mode="r") if arr is None else arr
    c = arr.chunks[0]
    found = _trailer(path, name, chunk_key(arr, i))
    if found is None:
        raise missing(path, name, arr, i, n_rows)
    if expected_crc is not None and found[1] != expected_crc:
        raise StoreError(f"{_where(path, name, arr, i, n_rows)} changed since the store was opened "
                         "(its checksum differs); the store is being rewritten: refit once it is done")
    try:
        decoder = None if _is_url(path) else direct_decoder(arr)
        if decoder is not None:  # the same bytes as Zarr's read, without its event loop and copy
            return read_whole_chunk(path, name, chunk_key(arr, i), arr, decoder)[:min(c, n_rows - i * c)]
        return np.asarray(arr[i * c:min((i + 1) * c, n_rows)])
    except FileNotFoundError:
        raise missing(path, name, arr, i, n_rows) from None
    except Exception as exc:
        raise corrupt(path, name, arr, i, n_rows, exc) from None


def missing(path: str, name: str, arr: zarr.Array, i: int, n_rows: int) -> StoreError:
    """The one-line error for a chunk whose file is gone (Zarr would read it as zeros)."""
    return StoreError(f"{_where(path, name, arr, i, n_rows)} is missing (its file was deleted); "
                      "restore the store from a backup or re-ingest its source")


def corrupt(path: str, name: str, arr: zarr.Array, i: int, n_rows: int, exc: BaseException) -> StoreError:
    """The one-line error for a chunk that does not decode."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    why = ("its checksum does not match (the file was changed or damaged on disk)"
           if "checksum" in first.lower() else f"it does not decode ({type(exc).__name__}: {first[:120]})")
    return StoreError(f"{_where(path, name, arr, i, n_rows)} is corrupt: {why}; restore the store from "
                      "a backup or re-ingest its source")


# ---- vbcluster check ----------------------------------------------------------------------------
@dataclass
class CheckReport:
    path: str
    n_rows: int
    chunks: int
    n_bytes: int
    seconds: float
    checksummed: bool
    nonfinite_rows: int

    @property
    def seconds_per_gb(self) -> float | None:
        """The check's time per GB of chunk files; None below RATE_MIN_BYTES, where it measures the
        start-up, not the reading (an empty store gave 11690331000.0 s/GB)."""
        return self.seconds / (self.n_bytes / 1e9) if self.n_bytes >= RATE_MIN_BYTES else None


#: the fewest bytes of chunk files whose check time is reported per GB
RATE_MIN_BYTES = 1_000_000


def check(path: str, progress: Callable[[int], None] | None = None) -> CheckReport:
    """Verify a whole store: every chunk present and decoded (checksum verified), features finite,
    and each chunk the one vbcluster wrote at its position (stores that record ``chunk_crcs``)."""
    from pipeline.store.features import FeatureStore

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreIntegrityWarning)
        store = FeatureStore.open(path)
    check_appends(path, store.attrs, store.n_rows)
    info = scan(path, store.group, store.n_rows) if store.n_rows else None
    chunks, bad_rows = 0, 0
    for name in ARRAYS:
        if name not in store.group.array_keys():
            continue
        for s in store.chunk_slices():
            i = s.start // store.chunk_rows
            crc = info.crcs[name][i] if info is not None and info.checksummed else None
            block = read_chunk(path, name, i, store.n_rows, crc)
            if name == "features":
                bad_rows += int((~np.isfinite(block).all(axis=1)).sum())
            chunks += 1
            if progress is not None:
                progress(1)
    if info is not None and info.checksummed:  # each chunk where vbcluster wrote it (chunk_crcs)
        try:
            _check_positions(path, store.group, info.crcs, store.n_rows)
        except StoreError as exc:
            raise StoreError(f"{exc}" + (f"; {bad_rows} rows of 'features' hold NaN/inf" if bad_rows else "")
                             ) from None
    return CheckReport(path, store.n_rows, chunks, info.n_bytes if info else 0, time.perf_counter() - t0,
                       info.checksummed if info else True, bad_rows)


def check_appends(path: str, attrs: dict[str, Any], n_rows: int) -> None:
    """The row count is what the append records add up to (every append records its rows): rows that
    no append wrote (two writers at once, an edited attribute) are refused by name."""
    records = attrs.get("appends")
    if not isinstance(records, list) or not all(isinstance(r, dict) and isinstance(r.get("rows"), int)
                                                for r in records):
        return  # a store of an older vbcluster without the records
    total = sum(int(r["rows"]) for r in records)
    if total != n_rows:
        raise StoreError(f"{path}: the store counts {n_rows} rows but its append records add up to {total} "
                         f"({len(records)} appends); rows were written outside an append: restore the "
                         "store from a backup or re-ingest its sources")


# ---- vbcluster check --upgrade --------------------------------------------------------------------
def recover_upgrade(path: str) -> None:
    """Finish or undo an upgrade that was killed between its two renames (idempotent)."""
    p = Path(path)
    old, tmp = p.with_name(p.name + UPGRADE_OLD), p.with_name(p.name + UPGRADE_TMP)
    done = p.with_name(p.name + COMPLETE)
    if p.exists() or not old.exists():
        return
    if done.is_file() and tmp.is_dir():
        os.replace(tmp, p)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(old, p)
    done.unlink(missing_ok=True)


def upgrade(path: str) -> bool:
    """Rewrite a store without checksums with them; False when it already has them.

    A complete copy is written to ``STORE.upgrade-tmp``, then swapped in by two renames; a kill at
    any point leaves either the old or the new store (finished by the next open).
    """
    from pipeline.store.features import FeatureStore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreIntegrityWarning)
        src = FeatureStore.open(path, "r+")
    with src.writing():  # no append while the copy is made and swapped in
        return _upgrade_locked(src)


def _upgrade_locked(src: Any) -> bool:
    names = [n for n in ARRAYS if n in src.group.array_keys()]
    if all(has_checksums(src.group[n]) for n in names):  # type: ignore[arg-type]
        return False
    path = src.path
    p = Path(path)
    tmp, old = p.with_name(p.name + UPGRADE_TMP), p.with_name(p.name + UPGRADE_OLD)
    done = p.with_name(p.name + COMPLETE)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _copy_with_checksums(src, tmp, names)
        _fsync_tree(tmp)
        done.write_text("")
        os.replace(p, old)
        os.replace(tmp, p)
        done.unlink()
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if not p.exists():
            recover_upgrade(path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (the copy is durable before it is swapped in)."""
    for d, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _copy_with_checksums(src: Any, tmp: Path, names: list[str]) -> None:
    """Copy every array of ``src`` into a new store at ``tmp`` with the checksum codec; copy anything
    else in the store (assignment groups) as files."""
    root = Path(src.path)
    for entry in root.iterdir():
        if entry.name not in names and entry.name != "zarr.json":
            dst = tmp / entry.name
            tmp.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, dst)
    group = zarr.open_group(str(tmp), mode="a")
    n = src.n_rows
    for name in names:
        a = src.group[name]
        level = next((c.level for c in a.compressors if isinstance(c, ZstdCodec)), 1)
        codec = codec_of(a)  # type: ignore[arg-type]
        comp = compressors(level) if codec == "zstd" else compressors(level, codec)
        new = group.create_array(name, shape=a.shape, chunks=a.chunks, dtype=a.dtype,
                                 compressors=comp, config={"write_empty_chunks": True})
        for s in src.chunk_slices():
            new[s] = read_rows(src.path, src.group, name, s, n)
    group.attrs.update(dict(src.group.attrs))
