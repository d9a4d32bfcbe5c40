"""A feature store as a source of its own: its rows (with their labels, ids and weights) copied into
a new store, or appended to another, with another normalisation, chunking or compression level,
without extracting anything again (``vbcluster ingest fm.zarr --out x.zarr --normalize power-l2``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.ingest.plan import Batch, Plan, id_kind, no_more_options, row_slices
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError


def is_store_source(source: str) -> bool:
    """True for a folder holding a Zarr group (``zarr.json``): a feature store, opened as one."""
    p = Path(source)
    return "://" not in source and p.is_dir() and (p / "zarr.json").is_file()


def read_store(path: Path, out: Path, labels: str | None, ids: str | None, options: dict[str, Any],
               weights: str | None) -> Plan:
    """The rows of the feature store at ``path``, chunk by chunk, with what it carries (labels, ids,
    weights: never named, always copied). A store whose rows are normalised is refused: its raw rows
    are not held, and normalising them again would not give the raw rows' normalisation."""
    no_more_options("a feature store", options)
    if labels is not None or ids is not None or weights is not None:
        raise ConfigError(f"{path}: a feature store source carries its own labels, ids and weights; leave "
                          "--labels, --ids and --weights out")
    if path.resolve() == out.resolve():
        raise ConfigError(f"{path}: the source and --out are the same store")
    src = FeatureStore.open(path, "r")
    if src.normalize != "none":
        raise ConfigError(f"{path}: its rows are normalised {src.normalize!r} (the raw rows are not held), "
                          "so they cannot be normalised again as they were; ingest from the store's own "
                          "source instead")
    ids_array = src.group["ids"] if src.has_ids else None
    ids_kind = None if ids_array is None else id_kind(np.dtype(getattr(ids_array, "dtype", "O")))
    carries_weights = "weights" in src.group.array_keys()

    def blocks(first: int, size: int) -> Iterator[Batch]:
        for s, e in row_slices(src.n_rows, first, size):
            rows = slice(s, e)
            idv = src.read_ids(rows)
            if idv is not None and idv.dtype.kind not in "biu":  # (Zarr's variable-width strings)
                idv = np.array(idv.tolist(), dtype=str)
            batch = (src.read(rows), src.read_labels(rows), idv)
            yield (*batch, src.read_weights(rows)) if carries_weights else batch  # type: ignore[misc]

    params = {**dict(src.attrs.get("extractor_params") or {}),
              "copied_from": {"store": str(path.resolve()), "fingerprint": src.fingerprint,
                              "source": src.attrs.get("source"), "n_rows": src.n_rows}}
    return Plan(src.n_features, src.has_labels, ids_kind, blocks, extractor=src.attrs.get("extractor"),
                extractor_params=params, weights=carries_weights)


__all__ = ["is_store_source", "read_store"]
