"""Reader of HDF5 files (``.h5``, ``.hdf5``): a dataset of features, datasets of labels and ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.ingest.plan import Plan, check_side_shape, id_kind, no_more_options, row_slices
from vbcore.data.validation import check_layout
from vbcore.errors import InputError


# ---- HDF5 ---------------------------------------------------------------------------------------
def read_hdf5(path: Path, labels: str | None, ids: str | None, options: dict[str, Any],
              weights: str | None = None) -> Plan:
    """A dataset of an HDF5 file (option ``dataset``); ``labels``/``ids``/``weights`` name datasets in it."""
    import h5py

    name = options.pop("dataset", None)
    no_more_options("HDF5", options)
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"{path}: cannot open as HDF5 ({exc})") from None
    try:
        found: dict[str, Any] = {}

        def collect(name: str, obj: Any) -> None:  # visititems stops at a callback's first non-None
            if isinstance(obj, h5py.Dataset):
                found[name] = obj

        f.visititems(collect)
        listing = ", ".join(f"{n} {d.shape}" for n, d in found.items()) or "none"
        if name is None:
            two_d = [n for n, d in found.items() if d.ndim == 2]
            if len(two_d) != 1:
                raise InputError(f"{path}: cannot tell which dataset holds the features "
                                 f"(datasets: {listing}); pass dataset=NAME")
            name = two_d[0]
        name = str(name).strip("/")
        if name not in found:
            raise InputError(f"{path}: no dataset {name!r} (datasets: {listing})")
        X = found[name]
        check_layout(X.shape, X.dtype, f"{path}[{name}]", min_rows=0)
        n = X.shape[0]
        side: dict[str, Any] = {}
        for what, dname in (("labels", labels), ("ids", ids), ("weights", weights)):
            if dname is None:
                side[what] = None
                continue
            dname = dname.strip("/")
            if dname not in found:
                raise InputError(f"{path}: no dataset {dname!r} for {what} (datasets: {listing})")
            check_side_shape(str(path), f"{what} {dname!r}", found[dname].shape, n)
            d = found[dname]
            side[what] = d.asstr() if h5py.check_string_dtype(d.dtype) else d
        kind = None
        if ids is not None:
            kind = "str" if h5py.check_string_dtype(found[ids.strip("/")].dtype) else id_kind(
                found[ids.strip("/")].dtype)
    except BaseException:
        f.close()
        raise

    def blocks(first: int, size: int) -> Iterator[Any]:
        for s, e in row_slices(n, first, size):
            # the source's own dtype: the magnitude check sees 1e300, not the inf of a float32 cast
            x = np.empty((e - s, X.shape[1]), dtype=X.dtype)
            if e > s:
                X.read_direct(x, source_sel=np.s_[s:e])
            got = {k: None if d is None else np.asarray(d[s:e]) for k, d in side.items()}
            batch = (x, got["labels"], got["ids"])
            yield batch if weights is None else (*batch, got["weights"])

    return Plan(X.shape[1], labels is not None, kind, blocks,
                 extractor_params={"file": path.name, "dataset": name}, close=f.close,
                 weights=weights is not None)


