"""Feature extraction at scale: the ONNX Runtime extractor against a NumPy forward pass, sharded and
distributed extraction (same store bits in-process and on workers), resume after SIGKILL, incremental
appends, tar shards and image lists."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from _extract_helpers import SIZE, tiny_cnn_forward, write_tiny_cnn

from pipeline.extractors import OnnxExtractor, make_extractor, resize_rgb
from vbcore.errors import ConfigError

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
