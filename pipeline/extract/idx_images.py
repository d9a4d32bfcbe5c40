"""Images in MNIST's idx format (LeCun et al. 1998) as an image source: MNIST, Fashion-MNIST, KMNIST.

An idx file is a 4-byte magic number ``0x00 0x00 TYPE NDIM`` (TYPE ``0x08``: unsigned bytes), NDIM
big-endian 32-bit sizes, then the values in row-major order; files may be gzipped (``.gz``). Images
files are ``PREFIX-images-idx3-ubyte[.gz]`` (n x rows x cols), each paired with the labels file
``PREFIX-labels-idx1-ubyte[.gz]`` (n values; ``.`` instead of ``-`` is accepted too, as in MNIST's
original names).

``list_idx(source, labels)`` lists the images of a folder holding such files (or of one images
file), sorted by file name, as an :class:`~pipeline.extract.image_sources.ImageSet` of kind ``'idx'``: the id
of image ``i`` of ``PREFIX-images-idx3-ubyte[.gz]`` is ``PREFIX/i`` (the same whether the file is
gzipped or not), its location ``FILE#i``, its size the image's bytes and its time the file's
modification time. ``labels=None`` takes the labels from the paired files when every images file has
one (no labels when none has); ``labels='idx'`` requires the pairs. ``read_idx_images(locs)`` decodes
locations to RGB ``uint8`` arrays, the grey value repeated in the 3 channels. A process keeps the
last file it decoded in memory (a gzipped file must be decompressed whole), so the shards of one file
cost one decompression per worker; plain files are memory-mapped.

Headers are not trusted: a file is refused, from its header and before anything is listed or read
whole, when its images are over Pillow's decoding limit, when it declares more than MAX_IDX_IMAGES
images, when a gzipped file would decompress to more than MAX_GZ_DATA_BYTES, and when its data (the
file size, or for gzip the bytes decompressed block by block, stopping one byte past the declared
size) are not what the header declares; a labels file declaring another count than its images is
refused before its labels are read.

Corrupt headers, a file size that does not match its header and a label count that does not match
the images are :class:`~vbcore.errors.InputError` s naming the file.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from vbcore.errors import ConfigError, InputError

IDX_SEP = "#"  # a location inside an idx file: "FILE#INDEX"
IMAGES_RE = re.compile(r"^(?P<prefix>.+?)[-.]images[-.]idx3[-.]ubyte(?P<gz>\.gz)?$")
UBYTE = 0x08
_CACHE: dict[str, tuple[tuple[int, int], np.ndarray]] = {}


def is_idx_images(name: str) -> bool:
    """True for a file name of the form ``PREFIX-images-idx3-ubyte[.gz]``."""
    return IMAGES_RE.match(Path(name).name) is not None


def is_idx_source(source: str) -> bool:
    """True for an idx images file, or a folder holding at least one."""
    p = Path(source)
    if p.is_file():
        return is_idx_images(p.name)
    return p.is_dir() and any(is_idx_images(f.name) for f in p.iterdir() if f.is_file())


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")  # type: ignore[return-value]


def read_header(path: Path, ndim: int) -> tuple[tuple[int, ...], int]:
    """The sizes and the header length of the idx file ``path``, which must hold ``ndim``-D unsigned
    bytes. Raises InputError naming the file when the header is not that."""
    want = f"0x0000{UBYTE:02x}{ndim:02x}"
    try:
        with _open(path) as f:
            head = f.read(4 + 4 * ndim)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot read the idx header ({type(exc).__name__}: {exc})") from None
    if len(head) < 4 or head[:2] != b"\0\0" or head[2] != UBYTE or head[3] != ndim:
        magic = "0x" + head[:4].hex() if len(head) >= 4 else f"{len(head)} bytes"
        raise InputError(f"{path}: corrupt idx header: magic number {magic}, expected {want} "
                         f"({ndim}-D unsigned bytes)")
    if len(head) < 4 + 4 * ndim:
        raise InputError(f"{path}: corrupt idx header: the file ends inside its {ndim} sizes")
    dims = tuple(int.from_bytes(head[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    if ndim == 3 and min(dims[1:]) < 1:
        raise InputError(f"{path}: corrupt idx header: images of {dims[1]} x {dims[2]} pixels")
    return dims, 4 + 4 * ndim


#: The most images one idx source may list: each is an id, a location and a size held in memory
#: (about 200 bytes), so 10 million take about 2 GB; MNIST8M, the largest idx set known, has 8.1 million.
MAX_IDX_IMAGES = 10_000_000
#: The most bytes of pixels a gzipped idx file may hold: it is decompressed whole into memory (a plain
#: file is memory-mapped instead); Fashion-MNIST's training set holds 47 MB.
MAX_GZ_DATA_BYTES = 2 * 2**30
_BLOCK = 1 << 20  # bytes decompressed at a time when a gzipped file is measured


def _pixel_limit() -> int | None:
    from PIL import Image

    return None if Image.MAX_IMAGE_PIXELS is None else int(Image.MAX_IMAGE_PIXELS)


def _check_dims(path: Path, dims: tuple[int, ...]) -> None:
    """Refuse, from the header alone, images over the decoding limit, more images than
    MAX_IDX_IMAGES, and a gzipped file too large to decompress into memory."""
    if len(dims) == 3:
        limit, pixels = _pixel_limit(), dims[1] * dims[2]
        if limit is not None and pixels > limit:
            raise InputError(f"{path}: the idx header declares images of {dims[1]} x {dims[2]} = {pixels:,} "
                             f"pixels, over the decoding limit of {limit:,} pixels "
                             "(PIL.Image.MAX_IMAGE_PIXELS)")
    if dims[0] > MAX_IDX_IMAGES:
        raise InputError(f"{path}: the idx header declares {dims[0]:,} images, over the limit of "
                         f"{MAX_IDX_IMAGES:,} for one idx source (idx_images.MAX_IDX_IMAGES)")
    want = int(np.prod(dims))
    if path.name.endswith(".gz") and want > MAX_GZ_DATA_BYTES:
        raise InputError(f"{path}: the idx header declares {want:,} bytes of data, over the "
                         f"{MAX_GZ_DATA_BYTES:,} a gzipped idx file may hold (it is decompressed into "
                         "memory); gunzip it: a plain file is memory-mapped")


def _gz_data_bytes(path: Path, header: int, want: int) -> int:
    """The bytes after the header of a gzipped file, decompressed block by block and counted; stops
    at ``want + 1`` (so a forged header or a gzip bomb costs one block of memory, not the whole)."""
    got = -header
    try:
        with gzip.open(path, "rb") as f:
            while got <= want:
                block = f.read(_BLOCK)
                if not block:
                    break
                got += len(block)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot decompress the idx file ({type(exc).__name__}: {exc})") from None
    return got


def _check_size(path: Path, dims: tuple[int, ...], header: int, found: int | None = None) -> None:
    """Refuse a file whose data (counted after the header: the file size, or for gzip the bytes
    decompressed) are not what its header declares; the header is checked against the limits first."""
    _check_dims(path, dims)
    want = int(np.prod(dims))
    if found is not None:
        got = found
    elif path.name.endswith(".gz"):
        got = _gz_data_bytes(path, header, want)
    else:
        got = path.stat().st_size - header
    if got != want:
        shape = " x ".join(str(d) for d in dims)
        holds = f"more than {want}" if got > want and path.name.endswith(".gz") else str(got)
        raise InputError(f"{path}: the idx header declares {shape} = {want} bytes of data but the file "
                         f"holds {holds}: truncated or corrupt")


def _read_data(path: Path, dims: tuple[int, ...], header: int) -> bytes:
    """The header and data of a gzipped idx file, decompressed; at most one byte more than the
    header declares is read, so the size check needs no second pass."""
    _check_dims(path, dims)
    want = int(np.prod(dims))
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read(header + want + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot decompress the idx file ({type(exc).__name__}: {exc})") from None
    _check_size(path, dims, header, len(raw) - header)
    return raw


def read_labels(path: Path, n: int | None = None, images: str = "") -> np.ndarray:
    """The labels of an idx1 labels file (int64). With ``n``, a header declaring another count is
    refused before any label is read (the message names the ``images`` file)."""
    (count,), header = read_header(path, 1)
    if n is not None and count != n:
        raise InputError(f"{path}: {count} labels for the {n} images of {images}")
    if path.name.endswith(".gz"):
        raw = _read_data(path, (count,), header)
    else:
        _check_size(path, (count,), header)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise InputError(f"{path}: cannot read the labels ({type(exc).__name__}: {exc})") from None
        _check_size(path, (count,), header, len(raw) - header)
    return np.frombuffer(raw, np.uint8, offset=header).astype(np.int64)


def read_images_file(path: Path) -> np.ndarray:
    """All images of an idx3 file, (n, rows, cols) uint8: memory-mapped when plain, decompressed when
    gzipped; the last file read stays cached in the process (keyed by size and mtime)."""
    st = path.stat()
    key = (st.st_size, st.st_mtime_ns)
    hit = _CACHE.get(str(path))
    if hit is not None and hit[0] == key:
        return hit[1]
    dims, header = read_header(path, 3)
    if path.name.endswith(".gz"):
        raw = _read_data(path, dims, header)
        arr = np.frombuffer(raw, np.uint8, offset=header).reshape(dims)
    else:
        _check_size(path, dims, header)
        arr = np.memmap(path, np.uint8, "r", offset=header, shape=dims)
    _CACHE.clear()
    _CACHE[str(path)] = (key, arr)
    return arr


def _pair(images: Path) -> Path | None:
    """The labels file paired with an images file (either compression), or None."""
    m = IMAGES_RE.match(images.name)
    assert m is not None
    sep = images.name[len(m["prefix"])]
    name = f"{m['prefix']}{sep}labels{sep}idx1{sep}ubyte"
    for candidate in (name, name + ".gz"):
        if (images.parent / candidate).is_file():
            return images.parent / candidate
    return None


def idx_files(source: str) -> list[Path]:
    """The idx images files of ``source`` (a folder or one file), sorted by name; no two may share a
    prefix (the ids would clash)."""
    p = Path(source)
    files = [p] if p.is_file() else sorted((f for f in p.iterdir() if f.is_file() and is_idx_images(f.name)),
                                           key=lambda f: f.name)
    prefixes: dict[str, Path] = {}
    for f in files:
        m = IMAGES_RE.match(f.name)
        assert m is not None
        if m["prefix"] in prefixes:
            raise InputError(f"{source}: {prefixes[m['prefix']].name} and {f.name} hold the same images "
                             "(plain and gzipped); keep one of them")
        prefixes[m["prefix"]] = f
    return files


def list_idx(source: str, labels: str | None) -> tuple[list[str], list[int], list[int], list[str],
                                                       list[str] | None]:
    """ids, sizes, mtimes, locations and labels (as text, or None) of the images of ``source``."""
    if labels not in (None, "idx"):
        raise ConfigError(f"an idx source takes labels='idx' (from the paired *-labels-idx1-ubyte files) or "
                          f"none (the pairs when present), got {labels!r}")
    files = idx_files(source)
    pairs = {f: _pair(f) for f in files}
    missing = [f for f, lab in pairs.items() if lab is None]
    if missing and (labels == "idx" or len(missing) < len(files)):
        raise InputError(f"{missing[0]}: no paired labels file {IMAGES_RE.match(missing[0].name)['prefix']}"  # type: ignore[index]
                         "-labels-idx1-ubyte[.gz] beside it; add it, or remove the images file")
    ids: list[str] = []
    sizes: list[int] = []
    mtimes: list[int] = []
    locs: list[str] = []
    labs: list[str] = []
    for f in files:
        dims, header = read_header(f, 3)
        _check_size(f, dims, header)
        n, prefix = dims[0], IMAGES_RE.match(f.name)["prefix"]  # type: ignore[index]
        if len(ids) + n > MAX_IDX_IMAGES:
            raise InputError(f"{f}: {len(ids) + n:,} images with the files before it, over the limit of "
                             f"{MAX_IDX_IMAGES:,} for one idx source; ingest the files one by one")
        lab_file = pairs[f]
        if lab_file is not None and not missing:
            labs.extend(str(v) for v in read_labels(lab_file, n, f.name).tolist())
        mtime = f.stat().st_mtime_ns
        ids.extend(f"{prefix}/{i}" for i in range(n))
        sizes.extend([dims[1] * dims[2]] * n)
        mtimes.extend([mtime] * n)
        locs.extend(f"{f}{IDX_SEP}{i}" for i in range(n))
    if not ids:
        raise InputError(f"{source}: the idx files hold no images")
    return ids, sizes, mtimes, locs, (labs if not missing else None)


def is_idx_loc(loc: str) -> bool:
    """True for a location ``FILE#INDEX`` inside an idx images file."""
    name, sep, index = loc.rpartition(IDX_SEP)
    return bool(sep) and index.isdigit() and is_idx_images(name)


def read_idx_images(locs: list[str]) -> Iterator[tuple[int, np.ndarray | Exception]]:
    """Decode idx locations (``FILE#INDEX``) to RGB uint8 (rows, cols, 3); yields (position, image
    or the exception raised), in order."""
    for i, loc in enumerate(locs):
        name, _, index = loc.rpartition(IDX_SEP)
        try:
            arr = read_images_file(Path(name))
            grey = np.asarray(arr[int(index)])
            yield i, np.repeat(grey[:, :, None], 3, axis=2)
        except (InputError, OSError, IndexError) as exc:
            yield i, exc


def shown(loc: str) -> str:
    """A location as shown in messages: ``FILE, image INDEX``."""
    name, _, index = loc.rpartition(IDX_SEP)
    return f"{name}, image {index}" if is_idx_loc(loc) else loc


__all__ = ["IDX_SEP", "MAX_GZ_DATA_BYTES", "MAX_IDX_IMAGES",
           "is_idx_images", "is_idx_source", "list_idx", "read_header", "read_idx_images",
           "read_images_file", "read_labels", "shown", "is_idx_loc", "idx_files"]
