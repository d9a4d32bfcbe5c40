"""Hostile idx files (issue 53, item 2): headers are checked against the file's real size (for gzip,
the bytes decompressed block by block), against the pixel limit and against the image limit, before
anything is listed or read whole; each refusal is one line naming the file, quick and in bounded
memory. The files are built small: sparse files and forged gzip trailers."""

from __future__ import annotations

import gzip
import struct
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.extract.idx_images import MAX_IDX_IMAGES, read_images_file
from pipeline.extract.image_sources import list_images
from vbcore.errors import InputError

MB = 2**20


def header(*dims: int) -> bytes:
    return bytes([0, 0, 8, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims)


def forged_gz(path: Path, head: bytes, size: int) -> None:
    """A gzip file holding only ``head`` whose trailer claims ``size`` bytes (mod 2**32)."""
    raw = bytearray(gzip.compress(head))
    raw[-4:] = struct.pack("<I", size % 2**32)
    path.write_bytes(bytes(raw))


def sparse(path: Path, head: bytes, data_bytes: int) -> None:
    """A sparse file: ``head``, then ``data_bytes`` bytes that take no disk."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + data_bytes)


def labels(root: Path, prefix: str, n: int) -> None:
    (root / f"{prefix}-labels-idx1-ubyte").write_bytes(header(n) + bytes(n))


def refused(source: Path, match: str, peak_mb: float = 16) -> None:
    """list_images(source) raises InputError matching ``match`` within 5 s and ``peak_mb`` of memory."""
    t0 = time.perf_counter()
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=match) as info:
            list_images(str(source))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "\n" not in str(info.value)
    assert time.perf_counter() - t0 < 5 and peak < peak_mb * MB, (time.perf_counter() - t0, peak)


def test_forged_gzip_header_and_trailer(tmp_path):
    d = tmp_path / "forged"
    d.mkdir()
    head = header(60_000, 28, 28)  # 47 MB declared, the trailer forged to match, 16 bytes held
    forged_gz(d / "x-images-idx3-ubyte.gz", head, len(head) + 60_000 * 784)
    assert (d / "x-images-idx3-ubyte.gz").stat().st_size < 60
    refused(d, r"forged/x-images-idx3-ubyte.gz: cannot decompress the idx file \(BadGzipFile: Incorrect "
               r"length of data produced\)")  # the stream is counted, not the trailer
    (d / "x-images-idx3-ubyte.gz").write_bytes(gzip.compress(head + bytes(100)))  # an honest short one
    refused(d, r"forged/x-images-idx3-ubyte.gz: the idx header declares 60000 x 28 x 28 = 47040000 bytes "
               r"of data but the file holds 100: truncated or corrupt")
    big = tmp_path / "billion"  # the attack's file: 10^9 images of 28 x 28 in 39 bytes
    big.mkdir()
    forged_gz(big / "x-images-idx3-ubyte.gz", header(10**9, 28, 28), 16 + 10**9 * 784)
    refused(big, rf"billion/x-images-idx3-ubyte.gz: the idx header declares 1,000,000,000 images, over the "
                 rf"limit of {MAX_IDX_IMAGES:,} for one idx source")


def test_sparse_file_declaring_a_billion_images(tmp_path):
    sparse(tmp_path / "x-images-idx3-ubyte", header(10**9, 1, 1), 10**9)  # sizes match: 1 GB, no disk
    refused(tmp_path, r"x-images-idx3-ubyte: the idx header declares 1,000,000,000 images, over the limit")


def test_gzip_bomb_is_not_decompressed_whole(tmp_path):
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    parts = [comp.compress(header(4, 8, 8))]
    zeros = bytes(MB)
    parts += [comp.compress(zeros) for _ in range(256)]  # 256 MB of zeros in about 250 KB
    parts.append(comp.flush())
    path = tmp_path / "x-images-idx3-ubyte.gz"
    path.write_bytes(b"".join(parts))
    labels(tmp_path, "x", 4)
    assert path.stat().st_size < MB
    refused(tmp_path, r"x-images-idx3-ubyte.gz: the idx header declares 4 x 8 x 8 = 256 bytes of data but "
                      r"the file holds more than 256: truncated or corrupt")
    tracemalloc.start()  # a worker decoding it (its listing skipped) stops as early
    try:
        with pytest.raises(InputError, match=r"holds more than 256"):
            read_images_file(path)
        assert tracemalloc.get_traced_memory()[1] < 16 * MB
    finally:
        tracemalloc.stop()


def test_images_over_the_pixel_limit(tmp_path):
    sparse(tmp_path / "x-images-idx3-ubyte", header(1, 20_000, 20_000), 20_000 * 20_000)
    refused(tmp_path, r"x-images-idx3-ubyte: the idx header declares images of 20000 x 20000 = "
                      r"400,000,000 pixels, over the decoding limit of 89,478,485 pixels")


def test_labels_header_is_compared_before_the_labels_are_read(tmp_path):
    (tmp_path / "x-images-idx3-ubyte").write_bytes(header(4, 2, 2) + bytes(16))
    sparse(tmp_path / "x-labels-idx1-ubyte", header(3 * 10**9), 3 * 10**9)
    refused(tmp_path, r"x-labels-idx1-ubyte: 3000000000 labels for the 4 images of x-images-idx3-ubyte")


def test_cli_refuses_in_one_line(tmp_path):
    forged_gz(tmp_path / "x-images-idx3-ubyte.gz", header(10**9, 28, 28), 16 + 10**9 * 784)
    res = CliRunner().invoke(app, ["ingest", str(tmp_path), "--out", str(tmp_path / "s.zarr"),
                                   "-o", "extractor=color-hog", "-q"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, (res.exit_code, res.output)
    assert "1,000,000,000 images, over the limit" in lines[0]
    assert not (tmp_path / "s.zarr").exists()
