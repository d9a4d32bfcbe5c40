"""Fit settings refused up front in one line (issue 53): more components than rows (item 10), row
weights out of the range the fit computes with (item 6), a run directory that would land in the
store, at /, or through a link to a system folder (item 8)."""

from __future__ import annotations

import json
import os
import re
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipeline import VBMixture
from pipeline.ingest import ingest
from vbcore.errors import ConfigError

runner = CliRunner()


def _lines(res) -> list[str]:
    return [ln for ln in res.output.splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("refuse")
    np.save(root / "x.npy", np.random.default_rng(0).normal(size=(500, 40)))
    ingest(str(root / "x.npy"), root / "s.zarr", chunk_rows=200)
    return root / "s.zarr"


# ---- item 10: -k above the number of rows --------------------------------------------------------
def test_more_components_than_rows_is_refused_on_the_cli(store, tmp_path):
    t0 = time.perf_counter()
    res = runner.invoke(app, ["fit", str(store), "--run-dir", str(tmp_path / "r"), "-k", "100000", "-q"])
    lines = _lines(res)
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert re.search(r"s\.zarr \(500 x 40\): n_components \(-k\) is 100000 but the data hold 500 rows; a "
                     r"fit starts with at most one component per row: use at most 500", lines[0])
    assert not (tmp_path / "r").exists() and time.perf_counter() - t0 < 30


def test_more_components_than_rows_is_refused_by_the_estimator():
    X = np.random.default_rng(1).normal(size=(30, 3))
    with pytest.raises(ConfigError, match=r"array of shape \(30, 3\): n_components \(-k\) is 31 but the "
                                          r"data hold 30 rows"):
        VBMixture(n_components=31, random_state=0).fit(X)
    VBMixture(n_components=30, max_iter=2, random_state=0).fit(X)  # one per row is allowed


def test_a_store_of_fewer_rows_than_the_default_k_fits_with_one_component_per_row(tmp_path):
    """Without -k, a 30-row store starts at K = 30 instead of refusing the default 50 (an explicit
    -k above the rows is still refused, above)."""
    np.save(tmp_path / "x.npy", np.random.default_rng(2).normal(size=(30, 3)))
    ingest(str(tmp_path / "x.npy"), tmp_path / "t.zarr", chunk_rows=10)
    res = runner.invoke(app, ["fit", str(tmp_path / "t.zarr"), "--run-dir", str(tmp_path / "r"),
                              "--max-iter", "3", "-q"])
    assert res.exit_code == 0, res.output
    spec = json.loads((tmp_path / "r" / "run.json").read_text())
    assert spec["components"] == 30, spec


# ---- item 8: a run directory inside the store, at /, or through a link to a system folder --------
def _refused(store, run_dir, expect: str) -> None:
    res = runner.invoke(app, ["fit", str(store), "--run-dir", str(run_dir), "-k", "2", "--max-iter", "2",
                              "-q"])
    lines = _lines(res)
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert re.search(expect, lines[0]), lines[0]


def test_run_dir_where_run_files_do_not_belong_is_refused(store, tmp_path):
    before = sorted(p.name for p in store.rglob("*"))
    inside = r"is inside the feature store .*s\.zarr: run files would land in its Zarr group; choose a folder"
    _refused(store, store, inside)
    _refused(store, store / "features", inside)
    _refused(store, store / "new" / "run", inside)
    link = tmp_path / "via-link"
    os.symlink(store, link)
    _refused(store, link, rf"--run-dir .*via-link \(that is .*s\.zarr\) {inside}")
    assert sorted(p.name for p in store.rglob("*")) == before  # nothing written into the store
    _refused(store, "/", r"--run-dir / is the root folder: run files need a folder of their own; choose "
                         r"one, e.g\. runs/NAME")
    etc = tmp_path / "etc-link"
    os.symlink("/etc", etc)
    _refused(store, etc, r"etc-link \(that is /etc\) is a system folder: run files need a folder")
    _refused(store, "/usr/share/x", r"--run-dir /usr/share/x is a system folder")
    _refused(store, "/tmp", r"--run-dir /tmp is a folder shared by everything on the host")


def test_resume_of_a_run_json_pointing_into_the_store_is_refused(store, tmp_path):
    run = tmp_path / "r"
    res = runner.invoke(app, ["fit", str(store), "--run-dir", str(run), "-k", "2", "--max-iter", "2", "-q"])
    assert res.exit_code == 0, res.output
    (run / "result.json").unlink()
    moved = store / "r"  # a run directory moved into the store, then resumed there
    os.rename(run, moved)
    try:
        res = runner.invoke(app, ["resume", str(moved), "-q"])
        lines = _lines(res)
        assert res.exit_code == 2 and len(lines) == 1, res.output
        assert "is inside the feature store" in lines[0]
    finally:
        os.rename(moved, run)
