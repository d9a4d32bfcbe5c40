"""Writing a plan into a feature store: one append transaction, or a new store built beside the
target and moved into place whole; batches re-cut to whole store chunks."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.files import leftovers
from pipeline.files.atomic import replace_dir
from pipeline.ingest.plan import Batch, Plan
from pipeline.store.features import FeatureStore
from pipeline.store.journal import AppendLock, journal_paths
from vbcore.data.normalize import check_normalization
from vbcore.errors import ConfigError, InputError, StoreError

#: the chunk of a store made from a source smaller than the ``chunk_rows`` asked for (the default)
SMALL_SOURCE_CHUNK_ROWS = 8192


def write_plan(plan: Plan, out: Path, source: str, append: bool, chunk_rows: int, batch_chunks: int,
               on_nonfinite: str, compression_level: int, record: dict[str, Any] | None = None,
               normalize: str = "none", codec: str | None = None) -> tuple[FeatureStore, int]:
    """Append the plan's rows to the store at ``out``, or build a new store and move it there;
    ``record`` goes into the append record (the source fingerprint); ``normalize``: a new store's
    row normalisation (an append applies the store's, :func:`store_normalization`); ``codec``: a new
    store's features codec (None: the default, :data:`pipeline.store.integrity.FEATURE_CODEC`)."""
    if append:
        store = FeatureStore.open(out, "r+")
        size = store.chunk_rows * batch_chunks
        first = store.chunk_rows - store.n_rows % store.chunk_rows  # then whole chunks
        written = store.append_batches(_aligned(_some_rows(plan.blocks(first, size), source), first, size),
                                       source=source, on_nonfinite=on_nonfinite, record=record)
        return store, written
    size = chunk_rows * batch_chunks
    blocks, short = _peek_rows(_some_rows(plan.blocks(size, size), source), chunk_rows)
    if short is not None:  # a source smaller than one chunk (issue 29): no chunk larger than the
        # source, or than the default chunk when the source is smaller (room for appends)
        chunk_rows = min(chunk_rows, max(short, SMALL_SOURCE_CHUNK_ROWS))
        size = chunk_rows * batch_chunks
    tmp = leftovers.make_temp(out)  # a private sibling .OUT.tmp-<random>, its writer recorded
    try:
        store = FeatureStore.create(
            tmp, plan.n_features, chunk_rows=chunk_rows, labels=plan.labels, ids=plan.ids,
            weights=plan.weights, source=source,
            extractor=plan.extractor, extractor_params=plan.extractor_params,
            compression_level=compression_level, normalize=normalize,
            **({} if codec is None else {"codec": codec}))
        written = store.append_batches(_aligned(blocks, size, size), source=source,
                                       on_nonfinite=on_nonfinite, record=record)
        _move_into_place(tmp, out)
    except BaseException:
        _remove_store(tmp)
        leftovers.release(tmp)
        raise
    leftovers.release(tmp)  # after the old store (renamed aside) is gone too
    return FeatureStore.open(out, "r"), written


def _some_rows(blocks: Iterator[Batch], source: str) -> Iterator[Batch]:
    """``blocks``, refusing a source that yields no row at all (a 0-row .npy used to make an empty
    store, or an empty append, silently); raised inside the write, so nothing is kept."""
    n = 0
    for b in blocks:
        n += int(b[0].shape[0])
        yield b
    if n == 0:
        raise InputError(f"{source}: the source holds no rows; nothing to ingest")


def counted(blocks: Callable[[int, int], Iterator[Batch]],
             progress: Callable[[int], None]) -> Callable[[int, int], Iterator[Batch]]:
    """``blocks`` that reports the rows of each batch it yields."""
    def wrapped(first: int, size: int) -> Iterator[Batch]:
        for b in blocks(first, size):
            progress(int(b[0].shape[0]))
            yield b
    return wrapped


# ---- placing the store --------------------------------------------------------------------------
def occupied(path: Path) -> bool:
    """True when ``path`` exists and is not an empty directory."""
    return path.exists() and not (path.is_dir() and not any(path.iterdir()))


def check_target(out: Path, append: bool, overwrite: bool) -> None:
    """Refuse a target that does not fit the mode: an append needs a store, a new store a free path
    (``overwrite`` replaces only a feature store)."""
    if append and overwrite:
        raise ConfigError("--append (append=True) and --overwrite (overwrite=True) contradict each other; "
                          "pass one of them")
    if append and not out.exists():
        raise StoreError(f"{out}: no feature store to append to; leave out append to create one")
    if not append and occupied(out):
        if not overwrite:
            raise StoreError(f"{out} already exists; pass --append (append=True) to add rows to it or "
                             "--overwrite (overwrite=True) to replace it")
        check_replaceable(out)


def store_normalization(out: Path, append: bool, normalize: str | None) -> str:
    """The row normalisation of an ingest into ``out`` (:mod:`vbcore.data.normalize`): a new store takes
    ``normalize`` (None: ``'none'``); an append applies the one the store recorded when it was
    created, and refuses an explicit ``normalize`` that differs from it."""
    asked = None if normalize is None else check_normalization(normalize, "--normalize (normalize=)")
    if not append:
        return asked or "none"
    held = FeatureStore.open(out, "r").normalize
    if asked is not None and asked != held:
        raise StoreError(f"{out}: the store's rows are normalised {held!r} (recorded when it was created), "
                         f"but this append asks for --normalize {asked!r}; leave --normalize out to apply "
                         f"{held!r}, or ingest into a new store")
    return held


def check_replaceable(out: Path) -> None:
    """Refuse to overwrite anything but a feature store (or an empty directory), and a store that holds
    files vbcluster did not write there (they would go with it): the store's ``zarr.json`` and its
    Zarr members (arrays, the ``assignments`` group) are all it may hold."""
    if out.is_symlink():
        raise StoreError(f"{out} is a symbolic link; refusing to replace it (remove it yourself or choose "
                         "another path)")
    try:
        store = FeatureStore.open(out, "r")
    except StoreError:
        raise StoreError(f"{out} exists and is not a vbcluster feature store; refusing to replace it "
                         "(remove it yourself or choose another path)") from None
    own = {"zarr.json", *store.group.array_keys(), *store.group.group_keys()}
    foreign = sorted(p.name for p in out.iterdir() if p.name not in own)
    if foreign:
        raise StoreError(f"{out} holds {foreign[0]!r}, which vbcluster did not write there; refusing to "
                         "replace the store (it would be deleted with it): move it out first")


def _remove_store(root: Path) -> None:
    for p in (root, *journal_paths(root)):
        shutil.rmtree(p, ignore_errors=True)


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the complete store ``tmp`` to ``out``; an old store there goes only after that."""
    with AppendLock(out):  # no append to an old store at out meanwhile (refused while one runs)
        for j in journal_paths(out):  # an old store's interrupted-append journal must not touch the new one
            shutil.rmtree(j, ignore_errors=True)
        replace_dir(tmp, out, discard=_remove_store)


# ---- batching -----------------------------------------------------------------------------------
def _take(b: Batch, start: int, stop: int) -> Batch:
    return tuple(None if a is None else a[start:stop] for a in b)  # type: ignore[return-value]


def _concat(pieces: list[Batch]) -> Batch:
    """One batch of the pieces (features, labels, ids and, where given, weights)."""
    if len(pieces) == 1:
        return pieces[0]
    return tuple(None if pieces[0][j] is None else np.concatenate([p[j] for p in pieces])  # type: ignore[return-value]
                 for j in range(len(pieces[0])))


def _peek_rows(blocks: Iterator[Batch], chunk_rows: int) -> tuple[Iterator[Batch], int | None]:
    """Read ahead until ``chunk_rows`` rows are seen or the source ends; returns the same batches and,
    when the whole source holds fewer rows than one chunk, its row count (else None). Zarr builds a
    whole chunk in memory to write a partial one: 10 rows into a 50,000,000-row chunk allocated
    1.8 GB at 9 features, so :func:`write_plan` caps the chunk of a new store by the source."""
    head: list[Batch] = []
    rows = 0
    for block in blocks:
        head.append(block)
        rows += len(block[0])
        if rows >= chunk_rows:
            return itertools.chain(head, blocks), None
    return iter(head), rows


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


