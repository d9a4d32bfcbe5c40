"""Image files for the readers that decode images themselves (``image:NAME``). Image folders, tar
shards and image lists go through :mod:`pipeline.extract.extraction` (sharded, resumable extraction)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.extract.image_sources import IMAGE_SUFFIXES, decode_rgb

__all__ = ["IMAGE_SUFFIXES", "read_rgb"]


def read_rgb(path: Path) -> np.ndarray:
    """An image file as an RGB array of shape (height, width, 3), uint8
    (:func:`pipeline.extract.image_sources.decode_rgb`: 16-bit kept in range, the decoding bounded)."""
    return decode_rgb(path)
