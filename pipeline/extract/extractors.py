"""Feature extractors: images in, one feature vector per image out.

An extractor is anything that satisfies :class:`FeatureExtractor`: a ``name`` and ``params`` (written
to the store attributes ``extractor`` and ``extractor_params``), the output width ``n_features``, and
``__call__(images) -> array of shape (len(images), n_features)``. Images arrive as RGB ``uint8``
arrays of shape ``(height, width, 3)``, one size per image.

Built in:

- :class:`ColorHogExtractor` -- classical and deterministic (scikit-image): a per-channel colour
  histogram plus a HOG descriptor of the grey image, both after resizing to a fixed size;
- :class:`OnnxExtractor` -- any network exported to ONNX (a local ``.onnx`` file, never downloaded),
  run with ONNX Runtime: the activations of a named output or intermediate tensor, after resizing and
  mean/std normalisation; batched; CPU by default, CUDA when asked for and available. ``onnxruntime``
  (and ``onnx``, to read intermediate tensors) come with the ``onnx`` extra;
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


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise ConfigError(
            f"OnnxExtractor needs onnxruntime, which is not installed ({exc}); install it with "
            "`pip install 'vbcluster[onnx]'` (or `pip install onnxruntime onnx`)"
        ) from None
    return onnxruntime


def _triple(label: str, value: Any) -> tuple[float, float, float]:
    """Three per-channel floats from a sequence, a number or a comma-separated string (one number:
    the same for the three channels)."""
    items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    try:
        vals = [float(items)] * 3 if isinstance(items, int | float) else [float(v) for v in items]
    except (TypeError, ValueError):
        raise ConfigError(f"OnnxExtractor: {label} must be 3 numbers (R, G, B), got {value!r}") from None
    if len(vals) == 1:  # one number for every channel ("127" on the command line)
        vals = vals * 3
    if len(vals) != 3 or not all(np.isfinite(vals)):
        raise ConfigError(f"OnnxExtractor: {label} must be 3 finite numbers (R, G, B), got {value!r}")
    return vals[0], vals[1], vals[2]


INTERPOLATIONS = ("bilinear", "nearest")


def resize_rgb(image: np.ndarray, size: tuple[int, int], mode: str = "stretch",
               interpolation: str = "bilinear") -> np.ndarray:
    """``image`` (RGB uint8, (h, w, 3)) resized to ``size`` = (height, width) with Pillow's bilinear
    (or nearest-neighbour) filter: ``'stretch'`` resizes to the size directly; ``'crop'`` scales the
    shorter side to the larger of the two target sides and cuts the centre out. Nearest-neighbour
    upsampling by a whole factor repeats every pixel. Returns uint8 (height, width, 3)."""
    from PIL import Image

    h, w = size
    resample = Image.Resampling.NEAREST if interpolation == "nearest" else Image.Resampling.BILINEAR
    im = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
    if mode == "crop":
        side = max(h, w)
        scale = side / min(im.width, im.height)
        sw, sh = max(w, round(im.width * scale)), max(h, round(im.height * scale))
        im = im.resize((sw, sh), resample)
        left, top = (sw - w) // 2, (sh - h) // 2
        return np.asarray(im.crop((left, top, left + w, top + h)))
    return np.asarray(im.resize((w, h), resample))


class OnnxExtractor:
    """Activations of an ONNX network (a local ``.onnx`` file) at ``output``, run with ONNX Runtime.

    Each image is resized to ``input_size`` (``resize='stretch'``, or ``'crop'``: shorter side scaled
    to fit, centre cut out) with Pillow's bilinear filter (``interpolation='nearest'``: nearest
    neighbour), scaled by ``scale`` (``1/255`` by default: 0..255 -> [0, 1]), normalised per channel
    with ``(x - mean) / std`` (ImageNet's by default; a network trained on ``(x - 127) / 128`` of
    0..255 pixels takes ``scale=1, mean=127, std=128``) and fed in float32 as one batch of shape
    (n, 3, H, W) (``layout='nchw'``) or (n, H, W, 3) (``'nhwc'``). The tensor named ``output`` (a graph
    output, or any intermediate tensor, e.g. VGG16's fc7 or ResNet's pooled features; default: the
    only graph output) is flattened to (n, n_features) float32.

    ``input_size`` defaults to the model's static input shape. ``device='cpu'`` (default) runs on the
    CPU execution provider, ``'cuda'`` on the CUDA one (an error when onnxruntime-gpu or the GPU is
    missing), ``'auto'`` on CUDA when available. ``threads`` caps ONNX Runtime's intra-op threads (0:
    its default, one per core). The session is created on first use and not pickled, so the
    extractor can be sent to Dask workers, each of which loads the model once.
    """

    name = "onnx"

    def __init__(self, model_path: str | Path, output: str | None = None, *,
                 input_size: int | tuple[int, int] | None = None, mean: Any = _MEAN, std: Any = _STD,
                 layout: str = "nchw", resize: str = "stretch", device: str = "cpu",
                 threads: int = 0, scale: float | str | None = None, interpolation: str = "bilinear") -> None:
        _import_onnxruntime()
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ConfigError(f"OnnxExtractor: model file {self.model_path} does not exist (models are "
                              "never downloaded: export one to ONNX first, see docs/ingest.md)")
        for label, v, ok in (("layout", layout, ("nchw", "nhwc")), ("resize", resize, ("stretch", "crop")),
                             ("device", device, ("cpu", "cuda", "auto")),
                             ("interpolation", interpolation, INTERPOLATIONS)):
            if v not in ok:
                raise ConfigError(f"OnnxExtractor: {label} must be one of {ok}, got {v!r}")
        if int(threads) < 0:
            raise ConfigError(f"OnnxExtractor: threads must be >= 0, got {threads}")
        self.mean, self.std = _triple("mean", mean), _triple("std", std)
        if min(self.std) <= 0:
            raise ConfigError(f"OnnxExtractor: std must be positive, got {self.std}")
        self.layout, self.resize, self.device, self.threads = layout, resize, device, int(threads)
        self.interpolation = interpolation
        try:
            self.scale = 1.0 / 255.0 if scale is None else float(scale)
        except (TypeError, ValueError):
            raise ConfigError(f"OnnxExtractor: scale must be a number, got {scale!r}") from None
        if not (np.isfinite(self.scale) and self.scale > 0):
            raise ConfigError(f"OnnxExtractor: scale must be a finite number > 0, got {scale!r}")
        raw = self.model_path.read_bytes()
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self._session: Any = None
        self._model_bytes: bytes | None = None
        self.output = output
        sess = self._get_session(raw)
        self.input_name = sess.get_inputs()[0].name
        self.input_size = self._input_size(sess.get_inputs()[0].shape, input_size)
        self.n_features = int(self._run(np.zeros((1, *self.input_size, 3), dtype=np.uint8)).shape[1])
        self.params: dict[str, Any] = {
                       "model": self.model_path.name, "model_sha256": self.sha256, "output": self.output,
                       "input_size": list(self.input_size), "mean": list(self.mean), "std": list(self.std),
                       "layout": layout, "resize": resize, "n_features": self.n_features}
        # recorded only when set, so stores extracted before these options existed keep their params
        if scale is not None:
            self.params["scale"] = self.scale
        if interpolation != "bilinear":
            self.params["interpolation"] = interpolation

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_session"] = state["_model_bytes"] = None  # rebuilt from the file where unpickled
        return state

    def _expose(self, raw: bytes) -> bytes:
        """The model with ``self.output`` made a graph output when it is an intermediate tensor."""
        try:
            import onnx
        except ImportError:
            raise ConfigError(f"OnnxExtractor: reading the intermediate tensor {self.output!r} needs the "
                              "onnx package: pip install 'vbcluster[onnx]'") from None
        model = onnx.load_from_string(raw)
        produced = [o for node in model.graph.node for o in node.output]
        if self.output not in produced:
            outs = [o.name for o in model.graph.output]
            raise ConfigError(f"OnnxExtractor: {self.model_path.name} has no tensor {self.output!r}; graph "
                              f"outputs {outs}, node outputs include {produced[-20:]}")
        model.graph.output.append(onnx.ValueInfoProto(name=self.output))
        return bytes(model.SerializeToString())

    def _get_session(self, raw: bytes | None = None) -> Any:
        if self._session is not None:
            return self._session
        ort = _import_onnxruntime()
        raw = self.model_path.read_bytes() if raw is None else raw
        if hashlib.sha256(raw).hexdigest() != self.sha256:
            raise ConfigError(f"OnnxExtractor: {self.model_path} changed since the extractor was made "
                              f"(sha256 {self.sha256[:12]}...); every image must see the same model")
        avail = ort.get_available_providers()
        if self.device == "cuda" and "CUDAExecutionProvider" not in avail:
            raise ConfigError(f"OnnxExtractor: device='cuda' but onnxruntime offers only {avail}; install "
                              "onnxruntime-gpu on the GPU workers, or use device='auto' or 'cpu'")
        cuda = self.device != "cpu" and "CUDAExecutionProvider" in avail
        providers = (["CUDAExecutionProvider"] if cuda else []) + ["CPUExecutionProvider"]
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.use_deterministic_compute = True
        opts.log_severity_level = 3
        try:
            sess = ort.InferenceSession(raw, sess_options=opts, providers=providers)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types for bad models
            raise ConfigError(f"OnnxExtractor: onnxruntime cannot load {self.model_path} "
                              f"({type(exc).__name__}: {exc})") from None
        outs = [o.name for o in sess.get_outputs()]
        if self.output is None:
            if len(outs) != 1:
                raise ConfigError(f"OnnxExtractor: {self.model_path.name} has outputs {outs}; name one "
                                  "with output=NAME")
            self.output = outs[0]
        elif self.output not in outs:
            sess = ort.InferenceSession(self._expose(raw), sess_options=opts, providers=providers)
        if len(sess.get_inputs()) != 1:
            raise ConfigError(f"OnnxExtractor: {self.model_path.name} takes inputs "
                              f"{[i.name for i in sess.get_inputs()]}; only one-input models are supported")
        self._session = sess
        return sess

    def _input_size(self, shape: list[Any], input_size: int | tuple[int, int] | None) -> tuple[int, int]:
        if len(shape) != 4:
            raise ConfigError(f"OnnxExtractor: the model input has shape {shape}; expected 4-D images")
        ch, hw = (shape[1], shape[2:4]) if self.layout == "nchw" else (shape[3], shape[1:3])
        if isinstance(ch, int) and ch != 3:
            raise ConfigError(f"OnnxExtractor: the model input {shape} has {ch} channels in layout "
                              f"{self.layout!r}; expected 3 (RGB). Is layout right?")
        static = tuple(int(d) for d in hw) if all(isinstance(d, int) and d > 0 for d in hw) else None
        if input_size is None:
            if static is None:
                raise ConfigError(f"OnnxExtractor: the model input {shape} has no fixed size; pass "
                                  "input_size=N or (H, W)")
            return static[0], static[1]
        size = (int(input_size), int(input_size)) if isinstance(input_size, int | np.integer | str) \
            else (int(input_size[0]), int(input_size[1]))
        if min(size) < 1 or (static is not None and size != static):
            raise ConfigError(f"OnnxExtractor: input_size {size} does not fit the model input {shape}")
        return size

    def _run(self, pixels: np.ndarray) -> np.ndarray:
        x: np.ndarray = (pixels.astype(np.float32) / np.float32(255.0) if self.scale == 1.0 / 255.0
                         else pixels.astype(np.float32) * np.float32(self.scale))
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        if self.layout == "nchw":
            x = x.transpose(0, 3, 1, 2)
        sess = self._get_session()
        (out,) = sess.run([self.output], {self.input_name: np.ascontiguousarray(x)})
        out = np.asarray(out)
        if out.ndim < 1 or out.shape[0] != pixels.shape[0]:
            raise ConfigError(f"OnnxExtractor: output {self.output!r} has shape {out.shape} for a batch of "
                              f"{pixels.shape[0]}; choose a tensor with the batch as its first axis")
        return out.reshape(out.shape[0], -1).astype(np.float32)

    def __call__(self, images: list[np.ndarray]) -> np.ndarray:
        if not images:
            return np.empty((0, self.n_features), dtype=np.float32)
        pixels = np.stack([resize_rgb(im, self.input_size, self.resize, self.interpolation) for im in images])
        return self._run(pixels)


def make_extractor(spec: Any, **options: Any) -> FeatureExtractor:
    """An extractor from ``spec``: an object satisfying :class:`FeatureExtractor`, ``'color-hog'``
    (options ``size``, ``bins``, ...), ``'onnx'`` (options ``model``, ``output``, ``input_size`` or
    ``size``, ``mean``, ``std``, ``scale``, ``layout``, ``resize``, ``interpolation``, ``device``,
    ``threads``) or ``'torch'`` (options
    ``weights``, ``arch``, ``layer``, ``input_size``, ``device``)."""
    if spec is None or spec in ("color-hog", "colorhog"):
        return ColorHogExtractor(**options)
    if spec == "onnx":
        if "model" not in options:
            raise ConfigError("the onnx extractor needs model=PATH (a local .onnx file)")
        if "size" in options:  # the image side, as for color-hog
            if "input_size" in options:
                raise ConfigError("the onnx extractor takes size or input_size (the same thing), not both")
            options["input_size"] = options.pop("size")
        return OnnxExtractor(options.pop("model"), **options)
    if spec == "torch":
        if "weights" not in options:
            raise ConfigError("the torch extractor needs weights=PATH (a local state_dict file)")
        return TorchExtractor(options.pop("weights"), **options)
    if isinstance(spec, str):
        raise ConfigError(f"unknown extractor {spec!r}; use 'color-hog', 'onnx', 'torch' or pass an "
                          "extractor object")
    missing = [a for a in ("name", "params", "n_features") if not hasattr(spec, a)]
    if missing or not callable(spec):
        raise ConfigError(f"{spec!r} is not a feature extractor: it needs name, params, n_features and "
                          f"__call__(images) (missing: {missing or ['__call__']})")
    if options:
        raise ConfigError(f"extractor options {sorted(options)} apply only to a built-in extractor name")
    return spec  # type: ignore[no-any-return]
