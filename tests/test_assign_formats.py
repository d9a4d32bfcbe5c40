"""`vbcluster assign --format parquet|csv|zarr`: the same labels and probabilities in every format, one
row per store row (with the store's ids when it has them), written atomically; bad requests refused
with one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import zarr
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.estimator import load_model
from pipeline.runs.directory import assign_store, read_result
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError, InputError, StoreError

runner = CliRunner()


def _store(path, n=300, ids=True):
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=6.0, size=(3, 4))
    X = centres[rng.integers(0, 3, size=n)] + rng.normal(size=(n, 4))
    s = FeatureStore.create(path, 4, chunk_rows=64, ids="str" if ids else None)
    s.append(X, ids=np.array([f"img-{i:04d}" for i in range(n)]) if ids else None)
    return X


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("assign")
    store = tmp / "s.zarr"
    X = _store(store)
    run = tmp / "run"
    res = runner.invoke(app, ["fit", str(store), "--run-dir", str(run), "-k", "6", "-q", "--max-iter", "30"])
    assert res.exit_code == 0, res.output
    return store, run, X


def test_every_format_holds_the_same_assignments(fitted, tmp_path):
    store, run, X = fitted
    model = load_model(run)
    want_labels = model.predict(X.astype(np.float32))
    want_prob = model.predict_proba(X.astype(np.float32)).max(1)

    res = runner.invoke(app, ["assign", str(run), "--format", "parquet"])
    assert res.exit_code == 0, res.output
    t = pq.read_table(run / "assignments.parquet")
    assert t.column_names == ["row", "id", "label", "probability"]
    assert str(t.schema.field("label").type) == "int32" and str(t.schema.field("probability").type) == "float"
    np.testing.assert_array_equal(t["row"].to_numpy(), np.arange(len(X)))
    assert t["id"].to_pylist()[:2] == ["img-0000", "img-0001"]
    np.testing.assert_array_equal(t["label"].to_numpy(), want_labels)
    np.testing.assert_allclose(t["probability"].to_numpy(), want_prob, rtol=1e-5)
    meta = t.schema.metadata
    assert meta[b"store_fingerprint"].decode() == read_result(run)["store_fingerprint"]
    assert meta[b"posterior_sha256"].decode() == read_result(run)["posterior_sha256"]

    out = tmp_path / "labels.csv"
    res = runner.invoke(app, ["assign", str(run), "-f", "csv", "--out", str(out)])
    assert res.exit_code == 0, res.output
    c = pcsv.read_csv(out)
    assert c.column_names == ["row", "id", "label", "probability"]
    np.testing.assert_array_equal(c["label"].to_numpy(), want_labels)
    np.testing.assert_allclose(c["probability"].to_numpy(), want_prob, rtol=1e-5)

    res = runner.invoke(app, ["assign", str(run), "--format", "zarr"])  # the default, explicitly
    assert res.exit_code == 0, res.output
    g = zarr.open_group(str(store / "assignments" / "run"), mode="r")
    np.testing.assert_array_equal(g["labels"][:], t["label"].to_numpy())
    assert not list(run.glob(".assignments*")) and not list(tmp_path.glob(".labels*"))  # no leftovers


def test_a_store_without_ids_has_no_id_column(tmp_path):
    store = tmp_path / "s.zarr"
    _store(store, n=150, ids=False)
    run = tmp_path / "run"
    assert runner.invoke(app, ["fit", str(store), "--run-dir", str(run), "-k", "4", "-q",
                               "--max-iter", "10"]).exit_code == 0
    path = assign_store(run, format="PARQUET")
    assert path == run / "assignments.parquet"
    assert pq.read_table(path).column_names == ["row", "label", "probability"]
    # a rewrite replaces the file whole, atomically
    first = path.read_bytes()
    assign_store(run, format="parquet")
    assert path.read_bytes() == first and not list(run.glob(".assignments.parquet.tmp-*"))


def test_bad_requests_are_refused_with_one_line(fitted, tmp_path):
    store, run, _ = fitted
    with pytest.raises(ConfigError, match=r"format must be one of zarr, parquet, csv, got 'xlsx'"):
        assign_store(run, format="xlsx")
    res = runner.invoke(app, ["assign", str(run), "--format", "xlsx"])
    assert res.exit_code == 2 and "format must be one of zarr, parquet, csv, got 'xlsx'" in res.output
    res = runner.invoke(app, ["assign", str(run), "--format", "csv", "--name", "x"])
    assert res.exit_code == 2
    assert "--name names the Zarr group; with --format csv choose the file with --out" in res.output
    res = runner.invoke(app, ["assign", str(run), "-f", "zarr", "--out", str(tmp_path / "a.parquet")])
    assert res.exit_code == 2 and "--out is for --format parquet or csv" in res.output
    res = runner.invoke(app, ["assign", str(run), "--out", str(tmp_path / "a.xlsx")])
    assert res.exit_code == 2
    assert "a.xlsx: no format given and the file's suffix is neither .parquet nor .csv" in res.output
    assert not (tmp_path / "a.xlsx").exists()
    with pytest.raises(ConfigError, match=r"name is the Zarr group of the zarr format; for csv"):
        assign_store(run, format="csv", name="x")
    with pytest.raises(InputError, match=r"nope: no such directory \(for the csv assignments a\.csv\)"):
        assign_store(run, format="csv", out=tmp_path / "nope" / "a.csv")
    res = runner.invoke(app, ["assign", str(run), "-f", "csv", "--out", str(tmp_path / "nope" / "a.csv")])
    assert res.exit_code == 2 and "no such directory" in res.output
    assert not (tmp_path / "a.parquet").exists()


def test_a_changed_store_is_refused_in_every_format(tmp_path):
    store = tmp_path / "s.zarr"
    _store(store, n=120)
    run = tmp_path / "run"
    assert runner.invoke(app, ["fit", str(store), "--run-dir", str(run), "-k", "3", "-q",
                               "--max-iter", "5"]).exit_code == 0
    FeatureStore.open(store, "r+").append(np.zeros((5, 4)), ids=np.array([f"new-{i}" for i in range(5)]))
    for fmt in ("parquet", "csv"):
        with pytest.raises(StoreError, match=r"changed since the run .* was fitted"):
            assign_store(run, format=fmt)
        assert not (run / f"assignments.{fmt}").exists()


def test_the_format_follows_the_suffix_of_out_when_not_given(fitted, tmp_path):
    from pipeline.runs.assign_formats import format_of

    assert (format_of(None), format_of("x.PARQUET"), format_of(Path("d/x.csv"))) == ("zarr", "parquet", "csv")
    with pytest.raises(ConfigError, match=r"x\.txt: no format given"):
        format_of("x.txt")
    store, run, _ = fitted
    for name in ("a.parquet", "b.CSV"):
        res = runner.invoke(app, ["assign", str(run), "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        kind = name.split(".")[1].lower()
        assert f"one row per store row, {kind}" in res.output
    assert pq.read_table(tmp_path / "a.parquet").column_names == ["row", "id", "label", "probability"]
    assert (tmp_path / "b.CSV").read_text().splitlines()[0].replace('"', "") == "row,id,label,probability"

