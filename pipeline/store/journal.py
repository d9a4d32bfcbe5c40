"""The append journal and the append lock of a feature store (:mod:`pipeline.store.features` describes the
transaction): one writer at a time, and an interrupted append undone only once its writer is gone.

The journal ``STORE.append-journal/`` beside the store holds the metadata files and the rows of the
last, partly filled chunk of every row array from before the append (:func:`begin`);
:func:`rollback` restores them and deletes the chunks beyond the old extent; :func:`commit` renames
it away. The lock ``.STORE.lock`` beside the store is :class:`AppendLock`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from pipeline.files.atomic import fsync_dir, rename
from pipeline.files.locks import RunLock
from pipeline.store.integrity import ARRAYS
from vbcore.errors import RunLockedError, StoreError

__all__ = ["JOURNAL", "AppendLock", "settle", "journal_path", "journal_paths", "begin", "commit", "rollback"]

JOURNAL = ".append-journal"  # suffix of a directory beside the store


def _array(group: zarr.Group, name: str) -> zarr.Array:
    a = group[name]
    if not isinstance(a, zarr.Array):
        raise StoreError(f"'{name}' in the store is a group, not an array")
    return a


class AppendLock(RunLock):
    """The append lock of the store at ``root``: the file ``.NAME.lock`` beside it (outside the Zarr
    hierarchy, which warns about foreign files; it guards the path, so it also covers a replacement
    of the whole store). The run lock's mechanism (:class:`pipeline.files.locks.RunLock`): a lock
    whose process is gone is stale and taken over; ``acquire`` refuses a live holder; ``release``
    removes the file."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        root = Path(root)
        super().__init__(root.parent)
        self.path = root.parent / f".{root.name}.lock"
        self.store = str(root)

    def acquire(self) -> AppendLock:
        """Take the lock, or a :class:`StoreError` naming the writer that holds it."""
        try:
            super().acquire()
        except RunLockedError as exc:
            raise StoreError(str(exc)) from None
        return self

    def _locked(self, holder: dict[str, Any] | None) -> RunLockedError:
        if holder is None:
            return RunLockedError(f"{self.store}: its append lock {self.path} is being written or "
                                  "unreadable; if no vbcluster process writes the store, remove that file")
        return RunLockedError(
            f"{self.store}: an append by pid {holder.get('pid')} on host {holder.get('host')} (since "
            f"{_dt.datetime.fromtimestamp(holder.get('started', 0)).isoformat(timespec='seconds')}) is in "
            "progress; wait for it to finish, then retry")

    def describe(self) -> StoreError:
        """The one-line 'in progress' error for the current holder."""
        holder = self._holder()
        if holder is None:
            return StoreError(f"{self.store}: an append is in progress or was just interrupted (its journal "
                              f"{journal_path(Path(self.store))} exists); retry in a moment")
        return StoreError(str(self._locked(holder)))


def settle(root: Path, writable: bool) -> None:
    """An open found a journal: refuse while its append is live, else roll it back (under the lock)."""
    lock = AppendLock(root)
    if lock.is_held():  # a live writer: never touch its journal
        if journal_path(root).exists():  # (.tmp or .done alone: the store is consistent, read it)
            raise lock.describe()
        return
    if not writable:
        if journal_path(root).exists():
            raise StoreError(f"{root}: an append was interrupted; open the store with write access once "
                             "to roll it back")
        return
    try:
        lock.acquire()
    except StoreError:  # a writer took it since we looked
        if journal_path(root).exists():
            raise
        return
    try:
        rollback(root)
    finally:
        lock.release()


def journal_path(root: str | os.PathLike[str], suffix: str = "") -> Path:
    """The journal directory beside the store (outside the Zarr hierarchy)."""
    root = Path(root)
    return root.parent / (root.name + JOURNAL + suffix)


def journal_paths(root: str | os.PathLike[str]) -> list[Path]:
    """Every path an append's journal can occupy beside the store at ``root``: the journal, its
    ``.tmp`` (before the start of the transaction) and its ``.done`` (during the commit)."""
    return [journal_path(Path(root), s) for s in ("", ".tmp", ".done")]


def _save_tail(path: Path, values: np.ndarray) -> None:
    if values.dtype.kind in "biuf":
        np.save(path.with_suffix(".npy"), values, allow_pickle=False)
    else:
        path.with_suffix(".json").write_text(json.dumps([str(v) for v in values.tolist()]))


def _load_tail(path: Path) -> np.ndarray | None:
    if path.with_suffix(".npy").exists():
        return np.load(path.with_suffix(".npy"), allow_pickle=False)
    if path.with_suffix(".json").exists():
        return np.array(json.loads(path.with_suffix(".json").read_text()), dtype=str)
    return None


def _metadata_files(root: Path) -> Iterator[Path]:
    yield root / "zarr.json"
    for name in ARRAYS:
        if (root / name / "zarr.json").is_file():
            yield root / name / "zarr.json"


def begin(root: Path, group: zarr.Group, old_n: int, chunk_rows: int) -> None:
    if journal_path(root).exists():
        rollback(root)
    tmp = journal_path(root, ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for f in _metadata_files(root):
        rel = f.relative_to(root)
        (tmp / "meta" / rel.parent).mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, tmp / "meta" / rel)
    tail = (old_n // chunk_rows) * chunk_rows
    for name in ARRAYS:
        if name in group.array_keys() and tail < old_n:
            _save_tail(tmp / f"tail-{name}", np.asarray(_array(group, name)[tail:old_n]))
    (tmp / "journal.json").write_text(json.dumps({"old_n_rows": old_n, "tail_start": tail}))
    fsync_dir(tmp)
    rename(tmp, journal_path(root))  # the start of the transaction


def commit(root: Path) -> None:
    done = journal_path(root, ".done")
    shutil.rmtree(done, ignore_errors=True)
    rename(journal_path(root), done)  # the commit
    shutil.rmtree(done, ignore_errors=True)


def rollback(root: Path) -> None:
    """Undo an interrupted append (idempotent: safe to interrupt and repeat)."""
    with zarr.config.set({"array.write_empty_chunks": True}):  # an all-zero tail is a chunk file too
        _undo(root)


def _undo(root: Path) -> None:
    shutil.rmtree(journal_path(root, ".tmp"), ignore_errors=True)
    shutil.rmtree(journal_path(root, ".done"), ignore_errors=True)
    j = journal_path(root)
    if not j.exists():
        return
    info = json.loads((j / "journal.json").read_text())
    old_n, tail = int(info["old_n_rows"]), int(info["tail_start"])
    meta = j / "meta"
    for f in sorted(meta.rglob("zarr.json")):
        shutil.copy2(f, root / f.relative_to(meta))
    group = zarr.open_group(str(root), mode="r+")
    for name in ARRAYS:
        if name not in group.array_keys():
            continue
        arr = _array(group, name)
        # drop chunk files a killed append wrote beyond the old extent
        chunk = arr.chunks[0]
        for d in _chunk_dirs(root / name):
            try:
                idx = int(d.name)
            except ValueError:
                continue
            if idx * chunk >= old_n:
                if d.is_dir():
                    shutil.rmtree(d, ignore_errors=True)
                else:
                    d.unlink(missing_ok=True)
        saved = _load_tail(j / f"tail-{name}")
        if saved is not None:
            arr[tail:old_n] = saved
    rename(j, journal_path(root, ".done"))
    shutil.rmtree(journal_path(root, ".done"), ignore_errors=True)


def _chunk_dirs(array_dir: Path) -> list[Path]:
    c = array_dir / "c"
    return list(c.iterdir()) if c.is_dir() else []
