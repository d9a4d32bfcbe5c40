"""Writing extracted images into a feature store: chunk-aligned batches, an atomic create or append,
and the image manifest (which images the store holds, with their size and modification time).

Used by :mod:`pipeline.extract.extraction`. The manifest is the str array ``image_manifest`` in the store's
group, one ``ID<TAB>SIZE<TAB>MTIME_NS`` line per image held, beside it ``image_digests``, one
``ID<TAB>DIGEST`` line per image (the digest of its decoded pixels,
:func:`pipeline.extract.image_sources.pixel_digest`; stores written before hold none), and the group
attribute ``images`` records ``held``, ``n_skipped`` and the ``skipped`` images' ids.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.extract.extractors import FeatureExtractor
from pipeline.extract.image_sources import ImageSet
from pipeline.files import leftovers
from pipeline.files.atomic import replace_dir
from pipeline.store.features import FeatureStore
from pipeline.store.journal import JOURNAL, AppendLock

MANIFEST = "image_manifest"
DIGESTS = "image_digests"  # one ID<TAB>DIGEST line per image held (pixel_digest); absent in older stores
Batch = tuple[np.ndarray, np.ndarray | None, np.ndarray]  # (features, labels or None, ids)


def read_manifest(store: FeatureStore) -> dict[str, tuple[int, int]]:
    """{id: (size, mtime_ns)} of the images the store's manifest lists (empty when it has none)."""
    if MANIFEST not in store.group.array_keys():
        return {}
    arr = store.group[MANIFEST]
    out = {}
    for line in np.asarray(arr[:]).tolist():  # type: ignore[index]
        i, size, mtime = str(line).rsplit("\t", 2)  # (ids held before tabs were refused may hold one)
        out[i] = (int(size), int(mtime))
    return out


def read_digests(store: FeatureStore) -> dict[str, str]:
    """{id: pixel digest} of the images held (empty for a store written before digests were kept)."""
    if DIGESTS not in store.group.array_keys():
        return {}
    out = {}
    for line in np.asarray(store.group[DIGESTS][:]).tolist():  # type: ignore[index]
        i, digest = str(line).rsplit("\t", 1)
        out[i] = digest
    return out


def _write_lines(store: FeatureStore, name: str, lines: list[str]) -> None:
    arr = store.group.create_array(name, shape=(len(lines),), chunks=(max(1, min(len(lines), 65536)),),
                                   dtype=str, overwrite=True)
    if lines:
        arr[:] = np.array(lines, dtype=str)


# ---- writing the store --------------------------------------------------------------------------
def aligned(blocks: Iterator[Batch], first: int, size: int) -> Iterator[Batch]:
    """Re-cut ``blocks`` into batches of ``first``, then ``size`` rows, so writes fill whole chunks."""
    want, pending, have = first, [], 0
    for b in blocks:
        pending.append(b)
        have += len(b[0])
        while have >= want:
            X = np.concatenate([p[0] for p in pending])
            lab = None if pending[0][1] is None else np.concatenate([p[1] for p in pending])  # type: ignore[misc]
            ids = np.concatenate([p[2] for p in pending])
            yield X[:want], None if lab is None else lab[:want], ids[:want]
            pending = [(X[want:], None if lab is None else lab[want:], ids[want:])]
            have, want = have - want, size
    if have:
        yield (np.concatenate([p[0] for p in pending]),
               None if pending[0][1] is None else np.concatenate([p[1] for p in pending]),  # type: ignore[misc]
               np.concatenate([p[2] for p in pending]))


def _remove_store(root: Path) -> None:
    for p in (root, *(root.parent / (root.name + JOURNAL + s) for s in ("", ".tmp", ".done"))):
        shutil.rmtree(p, ignore_errors=True)


def create_store(out: Path, blocks: Iterator[Batch], source: str, chunk_rows: int, batch_chunks: int,
            drop: bool, level: int, ext: FeatureExtractor, params: dict[str, Any], labels: bool,
            images: ImageSet, todo: list[int], skipped: list[str], normalize: str = "none",
            digests: dict[str, str] | None = None) -> int:
    """Build the store at a temporary sibling path and move it into place once complete; ``normalize``:
    its row normalisation (:mod:`vbcore.data.normalize`)."""
    tmp = leftovers.make_temp(out)  # .OUT.tmp-<random>, its writer recorded (pipeline.files.leftovers)
    try:
        store = FeatureStore.create(tmp, ext.n_features, chunk_rows=chunk_rows, labels=labels, ids="str",
                                    source=source, extractor=ext.name, extractor_params=params,
                                    compression_level=level, normalize=normalize)
        size = chunk_rows * batch_chunks
        written = store.append_batches(aligned(blocks, size, size), source=source,
                                       on_nonfinite="drop" if drop else "raise")
        record_images(store, images, todo, skipped, digests)
        with AppendLock(out):  # no append to an old store at out meanwhile
            for j in ("", ".tmp", ".done"):
                shutil.rmtree(out.parent / (out.name + JOURNAL + j), ignore_errors=True)
            replace_dir(tmp, out, discard=_remove_store)  # an old store is renamed aside, then removed
    except BaseException:
        _remove_store(tmp)
        leftovers.release(tmp)
        raise
    leftovers.release(tmp)
    return written


def append_store(out: Path, blocks: Iterator[Batch], source: str, batch_chunks: int, drop: bool,
            images: ImageSet, todo: list[int], skipped: list[str],
            digests: dict[str, str] | None = None) -> int:
    store = FeatureStore.open(out, "r+")
    with store.writing():  # the rows and the manifest under one hold of the append lock
        size = store.chunk_rows * batch_chunks
        first = store.chunk_rows - store.n_rows % store.chunk_rows
        written = store.append_batches(aligned(blocks, first, size), source=source,
                                       on_nonfinite="drop" if drop else "raise")
        record_images(store, images, todo, skipped, digests)
    return written


def record_images(store: FeatureStore, images: ImageSet, todo: list[int], skipped: list[str],
                  digests: dict[str, str] | None = None) -> None:
    """The image manifest (id, size, mtime of every image held), the pixel digests of the images held
    (``digests``: the new ones) and the skipped images.

    Written after the rows (for an append, after its commit): when a kill lands in between, the next
    append finds held ids missing from the manifest and takes their size and mtime from the listing."""
    known = read_manifest(store)
    held = set(np.asarray(store.read_ids()).tolist())
    new = set(todo)
    for i, name in enumerate(images.ids):
        if name in held and (name not in known or i in new):
            known[name] = (images.sizes[i], images.mtimes[i])
    _write_lines(store, MANIFEST, [f"{k}\t{s}\t{m}" for k, (s, m) in known.items()])
    sums = {**read_digests(store), **{k: v for k, v in (digests or {}).items() if k in held}}
    _write_lines(store, DIGESTS, [f"{k}\t{v}" for k, v in sums.items()])
    store.group.attrs.update({"images": {"held": len(known), "n_skipped": len(skipped),
                                         "skipped": list(skipped), "manifest": MANIFEST}})
