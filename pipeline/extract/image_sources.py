"""Image sources for extraction: folders, WebDataset-style tar shards and image lists.

``list_images(source, labels)`` returns an :class:`ImageSet`: for every image, in a fixed order, its
id (what the store's ``ids`` hold), its size and modification time (what an incremental append
compares), its raw label and where to read it. ``read_images(locs)`` decodes a list of those
locations to RGB ``uint8`` arrays; tar members are streamed out of the archive into memory (never
unpacked to disk).

==============================  =======================================================================
``DIR``                         image files below ``DIR`` (hidden ones skipped), sorted by relative
                                path; ids are the relative paths; ``labels='folders'``
``SHARD.tar`` / ``DIR/*.tar``   the image members of one tar file or of every tar file matching the
                                pattern (sorted), in archive order; ids are ``TARNAME/MEMBER``;
                                ``labels='folders'`` (first directory of the member) or ``'cls'``
                                (WebDataset: the member ``KEY.cls`` holds the label of ``KEY.jpg``)
``LIST.txt`` / ``LIST.lst``     one image path per line (relative to the list's folder, ``#`` comments),
                                optionally followed by a tab or spaces and a label: ``labels='list'``
``DIR`` of idx files            MNIST-format ``*-images-idx3-ubyte[.gz]`` files (a folder holding any,
``*-images-idx3-ubyte[.gz]``    or one such file), grey images as RGB; ids ``PREFIX/INDEX``; labels from
                                the paired ``*-labels-idx1-ubyte[.gz]`` (:mod:`pipeline.extract.idx_images`)
==============================  =======================================================================
"""

from __future__ import annotations

import glob
import hashlib
import io
import tarfile
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.extract.idx_images import is_idx_images, is_idx_loc, is_idx_source, list_idx, read_idx_images
from vbcore.errors import ConfigError, InputError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
LIST_SUFFIXES = (".txt", ".lst")
TAR_SEP = "::"  # a location inside a tar file: "ARCHIVE::MEMBER"


@dataclass(frozen=True)
class ImageSet:
    """The images of a source, in extraction order (all lists have one entry per image)."""

    kind: str                   # 'folder', 'tar', 'list' or 'idx'
    ids: list[str]
    sizes: list[int]            # bytes
    mtimes: list[int]           # nanoseconds since the epoch (tar members: whole seconds)
    locs: list[str]             # a file path, or "ARCHIVE::MEMBER" for a tar member
    labels: list[str] | None    # raw labels (class names or integers as text), or None

    def __len__(self) -> int:
        return len(self.ids)


def is_image_source(source: str) -> bool:
    """True for a folder, a ``.tar`` file or pattern, a ``.txt``/``.lst`` list of images, or an idx
    images file."""
    s = str(source)
    if "://" in s or s in ("digits", "synthetic") or s.startswith("image:"):
        return False
    p = Path(s)
    return (p.is_dir() or s.endswith(".tar") or (p.suffix.lower() in LIST_SUFFIXES and p.is_file())
            or (p.is_file() and is_idx_images(p.name)))


def list_images(source: str, labels: str | None = None) -> ImageSet:
    """The images of ``source`` (see the module docstring), with their labels when asked for."""
    s = str(source)
    if is_idx_source(s):
        images = ImageSet("idx", *list_idx(s, labels))
    elif Path(s).is_dir():
        images = _folder(Path(s), labels)
    elif s.endswith(".tar"):
        images = _tars(s, labels)
    else:
        images = _listfile(Path(s), labels)
    check_names(images)
    return images


def pixel_digest(img: np.ndarray) -> str:
    """A digest of a decoded image (its shape and RGB bytes): what the store's image manifest records
    at extraction and the report compares before showing a thumbnail (a file replaced by another of
    the same size and time is told apart)."""
    a = np.ascontiguousarray(img, dtype=np.uint8)
    h = hashlib.sha256(repr(a.shape).encode())
    h.update(a.tobytes())
    return h.hexdigest()[:32]


def printable(text: str) -> str:
    """``text`` safe to print on one line: bytes that are not UTF-8 (a file name's, kept by Python as
    surrogate escapes) as ``\\xff``, control characters (tab, newline) as ``\\t``, ``\\n``."""
    s = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def check_names(images: ImageSet) -> None:
    """Refuse an image whose id is not one line of UTF-8 text (a tab or a newline in a file name, a
    byte that is not UTF-8): the store's ids and its image manifest hold text, one line per image."""
    for name, loc in zip(images.ids, images.locs, strict=True):
        if name.isprintable():
            continue
        bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Cs")), None)
        if bad is None:  # (other unprintable characters, a no-break space, are text)
            continue
        if unicodedata.category(bad) == "Cs":
            what = "a byte that is not UTF-8"
        else:
            what = {"\t": "a tab", "\n": "a newline", "\r": "a carriage return"}.get(
                bad, "a control character")
        raise InputError(f"{printable(loc)}: the image's name holds {what}; image ids are one line of "
                         "UTF-8 text: rename the file")


def _is_image(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_SUFFIXES and not any(
        part.startswith(".") for part in Path(name).parts)


def check_inside(images: ImageSet, root: str | Path) -> None:
    """Refuse (for an extraction) an image of a folder source that is a symbolic link, or lies below
    one, to a place outside the folder ``root``: the folder is what was asked for, and a link swapped in
    after an ingest (same size and time) would embed a file from elsewhere. Links that stay inside the
    folder are read. (The report lists such images without reading them.)"""
    if images.kind != "folder":
        return
    real = Path(root).resolve()
    for loc in images.locs:
        target = Path(loc).resolve()
        if real not in target.parents:
            raise InputError(f"{printable(loc)}: a symbolic link out of the image folder (to "
                             f"{printable(str(target))}); vbcluster reads only files inside the folder "
                             "it is given: copy the image in, or give the folder the link points into")


def _folder(root: Path, labels: str | None) -> ImageSet:
    if labels not in (None, "folders"):
        raise ConfigError(f"an image folder takes labels='folders' (one class per sub-folder) or none, "
                          f"got {labels!r}")
    files = sorted((p.relative_to(root) for p in root.rglob("*")
                    if p.is_file() and _is_image(p.relative_to(root).as_posix())), key=lambda p: p.as_posix())
    if not files:
        raise InputError(f"{root}: no image files ({', '.join(IMAGE_SUFFIXES)}) in the folder or below")
    if labels == "folders":
        top = [f for f in files if len(f.parts) < 2]
        if top:
            raise InputError(f"{root}: labels='folders' needs every image inside a class sub-folder, but "
                             f"{top[0].as_posix()} is not")
    stats = [(root / f).stat() for f in files]
    return ImageSet("folder", [f.as_posix() for f in files], [st.st_size for st in stats],
                    [st.st_mtime_ns for st in stats], [str(root / f) for f in files],
                    [f.parts[0] for f in files] if labels == "folders" else None)


def _tars(pattern: str, labels: str | None) -> ImageSet:
    if labels not in (None, "folders", "cls"):
        raise ConfigError(f"tar shards take labels='folders' (first directory of each member), 'cls' "
                          f"(WebDataset KEY.cls members) or none, got {labels!r}")
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    if not paths:
        raise InputError(f"{pattern}: no tar files match")
    ids: list[str] = []
    sizes: list[int] = []
    mtimes: list[int] = []
    locs: list[str] = []
    labs: list[str | None] = []
    for path in paths:
        if not Path(path).is_file():
            raise InputError(f"{path}: no such tar file")
        cls: dict[str, str] = {}
        start = len(ids)
        try:
            with tarfile.open(path, "r:*") as tf:
                for m in tf:
                    if not m.isfile():
                        continue
                    if labels == "cls" and m.name.endswith(".cls"):
                        data = tf.extractfile(m)
                        cls[_key(m.name)] = (data.read() if data else b"").decode().strip()
                    elif _is_image(m.name):
                        ids.append(f"{Path(path).name}/{m.name}")
                        sizes.append(int(m.size))
                        mtimes.append(int(m.mtime) * 10**9)
                        locs.append(f"{path}{TAR_SEP}{m.name}")
                        labs.append(m.name.split("/")[0] if labels == "folders" and "/" in m.name else None)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise InputError(f"{path}: cannot read the tar file ({type(exc).__name__}: {exc})") from None
        if labels == "cls":
            for i in range(start, len(labs)):
                labs[i] = cls.get(_key(locs[i].split(TAR_SEP, 1)[1]))
    if not ids:
        raise InputError(f"{pattern}: no image members ({', '.join(IMAGE_SUFFIXES)}) in the tar file(s)")
    if labels is not None:
        missing = [ids[i] for i, lab in enumerate(labs) if lab is None]
        if missing:
            what = "has no KEY.cls member" if labels == "cls" else "is not inside a class directory"
            raise InputError(f"{missing[0]}: labels={labels!r} but the image {what} "
                             f"({len(missing)} such images)")
    return ImageSet("tar", ids, sizes, mtimes, locs, [str(lab) for lab in labs] if labels else None)


def _key(member: str) -> str:
    """WebDataset sample key: the member path up to the first dot of its file name."""
    d, _, name = member.rpartition("/")
    return (d + "/" if d else "") + name.split(".", 1)[0]


def _listfile(path: Path, labels: str | None) -> ImageSet:
    if labels not in (None, "list"):
        raise ConfigError(f"an image list takes labels='list' (the label after each path) or none, "
                          f"got {labels!r}")
    if not path.is_file():
        raise InputError(f"{path}: no such image list file")
    ids: list[str] = []
    sizes: list[int] = []
    mtimes: list[int] = []
    locs: list[str] = []
    labs: list[str] = []
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, label = line, None
        if "\t" in line:
            name, label = (v.strip() for v in line.split("\t", 1))
        elif not (path.parent / line).is_file() and len(line.split()) > 1:
            name, label = (v.strip() for v in line.rsplit(None, 1))
        full = path.parent / name
        if not full.is_file():
            raise InputError(f"{path}, line {lineno}: no such image file {name}")
        if labels == "list" and not label:
            raise InputError(f"{path}, line {lineno}: labels='list' but {name} has no label")
        st = full.stat()
        ids.append(name)
        sizes.append(st.st_size)
        mtimes.append(st.st_mtime_ns)
        locs.append(str(full))
        labs.append(label or "")
    if not ids:
        raise InputError(f"{path}: the list names no images")
    return ImageSet("list", ids, sizes, mtimes, locs, labs if labels == "list" else None)


def label_codes(raw: list[str], folders: bool) -> tuple[np.ndarray, list[str] | None]:
    """Integer labels from raw labels: integers stay as they are (unless ``folders``); otherwise the
    sorted distinct names are the classes and a label is its class's index. Returns (labels, classes)."""
    if not folders:
        try:
            return np.array([int(v) for v in raw], dtype=np.int64), None
        except ValueError:
            pass
    classes = sorted(set(raw))
    index = {c: i for i, c in enumerate(classes)}
    return np.array([index[v] for v in raw], dtype=np.int64), classes


#: Pillow modes of 16-bit (and 32-bit integer) greyscale images, which ``convert("RGB")`` clips at 255
WIDE_GREY = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def decode_rgb(data: bytes | str | Path) -> np.ndarray:
    """An image file (a path, or its bytes) as RGB ``uint8`` of shape (height, width, 3).

    16-bit greyscale keeps its range: ``round(v * 255 / 65535)`` (mid-grey 32768 becomes 128, where
    Pillow's own conversion clips everything above 255 to white; 16-bit RGB already arrives as its high
    bytes). An image with more pixels than Pillow's decompression-bomb limit
    (``PIL.Image.MAX_IMAGE_PIXELS``, 89,478,485 by default; Pillow itself only warns below twice that)
    is refused from its header, before any pixel is decoded: a 12,000 x 12,000 PNG took 214 s and
    7.4 GB to extract.
    """
    from PIL import Image

    with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as im:
        limit = Image.MAX_IMAGE_PIXELS
        w, h = im.size
        if limit is not None and w * h > limit:
            raise ValueError(f"{w} x {h} = {w * h:,} pixels is over the decoding limit of {int(limit):,} "
                             "pixels (PIL.Image.MAX_IMAGE_PIXELS); shrink the image")
        im.load()
        if im.mode in WIDE_GREY:
            v = np.clip(np.asarray(im).astype(np.int64), 0, 65535)
            grey = ((v * 255 + 32767) // 65535).astype(np.uint8)
            return np.repeat(grey[..., None], 3, axis=2)
        return np.asarray(im.convert("RGB"))


def read_images(locs: list[str]) -> Iterator[tuple[int, np.ndarray | Exception]]:
    """Decode the images at ``locs`` (RGB uint8); yields (position, image or the exception raised).

    Files are read in order; the members of a tar file are collected in one pass over the archive.
    """
    if locs and all(is_idx_loc(loc) for loc in locs):
        yield from read_idx_images(locs)
        return
    in_tar: dict[str, dict[str, int]] = {}
    for i, loc in enumerate(locs):
        if TAR_SEP in loc:
            archive, member = loc.split(TAR_SEP, 1)
            in_tar.setdefault(archive, {})[member] = i
    found: dict[int, np.ndarray | Exception] = {}
    for archive, wanted in in_tar.items():
        left = len(wanted)
        try:
            with tarfile.open(archive, "r:*") as tf:
                for m in tf:
                    if m.name in wanted and wanted[m.name] not in found:
                        try:
                            data = tf.extractfile(m)
                            found[wanted[m.name]] = decode_rgb(data.read() if data else b"")
                        except Exception as exc:  # noqa: BLE001 - PIL raises many types for a bad image
                            found[wanted[m.name]] = exc
                        left -= 1
                        if left == 0:
                            break
        except (tarfile.TarError, OSError, EOFError) as exc:
            for i in wanted.values():
                found.setdefault(i, exc)
    for i, loc in enumerate(locs):
        if TAR_SEP in loc:
            yield i, found.get(i, FileNotFoundError(f"member not found in {loc.split(TAR_SEP)[0]}"))
            continue
        try:
            yield i, decode_rgb(Path(loc))
        except Exception as exc:  # noqa: BLE001 - PIL raises many types for a bad image
            yield i, exc
