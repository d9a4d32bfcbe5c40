"""`vbcluster resume` from another working directory (issue 29): run.json keeps the store and the
cluster config as absolute paths; a run.json of an older vbcluster (a relative store) is still read,
and when its store cannot be found from here the error says why in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.service import make_spec, read_spec
from pipeline.store.features import FeatureStore

runner = CliRunner()


def _store(path: Path) -> None:
    rng = np.random.default_rng(0)
    s = FeatureStore.create(path, 2, chunk_rows=100)
    s.append(rng.normal(size=(200, 2)).astype(np.float32))


def test_resume_from_another_directory(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _store(tmp_path / "a" / "s.zarr")
    monkeypatch.chdir(tmp_path / "a")
    res = runner.invoke(app, ["fit", "s.zarr", "--run-dir", "run", "-k", "3", "--max-iter", "3", "-q"])
    assert res.exit_code == 0, res.output
    spec = json.loads((tmp_path / "a" / "run" / "run.json").read_text())
    assert spec["store"] == str(tmp_path / "a" / "s.zarr")
    for name in ("result.json", "posterior.npz"):  # killed after its last checkpoint (a finished run
        (tmp_path / "a" / "run" / name).unlink()  # has nothing to resume: issue 53)
    monkeypatch.chdir(tmp_path / "b")
    res = runner.invoke(app, ["resume", str(tmp_path / "a" / "run"), "-q"])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output


def test_cluster_configs_are_kept_as_absolute_paths(tmp_path, monkeypatch):
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    spec = make_spec("s.zarr", cluster="cluster_config/local.yaml")
    assert spec.cluster == str(root / "cluster_config" / "local.yaml") and spec.store == str(root / "s.zarr")
    assert make_spec("s.zarr", cluster="tcp://10.0.0.1:8786").cluster == "tcp://10.0.0.1:8786"


def test_an_old_run_json_with_a_relative_store(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    _store(tmp_path / "a" / "s.zarr")
    monkeypatch.chdir(tmp_path / "a")
    res = runner.invoke(app, ["fit", "s.zarr", "--run-dir", "run", "-k", "3", "--max-iter", "2", "-q"])
    assert res.exit_code == 0, res.output
    path = tmp_path / "a" / "run" / "run.json"
    old = dict(json.loads(path.read_text()), store="s.zarr")  # as older versions wrote it
    path.write_text(json.dumps(old))
    assert read_spec("run").store == "s.zarr"  # still read, from the directory it was written for
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["resume", "a/run"])
    assert res.exit_code == 2
    assert "names the store 's.zarr' relative to the directory the fit was started in" in res.output
