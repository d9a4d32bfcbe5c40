"""Built-in data sets: scikit-learn's digits and the photos bundled with scikit-image."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.ingest.images import read_rgb
from pipeline.ingest.plan import Batch, Plan, as_int, no_more_options, no_side_data, row_slices
from vbcore.errors import ConfigError

MAX_IMAGE_PIXELS = 40_000  # default downsampling target of image:NAME


# ---- built-in datasets --------------------------------------------------------------------------
def read_digits(labels: str | None, ids: str | None, options: dict[str, Any]) -> Plan:
    """scikit-learn's bundled 8x8 digits: 1,797 rows x 64 features, labels and row ids."""
    from sklearn.datasets import load_digits

    no_more_options("digits", options)
    no_side_data("digits", labels, ids)
    X, y = load_digits(return_X_y=True)

    def blocks(first: int, size: int) -> Iterator[Batch]:
        for s, e in row_slices(len(X), first, size):
            yield X[s:e].astype(np.float32), y[s:e].astype(np.int64), np.arange(s, e, dtype=np.int64)

    return Plan(X.shape[1], True, "int", blocks, extractor="sklearn.load_digits",
                 extractor_params={"dataset": "digits", "n_classes": 10})


# scikit-image sample photos shipped inside the wheel (skimage/data/), read from there directly so
# that no download (pooch) can ever start. Only names whose file is present are offered.
_SKIMAGE_FILES = {
    "astronaut": "astronaut.png", "brick": "brick.png", "camera": "camera.png", "cat": "chelsea.png",
    "cell": "cell.png", "chelsea": "chelsea.png", "clock": "clock_motion.png", "coffee": "coffee.png",
    "coins": "coins.png", "colorwheel": "color.png", "grass": "grass.png", "gravel": "gravel.png",
    "horse": "horse.png", "hubble_deep_field": "hubble_deep_field.jpg",
    "immunohistochemistry": "ihc.png", "logo": "logo.png", "microaneurysms": "microaneurysms.png",
    "moon": "moon.png", "page": "page.png", "retina": "retina.jpg", "rocket": "rocket.jpg",
    "text": "text.png",
}


def bundled_images() -> dict[str, Path]:
    """The ``image:NAME`` names available offline, with their files in the installed scikit-image."""
    import skimage.data

    base = Path(skimage.data.__file__).parent
    return {k: base / f for k, f in sorted(_SKIMAGE_FILES.items()) if (base / f).is_file()}


def read_image(name: str, labels: str | None, ids: str | None, options: dict[str, Any]) -> Plan:
    """A photo bundled with scikit-image as pixels (r, g, b, row, col) scaled to [-1, 1]."""
    downsample = options.pop("downsample", None)
    no_more_options("image:NAME", options)
    no_side_data("image:NAME", labels, ids)
    available = bundled_images()
    if name not in available:
        raise ConfigError(f"unknown image {name!r}; bundled with the installed scikit-image (no download): "
                          f"{', '.join(available)}")
    img = read_rgb(available[name])
    H, W = img.shape[:2]
    if downsample is None:
        stride = 1
        while math.ceil(H / stride) * math.ceil(W / stride) > MAX_IMAGE_PIXELS:
            stride += 1
    else:
        stride = as_int("downsample", downsample, minimum=1)
    img = img[::stride, ::stride]
    h, w = img.shape[:2]
    n = h * w

    def scale(v: np.ndarray, top: int) -> np.ndarray:  # [0, top] -> [-1, 1]
        return np.zeros(v.shape) if top == 0 else v * (2.0 / top) - 1.0

    def blocks(first: int, size: int) -> Iterator[Batch]:
        flat = img.reshape(n, 3)
        for s, e in row_slices(n, first, size):
            idx = np.arange(s, e, dtype=np.int64)
            X = np.empty((e - s, 5), dtype=np.float32)
            X[:, :3] = scale(flat[s:e].astype(np.float64), 255)
            X[:, 3] = scale((idx // w).astype(np.float64), h - 1)
            X[:, 4] = scale((idx % w).astype(np.float64), w - 1)
            yield X, None, idx

    params = {"image": name, "shape": [h, w], "original_shape": [H, W], "downsample": stride,
              "features": ["r", "g", "b", "row", "col"],
              "scaling": "colour c -> c/127.5 - 1; row i -> 2i/(h-1) - 1; col j -> 2j/(w-1) - 1",
              "ids": "pixel index i*w + j of the downsampled image"}
    return Plan(5, False, "int", blocks, extractor="pixels-rgb-rowcol", extractor_params=params)


