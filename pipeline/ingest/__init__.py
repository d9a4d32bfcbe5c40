"""Ingest: stream a source into a feature store, chunk by chunk, atomically.

``ingest(source, out)`` reads ``source`` in batches of ``chunk_rows`` rows and hands a generator of
batches to :meth:`FeatureStore.append_batches` (one transaction), so memory stays at a few chunks
whatever the size of the source. A new store is built at a private sibling path ``.OUT.tmp-<random>``
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
``STORE.zarr/``             a feature store of raw rows, copied (labels, ids, weights with it)
==========================  ===================================================================

The package has one reader module per source kind (``numpy_files``: .npy/.npz, ``hdf5``, ``tables``:
Parquet/CSV, ``images``: image folders, ``bundled``: digits and ``image:NAME``, ``synthetic``,
``stores``: a feature store), each
turning a source into a :class:`~pipeline.ingest.plan.Plan`, and ``writer``, which streams a plan into
a store (one append transaction, or a new store moved into place whole with :mod:`pipeline.files.atomic`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zarr

from pipeline.files import leftovers
from pipeline.ingest.bundled import MAX_IMAGE_PIXELS, bundled_images, read_digits, read_image
from pipeline.ingest.fingerprint import find_duplicate, source_fingerprint
from pipeline.ingest.hdf5 import read_hdf5
from pipeline.ingest.images import IMAGE_SUFFIXES
from pipeline.ingest.numpy_files import read_npy, read_npz
from pipeline.ingest.plan import Batch, Plan, as_int, with_weights
from pipeline.ingest.stores import is_store_source, read_store
from pipeline.ingest.synthetic import SYNTHETIC_DEFAULTS, read_synthetic, synthetic_class_sizes
from pipeline.ingest.tables import read_csv, read_parquet
from pipeline.ingest.writer import check_target, counted, store_normalization, write_plan
from pipeline.store import CHUNK_ROWS
from vbcore.errors import ConfigError, InputError, StoreError

__all__ = ["ingest", "IngestReport", "bundled_images", "synthetic_class_sizes", "SYNTHETIC_DEFAULTS",
           "FILE_SUFFIXES", "IMAGE_SUFFIXES", "MAX_IMAGE_PIXELS", "Batch", "Plan", "open_source"]

FILE_SUFFIXES = (".npy", ".npz", ".h5", ".hdf5", ".parquet", ".csv")


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


# ---- the entry point ----------------------------------------------------------------------------
def ingest(source: str, out: str | os.PathLike[str], *, chunk_rows: int = CHUNK_ROWS,
           labels: str | None = None, ids: str | None = None, append: bool = False,
           drop_nonfinite: bool = False, overwrite: bool = False, allow_duplicate: bool = False,
           compression_level: int = 1, batch_chunks: int = 1, progress: Callable[[int], None] | None = None,
           weights: str | None = None, normalize: str | None = None, codec: str | None = None,
           **options: Any) -> IngestReport:
    """Stream ``source`` into the feature store ``out``.

    Parameters
    ----------
    source : str
        A file path (.npy, .npz, .h5/.hdf5, .parquet, .csv), an image folder, tar shards of images
        (``*.tar``), a text file listing image paths (``.txt``/``.lst``; images go through
        :mod:`pipeline.extract.extraction`), ``'digits'``, ``'image:NAME'``, ``'synthetic'``, a store.
    out : path
        The store. It must not exist unless ``append`` (add rows to it) or ``overwrite`` (replace it,
        only once the new store is complete).
    chunk_rows : int
        Rows per store chunk and per batch read (a new store's chunking; an append follows the store's).
    labels, ids : str, optional
        Where labels / ids come from: a file, key, dataset or column name (``'folders'``: image folders).
    drop_nonfinite : bool
        Skip rows holding NaN/inf (counted in the report) instead of failing on the first one.
    compression_level, codec : int, {'lz4', 'lz4hc', 'zstd'} or None
        zstd level of a new store's chunks; its features' codec (None: lz4; zstd at that level).
    batch_chunks : int
        Store chunks per batch written. Zarr compresses the chunks of one batch in parallel threads,
        so 2 uses two cores; memory grows with it (about 3 x batch_chunks chunks).
    progress : callable, optional
        ``progress(rows)`` after each batch read from the source, with the number of rows in it.
    weights : str, optional
        Row weights (:func:`open_weighted`): a ``.npy`` file or the source's column, array, dataset.
    normalize : {'none', 'l2', 'power-l2'}, optional
        A new store's row normalisation (:mod:`vbcore.data.normalize`; default ``'none'``), recorded in its
        ``normalize`` attribute; an append applies the store's and refuses a different one.
    allow_duplicate : bool
        Append a source the store holds (same fingerprint, :mod:`pipeline.ingest.fingerprint`).
    **options
        Source options (``key``, ``dataset``, ``ignore_columns``, ``delimiter``, ``extractor``,
        ``skip_unreadable``, ``batch_images``, ``downsample``, ``rows``, ``dim``, ``classes``,
        ``seed``, ...). Unknown options are an error.

    Returns
    -------
    IngestReport
    """
    # ---- image sources (folders, tar shards, image lists): sharded extraction in pipeline/extract/ ----
    from pipeline.extract.extraction import ingest_images, is_image_source

    leftovers.clean(out)  # temporaries of killed ingests into ``out`` whose writer is gone
    if is_image_source(str(source)) and not is_store_source(str(source)):
        if weights is not None:
            raise ConfigError("--weights is for array and table sources, not image sources")
        return ingest_images(str(source), out, chunk_rows=chunk_rows, labels=labels, ids=ids, append=append,
                             drop_nonfinite=drop_nonfinite, overwrite=overwrite,
                             compression_level=compression_level, batch_chunks=batch_chunks,
                             progress=progress, normalize=normalize, **options)
    # ---- end of image sources -------------------------------------------------------------------
    t0 = time.perf_counter()
    out = Path(out)
    chunk_rows = as_int("chunk_rows", chunk_rows, minimum=1)
    batch_chunks = as_int("batch_chunks", batch_chunks, minimum=1)
    compression_level = as_int("compression_level", compression_level, minimum=0)
    check_target(out, append, overwrite)
    normalize = store_normalization(out, append, normalize)
    plan = _open_plan(str(source), out, append, labels, ids, dict(options), chunk_rows, weights)
    if progress is not None:
        plan.blocks = counted(plan.blocks, progress)
    # Every chunk written here is full of rows, so zarr's per-chunk "is it all fill value?" scan (a
    # third of the write time on dense features) is wasted work: skip it.
    with contextlib.ExitStack() as stack:
        stack.callback(plan.close)
        fp = source_fingerprint(str(source), labels, ids, options, chunk_rows)
        if append and not allow_duplicate:
            refuse_duplicate(out, str(source), fp)
        stack.enter_context(zarr.config.set({"array.write_empty_chunks": True}))
        store, written = write_plan(plan, out, str(source), append, chunk_rows, batch_chunks,
                                    "drop" if drop_nonfinite else "raise", compression_level,
                                    {"source_fingerprint": fp}, normalize, codec)
    return _report(store, written, str(source), t0, plan)


def _open_plan(source: str, out: Path, append: bool, labels: str | None, ids: str | None,
               options: dict[str, Any], chunk_rows: int, weights: str | None) -> Plan:
    """The plan of a source that is not images: a feature store's rows (:mod:`pipeline.ingest.stores`),
    or :func:`open_weighted` (an append of ``synthetic`` continues the store's class model)."""
    if is_store_source(source):
        return read_store(Path(source), out, labels, ids, options, weights)
    model = synthetic_model(out) if append and source == "synthetic" else None
    return open_weighted(source, labels, ids, options, chunk_rows, weights, model)


def _report(store: Any, written: int, source: str, t0: float, plan: Plan) -> IngestReport:
    record = store.attrs["appends"][-1]
    return IngestReport(path=str(store.path), rows_written=int(written),
                        rows_dropped=int(record.get("dropped_nonfinite", 0)),
                        n_features=store.n_features, source=source,
                        elapsed_s=time.perf_counter() - t0, n_rows=store.n_rows,
                        skipped_files=tuple(plan.skipped))


def refuse_duplicate(out: Path, source: str, fingerprint: str) -> None:
    """Refuse to append a source whose fingerprint the store at ``out`` already records."""
    from pipeline.store.features import FeatureStore

    rec = find_duplicate(list(FeatureStore.open(out, "r").attrs.get("appends", [])), fingerprint)
    if rec is not None:
        raise StoreError(f"{out}: {source} was already appended to this store on {rec.get('time')} "
                         f"({rec.get('rows')} rows, as {rec.get('source')!r}; same source fingerprint "
                         f"{fingerprint[:12]}); pass --allow-duplicate (allow_duplicate=True) to append "
                         "it again")


# ---- choosing the reader ------------------------------------------------------------------------
#: sources whose readers take the weights from a column, array or dataset of their own
SIDE_WEIGHTS = (".npz", ".h5", ".hdf5", ".parquet", ".csv")


def synthetic_model(out: Path) -> dict[str, Any] | None:
    """The extractor_params of the synthetic store at ``out`` (whose class model an append of
    ``synthetic`` continues), or None for a store made from another source."""
    from pipeline.store.features import FeatureStore

    attrs = FeatureStore.open(out, "r").attrs
    return dict(attrs["extractor_params"]) if attrs.get("extractor") == "synthetic" else None


def open_weighted(source: str, labels: str | None, ids: str | None, options: dict[str, Any],
                  chunk_rows: int, weights: str | None, model: dict[str, Any] | None = None) -> Plan:
    """:func:`open_source` with the row weights ``weights``: a column, array or dataset of a table,
    ``.npz`` or HDF5 source (a name that is no ``.npy`` path), read by the source's reader, or a
    ``.npy`` file (:func:`pipeline.ingest.plan.with_weights`)."""
    inside = (weights is not None and Path(source).suffix.lower() in SIDE_WEIGHTS
              and Path(weights).suffix.lower() != ".npy")
    plan = open_source(source, labels, ids, options, chunk_rows, weights if inside else None, model)
    return with_weights(plan, None if inside else weights)


def open_source(source: str, labels: str | None, ids: str | None, options: dict[str, Any],
                chunk_rows: int, weights: str | None = None, model: dict[str, Any] | None = None) -> Plan:
    """Open and check ``source`` with the reader of its kind; ``options`` are consumed (a reader
    refuses the ones it does not know); ``weights``: the column, array or dataset of the row weights
    (:func:`open_weighted`); ``model``: the synthetic store an append continues (:func:`synthetic_model`)."""
    if source == "digits":
        return read_digits(labels, ids, options)
    if source == "synthetic":
        return read_synthetic(labels, ids, options, chunk_rows, model)
    if source.startswith("image:"):
        return read_image(source[len("image:"):], labels, ids, options)
    path = Path(source)  # image folders, tar shards and lists went to pipeline.extract.extraction in ingest()
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise ConfigError(
            f"unknown source {source!r}: expected a file ending in {', '.join(FILE_SUFFIXES)}, an image "
            "folder, 'digits', 'image:NAME' or 'synthetic'"
        )
    if not path.is_file():
        raise InputError(f"{source}: no such file")
    if suffix == ".npy":
        return read_npy(path, labels, ids, options)
    if suffix == ".npz":
        return read_npz(path, labels, ids, options, weights)
    if suffix in (".h5", ".hdf5"):
        return read_hdf5(path, labels, ids, options, weights)
    if suffix == ".parquet":
        return read_parquet(path, labels, ids, options, weights)
    return read_csv(path, labels, ids, options, weights)


