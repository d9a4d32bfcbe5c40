"""The scheduled refresh on an image folder (issue 18): the first run extracts the images into a new
store and fits it cold; after images are added, the next run appends only the new ones and
warm-starts from the published version; `vbcluster deploy --images ... --dry-run` checks it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipeline.store.features import FeatureStore
from tests._extract_helpers import make_images, write_tiny_cnn

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_refresh_extracts_new_images_then_warm_starts(tmp_path):
    from flows.schedule import refresh_flow

    model = tmp_path / "tiny.onnx"
    write_tiny_cnn(model, seed=0)
    root = tmp_path / "imgs"
    make_images(root, 24, seed=1, classes=2)
    store, out = tmp_path / "s.zarr", tmp_path / "versions"
    opts = {"extractor": "onnx", "model": str(model), "batch_images": 4, "shard_images": 8, "chunk_rows": 8}
    kw = dict(images=str(root), extract_options=opts, components=4, max_iter=5)
    first = refresh_flow(str(store), str(out), **kw)
    assert first["action"] == "cold" and FeatureStore.open(store).n_rows == 24
    make_images(root / "c0", 6, seed=2, start=100)
    second = refresh_flow(str(store), str(out), **kw)
    assert second["action"] == "warm" and FeatureStore.open(store).n_rows == 30
    assert second["warm_start_from"] == first["version"]
    assert json.loads(Path(second["version"], "result.json").read_text())["n_rows"] == 30
    third = refresh_flow(str(store), str(out), **kw)  # nothing new: nothing refitted
    assert third["action"] == "skip" and FeatureStore.open(store).n_rows == 30


def test_deploy_dry_run_with_images(tmp_path):
    root = tmp_path / "imgs"
    make_images(root, 3, seed=1)
    res = CliRunner().invoke(app, ["deploy", str(tmp_path / "new.zarr"), "--images", str(root), "-x",
                                   "batch_images=2", "--cron", "0 2 * * *", "--dry-run"])
    assert res.exit_code == 0 and "ok: would refresh" in res.output, res.output
    res = CliRunner().invoke(app, ["deploy", str(tmp_path / "new.zarr"), "--images", str(tmp_path / "x.npy"),
                                   "--cron", "0 2 * * *", "--dry-run"])
    assert res.exit_code != 0 and "not an image folder" in res.output
