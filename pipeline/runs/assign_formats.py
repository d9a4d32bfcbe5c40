"""Assignments as a table file for the tools users join them with: Parquet or CSV.

:func:`pipeline.runs.directory.assign_store` writes one row per store row with the columns ``row`` (the row's
position in the store, int64), ``id`` (the store's row ids, when it has them), ``label`` (the MAP
cluster, int32) and ``probability`` (its responsibility, float32). This module builds the table and
encodes it; the caller writes the bytes atomically.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from vbcore.errors import ConfigError

#: the formats of ``vbcluster assign --format``
FORMATS = ("zarr", "parquet", "csv")
FILE_FORMATS = ("parquet", "csv")


def check_format(fmt: str) -> str:
    """The format, lower-cased, or a ConfigError naming the known ones."""
    value = str(fmt).lower()
    if value not in FORMATS:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return value


def format_of(out: str | Path | None) -> str:
    """The format a file name asks for, when none is given: its suffix (``.parquet``, ``.csv``, any
    case), or ``'zarr'`` without a file; any other suffix is a ConfigError naming the file."""
    if out is None:
        return "zarr"
    suffix = Path(out).suffix.lower().lstrip(".")
    if suffix not in FILE_FORMATS:
        raise ConfigError(f"{out}: no format given and the file's suffix is neither .parquet nor .csv "
                          "(give the format: parquet or csv)")
    return suffix


def default_path(run_dir: str | Path, fmt: str) -> Path:
    """``RUN_DIR/assignments.parquet`` or ``RUN_DIR/assignments.csv``."""
    return Path(run_dir) / f"assignments.{fmt}"


def table(labels: np.ndarray, probability: np.ndarray, ids: np.ndarray | None = None) -> Any:
    """A pyarrow Table with the columns ``row``, ``id`` (when given), ``label``, ``probability``.

    Parameters
    ----------
    labels : array of shape (n_rows,)
    probability : array of shape (n_rows,)
    ids : array of shape (n_rows,), optional
    """
    import pyarrow as pa

    n = len(labels)
    cols: dict[str, Any] = {"row": pa.array(np.arange(n, dtype=np.int64))}
    if ids is not None:
        if len(ids) != n:
            raise ConfigError(f"the store has {len(ids)} row ids for {n} rows")
        cols["id"] = pa.array(np.asarray(ids).tolist() if np.asarray(ids).dtype.kind in "OSU" else ids)
    cols["label"] = pa.array(np.asarray(labels, dtype=np.int32))
    cols["probability"] = pa.array(np.asarray(probability, dtype=np.float32))
    return pa.table(cols)


def writer(tbl: Any, fmt: str, metadata: dict[str, str] | None = None) -> Callable[[IO[bytes]], None]:
    """A function that writes ``tbl`` as ``fmt`` ('parquet' or 'csv') into an open binary file.

    Parquet carries ``metadata`` (run directory, store fingerprint, posterior sha256) in its schema;
    CSV has no place for it.
    """
    if fmt == "parquet":
        import pyarrow.parquet as pq

        meta = {k.encode(): v.encode() for k, v in (metadata or {}).items()}
        tbl = tbl.replace_schema_metadata({**(tbl.schema.metadata or {}), **meta})
        return lambda f: pq.write_table(tbl, f)
    if fmt == "csv":
        import pyarrow.csv as pcsv

        return lambda f: pcsv.write_csv(tbl, f)
    raise ConfigError(f"format must be one of {', '.join(FILE_FORMATS)} for a table file, got {fmt!r}")
