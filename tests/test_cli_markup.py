"""Square brackets in paths and messages are printed as they are (issue 29, medium 9): the command
line's output used to be read as rich markup, so ``[gpu]`` and ``[v2]`` vanished from messages and
``x[/b].zarr`` crashed with MarkupError."""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipeline.ingest import ingest


def _run(*args: str):
    return CliRunner().invoke(app, list(args), terminal_width=200)


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("markup")
    rng = np.random.default_rng(0)
    np.save(root / "x.npy", np.concatenate([rng.normal(c, 1.0, size=(100, 3)) for c in (-6, 0, 6)]))
    ingest(str(root / "x.npy"), root / "feats[v2].zarr")
    return root


@pytest.mark.parametrize("name", ["x[/b].zarr", "feats[v2]-gone.zarr", "[bold]y.zarr"])
def test_a_missing_store_is_named_as_typed(tmp_path, name):
    res = _run("fit", str(tmp_path / name), "--run-dir", str(tmp_path / "run"), "-q")
    assert res.exit_code == 2, res.output
    assert f"{tmp_path / name}: no such feature store" in _flat(res.output)
    assert "MarkupError" not in res.output


def test_fit_summary_and_bar_keep_brackets(store, tmp_path):
    run = tmp_path / "r[/i]"
    res = _run("fit", str(store / "feats[v2].zarr"), "--run-dir", str(run), "-k", "3", "--max-iter", "5")
    assert res.exit_code == 0, res.output
    assert f"vbcluster fit {store / 'feats[v2].zarr'}" in res.output  # the summary's title
    assert f"wrote {run}/result.json" in _flat(res.output)


def test_ingest_progress_and_summary_keep_brackets(store, tmp_path):
    src = tmp_path / "a[/b].npy"  # a file b].npy in a folder a[
    src.parent.mkdir()
    shutil.copy(store / "x.npy", src)
    res = _run("ingest", str(src), "--out", str(tmp_path / "o[red].zarr"))
    assert res.exit_code == 0, res.output
    assert f"ingest {src}" in res.output  # the progress line, read as markup it crashed
    assert f"{tmp_path / 'o[red].zarr'}: wrote 300 rows" in _flat(res.output)


def test_a_missing_cluster_config_is_named_as_typed(store, tmp_path):
    config = tmp_path / "c[gpu].yaml"
    res = _run("fit", str(store / "feats[v2].zarr"), "--run-dir", str(tmp_path / "run"), "-q",
               "--cluster", str(config))
    assert res.exit_code == 2, res.output
    assert f"{config}: no such cluster config file" in _flat(res.output)


@pytest.mark.skipif(importlib.util.find_spec("dask_cuda") is not None, reason="dask-cuda is installed")
def test_the_gpu_extra_is_named_whole(store, tmp_path):
    from pathlib import Path

    gpu = Path(__file__).resolve().parents[1] / "cluster_config" / "gpu.yaml"
    res = _run("fit", str(store / "feats[v2].zarr"), "--run-dir", str(tmp_path / "run"), "-q",
               "--cluster", str(gpu))
    assert res.exit_code == 2, res.output
    assert "pip install 'vbcluster[gpu]'" in _flat(res.output)
