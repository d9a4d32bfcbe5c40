"""Image files for the readers that decode images themselves (``image:NAME``). Image folders, tar
shards and image lists go through :mod:`pipeline.extract` (sharded, resumable extraction)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.image_sources import IMAGE_SUFFIXES

__all__ = ["IMAGE_SUFFIXES", "read_rgb"]


def read_rgb(path: Path) -> np.ndarray:
    """An image file as an RGB array of shape (height, width, 3), uint8."""
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        return np.asarray(im.convert("RGB"))
