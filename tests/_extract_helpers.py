"""Helpers for tests/test_extract.py: a tiny ONNX CNN with its float64 NumPy forward pass, image
folders, and a slow plug-in extractor (importable by the subprocess that a SIGKILL test starts)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

SIZE = 16  # the tiny CNN's input is 3 x 16 x 16


def tiny_cnn_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights of the tiny CNN: conv 3->4 (3x3, pad 1), relu, maxpool 2; conv 4->6
    (3x3), relu, averagepool 2; flatten (54); dense 54->10, relu ('feat'); dense 10->5 ('logits')."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {"W1": w(4, 3, 3, 3, scale=0.4), "B1": w(4, scale=0.1), "W2": w(6, 4, 3, 3, scale=0.3),
            "B2": w(6, scale=0.1), "W3": w(10, 54, scale=0.2), "B3": w(10, scale=0.1),
            "W4": w(5, 10, scale=0.3), "B4": w(5, scale=0.1)}


def write_tiny_cnn(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Build the tiny CNN with ``onnx.helper`` and save it to ``path``; returns its weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    wts = tiny_cnn_weights(seed)
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "W2", "B2"], ["c2"], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("AveragePool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p2"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "W3", "B3"], ["fc"], transB=1),
        helper.make_node("Relu", ["fc"], ["feat"]),
        helper.make_node("Gemm", ["feat", "W4", "B4"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])],
        initializer=[numpy_helper.from_array(v, k) for k, v in wts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return wts


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(x, w.shape[2:], axis=(2, 3))  # (n, c, h', w', kh, kw)
    return np.einsum("nchwij,ocij->nohw", win, w) + b[None, :, None, None]


def _pool(x: np.ndarray, reduce: str) -> np.ndarray:
    n, c, h, w = x.shape
    blocks = x[:, :, : h // 2 * 2, : w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2)
    return blocks.max(axis=(3, 5)) if reduce == "max" else blocks.mean(axis=(3, 5))


def tiny_cnn_forward(x: np.ndarray, wts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tiny CNN in float64 NumPy: ``x`` (n, 3, 16, 16) -> {'feat': (n, 10), 'logits': (n, 5)}."""
    w = {k: v.astype(np.float64) for k, v in wts.items()}
    h = _pool(np.maximum(_conv(x.astype(np.float64), w["W1"], w["B1"], 1), 0), "max")
    h = _pool(np.maximum(_conv(h, w["W2"], w["B2"], 0), 0), "mean")
    feat = np.maximum(h.reshape(len(h), -1) @ w["W3"].T + w["B3"], 0)
    return {"feat": feat, "logits": feat @ w["W4"].T + w["B4"]}


def make_images(root: Path, n: int, seed: int = 0, classes: int = 0, size: tuple[int, int] = (SIZE, SIZE),
                start: int = 0) -> dict[str, np.ndarray]:
    """``n`` random PNG images under ``root`` (in class sub-folders c0, c1, ... when ``classes``),
    named im00000.png...; returns {relative path: pixels}."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    made = {}
    for i in range(start, start + n):
        sub = f"c{i % classes}/" if classes else ""
        rel = f"{sub}im{i:05d}.png"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        arr = rng.integers(0, 256, size=(*size, 3), dtype=np.uint8)
        Image.fromarray(arr).save(root / rel)
        made[rel] = arr
    return made


class SlowMean:
    """A plug-in extractor, mean R, G, B per image, that sleeps ``delay`` seconds per batch and, with
    ``stall_after=n``, hangs (for an hour) on every batch after the first ``n``: a process running it
    is then surely still alive, part way through, when a test kills it."""

    name = "slow-mean"
    n_features = 3

    def __init__(self, delay: float = 0.0, stall_after: int | None = None) -> None:
        self.delay, self.stall_after, self.calls = delay, stall_after, 0
        self.params = {"what": "mean rgb"}

    def __call__(self, images: list[np.ndarray]) -> np.ndarray:
        self.calls += 1
        time.sleep(3600 if self.stall_after is not None and self.calls > self.stall_after else self.delay)
        return np.array([im.reshape(-1, 3).mean(axis=0) for im in images], dtype=np.float32)
