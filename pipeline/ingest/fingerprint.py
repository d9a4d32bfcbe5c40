"""Source fingerprints: what a store records of each source appended to it, so that a second append
of the same source is refused (unless ``allow_duplicate``).

A fingerprint is the sha256 of a canonical JSON description of the rows a source yields:

* a file source (.npy, .npz, .h5/.hdf5, .parquet, .csv): the sha256 of the file's bytes (not its
  name: a copy of the same file is the same source), the sha256 of every side file (the ``labels``/
  ``ids`` .npy files of a .npy source) and the options that choose what is read (``key``,
  ``dataset``, ``labels``, ``ids`` column names, ``ignore_columns``, ``delimiter``); one sequential
  extra read of the file before it is ingested (about a tenth of the ingest time of a .npy,
  docs/operations.md);
* ``synthetic``: its parameters (``rows``, ``dim``, ``classes``, ``seed`` with their defaults, and
  ``chunk_rows``, which the generator's streams follow);
* ``digits`` and ``image:NAME``: the name and the options;
* a feature store: its content fingerprint (the chunks' checksums).

Image folders, tar shards and image lists are not fingerprinted: their appends add only the images
the store does not hold yet (the image manifest, :mod:`pipeline.extract.image_store`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pipeline.ingest.synthetic import SYNTHETIC_DEFAULTS

__all__ = ["source_fingerprint", "find_duplicate"]

_NOT_CONTENT = ("block_bytes",)  # options that change how a source is read, not what it yields
_CHUNK = 8 << 20


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read sequentially in 8 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(_CHUNK):
            h.update(piece)
    return h.hexdigest()


def source_fingerprint(source: str, labels: str | None, ids: str | None, options: dict[str, Any],
                       chunk_rows: int) -> str:
    """The fingerprint of ``source`` read with these settings (see the module docstring).

    Call it after the source was opened (so that a missing file was already reported)."""
    opts = {k: str(v) for k, v in options.items() if k not in _NOT_CONTENT}
    desc: dict[str, Any] = {"labels": labels, "ids": ids, "options": opts}
    if source == "synthetic":
        params = {k: int(options.get(k, v)) for k, v in SYNTHETIC_DEFAULTS.items()}
        desc = {"kind": "synthetic", **params, "chunk_rows": int(chunk_rows)}
    elif source == "digits" or source.startswith("image:"):
        desc["kind"] = source
    elif Path(source).is_dir():  # a feature store (pipeline.ingest.stores): its content fingerprint
        from pipeline.store.features import FeatureStore

        desc = {"kind": "feature store", "fingerprint": FeatureStore.open(source, "r").fingerprint}
    else:
        path = Path(source)
        desc["kind"] = path.suffix.lower()
        desc["sha256"] = file_sha256(path)
        if desc["kind"] == ".npy":  # labels= and ids= name other .npy files: their content counts
            for what, side in (("labels", labels), ("ids", ids)):
                if side is not None:
                    desc[what] = file_sha256(Path(side))
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()


def find_duplicate(appends: list[dict[str, Any]], fingerprint: str) -> dict[str, Any] | None:
    """The first append record of a store with this source fingerprint (None if there is none)."""
    for rec in appends:
        if isinstance(rec, dict) and rec.get("source_fingerprint") == fingerprint:
            return rec
    return None
