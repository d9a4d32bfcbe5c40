"""Decoding images for extraction (issue 29, medium 7): 16-bit greyscale PNG and TIFF keep their
range (Pillow's own conversion clipped mid-grey 32768 to white), and an image over Pillow's
decompression-bomb limit is refused from its header, one line naming the file, before it is decoded."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.extract.image_sources import decode_rgb, read_images
from pipeline.ingest import ingest
from pipeline.store.features import FeatureStore
from vbcore.errors import InputError

GREY16 = np.array([[0, 257, 32768], [40000, 65279, 65535]], dtype=np.uint16)
GREY8 = np.array([[0, 1, 128], [156, 254, 255]], dtype=np.uint8)  # round(v * 255 / 65535)


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_16_bit_grey_keeps_its_range(tmp_path, suffix):
    path = tmp_path / f"g{suffix}"
    Image.fromarray(GREY16).save(path)
    assert Image.open(path).mode == "I;16"
    rgb = decode_rgb(path)
    assert rgb.dtype == np.uint8 and rgb.shape == (2, 3, 3)
    np.testing.assert_array_equal(rgb, np.repeat(GREY8[..., None], 3, axis=2))
    np.testing.assert_array_equal(decode_rgb(path.read_bytes()), rgb)  # tar members arrive as bytes
    np.testing.assert_array_equal(np.round(GREY16 * (255 / 65535)), GREY8)  # the reference, in float


def test_a_16_bit_image_extracts_as_its_8_bit_twin(tmp_path):
    """Through the whole ingest: a 16-bit mid-grey image gets the features of the same image in 8 bits."""
    root = tmp_path / "imgs"
    root.mkdir()
    ramp = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)
    Image.fromarray(ramp).save(root / "a16.png")
    Image.fromarray(((ramp.astype(np.int64) * 255 + 32767) // 65535).astype(np.uint8)).save(root / "b8.png")
    ingest(str(root), tmp_path / "s", chunk_rows=4)
    s = FeatureStore.open(tmp_path / "s")
    assert list(s.read_ids()) == ["a16.png", "b8.png"]
    X = s.read()
    np.testing.assert_array_equal(X[0], X[1])


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height RGB pixels, with a few bytes of data (a decompression
    bomb's shape: tiny on disk, huge when decoded)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + chunk(b"IEND", b""))


def test_an_image_over_the_decoding_limit_is_refused_from_its_header(tmp_path):
    root = tmp_path / "imgs"
    root.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "a.png")
    (root / "huge.png").write_bytes(_png_header(10_000, 10_000))  # 1e8 pixels: Pillow only warns
    assert (root / "huge.png").stat().st_size < 200
    got = dict(read_images([str(root / "a.png"), str(root / "huge.png")]))
    assert got[0].shape == (8, 8, 3)
    assert isinstance(got[1], ValueError) and str(got[1]) == (
        "10000 x 10000 = 100,000,000 pixels is over the decoding limit of 89,478,485 pixels "
        "(PIL.Image.MAX_IMAGE_PIXELS); shrink the image")
    with pytest.raises(InputError, match=r"huge\.png: cannot read the image \(ValueError: 10000 x 10000 = "
                       r"100,000,000 pixels is over the decoding limit of 89,478,485 pixels"):
        ingest(str(root), tmp_path / "s")
    res = CliRunner().invoke(app, ["ingest", str(root), "--out", str(tmp_path / "s")])
    said = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "huge.png: cannot read the image (ValueError: 10000 x 10000" in said, res.output
    rep = ingest(str(root), tmp_path / "s", skip_unreadable=True)
    assert rep.skipped_files == ("huge.png",) and rep.rows_written == 1


def test_the_limit_is_pillows_setting(tmp_path, monkeypatch):
    path = tmp_path / "a.png"
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 599)
    with pytest.raises(ValueError, match=r"^30 x 20 = 600 pixels is over the decoding limit of 599 pixels"):
        decode_rgb(Path(path))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 600)
    assert decode_rgb(path).shape == (20, 30, 3)
