"""bench/bench_battery.py: the battery's sets load (or skip with the command that installs them) and one
small set runs end to end."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _battery():
    spec = importlib.util.spec_from_file_location("bench_battery", BENCH / "bench_battery.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_battery"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_a_missing_set_is_skipped_with_its_install_command(tmp_path, monkeypatch) -> None:
    b = _battery()
    monkeypatch.setattr(b, "MLBENCH", tmp_path / "nowhere")
    with pytest.raises(b.Skip, match="apt-get install -y r-cran-mlbench"):
        b.load("vehicle", tmp_path)
    assert b.main(["--out", str(tmp_path), "--only", "vowel", "--no-sklearn"]) == 0  # skipped, not failed


def test_vehicle_runs_end_to_end(tmp_path) -> None:
    b = _battery()
    pytest.importorskip("rdata")
    if not (b.MLBENCH / "Vehicle.rda").exists():
        pytest.skip("r-cran-mlbench is not installed")
    x, y = b.load("vehicle", tmp_path)
    assert x.shape == (846, 18) and x.dtype == np.float32 and len(np.unique(y)) == 4
    assert b.main(["--out", str(tmp_path), "--only", "vehicle", "--modes", "default"]) == 0
    table = (tmp_path / "battery" / "README.md").read_text()
    # the default selects the model by its bound (issue 51): a Gaussian family under one of the priors
    assert re.search(r"\| vehicle \| default \| (diag|full|tied|spherical), (empirical|bound|sklearn) \|",
                     table) and "k-means K=4" in table
