"""Feature extraction at scale: the ONNX Runtime extractor against a NumPy forward pass, sharded and
distributed extraction (same store bits in-process and on workers), resume after SIGKILL, incremental
appends, tar shards and image lists."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from _extract_helpers import SIZE, make_images, tiny_cnn_forward, write_tiny_cnn

from pipeline.extract.extraction import cache_size, refresh_images
from pipeline.extract.extractors import OnnxExtractor, make_extractor, resize_rgb
from pipeline.ingest import ingest
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError, InputError, StoreError

MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    return path, write_tiny_cnn(path, seed=0)


def _normalised(images, mean=MEAN, std=STD):
    return ((np.stack(images) / 255.0 - mean) / std).transpose(0, 3, 1, 2)


# ---- the ONNX Runtime extractor -----------------------------------------------------------------
def test_onnx_extractor_matches_numpy_forward_pass(tiny):
    path, wts = tiny
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8) for _ in range(7)]
    ref = tiny_cnn_forward(_normalised(images), wts)
    ext = OnnxExtractor(path)  # the only graph output, input size from the model
    assert (ext.output, ext.input_size, ext.n_features) == ("logits", (SIZE, SIZE), 5)
    np.testing.assert_allclose(ext(images), ref["logits"], rtol=1e-5, atol=1e-5)
    feat = make_extractor("onnx", model=str(path), output="feat", threads=1)  # an intermediate tensor
    assert feat.n_features == 10 and feat.params["model_sha256"] == ext.sha256
    out = feat(images)
    assert out.dtype == np.float32 and out.shape == (7, 10)
    np.testing.assert_allclose(out, ref["feat"], rtol=1e-5, atol=1e-5)
    # same bits: unpickled (as on a Dask worker), other thread counts, smaller batches
    again = pickle.loads(pickle.dumps(feat))
    np.testing.assert_array_equal(again(images), out)
    np.testing.assert_array_equal(OnnxExtractor(path, "feat", threads=2)(images), out)
    np.testing.assert_array_equal(feat(images[:3]), out[:3])
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():  # 'auto' falls back to the CPU
        np.testing.assert_array_equal(OnnxExtractor(path, "feat", device="auto")(images), out)


def test_onnx_extractor_resizes_and_normalises(tiny):
    path, wts = tiny
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((20, 30), (40, 17), (16, 16))]
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    for mode in ("stretch", "crop"):
        ext = OnnxExtractor(path, "feat", mean=mean, std=std, resize=mode)
        resized = [resize_rgb(im, (SIZE, SIZE), mode) for im in images]
        assert all(r.shape == (SIZE, SIZE, 3) and r.dtype == np.uint8 for r in resized)
        ref = tiny_cnn_forward(_normalised(resized, np.array(mean), np.array(std)), wts)
        np.testing.assert_allclose(ext(images), ref["feat"], rtol=1e-5, atol=1e-5)
    from PIL import Image

    expect = np.asarray(Image.fromarray(images[0]).resize((SIZE, SIZE), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(resize_rgb(images[0], (SIZE, SIZE)), expect)
    crop = resize_rgb(images[0], (SIZE, SIZE), "crop")  # 20 x 30 -> 16 x 24, centre 16 x 16
    big = np.asarray(Image.fromarray(images[0]).resize((24, 16), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(crop, big[:, 4:20])


def test_onnx_extractor_errors(tiny, tmp_path):
    path, _ = tiny
    with pytest.raises(ConfigError, match=r"model file .*nothing\.onnx does not exist"):
        OnnxExtractor(tmp_path / "nothing.onnx")
    with pytest.raises(ConfigError, match=r"tiny\.onnx has no tensor 'fc7'; graph outputs \['logits'\]"):
        OnnxExtractor(path, "fc7")
    with pytest.raises(ConfigError, match=r"input_size \(32, 32\) does not fit the model input"):
        OnnxExtractor(path, input_size=32)
    with pytest.raises(ConfigError, match=r"layout must be one of \('nchw', 'nhwc'\), got 'chw'"):
        OnnxExtractor(path, layout="chw")
    with pytest.raises(ConfigError, match=r"has 16 channels in layout 'nhwc'; expected 3 \(RGB\)"):
        OnnxExtractor(path, layout="nhwc")
    with pytest.raises(ConfigError, match=r"mean must be 3 numbers \(R, G, B\), got 'a,b'"):
        OnnxExtractor(path, mean="a,b")
    with pytest.raises(ConfigError, match=r"std must be positive"):
        OnnxExtractor(path, std=(0.2, 0.0, 0.2))
    with pytest.raises(ConfigError, match=r"the onnx extractor needs model=PATH"):
        make_extractor("onnx")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        with pytest.raises(ConfigError, match=r"device='cuda' but onnxruntime offers only"):
            OnnxExtractor(path, device="cuda")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match=r"onnxruntime cannot load .*bad\.onnx"):
        OnnxExtractor(bad)


# ---- sharded, distributed extraction ------------------------------------------------------------
def _store(path):
    s = FeatureStore.open(path)
    return s.read(), s.read_labels(), list(s.read_ids()), s.fingerprint, s.attrs


def test_in_process_and_two_workers_give_the_same_store(tiny, tmp_path, client):
    path, wts = tiny
    made = dict(sorted(make_images(tmp_path / "imgs", 45, seed=3, classes=3).items()))
    (tmp_path / "imgs" / "c1" / "broken.png").write_bytes(b"\x89PNG not really")
    opts = dict(extractor="onnx", model=str(path), output="feat", labels="folders", chunk_rows=16,
                batch_images=4, shard_images=8, skip_unreadable=True)
    seen = []
    rep1 = ingest(str(tmp_path / "imgs"), tmp_path / "local", progress=seen.append, **opts)
    rep2 = ingest(str(tmp_path / "imgs"), tmp_path / "dask", cluster=client, **opts)
    assert (rep1.workers, rep2.workers, rep1.shards, rep2.shards) == (0, 2, 6, 6)
    assert sum(seen) == 46 and rep1.images_per_s > 0 and rep2.images_per_s > 0
    a, b = _store(tmp_path / "local"), _store(tmp_path / "dask")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2] == b[2] == list(made) and a[3] == b[3]
    assert a[4]["images"] == b[4]["images"] == {"held": 45, "n_skipped": 1, "skipped": ["c1/broken.png"],
                                                "manifest": "image_manifest"}
    assert rep1.skipped_files == ("c1/broken.png",) and rep1.rows_written == 45
    ref = tiny_cnn_forward(_normalised(list(made.values())), wts)["feat"]
    np.testing.assert_allclose(a[0], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(a[1], [int(p[1]) for p in made])  # classes c0, c1, c2
    assert a[4]["extractor_params"]["classes"] == ["c0", "c1", "c2"]
    assert sorted(client.run(cache_size).values()) == [1, 1]  # each worker loaded the model once
    assert not list(tmp_path.glob("*.extract-*"))  # the work folder is gone
    with pytest.raises(InputError, match=r"c1/broken\.png: cannot read the image"):
        ingest(str(tmp_path / "imgs"), tmp_path / "strict", cluster=client,
               **{**opts, "skip_unreadable": False})
    # nothing is left: no store, no temporary (.strict.tmp-*) and no writer record
    assert not (tmp_path / "strict").exists() and not list(tmp_path.glob("*strict*"))


def test_append_extracts_only_new_images(tiny, tmp_path):
    path, _ = tiny
    root = tmp_path / "imgs"
    first = make_images(root, 20, seed=4)
    opts = dict(extractor="onnx", model=str(path), chunk_rows=8, batch_images=4, shard_images=8)
    ingest(str(root), tmp_path / "s", **opts)
    more = make_images(root, 7, seed=5, start=20)
    os.utime(root / "im00003.png", ns=(10**18, 10**18))  # a held image touched: reported, kept
    rep = ingest(str(root), tmp_path / "s", append=True, **opts)
    assert (rep.rows_written, rep.images_new, rep.images_listed, rep.n_rows) == (7, 7, 27, 27)
    assert rep.changed == ("im00003.png",)
    full = ingest(str(root), tmp_path / "full", **opts)
    assert full.rows_written == 27
    s, f = _store(tmp_path / "s"), _store(tmp_path / "full")
    assert s[2] == f[2] == list(first) + list(more)
    np.testing.assert_allclose(s[0], f[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(s[0][:20], _store(tmp_path / "full")[0][:20])
    again = refresh_images(str(root), tmp_path / "s", **opts)  # nothing new: the store is untouched
    assert (again.rows_written, again.images_new, again.n_rows) == (0, 0, 27)
    assert FeatureStore.open(tmp_path / "s").fingerprint == s[3]
    manifest = FeatureStore.open(tmp_path / "s").group["image_manifest"][:]
    assert sorted(str(m).split("\t")[0] for m in manifest) == sorted(s[2])
    with pytest.raises(StoreError, match=r"was extracted with 'onnx'.*this append would use 'onnx'"):
        ingest(str(root), tmp_path / "s", append=True, **{**opts, "output": "feat"})


def test_option_errors(tiny, tmp_path):
    path, _ = tiny
    make_images(tmp_path / "imgs", 3)
    with pytest.raises(ConfigError, match=r"shard_images \(10\) must be a multiple of batch_images \(4\)"):
        ingest(str(tmp_path / "imgs"), tmp_path / "s", batch_images=4, shard_images=10)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['colour'\] for an image source"):
        ingest(str(tmp_path / "imgs"), tmp_path / "s", colour=1)
    with pytest.raises(ConfigError, match=r"batch_images must be >= 1, got 0"):
        ingest(str(tmp_path / "imgs"), tmp_path / "s", batch_images=0)
    with pytest.raises(ConfigError, match=r"an image source's ids are the images' relative paths"):
        ingest(str(tmp_path / "imgs"), tmp_path / "s", ids="x")


# ---- resume after SIGKILL -----------------------------------------------------------------------
_KILLED_RUN = """
import sys
sys.path.insert(0, {tests!r})
from _extract_helpers import SlowMean
from pipeline.ingest import ingest
ingest({src!r}, {out!r}, extractor=SlowMean(0.05, stall_after=7), batch_images=2, shard_images=4,
       chunk_rows=6, labels="folders")
"""


def test_sigkill_then_resume_gives_the_same_store(tmp_path):
    """The killed run finishes shards 0-2 (6 batches), starts shard 3 and hangs: SIGKILL lands there."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from _extract_helpers import SlowMean

    src, out = tmp_path / "imgs", tmp_path / "s"
    make_images(src, 40, seed=6, classes=2)
    code = _KILLED_RUN.format(tests=str(Path(__file__).parent), src=str(src), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if len(list(tmp_path.glob("s.extract-*/shard-*.npz"))) >= 3:  # shard 3 can never finish
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the extraction ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    done = len(list(tmp_path.glob("s.extract-*/shard-*.npz")))
    assert done == 3 and not out.exists()
    opts = dict(extractor=SlowMean(), batch_images=2, shard_images=4, chunk_rows=6, labels="folders")
    rep = ingest(str(src), out, **opts)
    assert rep.shards == 10 and rep.shards_resumed == done and rep.rows_written == 40
    ingest(str(src), tmp_path / "ref", **opts)  # uninterrupted
    a, b = _store(out), _store(tmp_path / "ref")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2] == b[2] and a[3] == b[3]
    assert not list(tmp_path.glob("*.extract-*")) and not list(tmp_path.glob("*.tmp-*"))


# ---- tar shards and image lists -----------------------------------------------------------------
def _tar(path, members):
    import io
    import tarfile

    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tf.addfile(info, io.BytesIO(data))


def test_tar_shards_are_streamed_in_archive_order(tiny, tmp_path):
    path, _ = tiny
    made = make_images(tmp_path / "imgs", 12, seed=7)
    names = list(made)
    for k, part in enumerate((names[:7], names[7:])):  # WebDataset style: KEY.png + KEY.cls
        _tar(tmp_path / f"train-{k:03d}.tar",
             [m for n in part for m in ((n, (tmp_path / "imgs" / n).read_bytes()),
                                        (n.replace(".png", ".cls"), str(int(n[2:7]) % 3).encode()))])
    _tar(tmp_path / "bad.tar", [("x.png", b"garbage")])
    opts = dict(extractor="onnx", model=str(path), output="feat", batch_images=4, shard_images=4)
    rep = ingest(str(tmp_path / "train-*.tar"), tmp_path / "t", labels="cls", **opts)
    assert rep.rows_written == 12 and rep.images_listed == 12
    t = _store(tmp_path / "t")
    assert t[2] == [f"train-000.tar/{n}" for n in names[:7]] + [f"train-001.tar/{n}" for n in names[7:]]
    np.testing.assert_array_equal(t[1], [i % 3 for i in range(12)])
    ingest(str(tmp_path / "imgs"), tmp_path / "f", **opts)  # the same images from a folder
    np.testing.assert_array_equal(t[0], _store(tmp_path / "f")[0])
    assert sorted(p.name for p in tmp_path.rglob("*.png")) == sorted(names)  # nothing unpacked
    with pytest.raises(InputError, match=r"bad\.tar/x\.png: cannot read the image"):
        ingest(str(tmp_path / "bad.tar"), tmp_path / "b", **opts)
    with pytest.raises(InputError, match=r"train-000\.tar/im00000\.png: labels='folders' but the image is "
                                         r"not inside a class directory \(7 such images\)"):
        ingest(str(tmp_path / "train-000.tar"), tmp_path / "b", labels="folders", **opts)
    _tar(tmp_path / "classes.tar", [(f"{c}/{n}", (tmp_path / "imgs" / n).read_bytes())
                                     for c, n in (("dog", names[0]), ("cat", names[1]), ("dog", names[2]))])
    ingest(str(tmp_path / "classes.tar"), tmp_path / "c", labels="folders", **opts)
    c = _store(tmp_path / "c")
    np.testing.assert_array_equal(c[1], [1, 0, 1])
    assert c[4]["extractor_params"]["classes"] == ["cat", "dog"]
    np.testing.assert_allclose(c[0], t[0][:3], rtol=1e-6, atol=1e-6)  # other batches: to rounding
    with pytest.raises(InputError, match=r"nothing-\*\.tar: no tar files match"):
        ingest(str(tmp_path / "nothing-*.tar"), tmp_path / "b", **opts)


def test_image_list_with_labels(tmp_path):
    from _extract_helpers import SlowMean

    made = make_images(tmp_path / "imgs", 5, seed=8)
    lines = ["# path label", "imgs/im00003.png\tdog", "", "imgs/im00000.png cat", "imgs/im00004.png   dog"]
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    rep = ingest(str(tmp_path / "list.txt"), tmp_path / "s", extractor=SlowMean(), labels="list")
    s = _store(tmp_path / "s")
    assert rep.rows_written == 3 and s[2] == ["imgs/im00003.png", "imgs/im00000.png", "imgs/im00004.png"]
    np.testing.assert_array_equal(s[1], [1, 0, 1])
    assert s[4]["extractor_params"]["classes"] == ["cat", "dog"]
    expect = [made[p[5:]].reshape(-1, 3).mean(axis=0) for p in s[2]]
    np.testing.assert_allclose(s[0], expect, rtol=1e-6)
    (tmp_path / "ints.lst").write_text("imgs/im00001.png 7\nimgs/im00002.png 2\n")
    ingest(str(tmp_path / "ints.lst"), tmp_path / "i", extractor=SlowMean(), labels="list")
    np.testing.assert_array_equal(_store(tmp_path / "i")[1], [7, 2])
    (tmp_path / "bad.txt").write_text("imgs/im00001.png\nimgs/nope.png\n")
    with pytest.raises(InputError, match=r"bad\.txt, line 2: no such image file imgs/nope\.png"):
        ingest(str(tmp_path / "bad.txt"), tmp_path / "b", extractor=SlowMean())
    with pytest.raises(InputError, match=r"ints\.lst, line 1: labels='list' but imgs/im00001\.png has no"):
        (tmp_path / "ints.lst").write_text("imgs/im00001.png\n")
        ingest(str(tmp_path / "ints.lst"), tmp_path / "b", extractor=SlowMean(), labels="list")


def test_a_replaced_model_file_is_loaded_again(tmp_path):
    from pipeline.extract.extraction import cached_extractor

    path = tmp_path / "m.onnx"
    write_tiny_cnn(path, seed=1)
    recipe = ["onnx", {"model": str(path), "output": "feat"}]
    first = cached_extractor(recipe)
    assert cached_extractor(recipe) is first  # built once per process
    write_tiny_cnn(path, seed=2)
    os.utime(path, ns=(10**18, 10**18))
    second = cached_extractor(recipe)
    assert second is not first and second.params["model_sha256"] != first.params["model_sha256"]


def test_an_image_ingest_tells_its_progress_the_total(tiny, tmp_path):
    """Issue 53, item 12: 70,000 images showed a spinner for 7 minutes; a progress with ``total``
    learns the images listed before the first shard, then every row once."""
    path, _ = tiny
    make_images(tmp_path / "imgs", 11, seed=6)
    calls: list[tuple[str, int]] = []

    class Bar:
        def __call__(self, n):
            calls.append(("rows", n))

        def total(self, n):
            calls.append(("total", n))

    ingest(str(tmp_path / "imgs"), tmp_path / "s", extractor="onnx", model=str(path), chunk_rows=8,
           batch_images=4, shard_images=4, progress=Bar())
    assert calls[0] == ("total", 11) and sum(n for k, n in calls if k == "rows") == 11
