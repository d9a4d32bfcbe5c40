"""The logic of ``scripts/gpu_check.py`` that a CPU can check (issue 27): a failed, timed-out or
over-budget step is recorded and the next one runs; the summary files fit what a device call brings
back; the GPU-vs-CPU comparison and the targets come out right on real fits (two in-process fits of
the same settings agree exactly; a fit from another seed is told apart)."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from pipeline.engine.engines import LocalEngine
from pipeline.fit.progress import FitProgress
from pipeline.service import fit_run, make_spec
from pipeline.store.features import FeatureStore
from tests._reference import planted_blobs

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gc():
    return _load("gpu_check")


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    """A small labelled store and three VB EM fits: two with seed 0 (as the GPU and the CPU fit of
    the script), one with seed 1."""
    root = tmp_path_factory.mktemp("gpucheck")
    X, y = planted_blobs(n=1500, d=5, k=6, seed=3)
    store = FeatureStore.create(root / "s.zarr", X.shape[1], chunk_rows=400, labels=True)
    store.append(X.astype(np.float32), labels=y)
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        spec = make_spec(str(root / "s.zarr"), components=10, max_iter=6, tol=0.0, seed=seed,
                         init="random")
        run = root / name
        with FitProgress(6, name, quiet=True, log_path=run / "iterations.jsonl") as progress:
            fit_run(run, spec, engine=LocalEngine(array_backend="numpy"), callback=progress)
        runs[name] = run
    return runs, X.astype(np.float32)


def test_fit_figures_and_comparison_of_real_fits(gc, fits):
    summary = sys.modules["gpu_summary"]
    runs, X = fits
    fig = summary.fit_figures(runs["a"])
    result = json.loads((runs["a"] / "result.json").read_text())
    assert fig["n_iter"] == 6 and fig["elbo"] == result["elbo"]
    assert fig["elbo_per_row"] == pytest.approx(result["elbo"] / 1500, rel=1e-15)
    lines = (runs["a"] / "iterations.jsonl").read_text().splitlines()
    secs = [json.loads(s)["seconds"] for s in lines]
    assert len(lines) == 6 and fig["first_iter_s"] == secs[0]
    assert fig["s_per_iter"] == statistics.median(secs[1:])  # the first pays for start-up
    same = summary.compare_fits(runs["a"], runs["b"], X)
    assert same["same_label_share"] == 1.0 and same["elbo_rel_diff"] == 0.0 and same["ari"] == 1.0
    other = summary.compare_fits(runs["a"], runs["c"], X)
    assert other["same_label_share"] < 0.999 or other["elbo_rel_diff"] > 1e-5
    for cmp, met in ((same, True), (other, False)):
        steps = {"compare_gpu_cpu": {"status": "ok", "figures": {"comparison": cmp}}}
        (t,) = [t for t in summary.targets(steps, dry_run=True) if t["target"].startswith("GPU fit")]
        assert t["met"] is met and "dry run" in t["note"]


def test_targets_from_step_results(gc):
    summary = sys.modules["gpu_summary"]
    steps = {
        "gpu_tests": {"status": "ok", "figures": {"passed": 52, "failed": 0, "skipped": 0}},
        "bench_sun397": {"status": "ok", "figures": {"device_pass_s": 0.12, "gemm_share": 0.45,
                                                     "gemm_flops": 5.1e13}},
        "fit_cupy_exact": {"status": "ok", "figures": {"s_per_iter": 0.4}},
        "fit_cupy_truncated": {"status": "failed", "error": "x"},
        "onnx": {"status": "ok", "figures": {"cuda_images_per_s": 900.0, "cpu_images_per_s": 60.0}},
    }
    got = {t["target"].split(",")[0].split(" (")[0]: t for t in summary.targets(steps, dry_run=False)}
    assert got["gpu-marked tests pass"]["met"] is True
    assert got["one exact VB EM pass"]["met"] is True and got["one exact VB EM pass"]["figure"] == 0.12
    assert got["share of the device's float32 GEMM rate"]["met"] is False
    assert got["GPU fit = CPU fit"]["met"] is None  # not measured
    assert got["truncated vs exact E-step"]["met"] is None  # the truncated fit failed
    assert got["ONNX extraction on the CUDA provider vs the CPU"]["figure"]["cuda/cpu"] == 15.0
    steps["gpu_tests"]["figures"]["skipped"] = 2
    assert summary.targets(steps, dry_run=False)[0]["met"] is False


def test_a_failed_step_is_logged_and_the_next_one_runs(gc, tmp_path):
    c = gc.Check(tmp_path / "out", tmp_path / "work", budget=60.0, small=True)
    py = sys.executable

    def boom():
        raise ValueError("no such kernel")

    def skip():
        raise gc.Skip("needs a device")

    c.step("fails", boom)
    c.step("exits", lambda: c.sh("exits", [py, "-c", "print('half'); import sys; sys.exit(3)"], 30))
    c.slack = 1.0  # the device's limits, also in a dry run
    c.step("slow", lambda: c.sh("slow", [py, "-c", "import time; time.sleep(30)"], 11))
    c.step("skips", skip)
    c.step("runs", lambda: {"out": c.sh("runs", [py, "-c", "print('fine')"], 30).splitlines()[-1]})
    c.budget = 0.0
    c.step("late", lambda: c.sh("late", [py, "-c", "pass"], 30))
    s = c.steps
    assert s["fails"]["status"] == "failed" and s["fails"]["error"] == "ValueError: no such kernel"
    assert s["exits"]["status"] == "failed" and s["exits"]["error"] == "RuntimeError: exit 3: half"
    assert s["slow"]["status"] == "failed" and "timed out after 11 s" in s["slow"]["error"]
    assert s["skips"] == {"status": "skipped", "reason": "needs a device", "seconds": s["skips"]["seconds"]}
    assert s["runs"]["status"] == "ok" and s["runs"]["figures"] == {"out": "fine"}
    assert s["late"]["status"] == "skipped" and s["late"]["reason"] == "the time budget is spent"
    summary = gc.finish(c)
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["logs.tar.gz", "summary.json", "summary.txt"]  # a device call brings back <= 8
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["steps"]["exits"] == s["exits"]
    assert summary["dry_run"] is (gc.gpu_reason() is not None)
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as tar:
        assert "logs/exits.log" in tar.getnames()
        assert "half" in tar.extractfile("logs/exits.log").read().decode()
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert "fails" in text and "failed" in text and "[n/a   ] one exact VB EM pass" in text


def test_the_bench_step_runs_without_a_device(tmp_path):
    """``bench/bench_gpu.py --backend strict`` (the check's bench step in a dry run) runs to its JSON:
    the pass on array-api-strict agrees with NumPy's, and the host sgemm rate it is measured against
    is a positive number (an import of a helper that no longer exists once broke this step)."""
    import subprocess

    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_gpu.py"), "--rows", "3000", "--dim", "16",
           "--components", "8", "--gemm-size", "256", "--repeat", "2", "--cpu-repeat", "1",
           "--backend", "strict", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["gemm_flops"] > 0 and 0 < figures["gemm_share"]
    assert figures["nk_max_rel_diff"] <= 1e-6 and figures["log_norm_rel_diff"] <= 1e-6
    assert figures["flop_per_pass"] == 8.0 * 3000 * 16 * 8
