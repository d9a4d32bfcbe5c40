"""Readers of NumPy files: ``.npy`` (memory-mapped) and ``.npz`` (streamed from the zip)."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.ingest.plan import Batch, Plan, check_side_shape, id_kind, no_more_options, row_slices
from vbcore.data.validation import check_layout
from vbcore.errors import InputError


# ---- .npy ---------------------------------------------------------------------------------------
def _load_npy(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise InputError(f"{path}: no such file ({what})")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise InputError(f"{path}: cannot memory-map {what} ({exc})") from None


def read_npy(path: Path, labels: str | None, ids: str | None, options: dict[str, Any]) -> Plan:
    """A memory-mapped ``.npy`` of features; ``labels``/``ids`` name other ``.npy`` files."""
    no_more_options(".npy", options)
    X = _load_npy(path, "features")
    check_layout(X.shape, X.dtype, str(path), min_rows=0)
    n = X.shape[0]
    lab = idv = None
    if labels is not None:
        lab = _load_npy(Path(labels), "labels")
        check_side_shape(str(path), f"labels {labels}", lab.shape, n)
    if ids is not None:
        idv = _load_npy(Path(ids), "ids")
        check_side_shape(str(path), f"ids {ids}", idv.shape, n)

    def blocks(first: int, size: int) -> Iterator[Batch]:
        for s, e in row_slices(n, first, size):
            yield (np.array(X[s:e]), None if lab is None else np.array(lab[s:e]),  # cast by check_rows
                   None if idv is None else np.array(idv[s:e]))

    return Plan(X.shape[1], lab is not None, None if idv is None else id_kind(idv.dtype), blocks,
                 extractor_params={"file": path.name})


# ---- .npz ---------------------------------------------------------------------------------------
class _NpyMember:
    """One array of an .npz, read row block by row block from the (possibly deflated) zip stream."""

    def __init__(self, zf: zipfile.ZipFile, member: str) -> None:
        self.zf, self.member = zf, member
        with zf.open(member) as f:
            self.shape, self.fortran, self.dtype = self._header(f)

    @staticmethod
    def _header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        return tuple(shape), bool(fortran), np.dtype(dtype)

    def blocks(self, first: int, size: int) -> Iterator[np.ndarray]:
        if self.dtype.hasobject:
            raise InputError(f"{self.member}: object arrays cannot be ingested")
        with self.zf.open(self.member) as f:
            self._header(f)
            if self.fortran and len(self.shape) > 1:  # rows are not contiguous: read it whole
                whole = np.frombuffer(f.read(), dtype=self.dtype).reshape(self.shape, order="F")
                for s, e in row_slices(self.shape[0], first, size):
                    yield whole[s:e]
                return
            row_items = int(np.prod(self.shape[1:], dtype=np.int64))
            for s, e in row_slices(self.shape[0], first, size):
                nbytes = (e - s) * row_items * self.dtype.itemsize
                buf = bytearray(nbytes)
                view, got = memoryview(buf), 0
                while got < nbytes:
                    k = f.readinto(view[got:]) if hasattr(f, "readinto") else 0
                    if not k:
                        raise InputError(f"{self.member}: the array data ends early (truncated file?)")
                    got += k
                yield np.frombuffer(buf, dtype=self.dtype).reshape((e - s, *self.shape[1:]))


def read_npz(path: Path, labels: str | None, ids: str | None, options: dict[str, Any],
             weights: str | None = None) -> Plan:
    """One array of an ``.npz`` (option ``key``), streamed from the zip; ``labels``/``ids``/``weights``
    name arrays."""
    key = options.pop("key", None)
    no_more_options(".npz", options)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise InputError(f"{path}: not an .npz file ({exc})") from None
    try:
        arrays = {m[:-4]: _NpyMember(zf, m) for m in zf.namelist() if m.endswith(".npy")}
        listing = ", ".join(f"{k} {a.shape}" for k, a in arrays.items())
        if key is None:
            two_d = [k for k, a in arrays.items() if len(a.shape) == 2]
            named = [k for k in ("X", "features") if k in two_d]
            if len(two_d) == 1:
                key = two_d[0]
            elif len(named) == 1:
                key = named[0]
            else:
                raise InputError(f"{path}: cannot tell which array holds the features (arrays: {listing}); "
                                 "pass key=NAME")
        if key not in arrays:
            raise InputError(f"{path}: no array {key!r} (arrays: {listing})")
        X = arrays[key]
        check_layout(X.shape, X.dtype, f"{path}[{key}]", min_rows=0)
        n = X.shape[0]
        side: dict[str, _NpyMember | None] = {}
        for what, name in (("labels", labels), ("ids", ids), ("weights", weights)):
            if name is None:
                side[what] = None
                continue
            if name not in arrays:
                raise InputError(f"{path}: no array {name!r} for {what} (arrays: {listing})")
            check_side_shape(str(path), f"{what} {name!r}", arrays[name].shape, n)
            side[what] = arrays[name]
    except BaseException:
        zf.close()
        raise

    def blocks(first: int, size: int) -> Iterator[Any]:
        its = {k: None if a is None else a.blocks(first, size) for k, a in side.items()}
        for x in X.blocks(first, size):
            got = {k: None if it is None else next(it) for k, it in its.items()}
            batch = (x, got["labels"], got["ids"])  # cast (after their checks) by check_rows
            yield batch if weights is None else (*batch, got["weights"])

    ids_arr = side["ids"]
    return Plan(X.shape[1], side["labels"] is not None, None if ids_arr is None else id_kind(ids_arr.dtype),
                 blocks, extractor_params={"file": path.name, "key": key}, close=zf.close,
                 weights=weights is not None)


