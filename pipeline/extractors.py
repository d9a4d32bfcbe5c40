"""Feature extractors: images in, one feature vector per image out.

An extractor is anything that satisfies :class:`FeatureExtractor`: a ``name`` and ``params`` (written
to the store attributes ``extractor`` and ``extractor_params``), the output width ``n_features``, and
``__call__(images) -> array of shape (len(images), n_features)``. Images arrive as RGB ``uint8``
arrays of shape ``(height, width, 3)``, one size per image.

Built in:

- :class:`ColorHogExtractor` -- classical and deterministic (scikit-image): a per-channel colour
  histogram plus a HOG descriptor of the grey image, both after resizing to a fixed size;
- :class:`TorchExtractor` -- a torchvision network's activations at a named layer, with weights from
  a local file (never downloaded). torch and torchvision are imported only when it is built; they are
  not vbcluster dependencies.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vbcore.errors import ConfigError


@runtime_checkable
class FeatureExtractor(Protocol):
    """What the image-folder ingest needs from an extractor."""

    name: str
    params: dict[str, Any]
    n_features: int

    def __call__(self, images: list[np.ndarray]) -> np.ndarray:
        """Features of ``images`` (RGB uint8, each ``(h, w, 3)``), shape (len(images), n_features)."""
        ...


class ColorHogExtractor:
    """Colour histogram + HOG, after resizing every image to ``size`` (height, width).

    Features, in order:

    - ``3 * bins`` colour-histogram values: for each of R, G, B, the fraction of pixels in each of
      ``bins`` equal-width intensity bins over [0, 1] (each channel's block sums to 1);
    - ``orientations * cells_per_block**2 * n_blocks_rows * n_blocks_cols`` HOG values of the grey
      image (``skimage.feature.hog``, L2-Hys block norm), where
      ``n_blocks = size // pixels_per_cell - cells_per_block + 1`` per axis.

    With the defaults (64 x 64, 16 bins, 9 orientations, 8-pixel cells, 2 x 2 blocks):
    ``48 + 9 * 4 * 7 * 7 = 1812`` features. Deterministic: the same image gives the same bits.
    """

    name = "color-hog"

    def __init__(self, size: int | tuple[int, int] = 64, *, bins: int = 16, orientations: int = 9,
                 pixels_per_cell: int = 8, cells_per_block: int = 2) -> None:
        h, w = (int(size), int(size)) if isinstance(size, int | np.integer) else (int(size[0]), int(size[1]))
        for label, v in (("bins", bins), ("orientations", orientations),
                         ("pixels_per_cell", pixels_per_cell), ("cells_per_block", cells_per_block)):
            if int(v) < 1:
                raise ConfigError(f"ColorHogExtractor: {label} must be >= 1, got {v}")
        blocks_r = h // pixels_per_cell - cells_per_block + 1
        blocks_c = w // pixels_per_cell - cells_per_block + 1
        if blocks_r < 1 or blocks_c < 1:
            raise ConfigError(
                f"ColorHogExtractor: size {h}x{w} is too small for {cells_per_block}x{cells_per_block} "
                f"blocks of {pixels_per_cell}-pixel cells; use size >= {pixels_per_cell * cells_per_block}"
            )
        self.size = (h, w)
        self.bins = int(bins)
        self.orientations = int(orientations)
        self.pixels_per_cell = int(pixels_per_cell)
        self.cells_per_block = int(cells_per_block)
        self.n_features = 3 * self.bins + self.orientations * self.cells_per_block ** 2 * blocks_r * blocks_c
        self.params = {"size": [h, w], "bins": self.bins, "orientations": self.orientations,
                       "pixels_per_cell": self.pixels_per_cell, "cells_per_block": self.cells_per_block,
                       "block_norm": "L2-Hys", "n_features": self.n_features}

    def _one(self, image: np.ndarray) -> np.ndarray:
        from skimage.color import rgb2gray
        from skimage.feature import hog
        from skimage.transform import resize

        img = resize(np.asarray(image, dtype=np.float64) / 255.0, (*self.size, 3), order=1,
                     anti_aliasing=True, mode="reflect")
        img = np.clip(img, 0.0, 1.0)
        npix = self.size[0] * self.size[1]
        hist = [np.histogram(img[..., c], bins=self.bins, range=(0.0, 1.0))[0] / npix for c in range(3)]
        ppc, cpb = self.pixels_per_cell, self.cells_per_block
        h = hog(rgb2gray(img), orientations=self.orientations, pixels_per_cell=(ppc, ppc),
                cells_per_block=(cpb, cpb), block_norm="L2-Hys", feature_vector=True)
        return np.concatenate([*hist, h]).astype(np.float32)

    def __call__(self, images: list[np.ndarray]) -> np.ndarray:
        out = np.empty((len(images), self.n_features), dtype=np.float32)
        for i, image in enumerate(images):
            out[i] = self._one(image)
        return out


# ImageNet normalisation used by every torchvision classification model.
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


def _import_torch() -> tuple[Any, Any]:
    try:
        import torch
        import torchvision
    except ImportError as exc:
        raise ConfigError(
            f"TorchExtractor needs torch and torchvision, which are not installed ({exc}); install them "
            "(for example `pip install torch torchvision`) or use the built-in ColorHogExtractor"
        ) from None
    return torch, torchvision


class TorchExtractor:
    """Activations of a torchvision model at ``layer`` (flattened), weights from ``weights_path``.

    The model is built with ``weights=None`` (nothing is downloaded) and loaded with
    ``load_state_dict(torch.load(weights_path))``. Images are resized to ``input_size`` squared
    (bilinear, antialiased), scaled to [0, 1] and normalised with the ImageNet mean and std.
    ``layer`` is a name from ``model.named_modules()``: ``'avgpool'`` gives resnet18's 512-D
    penultimate features; for VGG16's fc7 use ``arch='vgg16', layer='classifier.4'`` (4096-D, after the
    ReLU).
    """

    name = "torch"

    def __init__(self, weights_path: str | Path, arch: str = "resnet18", layer: str = "avgpool", *,
                 input_size: int = 224, device: str = "cpu") -> None:
        torch, torchvision = _import_torch()
        weights_path = Path(weights_path)
        if not weights_path.is_file():
            raise ConfigError(f"TorchExtractor: weights file {weights_path} does not exist")
        ctor = getattr(torchvision.models, arch, None)
        if ctor is None or not callable(ctor):
            raise ConfigError(f"TorchExtractor: torchvision.models has no architecture {arch!r}")
        model = ctor(weights=None)
        state = torch.load(str(weights_path), map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        model.load_state_dict(state)
        model.eval().to(device)
        modules = dict(model.named_modules())
        if layer not in modules:
            names = [n for n in modules if n][:40]
            raise ConfigError(f"TorchExtractor: {arch} has no layer {layer!r}; layers include {names}")
        self._captured: list[Any] = []
        modules[layer].register_forward_hook(lambda _m, _i, out: self._captured.append(out))
        self._torch = torch
        self._model = model
        self._device = device
        self.input_size = int(input_size)
        self.layer = layer
        self.arch = arch
        self.n_features = int(self._forward(torch.zeros(1, 3, self.input_size, self.input_size)).shape[1])
        sha = hashlib.sha256(weights_path.read_bytes()).hexdigest()
        self.params = {"arch": arch, "layer": layer, "weights": str(weights_path), "weights_sha256": sha,
                       "input_size": self.input_size, "mean": list(_MEAN), "std": list(_STD),
                       "n_features": self.n_features}

    def _forward(self, batch: Any) -> np.ndarray:
        torch = self._torch
        self._captured.clear()
        with torch.no_grad():
            self._model(batch.to(self._device))
        if not self._captured:
            raise ConfigError(f"TorchExtractor: layer {self.layer!r} did not run in the forward pass")
        out = self._captured[-1]
        self._captured.clear()
        return out.flatten(1).float().cpu().numpy()

    def __call__(self, images: list[np.ndarray]) -> np.ndarray:
        torch = self._torch
        if not images:
            return np.empty((0, self.n_features), dtype=np.float32)
        s = self.input_size
        mean = torch.tensor(_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(_STD).view(1, 3, 1, 1)
        tensors = []
        for image in images:
            t = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].float() / 255.0
            tensors.append(torch.nn.functional.interpolate(t, size=(s, s), mode="bilinear",
                                                           align_corners=False, antialias=True))
        batch = (torch.cat(tensors) - mean) / std
        return self._forward(batch).astype(np.float32)


def make_extractor(spec: Any, **options: Any) -> FeatureExtractor:
    """An extractor from ``spec``: an object satisfying :class:`FeatureExtractor`, ``'color-hog'``
    (options ``size``, ``bins``, ...) or ``'torch'`` (options ``weights``, ``arch``, ``layer``,
    ``input_size``, ``device``)."""
    if spec is None or spec in ("color-hog", "colorhog"):
        return ColorHogExtractor(**options)
    if spec == "torch":
        if "weights" not in options:
            raise ConfigError("the torch extractor needs weights=PATH (a local state_dict file)")
        return TorchExtractor(options.pop("weights"), **options)
    if isinstance(spec, str):
        raise ConfigError(f"unknown extractor {spec!r}; use 'color-hog', 'torch' or pass an extractor object")
    missing = [a for a in ("name", "params", "n_features") if not hasattr(spec, a)]
    if missing or not callable(spec):
        raise ConfigError(f"{spec!r} is not a feature extractor: it needs name, params, n_features and "
                          f"__call__(images) (missing: {missing or ['__call__']})")
    if options:
        raise ConfigError(f"extractor options {sorted(options)} apply only to a built-in extractor name")
    return spec  # type: ignore[no-any-return]
