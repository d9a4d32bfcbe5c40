"""The projection benchmarks (`bench/bench_projection.py`, `bench/bench_sketch.py`, in `make bench`) on a
tiny store: each runs to its end and prints the figures its docs quote, for both solvers, with the
captured variance bounded as theory says (at most the exact components'). No time is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from pipeline.store.features import FeatureStore

ROOT = Path(__file__).resolve().parents[1]


def _bench(script: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True,
                         text=True, timeout=600, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout[out.stdout.rindex("\n{\n") + 1:])  # the last, indented, object


def _store(tmp_path: Path) -> str:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2400, 48)) * np.geomspace(5.0, 0.5, 48) + 10.0
    path = str(tmp_path / "s.zarr")
    FeatureStore.create(path, 48, chunk_rows=500).append(X.astype(np.float32))
    return path


def test_bench_projection_times_both_solvers_against_vb_em_iterations(tmp_path):
    got = _bench("bench_projection.py", "--store", _store(tmp_path), "--pca", "6", "-k", "4", "--iters", "2")
    for solver in ("exact", "randomized"):
        for tag in ("before", "after"):
            assert got[f"projection_{solver}_{tag}"]["cpu_s"] >= 0
        for name in ("exact", "truncated"):
            assert got[f"projection_{solver}_over_{name}_iteration_cpu"] > 0
    assert got["syrk_floor_cpu_s"] >= 0 and "syrk_floor_over_truncated_iteration_cpu" in got
    assert 0.5 < got["captured_over_exact"] <= 1 + 1e-6
    exact, randomized = (got[f"projection_{s}_before"]["explained_variance"] for s in ("exact", "randomized"))
    assert randomized <= exact * (1 + 1e-6)  # the Ritz values interlace below the eigenvalues


def test_bench_sketch_prints_every_variant_bounded_by_the_exact_subspace(tmp_path):
    got = _bench("bench_sketch.py", "--store", _store(tmp_path), "--pca", "6", "--k", "10", "14")
    assert got["exact"]["cpu_s"] >= 0 and got["read_once_cpu_s"] >= 0
    for k in (10, 14):
        for name in ("nystrom1", "rr2", "rr3", "rr4"):
            v = got[f"{name}_k{k}"]
            assert 0.0 < v["captured_over_optimum"] <= 1 + 1e-6, (name, k, v)
            assert v["passes"] == (1 if name == "nystrom1" else int(name[2]))
