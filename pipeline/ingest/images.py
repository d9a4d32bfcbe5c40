"""Reader of image folders: image files through a feature extractor, optional folder labels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.extractors import FeatureExtractor, make_extractor
from pipeline.ingest.plan import Batch, Plan, as_bool, as_int, no_more_options
from vbcore.errors import ConfigError, InputError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


# ---- image folders ------------------------------------------------------------------------------
def read_rgb(path: Path) -> np.ndarray:
    """An image file as an RGB array of shape (height, width, 3), uint8."""
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        return np.asarray(im.convert("RGB"))


def read_image_folder(root: Path, labels: str | None, ids: str | None, options: dict[str, Any]) -> Plan:
    """Image files under ``root`` through a feature extractor; ``labels='folders'`` labels by sub-folder."""
    skip_unreadable = as_bool("skip_unreadable", options.pop("skip_unreadable", False))
    batch_images = as_int("batch_images", options.pop("batch_images", 16), minimum=1)
    spec = options.pop("extractor", None)
    names = ("size", "bins", "orientations", "pixels_per_cell", "cells_per_block", "weights", "arch",
             "layer", "input_size", "device")
    ext_opts = {k: options.pop(k) for k in names if k in options}
    for k in ("size", "bins", "orientations", "pixels_per_cell", "cells_per_block", "input_size"):
        if k in ext_opts:
            ext_opts[k] = as_int(k, ext_opts[k], minimum=1)
    no_more_options("image-folder", options)
    if ids is not None:
        raise ConfigError("an image folder's ids are the files' relative paths; leave ids unset")
    if labels not in (None, "folders"):
        raise ConfigError(f"an image folder takes labels='folders' (one class per sub-folder) or none, "
                          f"got {labels!r}")
    files = sorted((p.relative_to(root) for p in root.rglob("*")
                    if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
                    and not any(part.startswith(".") for part in p.relative_to(root).parts)),
                   key=lambda p: p.as_posix())
    if not files:
        raise InputError(f"{root}: no image files ({', '.join(IMAGE_SUFFIXES)}) in the folder or below")
    classes: list[str] = []
    if labels == "folders":
        top = [f for f in files if len(f.parts) < 2]
        if top:
            raise InputError(f"{root}: labels='folders' needs every image inside a class sub-folder, but "
                             f"{top[0].as_posix()} is not")
        classes = sorted({f.parts[0] for f in files})
    index = {c: i for i, c in enumerate(classes)}
    extractor: FeatureExtractor = make_extractor(spec, **ext_opts)
    skipped: list[str] = []

    def blocks(first: int, size: int) -> Iterator[Batch]:
        for s in range(0, len(files), batch_images):
            images, names_ok = [], []
            for rel in files[s:s + batch_images]:
                try:
                    images.append(read_rgb(root / rel))
                except Exception as exc:  # noqa: BLE001 - PIL raises many types for a bad file
                    if not skip_unreadable:
                        raise InputError(f"{root / rel}: cannot read the image ({type(exc).__name__}: "
                                         f"{exc}); fix or remove it, or pass skip_unreadable=True") from None
                    skipped.append(rel.as_posix())
                    continue
                names_ok.append(rel)
            if not images:
                continue
            X = np.asarray(extractor(images))
            if X.shape != (len(images), extractor.n_features):
                raise InputError(f"extractor {extractor.name!r} returned shape {X.shape} for {len(images)} "
                                 f"images; expected ({len(images)}, {extractor.n_features})")
            lab = np.array([index[r.parts[0]] for r in names_ok], dtype=np.int64) if classes else None
            yield X, lab, np.array([r.as_posix() for r in names_ok], dtype=str)

    params = dict(extractor.params)
    if classes:
        params["classes"] = classes
    return Plan(int(extractor.n_features), bool(classes), "str", blocks, extractor=extractor.name,
                 extractor_params=params, skipped=skipped)


