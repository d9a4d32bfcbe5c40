"""What every reader hands the writer (:class:`Plan`, batches) and the checks readers share:
option coercion, side arrays (labels, ids), row ranges."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vbcore.errors import ConfigError, InputError

Batch = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]  # (features, labels, ids[, weights])


@dataclass
class Plan:
    """A source opened and checked: its shape, what it carries, and how to read it.

    ``blocks(first, size)`` yields batches in source order; sources that can slice freely make the
    first batch ``first`` rows and the rest ``size`` rows, the others yield what they read (the
    batches are re-cut to that layout anyway).
    """

    n_features: int
    labels: bool
    ids: str | None
    blocks: Callable[[int, int], Iterator[Batch]]
    extractor: str | None = None
    extractor_params: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    close: Callable[[], None] = lambda: None
    weights: bool = False  # batches carry row weights (ingest --weights FILE)


def with_weights(plan: Plan, path: str | None) -> Plan:
    """``plan`` with the row weights of the .npy file ``path`` (one per source row, in order) added to
    every batch; the store checks them (:func:`vbcore.data.validation.check_weights`). A file with fewer
    or more weights than the source has rows is an error (an append is then rolled back). ``path``
    None: the plan as it is (a store without weights)."""
    if path is None:
        return plan
    try:
        w = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read the weights ({type(exc).__name__}: {exc}); expected a "
                         ".npy file with one weight per row") from None
    if w.ndim != 1:
        raise InputError(f"{path}: weights must be a 1-D array (one per row), got shape {w.shape}")
    blocks = plan.blocks

    def weighted(first: int, size: int) -> Iterator[Any]:
        off = 0
        for b in blocks(first, size):
            n = int(b[0].shape[0])
            if off + n > w.shape[0]:
                raise InputError(f"{path}: {w.shape[0]} weights, but the source has more rows")
            yield (*b[:3], np.asarray(w[off:off + n]))
            off += n
        if off != w.shape[0]:
            raise InputError(f"{path}: {w.shape[0]} weights, but the source has {off} rows")

    plan.blocks, plan.weights = weighted, True
    return plan


def row_slices(n: int, first: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of ``n`` rows: the first ``first`` rows, then ``size`` rows at a time."""
    start, step = 0, first
    while start < n:
        yield start, min(start + step, n)
        start, step = start + step, size


# ---- options ------------------------------------------------------------------------------------
def as_int(name: str, value: Any, minimum: int | None = None) -> int:
    """An integer option (``'12'`` and ``12.0`` accepted), at least ``minimum``."""
    try:
        v = int(value)
        if isinstance(value, float) and v != value:
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and v < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {v}")
    return v


def as_bool(name: str, value: Any) -> bool:
    """A boolean option: a bool, 0/1, or one of 1/true/yes/on/0/false/no/off."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.lower() in ("1", "true", "yes", "on")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{name} must be true or false, got {value!r}")


def as_list(value: Any) -> list[str]:
    """A list option: a comma-separated string or an iterable of names."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def no_more_options(kind: str, options: dict[str, Any]) -> None:
    """Refuse the options a reader of ``kind`` did not consume."""
    if options:
        raise ConfigError(f"unknown option(s) {sorted(options)} for a {kind} source; see docs/ingest.md")


def no_side_data(kind: str, labels: str | None, ids: str | None) -> None:
    """Refuse ``labels``/``ids`` for a source that brings its own."""
    if labels is not None or ids is not None:
        raise ConfigError(f"the {kind} source brings its own labels and ids; leave labels and ids unset")


def check_side_shape(where: str, what: str, shape: tuple[int, ...], n: int) -> None:
    """Labels or ids must be 1-D with one value per row (``n``)."""
    if len(shape) != 1 or shape[0] != n:
        raise InputError(f"{where}: {what} must be 1-D with one value per row ({n}), got shape {shape}")


def id_kind(dtype: np.dtype) -> str:
    """The store's id kind for a dtype: ``'int'`` or ``'str'``."""
    return "int" if dtype.kind in "biu" else "str"


