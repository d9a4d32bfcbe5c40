"""MNIST's idx format as an image source (pipeline/extract/idx_images.py): hand-made idx files, plain and
gzipped, read back exactly; their error messages; the ONNX path on the grey images against a float64
forward pass; appends, resume and two Dask workers through the shared extraction machinery; the
EfficientNet-Lite0 export of ../shared/models/ against its documented input convention."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest
from _extract_helpers import SIZE, tiny_cnn_forward, write_tiny_cnn

from pipeline.extract.idx_images import read_labels
from pipeline.extract.image_sources import list_images, read_images
from pipeline.ingest import ingest
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError, InputError

SIDE = SIZE // 2  # hand-made images are 8 x 8; nearest upsampling to the tiny CNN's 16 x 16 repeats pixels
EFFNET = dict(scale=1, mean=127, std=128, interpolation="nearest")  # (x - 127) / 128 on 0..255


def idx_bytes(a: np.ndarray) -> bytes:
    """An idx file of unsigned bytes: magic 0x0000 08 NDIM, big-endian sizes, the values."""
    head = bytes([0, 0, 8, a.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in a.shape)
    return head + np.ascontiguousarray(a, np.uint8).tobytes()


def write_pair(root: Path, prefix: str, images: np.ndarray, labels: np.ndarray | None,
               gz: bool = False) -> None:
    root.mkdir(parents=True, exist_ok=True)
    put = gzip.compress if gz else bytes
    ext = ".gz" if gz else ""
    (root / f"{prefix}-images-idx3-ubyte{ext}").write_bytes(put(idx_bytes(images)))
    if labels is not None:
        (root / f"{prefix}-labels-idx1-ubyte{ext}").write_bytes(put(idx_bytes(labels)))


def grey(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, SIDE, SIDE), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    return path, write_tiny_cnn(path, seed=0)


def reference(images: np.ndarray, wts) -> np.ndarray:
    """The tiny CNN's 'feat' in float64: nearest 2x upsampling, (x - 127) / 128, 3 equal channels."""
    x = images.astype(np.float64).repeat(2, axis=1).repeat(2, axis=2)
    x = ((x - 127.0) / 128.0)[:, None].repeat(3, axis=1)
    return tiny_cnn_forward(x, wts)["feat"]


# ---- the reader ---------------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True])
def test_reader_lists_and_decodes_hand_made_files(tmp_path, gz):
    a, ya = grey(5, 0)
    b, yb = grey(3, 1)
    write_pair(tmp_path, "train", a, ya, gz)
    write_pair(tmp_path, "t10k", b, yb, gz)
    s = list_images(str(tmp_path))
    assert s.kind == "idx" and len(s) == 8
    assert s.ids == [f"t10k/{i}" for i in range(3)] + [f"train/{i}" for i in range(5)]  # sorted by file
    assert s.labels == [str(v) for v in [*yb, *ya]] and s.sizes == [SIDE * SIDE] * 8
    got = dict(read_images(s.locs))
    for i, want in enumerate([*b, *a]):
        assert got[i].shape == (SIDE, SIDE, 3) and got[i].dtype == np.uint8
        for c in range(3):  # the grey value in every channel
            np.testing.assert_array_equal(got[i][..., c], want)
    np.testing.assert_array_equal(read_labels(next(tmp_path.glob("train-labels*"))), ya)
    one = list_images(str(next(tmp_path.glob("t10k-images*"))))  # one images file as the source
    assert one.ids == s.ids[:3] and one.labels == s.labels[:3]


def test_labels_option(tmp_path):
    a, ya = grey(4, 2)
    write_pair(tmp_path / "both", "x", a, ya)
    assert list_images(str(tmp_path / "both"), "idx").labels == [str(v) for v in ya]
    write_pair(tmp_path / "none", "x", a, None)
    assert list_images(str(tmp_path / "none")).labels is None  # no pairs at all: no labels
    with pytest.raises(InputError, match=r"x-images-idx3-ubyte: no paired labels file x-labels-idx1-ubyte"):
        list_images(str(tmp_path / "none"), "idx")
    write_pair(tmp_path / "none", "y", a, ya)  # some pairs but not all
    with pytest.raises(InputError, match=r"none/x-images-idx3-ubyte: no paired labels file"):
        list_images(str(tmp_path / "none"))
    with pytest.raises(ConfigError, match=r"an idx source takes labels='idx'.*got 'folders'"):
        list_images(str(tmp_path / "both"), "folders")


# ---- error messages -----------------------------------------------------------------------------
def test_errors_name_the_file(tmp_path):
    a, ya = grey(4, 3)
    bad = tmp_path / "magic"
    write_pair(bad, "x", a, ya)
    raw = bytearray((bad / "x-images-idx3-ubyte").read_bytes())
    raw[2] = 0x0D  # float32 data, not unsigned bytes
    (bad / "x-images-idx3-ubyte").write_bytes(bytes(raw))
    with pytest.raises(InputError, match=r"magic/x-images-idx3-ubyte: corrupt idx header: magic number "
                                         r"0x00000d03, expected 0x00000803"):
        list_images(str(bad))
    write_pair(bad, "x", a, ya)
    (bad / "x-labels-idx1-ubyte").write_bytes(idx_bytes(a))  # a 3-D file where labels belong
    with pytest.raises(InputError, match=r"x-labels-idx1-ubyte: corrupt idx header: magic number "
                                         r"0x00000803, expected 0x00000801"):
        list_images(str(bad))
    (bad / "x-images-idx3-ubyte").write_bytes(b"\0\0")
    with pytest.raises(InputError, match=r"x-images-idx3-ubyte: corrupt idx header: magic number 2 bytes"):
        list_images(str(bad))
    for gz in (False, True):  # one pixel short: plain and gzipped
        short = tmp_path / f"short{int(gz)}"
        write_pair(short, "x", a, ya, gz)
        name = "x-images-idx3-ubyte" + (".gz" if gz else "")
        data = idx_bytes(a)[:-1]
        (short / name).write_bytes(gzip.compress(data) if gz else data)
        with pytest.raises(InputError, match=rf"short{int(gz)}/{name}: the idx header declares 4 x 8 x 8 = "
                                             r"256 bytes of data but the file holds 255"):
            list_images(str(short))
    count = tmp_path / "count"
    write_pair(count, "x", a, ya[:3])
    with pytest.raises(InputError, match=r"count/x-labels-idx1-ubyte: 3 labels for the 4 images of "
                                         r"x-images-idx3-ubyte"):
        list_images(str(count))
    twice = tmp_path / "twice"
    write_pair(twice, "x", a, ya)
    write_pair(twice, "x", a, ya, gz=True)
    with pytest.raises(InputError, match=r"x-images-idx3-ubyte and x-images-idx3-ubyte.gz hold the same"):
        list_images(str(twice))
    crc = tmp_path / "crc"  # a damaged gzip stream: caught when the listing decompresses it to count
    write_pair(crc, "x", a, ya, gz=True)
    whole = bytearray((crc / "x-images-idx3-ubyte.gz").read_bytes())
    whole[-10] ^= 0xFF  # inside the deflate data, after the header
    (crc / "x-images-idx3-ubyte.gz").write_bytes(bytes(whole))
    with pytest.raises(InputError, match=r"crc/x-images-idx3-ubyte.gz: cannot decompress the idx file "
                                         r"\(BadGzipFile: CRC check failed"):
        ingest(str(crc), tmp_path / "t.zarr", extractor="color-hog", size=16)
    assert not (tmp_path / "t.zarr").exists()


# ---- through the extraction machinery -----------------------------------------------------------
def test_onnx_on_grey_images_matches_float64(tiny, tmp_path):
    path, wts = tiny
    a, ya = grey(11, 4)
    write_pair(tmp_path / "src", "train", a, ya, gz=True)
    rep = ingest(str(tmp_path / "src"), tmp_path / "s", extractor="onnx", model=str(path), output="feat",
                 size=SIZE, batch_images=4, shard_images=8, chunk_rows=8, **EFFNET)
    assert (rep.rows_written, rep.n_features, rep.shards) == (11, 10, 2)
    s = FeatureStore.open(tmp_path / "s")
    np.testing.assert_allclose(s.read(), reference(a, wts), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(s.read_labels(), ya)
    assert list(s.read_ids()) == [f"train/{i}" for i in range(11)]
    params = s.attrs["extractor_params"]
    assert (params["scale"], params["mean"], params["std"], params["interpolation"]) == \
        (1.0, [127.0] * 3, [128.0] * 3, "nearest")


def test_append_resume_and_workers(tiny, tmp_path, client):
    path, _ = tiny
    src = tmp_path / "src"
    a, ya = grey(10, 5)
    b, yb = grey(6, 6)
    write_pair(src, "train", a, ya)
    opts = dict(extractor="onnx", model=str(path), output="feat", size=SIZE, batch_images=2,
                shard_images=4, chunk_rows=8, **EFFNET)
    ingest(str(src), tmp_path / "s", **opts)
    write_pair(src, "t10k", b, yb, gz=True)  # a new file: only its images are extracted
    rep = ingest(str(src), tmp_path / "s", append=True, **opts)
    assert (rep.rows_written, rep.images_new, rep.images_listed, rep.n_rows) == (6, 6, 16, 16)
    whole = ingest(str(src), tmp_path / "w", cluster=client, **opts)  # two worker processes
    assert whole.workers == 2 and whole.shards == 4
    s, w = FeatureStore.open(tmp_path / "s"), FeatureStore.open(tmp_path / "w")
    order = {name: i for i, name in enumerate(w.read_ids())}
    idx = [order[name] for name in s.read_ids()]
    np.testing.assert_allclose(s.read(), w.read()[idx], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(s.read_labels(), w.read_labels()[idx])
    # resume: an extraction that fails in its third shard keeps the first two; the rerun takes them
    from pipeline.extract.extractors import make_extractor

    good = make_extractor("onnx", model=str(path), output="feat", input_size=SIZE, **EFFNET)

    class FailsLater:
        name, params, n_features = good.name, good.params, good.n_features
        calls = 0

        def __call__(self, images):
            FailsLater.calls += 1
            if FailsLater.calls > 4:  # shards hold 2 batches
                raise RuntimeError("killed")
            return good(images)

    plug = {k: v for k, v in opts.items() if k not in ("model", "output", "size", *EFFNET)}
    with pytest.raises(RuntimeError, match="killed"):
        ingest(str(src), tmp_path / "r", **{**plug, "extractor": FailsLater()})
    assert len(list(tmp_path.glob("r.extract-*/shard-*.npz"))) == 2
    rep = ingest(str(src), tmp_path / "r", **{**plug, "extractor": good})
    assert rep.shards_resumed == 2 and rep.rows_written == 16
    np.testing.assert_array_equal(FeatureStore.open(tmp_path / "r").read(), w.read())


# ---- the real network (../shared/models/, skipped where it is absent) ---------------------------
def shared_models() -> Path | None:
    """``../shared/models`` beside the repository (or $VBCLUSTER_SHARED_MODELS), or None."""
    env = os.environ.get("VBCLUSTER_SHARED_MODELS")
    path = Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "models"
    return path if (path / "efficientnet_lite0_features.onnx").is_file() else None


def test_efficientnet_export_on_grey_images(tmp_path):
    models = shared_models()
    if models is None:
        pytest.skip("../shared/models/efficientnet_lite0_features.onnx is not here")
    import onnxruntime as ort

    model = models / "efficientnet_lite0_features.onnx"
    from PIL import Image
    from skimage import data

    camera = Image.fromarray(data.camera())  # a real grey photo (bundled), in 28 x 28 crops
    a = np.stack([np.asarray(camera.resize((28 * s, 28 * s)))[28 * i: 28 * i + 28, 28 * j: 28 * j + 28]
                  for s, i, j in ((1, 0, 0), (2, 0, 1), (2, 1, 0), (3, 1, 1), (3, 2, 0), (4, 2, 2))])
    write_pair(tmp_path / "src", "x", a, None, gz=True)
    ingest(str(tmp_path / "src"), tmp_path / "s", extractor="onnx", model=str(model), size=112, threads=1,
           **EFFNET)
    got = FeatureStore.open(tmp_path / "s").read()
    # the documented convention computed in float64, then run by onnxruntime directly
    x = a.astype(np.float64).repeat(4, axis=1).repeat(4, axis=2)  # 28 -> 112 px, nearest
    x = ((x - 127.0) / 128.0)[:, None].repeat(3, axis=1).astype(np.float32)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"images": x})
    assert got.shape == (6, 1280) and (got >= 0).all() and (got > 0).mean() > 0.05
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
