"""Image extraction throughput: a VGG-like ONNX network on 1 and 2 Dask workers, and in-process.

The network is built here with ``onnx.helper`` (random weights from a seed; nothing is downloaded):
ten 3x3 convolutions in five VGG blocks (16, 32, 64, 128, 128 channels, ReLU, 2x2 max pooling) on a
224 x 224 input, then fc6 (6272 -> 512), fc7 (512 -> 512, the features read) and fc8 (512 -> 100):
about 4.0 million parameters and 0.72 GMAC per image (VGG16: 138 million and 15.5 GMAC).

Measured: images/s of ``ingest(folder, extractor='onnx', ...)`` over JPEG images of 400 x 300 pixels
(decode, resize, forward pass, store write) with the shards on a LocalCluster of 1 and of 2 worker
processes (one thread each), and in-process (ONNX Runtime using every core); plus the split of one
image's cost between decode + resize and the forward pass. Projected from those: the time to extract
SUN397 (108,754 images) here, on a 16-core node (16 one-thread workers, assuming the per-worker rate
measured here) and on one GPU (not measured: see the printed note).

    python bench/bench_extract.py [--images 96] [--workdir bench/out]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

SUN397 = 108_754
BLOCKS = ((16, 2), (32, 2), (64, 2), (128, 2), (128, 2))


def build_vgg_like(path: Path, seed: int = 0) -> tuple[int, float]:
    """Write the network to ``path``; returns (parameters, GMAC per image)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes, x, cin, side, params, macs = [], [], "x", 3, 224, 0, 0

    def weight(name: str, *shape: int) -> None:
        nonlocal params
        fan_in = int(np.prod(shape[1:]))
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name))
        inits.append(numpy_helper.from_array(np.zeros(shape[0], np.float32), name + "_b"))
        params += int(np.prod(shape)) + shape[0]

    for b, (cout, reps) in enumerate(BLOCKS):
        for r in range(reps):
            name = f"conv{b + 1}_{r + 1}"
            weight(name, cout, cin, 3, 3)
            nodes += [helper.make_node("Conv", [x, name, name + "_b"], [name + "_c"], kernel_shape=[3, 3],
                                       pads=[1, 1, 1, 1]),
                      helper.make_node("Relu", [name + "_c"], [name + "_r"])]
            macs += side * side * cin * cout * 9
            x, cin = name + "_r", cout
        nodes.append(helper.make_node("MaxPool", [x], [f"pool{b + 1}"], kernel_shape=[2, 2], strides=[2, 2]))
        x, side = f"pool{b + 1}", side // 2
    nodes.append(helper.make_node("Flatten", [x], ["flat"], axis=1))
    x, width = "flat", cin * side * side
    for name, out in (("fc6", 512), ("fc7", 512), ("fc8", 100)):
        weight(name, out, width)
        nodes.append(helper.make_node("Gemm", [x, name, name + "_b"], [name + "_pre"], transB=1))
        macs += width * out
        if name != "fc8":
            nodes.append(helper.make_node("Relu", [name + "_pre"], [name + "_relu"]))
        x, width = name + ("_relu" if name != "fc8" else "_pre"), out
    graph = helper.make_graph(nodes, "vgg_like",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 224, 224])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", 100])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return params, macs / 1e9


def make_jpegs(root: Path, n: int, seed: int = 0) -> None:
    """``n`` smooth random 400 x 300 JPEG photos (quality 90)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        small = rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
        noise = rng.integers(0, 24, size=(300, 400, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(small).resize((400, 300), Image.Resampling.BILINEAR)) // 2 + noise
        Image.fromarray(img.astype(np.uint8)).save(root / f"img{i:05d}.jpg", quality=90)


def per_image_split(model: Path, folder: Path, n: int = 16) -> dict[str, float]:
    """Seconds per image (one thread) for decode + resize and for the forward pass, batch 16."""
    from pipeline.extract.extractors import OnnxExtractor, resize_rgb
    from pipeline.extract.image_sources import read_images

    files = sorted(str(p) for p in folder.glob("*.jpg"))[:n]
    ext = OnnxExtractor(model, "fc7_relu", threads=1)
    t0 = time.perf_counter()
    pixels = [resize_rgb(im, (224, 224)) for _, im in read_images(files)]  # type: ignore[arg-type]
    decode = time.perf_counter() - t0
    ext(pixels)  # warm-up: the first batch of a size sets up ONNX Runtime's buffers
    t0 = time.perf_counter()
    ext(pixels)  # already 224 x 224: resizing is a copy
    forward = time.perf_counter() - t0
    return {"decode_resize_s": decode / n, "forward_s": forward / n}


def run(images: int, workdir: Path) -> dict[str, object]:
    from distributed import Client, LocalCluster

    from pipeline.ingest import ingest

    workdir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-extract-", dir=workdir))
    try:
        model = tmp / "vgg_like.onnx"
        n_params, gmac = build_vgg_like(model)
        make_jpegs(tmp / "imgs", images)
        opts = dict(extractor="onnx", model=str(model), output="fc7_relu", batch_images=16, shard_images=16)
        result: dict[str, object] = {"images": images, "parameters": n_params, "gmac_per_image": gmac}
        split = per_image_split(model, tmp / "imgs")
        result.update(split)
        rep = ingest(str(tmp / "imgs"), tmp / "s0", **opts)
        result["in_process_images_per_s"] = images / rep.elapsed_s
        for workers in (1, 2):
            with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                              dashboard_address=None, host="127.0.0.1") as cluster, Client(cluster) as client:
                ingest(str(tmp / "imgs"), tmp / f"warm{workers}", **{**opts, "shard_images": 16},
                       cluster=client)  # starts the workers' imports and model loads
                rep = ingest(str(tmp / "imgs"), tmp / f"s{workers}", cluster=client, **opts)
            result[f"workers_{workers}_images_per_s"] = images / rep.elapsed_s
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=96)
    ap.add_argument("--workdir", type=Path, default=Path("bench/out"))
    args = ap.parse_args()
    r = run(args.images, args.workdir)
    one, two = float(r["workers_1_images_per_s"]), float(r["workers_2_images_per_s"])  # type: ignore[arg-type]
    per_core = 1.0 / (float(r["decode_resize_s"]) + float(r["forward_s"]))  # type: ignore[arg-type]
    print(f"VGG-like ONNX network: {r['parameters']:,} parameters, {r['gmac_per_image']:.2f} GMAC/image; "
          f"{r['images']} JPEG images of 400 x 300")
    print(f"per image, one thread: decode+resize {1e3 * float(r['decode_resize_s']):.1f} ms, "  # type: ignore[arg-type]
          f"forward {1e3 * float(r['forward_s']):.1f} ms")  # type: ignore[arg-type]
    print("| run | images/s | SUN397 (108,754 images) |\n|---|---|---|")
    for label, rate in (("in-process (ORT, all cores)", float(r["in_process_images_per_s"])),  # type: ignore[arg-type]
                        ("1 worker x 1 thread", one), ("2 workers x 1 thread", two)):
        print(f"| {label} (measured) | {rate:.1f} | {SUN397 / rate / 3600:.2f} h |")
    node = 16 * one
    print(f"| 16-core node, 16 workers (projected: 16 x the 1-worker rate) | {node:.0f} | "
          f"{SUN397 / node / 3600:.2f} h |")
    decode_only = 16 / float(r["decode_resize_s"])  # type: ignore[arg-type]
    print(f"| one GPU fed by 16 CPU cores (projected, decode-bound: 16 / decode+resize time; forward "
          f"pass not measured on a GPU) | {decode_only:.0f} | {SUN397 / decode_only / 3600:.2f} h |")
    vgg16 = float(r["decode_resize_s"]) + float(r["forward_s"]) * 15.5 / float(r["gmac_per_image"])  # type: ignore[arg-type]
    print(f"| VGG16 fc7, 16-core node (projected: decode+resize + forward x 15.5 GMAC / this network's, "
          f"one thread per image, 16 workers) | {16 / vgg16:.1f} | {SUN397 * vgg16 / 16 / 3600:.1f} h |")
    print(f"2-worker speed-up over 1 worker: {two / one:.2f}x; one-thread rate from the split: "
          f"{per_core:.1f} images/s. VGG16 costs {15.5 / float(r['gmac_per_image']):.0f}x this network's "  # type: ignore[arg-type]
          "forward pass. Timings from a shared, loaded machine.")
    out = args.workdir / "bench_extract.json"
    out.write_text(json.dumps(r, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
