"""Image sources into a feature store: sharded, distributed, resumable and incremental extraction.

``ingest_images(source, out, ...)`` (reached through :func:`pipeline.ingest.ingest` for folders, tar
shards and image lists, see :mod:`pipeline.extract.image_sources`) works in three steps:

1. **List and filter.** The source's images are listed in a fixed order. With ``append=True`` the
   images the store already holds (its ``ids``) are left out, so only new images are extracted; held
   images whose size or modification time changed since (the store's ``image_manifest``) are counted
   and reported, not re-extracted (a store only grows).
2. **Extract shards.** The images to extract are cut into shards of ``shard_images`` images (a
   multiple of ``batch_images``; every batch the extractor sees is fixed by the image order alone).
   Shards run in-process, or as Dask tasks on the cluster given by ``cluster=`` (the fit's configs,
   :func:`pipeline.engine.engines.make_engine`); each process builds the extractor once (a per-process cache
   keyed by the extractor's name and parameters, which include the model's sha256). Every finished
   shard is saved atomically in a work folder ``OUT.extract-<key>`` beside the store, the key hashing
   the images and the settings: a killed extraction run again resumes from its finished shards
   (each carries an id; a damaged or swapped one is extracted again: :mod:`pipeline.extract.shards`).
3. **Write.** The shards are streamed into the store in image order (one atomic create or append, cut
   on the store's chunks), then the image manifest and the skipped images are recorded and the work
   folder is removed. The store holds the same bits whether the shards ran in-process or on any
   number of workers, interrupted or not.

Unreadable images stop the extraction with an error naming the file, or with
``skip_unreadable=True`` are skipped and listed (the store attribute ``images['skipped']``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from pipeline.extract.extractors import FeatureExtractor, make_extractor
from pipeline.extract.idx_images import is_idx_loc
from pipeline.extract.idx_images import shown as idx_shown
from pipeline.extract.image_sources import (
    ImageSet,
    check_inside,
    is_image_source,
    label_codes,
    list_images,
    pixel_digest,
    read_images,
)
from pipeline.extract.image_store import Batch, append_store, create_store, read_manifest
from pipeline.extract.shards import read_shard, save_shard, shard_id, usable
from pipeline.ingest import IngestReport
from pipeline.ingest.plan import as_int
from pipeline.ingest.writer import check_target, store_normalization
from pipeline.store import CHUNK_ROWS
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError, InputError, StoreError, VBClusterError

__all__ = ["ExtractReport", "ingest_images", "is_image_source", "refresh_images", "run_shard"]

log = logging.getLogger("vbcluster.extract")
EXTRACTOR_OPTIONS = ("size", "bins", "orientations", "pixels_per_cell", "cells_per_block", "weights", "arch",
                     "layer", "input_size", "device", "model", "output", "mean", "std", "layout", "resize",
                     "threads", "scale", "interpolation")
INT_OPTIONS = ("size", "bins", "orientations", "pixels_per_cell", "cells_per_block", "input_size", "threads")


@dataclass(frozen=True)
class ExtractReport(IngestReport):
    """An :class:`~pipeline.ingest.IngestReport` plus what the extraction did."""

    images_listed: int = 0       # images in the source
    images_new: int = 0          # images extracted by this call (all of them unless append)
    changed: tuple[str, ...] = ()  # held images whose size or mtime changed (not re-extracted)
    shards: int = 0
    shards_resumed: int = 0      # shards found finished in the work folder
    images_per_s: float = 0.0    # extraction throughput of the shards run by this call
    workers: int = 0             # 0: in-process


# ---- the per-process extractor cache (one model load per worker) --------------------------------
_CACHE: dict[str, FeatureExtractor] = {}
CACHE_SIZE = 4


def _recipe_key(recipe: Any) -> str | None:
    """The cache key of a ``[name, options]`` recipe: the options plus the size and mtime of the model
    or weights file, so a replaced file is loaded again. None for an extractor object."""
    if not isinstance(recipe, list):
        return None
    files = [recipe[1].get(k) for k in ("model", "weights") if recipe[1].get(k)]
    stats = [(os.stat(f).st_size, os.stat(f).st_mtime_ns) if os.path.isfile(f) else None for f in files]
    return json.dumps([recipe, stats], sort_keys=True, default=str)


def cached_extractor(recipe: Any) -> FeatureExtractor:
    """The extractor of ``recipe`` (``[name, options]`` or an extractor object), built once per process.

    On a Dask worker an ONNX extractor without ``threads`` gets the worker's thread count."""
    key = _recipe_key(recipe)
    if key is None:
        return recipe  # type: ignore[no-any-return]
    if key not in _CACHE:
        name, opts = recipe[0], dict(recipe[1])
        if name == "onnx" and "threads" not in opts:
            opts["threads"] = _worker_threads()
        while len(_CACHE) >= CACHE_SIZE:  # a long-lived worker keeps the few most recent models
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = make_extractor(name, **opts)
    return _CACHE[key]


def cache_size() -> int:
    """Extractors built in this process (a Dask worker loads each model once)."""
    return len(_CACHE)


def _worker_threads() -> int:
    try:
        from distributed import get_worker

        return int(get_worker().state.nthreads)
    except (ImportError, ValueError, AttributeError):
        return 0


def canonical(params: dict[str, Any]) -> str:
    """Extractor parameters as canonical JSON, without the store's class list."""
    return json.dumps({k: v for k, v in params.items() if k != "classes"}, sort_keys=True, default=str)


# ---- one shard ----------------------------------------------------------------------------------
def run_shard(recipe: Any, locs: list[str], batch_images: int, skip_unreadable: bool) -> dict[str, Any]:
    """Extract the images at ``locs`` in batches of ``batch_images``.

    Returns ``{'X': (n_ok, n_features) float32, 'ok': positions of the rows in locs (int64),
    'skipped': positions skipped, 'errors': their messages, 'params': the extractor's parameters as
    canonical JSON, 'digests': the rows' :func:`pixel_digest`}`` (the driver checks that every worker
    ran the same model).
    """
    ext = cached_extractor(recipe)
    rows, ok, skipped, errors, digests = [], [], [], [], []
    for s in range(0, len(locs), batch_images):
        images, pos = [], []
        for i, got in read_images(locs[s:s + batch_images]):
            if isinstance(got, Exception):
                msg = f"{_shown(locs[s + i])}: cannot read the image ({type(got).__name__}: {got})"
                if not skip_unreadable:
                    raise InputError(f"{msg}; fix or remove it, or pass skip_unreadable=True")
                skipped.append(s + i)
                errors.append(msg)
                continue
            images.append(got)
            pos.append(s + i)
            digests.append(pixel_digest(got))
        if not images:
            continue
        X = np.asarray(ext(images))
        if X.shape != (len(images), ext.n_features):
            raise InputError(f"extractor {ext.name!r} returned shape {X.shape} for {len(images)} images; "
                             f"expected ({len(images)}, {ext.n_features})")
        rows.append(X.astype(np.float32, copy=False))
        ok.extend(pos)
    X = np.concatenate(rows) if rows else np.empty((0, ext.n_features), np.float32)
    return {"X": X, "ok": np.array(ok, np.int64), "skipped": np.array(skipped, np.int64),
            "errors": np.array(errors, dtype=str), "params": np.array(canonical(ext.params)),
            "digests": np.array(digests, dtype=str)}


def _shown(loc: str) -> str:
    return idx_shown(loc) if is_idx_loc(loc) else loc.replace("::", "/")


# ---- options ------------------------------------------------------------------------------------
@dataclass
class _Settings:
    recipe: Any
    skip_unreadable: bool
    batch_images: int
    shard_images: int
    cluster: Any


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool | np.bool_) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.lower() in ("1", "true", "yes", "on")
    raise ConfigError(f"{name} must be true or false, got {value!r}")


def _settings(options: dict[str, Any]) -> _Settings:
    opts = dict(options)
    skip = _as_bool("skip_unreadable", opts.pop("skip_unreadable", False))
    batch = as_int("batch_images", opts.pop("batch_images", 16), minimum=1)
    shard = as_int("shard_images", opts.pop("shard_images", 32 * batch), minimum=1)
    if shard % batch:
        raise ConfigError(f"shard_images ({shard}) must be a multiple of batch_images ({batch}), so that "
                          "every batch is the same whatever the sharding")
    cluster = opts.pop("cluster", None)
    spec = opts.pop("extractor", None)
    ext_opts = {k: opts.pop(k) for k in EXTRACTOR_OPTIONS if k in opts}
    if opts:
        raise ConfigError(f"unknown option(s) {sorted(opts)} for an image source; see docs/ingest.md")
    for k in INT_OPTIONS:
        if k in ext_opts and isinstance(ext_opts[k], str | int | float):
            ext_opts[k] = as_int(k, ext_opts[k], minimum=0 if k == "threads" else 1)
    if spec is None or isinstance(spec, str):
        recipe: Any = [spec or "color-hog", ext_opts]
    else:
        if ext_opts:
            raise ConfigError(f"extractor options {sorted(ext_opts)} apply only to a built-in extractor name")
        recipe = make_extractor(spec)
    return _Settings(recipe, skip, batch, shard, cluster)


# ---- the entry points ---------------------------------------------------------------------------
def refresh_images(source: str, out: str | os.PathLike[str], **options: Any) -> ExtractReport:
    """Bring the store ``out`` up to date with the image source: create it, or append the new images.

    What a scheduled refresh runs before its warm-started fit (``options`` as :func:`ingest_images`)."""
    exists = Path(out).exists() and (Path(out) / "zarr.json").is_file()
    return ingest_images(source, out, append=exists, **options)


def ingest_images(source: str, out: str | os.PathLike[str], *, chunk_rows: int = CHUNK_ROWS,
                  labels: str | None = None, ids: str | None = None, append: bool = False,
                  drop_nonfinite: bool = False, overwrite: bool = False, compression_level: int = 1,
                  batch_chunks: int = 1, progress: Callable[[int], None] | None = None,
                  normalize: str | None = None, **options: Any) -> ExtractReport:
    """Extract the images of ``source`` into the store ``out`` (see the module docstring).

    Parameters are those of :func:`pipeline.ingest.ingest`; ``progress(n)`` is called with the
    images of each finished shard. Source options: ``extractor`` (a name or an object) and the
    extractor's options, ``skip_unreadable``, ``batch_images`` (16), ``shard_images`` (32 batches),
    ``cluster`` (None: in-process; a cluster config .yaml, a scheduler address or a Client).
    """
    t0 = time.perf_counter()
    out = Path(out)
    st = _settings(options)
    check_target(out, append, overwrite)
    normalize = store_normalization(out, append, normalize)  # an append: the store's
    if ids is not None:
        raise ConfigError("an image source's ids are the images' relative paths; leave ids unset")
    images = list_images(source, labels)
    check_inside(images, source)
    probe = st.recipe
    if st.cluster is not None and isinstance(probe, list) and probe[1].get("device") == "cuda":
        probe = [probe[0], {**probe[1], "device": "auto"}]  # the driver may have no GPU; the workers must
    ext = cached_extractor(probe)
    codes, classes = (label_codes(images.labels, images.kind in ("folder", "tar") and labels != "cls")
                      if images.labels is not None else (None, None))
    params = dict(ext.params)
    if classes is not None:
        params["classes"] = classes
    todo, changed = list(range(len(images))), list[str]()
    if append:
        store = FeatureStore.open(out, "r")
        codes = _check_append(store, ext, params, images, codes, classes, labels)
        todo, changed = _new_images(store, images)
        if changed:
            log.warning("%d held images changed since they were extracted (not re-extracted): %s",
                        len(changed), changed[:5])
    if not todo:
        return _report(out, source, ext, images, 0, 0, [], changed, 0, 0, 0.0, 0, t0)
    key = _work_key(images, todo, ext, params, st)
    work = out.parent / f"{out.name}.extract-{key[:16]}"
    shards = [todo[s:s + st.shard_images] for s in range(0, len(todo), st.shard_images)]
    try:
        resumed, rate, workers = _run_shards(work, shards, images, st, canonical(ext.params), progress)
        skipped = [images.ids[todo[i]] for i in _skipped_positions(work, shards, images)]
        digests: dict[str, str] = {}  # filled as the blocks are written
        blocks = _blocks(work, shards, images, codes, digests)
        lab = codes is not None
        with zarr.config.set({"array.write_empty_chunks": True}):
            written = (append_store(out, blocks, str(source), batch_chunks, drop_nonfinite, images, todo,
                                    skipped, digests)
                       if append else
                       create_store(out, blocks, str(source), chunk_rows, batch_chunks, drop_nonfinite,
                                    compression_level, ext, params, lab, images, todo, skipped,
                                    normalize, digests))
    except VBClusterError:
        shutil.rmtree(work, ignore_errors=True)  # a bad image or setting: the listing will change
        raise
    for stale in out.parent.glob(f"{out.name}.extract-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return _report(out, source, ext, images, written, len(todo), skipped, changed, len(shards), resumed, rate,
                   workers, t0)


def _report(out: Path, source: str, ext: FeatureExtractor, images: ImageSet, written: int, new: int,
            skipped: list[str], changed: list[str], shards: int, resumed: int, rate: float, workers: int,
            t0: float) -> ExtractReport:
    n_rows = FeatureStore.open(out, "r").n_rows
    return ExtractReport(path=str(out), rows_written=int(written), rows_dropped=new - len(skipped) - written,
                         n_features=int(ext.n_features), source=str(source),
                         elapsed_s=time.perf_counter() - t0, n_rows=n_rows, skipped_files=tuple(skipped),
                         images_listed=len(images), images_new=new, changed=tuple(changed), shards=shards,
                         shards_resumed=resumed, images_per_s=rate, workers=workers)


# ---- appends: what is new -----------------------------------------------------------------------


def _check_append(store: FeatureStore, ext: FeatureExtractor, params: dict[str, Any], images: ImageSet,
                  codes: np.ndarray | None, classes: list[str] | None,
                  labels: str | None) -> np.ndarray | None:
    """Refuse an append that would mix extractors or label schemes; labels coded as the store's."""
    a = store.attrs
    old = dict(a.get("extractor_params") or {})
    if a.get("extractor") != ext.name or canonical(old) != canonical(params):
        raise StoreError(f"{store.path} was extracted with {a.get('extractor')!r} {canonical(old)}; this "
                         f"append would use {ext.name!r} {canonical(params)}: append with the same "
                         "extractor settings")
    if store.n_features != ext.n_features or not store.has_ids:
        raise StoreError(f"{store.path}: not an image store of {ext.n_features} features with ids")
    if store.has_labels != (codes is not None):
        raise StoreError(f"{store.path} {'has' if store.has_labels else 'has no'} labels; pass labels= "
                         f"{'as when it was created' if store.has_labels else 'unset'} (got {labels!r})")
    if codes is None or classes is None:
        return codes
    held = list(old.get("classes") or [])
    index = {c: i for i, c in enumerate(held)}
    assert images.labels is not None
    unknown = sorted({c for c in images.labels if c not in index})
    if unknown:
        raise InputError(f"{store.path}: images of classes {unknown} that the store does not have "
                         f"(it has {held}); extract them into a new store")
    return np.array([index[c] for c in images.labels], dtype=np.int64)


def _new_images(store: FeatureStore, images: ImageSet) -> tuple[list[int], list[str]]:
    held = set(np.asarray(store.read_ids()).tolist())
    known = read_manifest(store)
    todo, changed = [], []
    for i, name in enumerate(images.ids):
        if name not in held:
            todo.append(i)
        elif name in known and known[name] != (images.sizes[i], images.mtimes[i]):
            changed.append(name)
    return todo, changed


def _work_key(images: ImageSet, todo: list[int], ext: FeatureExtractor, params: dict[str, Any],
              st: _Settings) -> str:
    h = hashlib.sha256(json.dumps([ext.name, params, st.batch_images, st.shard_images, st.skip_unreadable],
                                  sort_keys=True, default=str).encode())
    for i in todo:
        h.update(f"{images.ids[i]}\t{images.sizes[i]}\t{images.mtimes[i]}\n".encode())
    return h.hexdigest()


# ---- running the shards -------------------------------------------------------------------------
def _run_shards(work: Path, shards: list[list[int]], images: ImageSet, st: _Settings, want: str,
                progress: Callable[[int], None] | None) -> tuple[int, float, int]:
    """Run the shards not yet in ``work``; returns (shards resumed, images/s, workers). ``want``: the
    extractor's canonical parameters, which every shard must report."""
    work.mkdir(parents=True, exist_ok=True)
    sids = _shard_ids(shards, images)
    todo = [i for i in range(len(shards)) if not usable(work, i, sids[i])]
    resumed = len(shards) - len(todo)
    if resumed:
        log.info("resuming: %d of %d shards already extracted in %s", resumed, len(shards), work)
        if progress is not None:
            left = set(todo)
            progress(sum(len(s) for i, s in enumerate(shards) if i not in left))
    total = getattr(progress, "total", None)  # a bar that takes its end (an ETA instead of a spinner)
    if callable(total):
        total(sum(len(s) for s in shards))
    t0, count = time.perf_counter(), [0]

    def done(i: int, res: dict[str, Any]) -> None:
        if str(res["params"]) != want:
            raise ConfigError(f"shard {i} ran the extractor with {res['params']}, not {want}: did the model "
                              "file change, or differ between machines?")
        save_shard(work, i, res, sids[i])
        count[0] += len(shards[i])
        if progress is not None:
            progress(len(shards[i]))
        log.info("shard %d/%d done: %.1f images/s", i + 1, len(shards),
                 count[0] / max(time.perf_counter() - t0, 1e-9))

    def args(i: int) -> tuple[list[str], int, bool]:
        return [images.locs[j] for j in shards[i]], st.batch_images, st.skip_unreadable

    workers = 0
    if st.cluster is None or st.cluster == "local":
        for i in todo:
            done(i, run_shard(st.recipe, *args(i)))
    else:
        workers = _run_on_cluster(st, todo, args, done)
    return resumed, count[0] / max(time.perf_counter() - t0, 1e-9), workers


def _run_on_cluster(st: _Settings, todo: list[int], args: Callable[[int], tuple[Any, ...]],
                    done: Callable[[int, dict[str, Any]], None]) -> int:
    """Shards as Dask tasks, at most two per worker in flight; results saved as they arrive."""
    from distributed import as_completed

    from pipeline.engine.engines import DaskEngine, make_engine

    engine = make_engine(st.cluster)
    if not isinstance(engine, DaskEngine):
        for i in todo:
            done(i, run_shard(st.recipe, *args(i)))
        return 0
    client = engine.client
    from pipeline.engine.cluster_jobs import wait_for_workers

    try:  # batch jobs may still queue: the report counts the workers that came
        wait_for_workers(client)
    except BaseException:  # SIGTERM / Ctrl-C while waiting: the cluster's jobs are cancelled
        engine.close()
        raise
    workers = len(client.scheduler_info()["workers"])
    recipe = st.recipe if isinstance(st.recipe, list) else client.scatter(st.recipe, broadcast=True)
    futures: dict[Any, int] = {}
    queue = iter(todo)

    def submit() -> Any:
        i = next(queue, None)
        if i is None:
            return None
        f = client.submit(run_shard, recipe, *args(i), pure=False)
        futures[f] = i
        return f

    try:
        ac = as_completed([f for f in (submit() for _ in range(max(2, 2 * workers))) if f is not None])
        for f in ac:
            done(futures.pop(f), f.result())
            nxt = submit()
            if nxt is not None:
                ac.add(nxt)
    finally:
        for f in futures:
            f.cancel()
        engine.close()
    return workers


def _shard_ids(shards: list[list[int]], images: ImageSet) -> list[str]:
    return [shard_id(i, [images.ids[j] for j in shard]) for i, shard in enumerate(shards)]


def _skipped_positions(work: Path, shards: list[list[int]], images: ImageSet) -> list[int]:
    """Positions (in the list of images extracted) of the images skipped as unreadable."""
    out: list[int] = []
    start = 0
    for i, (shard, sid) in enumerate(zip(shards, _shard_ids(shards, images), strict=True)):
        out.extend(int(start + p) for p in read_shard(work, i, sid)["skipped"])
        start += len(shard)
    return out


def _blocks(work: Path, shards: list[list[int]], images: ImageSet,
            codes: np.ndarray | None, digests: dict[str, str]) -> Iterator[Batch]:
    """The shards' rows in image order: (features, labels or None, ids); ``digests`` receives each
    row's pixel digest by id."""
    for i, (shard, sid) in enumerate(zip(shards, _shard_ids(shards, images), strict=True)):
        z = read_shard(work, i, sid)
        X, ok = z["X"], z["ok"]
        idx = [shard[int(p)] for p in ok]
        digests.update(zip((images.ids[j] for j in idx), (str(d) for d in z["digests"]), strict=True))
        yield (X, None if codes is None else codes[idx],
               np.array([images.ids[j] for j in idx], dtype=str))
