"""The GPU check of issue 27, as one run on a bare device machine: ``scripts/gpu_check.sh`` installs the
carried wheels and calls this; every step runs in a subprocess with its own time limit inside one
budget, a failed step is logged and the next one runs, and at the end ``OUT`` holds three files:

* ``summary.json`` -- each step's status, seconds and figures, and issue 27's targets;
* ``summary.txt`` -- the same as text (also printed);
* ``logs.tar.gz`` -- every step's log, the bench JSON, the runs' result.json and iterations.jsonl.

Steps, in order of what the issue needs most: the environment (versions, GPU, ONNX Runtime's
providers), the gpu-marked tests (the kernels, and every learner and fit option on a CuPy engine
against NumPy's), a SUN397-shaped synthetic store (108,754 x 4096, 397 classes),
``bench/bench_gpu.py --sun397`` (one exact VB EM pass and the device's sgemm rate, same run),
``bench/bench_gpu_parts.py`` (the pass's parts: GEMMs, softmax, sums, copies), VB EM fits
in-process with the CuPy backend (exact E-step) and with NumPy on the CPU (the reference for "the
same clusters, the same ELBO"), sga-f on CuPy and on the CPU, the default fit to convergence on
CuPy, the truncated E-step on CuPy, the VB EM fits on ``--cluster cluster_config/gpu.yaml``
(dask-cuda), and last the ONNX extractor on the CUDA provider (where ONNX Runtime has it) and on
the CPU.

Without CuPy or a device it is a dry run: NumPy in place of CuPy for the fits, array-api-strict for
the bench, ``cluster_config/local.yaml`` in place of gpu.yaml, a small store, three times the step
time limits (give it ``--budget``); the summary says so.

    python scripts/gpu_check.py --out OUT [--work DIR] [--budget 420] [--small]
    python scripts/gpu_check.py fit STORE RUN_DIR --backend cupy -k 1000 --max-iter 5 [-o KEY=VALUE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "bench")]

import gpu_summary  # noqa: E402

SUN397 = {"rows": 108_754, "dim": 4096, "classes": 397}
SMALL = {"rows": 6000, "dim": 64, "classes": 12}


class Skip(Exception):
    """A step that cannot run here (the reason goes into the summary)."""


def gpu_reason() -> str | None:
    """Why CuPy cannot run here, or None when it sees a device."""
    try:
        import cupy

        if int(cupy.cuda.runtime.getDeviceCount()) > 0:
            return None
        return "no CUDA device"
    except Exception as exc:  # noqa: BLE001 - ImportError, CUDA libraries or driver missing
        return f"{type(exc).__name__}: {exc}".splitlines()[0]


class Check:
    """Runs the steps inside one time budget and records what each one gave."""

    def __init__(self, out: Path, work: Path, budget: float, small: bool) -> None:
        self.out, self.work, self.budget = out, work, budget
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.no_gpu = gpu_reason()
        self.dry = self.no_gpu is not None
        self.small = small or self.dry
        self.shape = SMALL if self.small else SUN397
        self.k = 20 if self.small else 1000
        self.store = work / "sun.zarr"
        #: step time limits are set for the device; a dry run on a (shared) CPU gets three times as much
        self.slack = 3.0 if self.dry else 1.0
        self.steps: dict[str, dict[str, Any]] = {}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def sh(self, name: str, cmd: list[str], limit: float) -> str:
        """Run ``cmd`` (its output to logs/NAME.log) within ``limit`` seconds and what the budget has
        left; its output, or an exception naming the exit code and the last line."""
        limit = min(limit * self.slack, self.left() - 5)
        if limit < 10:
            raise Skip("the time budget is spent")
        log = self.logs / f"{name}.log"
        with log.open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            try:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=limit,
                                    cwd=ROOT).returncode
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"timed out after {limit:.0f} s (log: {log.name})") from None
        text = log.read_text()
        if rc != 0:
            last = [line for line in text.splitlines() if line.strip()][-1:] or [""]
            raise RuntimeError(f"exit {rc}: {last[0][:300]}")
        return text

    def step(self, name: str, fn: Any, *args: Any) -> None:
        t = time.monotonic()
        print(f"[{time.monotonic() - self.t0:6.1f} s] {name} ...", flush=True)
        try:
            figures = fn(*args)
            rec: dict[str, Any] = {"status": "ok", "figures": figures}
        except Skip as exc:
            rec = {"status": "skipped", "reason": str(exc)}
        except Exception as exc:  # noqa: BLE001 - log it and go on with the next step
            rec = {"status": "failed", "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:400]}
        rec["seconds"] = round(time.monotonic() - t, 2)
        self.steps[name] = rec
        print(f"          {rec['status']} in {rec['seconds']:.1f} s "
              f"{rec.get('error') or rec.get('reason') or json.dumps(rec.get('figures'))[:300]}", flush=True)

    def py(self, *args: str) -> list[str]:
        return [sys.executable, *args]


# ---- the steps -------------------------------------------------------------------------------------
def env_step(c: Check) -> dict[str, Any]:
    from importlib import metadata

    names = ["numpy", "scipy", "scikit-learn", "cupy-cuda13x", "cupy-cuda12x", "dask", "distributed",
             "dask-cuda", "zarr", "prefect", "onnxruntime", "onnxruntime-gpu", "array-api-strict",
             "cuda-core", "vbcluster"]
    versions = {}
    for n in names:
        try:
            versions[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    smi = subprocess.run(query, capture_output=True, text=True, check=False) if _which("nvidia-smi") else None
    providers = None
    try:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
    except Exception as exc:  # noqa: BLE001
        providers = [f"onnxruntime: {exc}"]
    return {"python": sys.version.split()[0], "versions": versions,
            "gpu": smi.stdout.strip() if smi else None,
            "no_gpu_reason": c.no_gpu, "onnxruntime_providers": providers, "cpus": os.cpu_count(),
            "unmet_requirements": unmet_requirements(os.environ.get("GPU_CHECK_SITE"))}


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _which(cmd: str) -> bool:
    import shutil

    return shutil.which(cmd) is not None


def unmet_requirements(site: str | None = None) -> list[str]:
    """Requirements of the distributions installed in ``site`` (default: all) that what Python sees
    does not meet: the carried wheels against the image's packages (``pip check`` does not look into
    a --target folder). bokeh is expected here: scripts/gpu_wheels.sh does not carry it."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen, out = set(), []
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name in seen or not name or (site and not str(dist.locate_file("")).startswith(site)):
            continue
        seen.add(name)
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                out.append(f"{name}: {req} (missing)")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                out.append(f"{name}: {req} (have {have})")
    return sorted(out)


def tests_step(c: Check) -> dict[str, Any]:
    text = ""
    try:
        # pytest-xdist where it is there (the GPU image has it): CuPy's first compilation of each
        # kernel dominates these tests, and its on-disk kernel cache is shared by the processes
        workers = ["-n", "4"] if _importable("xdist") else []
        text = c.sh("gpu_tests", c.py("-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *workers,
                                      "tests/test_gpu.py", "tests/test_engines.py",
                                      "tests/test_gpu_learners.py"), 240)
    except RuntimeError:
        text = (c.logs / "gpu_tests.log").read_text()
        if " passed" not in text and " failed" not in text:
            raise
    import re

    tail = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|skipped)", line)]
    counts = {k: int(m.group(1)) for k in ("passed", "failed", "skipped", "error")
              for m in [re.search(rf"(\d+) {k}", tail[-1] if tail else "")] if m}
    return {"passed": counts.get("passed", 0), "failed": counts.get("failed", 0) + counts.get("error", 0),
            "skipped": counts.get("skipped", 0), "line": tail[-1] if tail else None}


def store_step(c: Check) -> dict[str, Any]:
    s = c.shape
    c.sh("store", c.py("-c", "from flows.cli import app; app()", "ingest", "synthetic", "--out", str(c.store),
                      "--rows", str(s["rows"]), "--dim", str(s["dim"]), "--classes", str(s["classes"]), "-q"),
         150)
    return dict(s)


def bench_step(c: Check) -> dict[str, Any]:
    out = c.work / "bench_gpu.json"
    shape = (["--rows", "8000", "--dim", "64", "--components", "20", "--gemm-size", "1024"] if c.small
             else ["--sun397"])
    c.sh("bench_sun397", c.py("bench/bench_gpu.py", *shape, "--repeat", "5", "--cpu-repeat", "1",
                              "--backend", "strict" if c.dry else "cupy", "--json", str(out)), 150)
    return json.loads(out.read_text())


def parts_step(c: Check) -> dict[str, Any]:
    """``bench/bench_gpu_parts.py``: where a pass's time goes (each part, three block sizes)."""
    out = c.work / "bench_gpu_parts.json"
    shape = (["--rows", "4096", "--dim", "64", "--components", "20", "--gemm-size", "512",
              "--blocks", "512,2048"] if c.small else [])
    c.sh("bench_parts", c.py("bench/bench_gpu_parts.py", *shape, "--backend", "strict" if c.dry else "cupy",
                             "--json", str(out)), 60)
    return json.loads(out.read_text())


def fit_step(c: Check, name: str, backend: str, *options: str, learner: str = "vbem",
             cluster: str | None = None, iters: int = 5, limit: float = 90,
             converge: bool = False) -> dict[str, Any]:
    if not c.store.exists():
        raise Skip("no store (the store step failed)")
    run = c.work / "runs" / name
    common = ["-k", str(c.k), "--max-iter", str(iters), "--seed", "0"]
    # VB EM: the pipeline's default start (k-means++-projected: seconds at K = 1000 on 20,000 x 4096
    # sample rows, where k-means' Lloyd iterations would cost each fit much of the budget), the same
    # seed for all; tol 0, so that every fit makes the same number of iterations
    # (converge: the default tol, as `vbcluster fit STORE -k 1000` runs)
    common += ["--tol", "0"] if learner == "vbem" and not converge else []
    opts = [a for o in options for a in ("-o", o)]
    if cluster is None:
        cmd = c.py("scripts/gpu_check.py", "fit", str(c.store), str(run), "--backend", backend,
                   "--learner", learner, *common, *opts)
    else:
        cmd = c.py("-c", "from flows.cli import app; app()", "fit", str(c.store), "--run-dir", str(run),
                   "--learner", learner, "--cluster", cluster, "-q", "--restart", *common, *opts)
    c.sh(name, cmd, limit)
    return gpu_summary.fit_figures(run)


def compare_step(c: Check) -> dict[str, Any]:
    runs = c.work / "runs"
    if c.steps.get("fit_cupy_exact", {}).get("status") != "ok" or c.steps.get("fit_cpu_exact", {}).get(
            "status") != "ok":
        raise Skip("needs fit_cupy_exact and fit_cpu_exact")
    from pipeline.store.features import FeatureStore

    X = FeatureStore.open(c.store).read(slice(0, 20_000))
    return {"comparison": gpu_summary.compare_fits(runs / "fit_cupy_exact", runs / "fit_cpu_exact", X)}


def onnx_step(c: Check) -> dict[str, Any]:
    out = c.work / "onnx.json"
    c.sh("onnx", c.py("scripts/gpu_check.py", "onnx", str(c.work / "vgg_like.onnx"), str(out),
                      "--images", "64" if c.small else "256"), 120)
    return json.loads(out.read_text())


def run_all(c: Check) -> None:
    cupy = "numpy" if c.dry else "cupy"
    gpu_yaml = "cluster_config/local.yaml" if c.dry else "cluster_config/gpu.yaml"
    c.step("env", env_step, c)
    c.step("gpu_tests", tests_step, c)
    c.step("store", store_step, c)
    c.step("bench_sun397", bench_step, c)
    c.step("bench_parts", parts_step, c)
    c.step("fit_cupy_exact", fit_step, c, "fit_cupy_exact", cupy, "candidates=0")
    c.step("fit_cpu_exact", fit_step, c, "fit_cpu_exact", "numpy", "candidates=0")
    c.step("compare_gpu_cpu", compare_step, c)
    c.step("sgaf_cupy", lambda: fit_step(c, "sgaf_cupy", cupy, learner="sga-f", iters=30))
    c.step("sgaf_cpu", lambda: fit_step(c, "sgaf_cpu", "numpy", learner="sga-f", iters=30))
    c.step("fit_cupy_default",  # issue 26's `vbcluster fit sun.zarr -k 1000`, to convergence, on CuPy
           lambda: fit_step(c, "fit_cupy_default", cupy, iters=100, converge=True))
    c.step("fit_cupy_truncated", fit_step, c, "fit_cupy_truncated", cupy, "candidates=3")
    c.step("fit_daskcuda_exact",
           lambda: fit_step(c, "fit_daskcuda_exact", cupy, "candidates=0", cluster=gpu_yaml))
    c.step("fit_daskcuda_truncated",
           lambda: fit_step(c, "fit_daskcuda_truncated", cupy, "candidates=3", cluster=gpu_yaml))
    c.step("onnx", onnx_step, c)  # last: without onnxruntime-gpu it measures the CPU provider only


def finish(c: Check) -> dict[str, Any]:
    env = (c.steps.get("env") or {}).get("figures") or {}
    summary = {"device": env.get("gpu") or f"no device ({c.no_gpu})", "dry_run": c.dry, "budget_s": c.budget,
               "seconds": round(time.monotonic() - c.t0, 1), "store_shape": c.shape, "components": c.k,
               "steps": c.steps, "targets": gpu_summary.targets(c.steps, c.dry)}
    c.out.mkdir(parents=True, exist_ok=True)
    (c.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    text = gpu_summary.render(summary)
    (c.out / "summary.txt").write_text(text)
    with tarfile.open(c.out / "logs.tar.gz", "w:gz") as tar:
        tar.add(c.logs, arcname="logs")
        for p in sorted(c.work.glob("*.json")):
            tar.add(p, arcname=p.name)
        for p in sorted((c.work / "runs").glob("*/*")):
            if p.name in ("result.json", "iterations.jsonl", "run.json"):
                tar.add(p, arcname=f"runs/{p.parent.name}/{p.name}")
    print(text)
    return summary


# ---- sub-commands run in their own processes -------------------------------------------------------
def fit_main(argv: list[str]) -> None:
    """One fit with the in-process engine on ``--backend`` (the CLI has no switch for it)."""
    ap = argparse.ArgumentParser(prog="gpu_check.py fit")
    ap.add_argument("store")
    ap.add_argument("run_dir")
    ap.add_argument("--backend", choices=("numpy", "cupy"), required=True)
    ap.add_argument("--learner", default="vbem")
    ap.add_argument("-k", type=int, required=True)
    ap.add_argument("--max-iter", type=int, required=True)
    ap.add_argument("--tol", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", default=None)
    ap.add_argument("-o", action="append", default=[])
    a = ap.parse_args(argv)
    from pipeline.engine.engines import LocalEngine
    from pipeline.fit.progress import FitProgress
    from pipeline.service import fit_run, make_spec

    spec = make_spec(a.store, learner=a.learner, components=a.k, max_iter=a.max_iter, tol=a.tol, seed=a.seed,
                     init=a.init, learner_options=dict(o.split("=", 1) for o in a.o))
    with FitProgress(a.max_iter, f"{a.learner} {a.backend}", quiet=True,
                     log_path=Path(a.run_dir) / "iterations.jsonl") as progress:
        result = fit_run(a.run_dir, spec, engine=LocalEngine(array_backend=a.backend), callback=progress,
                         restart=True)
    print(json.dumps({k: result[k] for k in ("n_iter", "elbo", "n_effective", "seconds")}))


def onnx_main(argv: list[str]) -> None:
    """images/s of the ONNX extractor (bench/bench_extract.py's VGG-like network, random images) on
    the CPU provider and, where ONNX Runtime has it, the CUDA provider; the features' agreement."""
    ap = argparse.ArgumentParser(prog="gpu_check.py onnx")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args(argv)
    import numpy as np
    import onnxruntime as ort
    from bench_extract import build_vgg_like

    from pipeline.extract.extractors import OnnxExtractor

    if hasattr(ort, "preload_dlls"):  # the CUDA and cuDNN libraries of the nvidia-* wheels, if any
        try:
            ort.preload_dlls()
        except Exception as exc:  # noqa: BLE001 - then the provider says what it misses
            print(f"onnxruntime.preload_dlls: {exc}")
    build_vgg_like(Path(a.model))
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8) for _ in range(a.images)]
    providers = ort.get_available_providers()
    out: dict[str, Any] = {"providers": providers, "images": a.images, "batch": a.batch}

    def rate(device: str) -> tuple[float, Any]:
        ext = OnnxExtractor(a.model, "fc7_relu", device=device)
        ext(images[: a.batch])  # warm up (CUDA: kernels, cuDNN autotuning)
        t = time.perf_counter()
        feats = [ext(images[i : i + a.batch]) for i in range(0, a.images, a.batch)]
        return a.images / (time.perf_counter() - t), np.concatenate(feats)

    out["cpu_images_per_s"], cpu = rate("cpu")
    if "CUDAExecutionProvider" in providers:
        out["cuda_images_per_s"], gpu = rate("cuda")
        out["max_abs_diff_over_max"] = float(np.max(np.abs(gpu - cpu)) / max(np.max(np.abs(cpu)), 1e-30))
    else:
        out["cuda_images_per_s"] = None
        out["providers_note"] = ("this onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu is not "
                                 "installed: scripts/gpu_wheels.sh --ort)")
    Path(a.out).write_text(json.dumps(out, indent=1))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("fit", "onnx"):
        {"fit": fit_main, "onnx": onnx_main}[sys.argv[1]](sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where summary.json, summary.txt and logs.tar.gz go")
    ap.add_argument("--work", default="/tmp/vbc-gpu-check", help="store, runs and logs")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all the steps together")
    ap.add_argument("--small", action="store_true", help="a small store (also the dry run's)")
    a = ap.parse_args()
    c = Check(Path(a.out), Path(a.work), a.budget, a.small)
    try:
        run_all(c)
    finally:
        finish(c)


if __name__ == "__main__":
    main()
