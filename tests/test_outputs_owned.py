"""Outputs only ever replace what vbcluster wrote itself (issue 29): `report --out DIR` replaces a
report (its marker file), never a user's directory; `assign --name` stays inside STORE/assignments and
replaces only an assignment group vbcluster wrote; `ingest --overwrite` replaces only a store holding
nothing but what vbcluster writes there."""

from __future__ import annotations

import re

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from pipeline import VBMixture
from pipeline.cli import app
from pipeline.ingest import ingest
from pipeline.runs.directory import assign_store, save_run
from pipeline.runs.report import MARKER, write_report
from pipeline.store.features import FeatureStore
from vbcore.errors import InputError, StoreError

runner = CliRunner()


def _said(res) -> str:
    return " ".join(res.output.split())


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("owned")
    store = str(tmp / "d.zarr")
    ingest("digits", store, chunk_rows=900)
    model = VBMixture(n_components=5, covariance_type="diag", max_iter=5, random_state=0).fit(store)
    run = tmp / "run"
    save_run(run, model, store)
    return store, run


# ---- report --out -----------------------------------------------------------------------------------
def test_report_out_never_replaces_a_users_directory(fitted, tmp_path):
    _, run = fitted
    d = tmp_path / "d"
    d.mkdir()
    (d / "thesis.txt").write_text("three years")
    with pytest.raises(InputError, match=rf"^{re.escape(str(d))} exists and is not a vbcluster report \(no "
                       r"\.vbcluster-report file; it holds thesis\.txt\); refusing to replace it: choose "
                       r"another --out"):
        write_report([run], d)
    res = runner.invoke(app, ["report", str(run), "--out", str(d)])
    assert res.exit_code == 2 and "is not a vbcluster report" in _said(res)
    assert (d / "thesis.txt").read_text() == "three years" and sorted(p.name for p in d.iterdir()) == [
        "thesis.txt"]
    assert not list(tmp_path.glob(".d.*"))  # nothing was started beside it
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(InputError, match=r"f exists and is not a directory; refusing to replace it"):
        write_report([run], f)
    (tmp_path / "link").symlink_to(d)
    with pytest.raises(InputError, match=r"link is a symbolic link; refusing to replace it"):
        write_report([run], tmp_path / "link")
    assert (d / "thesis.txt").exists() and f.read_text() == "x"


def test_report_out_replaces_a_report_it_wrote_and_fills_an_empty_directory(fitted, tmp_path):
    _, run = fitted
    out = tmp_path / "r"
    out.mkdir()  # empty: used
    write_report([run], out)
    assert (out / MARKER).is_file() and (out / "report.html").is_file()
    (out / "stale.png").write_bytes(b"")
    write_report([run], out)  # its own report: replaced whole
    assert not (out / "stale.png").exists() and (out / MARKER).is_file()
    (out / MARKER).unlink()  # a report of a vbcluster without the marker: report.html and PNGs only
    write_report([run], out)
    assert (out / MARKER).is_file()


# ---- assign --name ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../features", "../../victim", "a/b", "..", ".", "", ".hidden", "a\\b"])
def test_assign_names_never_leave_the_store(fitted, name):
    store, run = fitted
    before = FeatureStore.open(store).fingerprint
    with pytest.raises(InputError, match=rf"^assignment name {re.escape(repr(name))} is not a plain name "
                       r"inside .*/assignments \(no '/', '\\', '\.\.' or leading '\.'\); choose another "
                       r"--name"):
        assign_store(run, name=name)
    assert FeatureStore.open(store).fingerprint == before


def test_cli_assign_name_outside_the_store_is_refused(fitted, tmp_path):
    store, run = fitted
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("x")
    res = runner.invoke(app, ["assign", str(run), "--name", "../features"])
    assert res.exit_code == 2 and "assignment name '../features' is not a plain name" in _said(res)
    res = runner.invoke(app, ["assign", str(run), "--name", f"../../{victim.name}"])
    assert res.exit_code == 2 and "is not a plain name" in _said(res)
    assert (victim / "keep.txt").exists() and FeatureStore.open(store).n_rows == 1797


def test_assign_replaces_only_its_own_groups(fitted):
    store, run = fitted
    first = assign_store(run, name="mine")
    assert zarr.open_group(str(first), mode="r").attrs["written_by"] == "vbcluster assign"
    assert assign_store(run, name="mine") == first  # its own group: replaced
    other = zarr.open_group(f"{store}/assignments/theirs", mode="w")
    other.create_array("labels", data=np.arange(3))
    with pytest.raises(InputError, match=r"assignments/theirs exists and is not an assignment group "
                       r"vbcluster wrote; refusing to replace it: choose another --name"):
        assign_store(run, name="theirs")
    kept = zarr.open_group(f"{store}/assignments/theirs", mode="r")["labels"]
    assert np.asarray(kept[:]).tolist() == [0, 1, 2]


# ---- ingest --overwrite -----------------------------------------------------------------------------
def test_overwrite_refuses_a_store_holding_a_users_file(tmp_path):
    out = tmp_path / "s.zarr"
    ingest("digits", out, chunk_rows=900)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match=r"s\.zarr holds 'notes\.txt', which vbcluster did not write there; "
                       r"refusing to replace the store \(it would be deleted with it\): move it out first"):
        ingest("digits", out, chunk_rows=500, overwrite=True)
    res = runner.invoke(app, ["ingest", "digits", "--out", str(out), "--overwrite"])
    assert res.exit_code == 2 and "which vbcluster did not write there" in _said(res)
    assert (out / "notes.txt").read_text() == "mine" and FeatureStore.open(out).chunk_rows == 900
    (out / "notes.txt").unlink()
    ingest("digits", out, chunk_rows=500, overwrite=True)  # what it wrote itself: replaced
    assert FeatureStore.open(out).chunk_rows == 500
