"""bench/bench_restarts.py on Vehicle (846 rows): the screen takes every row, so each candidate's full
fit is its screen fit (the same bound), and restart 0 is the default's kept model (the fit's own seed)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_vehicle_restarts_and_the_full_comparison(tmp_path) -> None:
    battery = _load("bench_battery")
    pytest.importorskip("rdata")
    if not (battery.MLBENCH / "Vehicle.rda").exists():
        pytest.skip("r-cran-mlbench is not installed")
    b = _load("bench_restarts")
    assert b.main(["--out", str(tmp_path), "--only", "vehicle", "--seeds", "2"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "restarts" / "fits.jsonl").read_text().splitlines()]
    cands = [r for r in rows if r["kind"] == "candidate"]
    restarts = [r for r in rows if r["kind"] == "restart"]
    assert len(cands) >= 8 and len(restarts) == 2
    for c in cands:  # every row screened: the screen's bound is the full fit's
        assert c["bound_per_row"] == pytest.approx(c["screen_bound"], rel=1e-12)
    assert restarts[0]["seed"] == 0 and restarts[0]["bound_per_row"] == cands[0]["bound_per_row"]
    assert restarts[1]["seed"] != 0
    text = (tmp_path / "restarts" / "README.md").read_text()
    assert f"| vehicle | {len(cands)} | {cands[0]['model']} |" in text
