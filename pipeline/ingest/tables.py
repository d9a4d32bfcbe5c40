"""Readers of tables: Parquet and CSV through Arrow, numeric columns as features."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.ingest.plan import Batch, Plan, as_bool, as_int, as_list, no_more_options
from vbcore.data.limits import check_magnitude
from vbcore.errors import ConfigError, InputError


# ---- Parquet and CSV ----------------------------------------------------------------------------
def _columns(where: str, schema: Any, labels: str | None, ids: str | None,
             ignore: list[str], weights: str | None = None) -> list[str]:
    """Feature columns of an Arrow schema; non-numeric ones that are not labels/ids/weights/ignored
    fail."""
    import pyarrow as pa

    names = list(schema.names)
    for what, col in (("labels", labels), ("ids", ids), ("weights", weights)):
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

    if weights is not None and not numeric(schema.field(weights).type):
        raise InputError(f"{where}: weights column {weights!r} has type {schema.field(weights).type}; "
                         "weights must be numbers")
    skip = {labels, ids, weights, *ignore}
    bad = [c for c in names if c not in skip and not numeric(schema.field(c).type)]
    if bad:
        types = ", ".join(f"{c} ({schema.field(c).type})" for c in bad)
        raise InputError(f"{where}: non-numeric column(s) {types}; name them in ignore_columns=, or as "
                         "labels=/ids=")
    feats = [c for c in names if c not in skip]
    if not feats:
        raise InputError(f"{where}: no numeric feature columns (columns: {names})")
    return feats


def _arrow_batch(batch: Any, feats: list[str], labels: str | None, ids: str | None, where: str,
                 first_row: int, weights: str | None = None) -> Any:
    """One Arrow record batch as float32 features (labels, ids[, weights]); each column's magnitudes
    are checked in the column's own type before the cast, so 1e300 is reported as 1e300
    (:mod:`vbcore.data.limits`); the weights (float64, nulls as NaN) are checked by the store."""
    import pyarrow as pa
    import pyarrow.compute as pc

    X = np.empty((batch.num_rows, len(feats)), dtype=np.float32)
    for j, c in enumerate(feats):
        col = batch.column(c)
        t = col.type
        if pa.types.is_floating(t) or (pa.types.is_integer(t) and col.null_count == 0):
            v = col.to_numpy(zero_copy_only=False)  # float (nulls as NaN) or int, as the source has it
        else:
            v = pc.cast(col, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        check_magnitude(v.reshape(-1, 1), where, first_row, n_features=len(feats), first_col=j)
        X[:, j] = v
    lab = None
    if labels is not None:
        lab = batch.column(labels).to_numpy(zero_copy_only=False)
    idv = None
    if ids is not None:
        idv = batch.column(ids).to_numpy(zero_copy_only=False)
    if weights is None:
        return X, lab, idv
    w = pc.cast(batch.column(weights), pa.float64(), safe=False)
    return X, lab, idv, w.to_numpy(zero_copy_only=False)


def _arrow_id_kind(schema: Any, ids: str | None) -> str | None:
    import pyarrow as pa

    if ids is None:
        return None
    return "int" if pa.types.is_integer(schema.field(ids).type) else "str"


def read_parquet(path: Path, labels: str | None, ids: str | None, options: dict[str, Any],
                 weights: str | None = None) -> Plan:
    """A Parquet file: numeric columns are features; ``labels``/``ids``/``weights`` name columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ignore = as_list(options.pop("ignore_columns", None))
    no_more_options("Parquet", options)
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{path}: cannot read as Parquet ({exc})") from None
    schema = pf.schema_arrow
    try:
        feats = _columns(str(path), schema, labels, ids, ignore, weights)
    except BaseException:
        pf.close()
        raise
    wanted = feats + [c for c in (labels, ids, weights) if c is not None]

    def blocks(first: int, size: int) -> Iterator[Batch]:
        row = 0
        for batch in pf.iter_batches(batch_size=size, columns=wanted, use_threads=True):
            yield _arrow_batch(batch, feats, labels, ids, str(path), row, weights)
            row += batch.num_rows

    return Plan(len(feats), labels is not None, _arrow_id_kind(schema, ids), blocks,
                 extractor_params={"file": path.name, "columns": feats}, close=pf.close,
                 weights=weights is not None)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_header(path: Path, names: list[str]) -> None:
    """Refuse a first line of numbers only, read as column names (with ``header`` unset): a CSV
    without a header row would lose its first row silently (300 lines: 299 rows written)."""
    if names and all(_is_number(n) for n in names):
        shown = ",".join(names[:4]) + (",..." if len(names) > 4 else "")
        raise InputError(f"{path}: the first line ({shown}) holds only numbers: a row, or column names? "
                         "Pass -o header=no to read it as a row (columns are then named f0, f1, ...) or "
                         "-o header=yes to take it as the column names")


def read_csv(path: Path, labels: str | None, ids: str | None, options: dict[str, Any],
             weights: str | None = None) -> Plan:
    """A CSV file through Arrow (options ``delimiter``, ``block_bytes``, ``ignore_columns``, ``header``:
    unset, a first line of numbers only is refused; ``no``: no header row, columns f0, f1, ...)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    ignore = as_list(options.pop("ignore_columns", None))
    delimiter = str(options.pop("delimiter", ","))
    block_bytes = as_int("block_bytes", options.pop("block_bytes", 16 << 20), minimum=1 << 10)
    header = options.pop("header", None)
    header = None if header is None else as_bool("header", header)
    no_more_options("CSV", options)
    read = pcsv.ReadOptions(block_size=block_bytes, autogenerate_column_names=header is False)
    parse = pcsv.ParseOptions(delimiter=delimiter)
    try:  # the first block gives the column names and inferred types
        with pcsv.open_csv(path, read_options=read, parse_options=parse) as reader:
            schema = reader.schema
    except pa.ArrowInvalid as exc:
        raise InputError(f"{path}: cannot read as CSV ({exc})") from None
    if header is None:
        _check_header(path, list(schema.names))
    feats = _columns(str(path), schema, labels, ids, ignore, weights)
    # fix the types so that a later block cannot be inferred differently (ints, then a float)
    types = {c: pa.float64() for c in feats}
    if labels is not None:
        types[labels] = pa.float64() if pa.types.is_floating(schema.field(labels).type) else pa.int64()
    if ids is not None:
        types[ids] = pa.int64() if pa.types.is_integer(schema.field(ids).type) else pa.string()
    if weights is not None:
        types[weights] = pa.float64()
    convert = pcsv.ConvertOptions(column_types=types,
                                  include_columns=feats + [c for c in (labels, ids, weights) if c])

    def blocks(first: int, size: int) -> Iterator[Batch]:
        try:
            with pcsv.open_csv(path, read_options=read, parse_options=parse,
                               convert_options=convert) as reader:
                row = 0
                for batch in reader:
                    yield _arrow_batch(batch, feats, labels, ids, str(path), row, weights)
                    row += batch.num_rows
        except pa.ArrowInvalid as exc:
            raise InputError(f"{path}: {exc}") from None

    return Plan(len(feats), labels is not None, _arrow_id_kind(schema, ids), blocks,
                 extractor_params={"file": path.name, "columns": feats}, weights=weights is not None)


