"""Sources a new user meets, read as they mean or refused in one line (issue 53): a CSV without a
header row (item 9)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipeline.ingest import ingest
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError, InputError, StoreError

runner = CliRunner()


def _lines(res) -> list[str]:
    return [ln for ln in res.output.splitlines() if ln.strip()]


# ---- item 9: a CSV without a header row ----------------------------------------------------------
def test_csv_without_header_is_refused_unless_header_is_given(tmp_path):
    X = np.round(np.random.default_rng(0).normal(size=(300, 3)), 4)
    path = tmp_path / "noheader.csv"
    np.savetxt(path, X, delimiter=",", fmt="%.4f")  # 300 lines, no header
    res = runner.invoke(app, ["ingest", str(path), "--out", str(tmp_path / "s.zarr"), "-q"])
    lines = _lines(res)
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert f"{path}: the first line ({X[0, 0]:.4f},{X[0, 1]:.4f},{X[0, 2]:.4f}) holds only numbers: a row, " \
           "or column names? Pass -o header=no to read it as a row" in lines[0]
    assert not (tmp_path / "s.zarr").exists()
    rep = ingest(str(path), tmp_path / "no.zarr", header="no")
    assert rep.rows_written == 300  # every line a row
    np.testing.assert_allclose(FeatureStore.open(tmp_path / "no.zarr").read(), X.astype(np.float32))
    assert FeatureStore.open(tmp_path / "no.zarr").attrs["extractor_params"]["columns"] == ["f0", "f1", "f2"]
    res = runner.invoke(app, ["ingest", str(path), "--out", str(tmp_path / "yes.zarr"), "-o", "header=yes"])
    assert res.exit_code == 0 and "wrote 299 rows" in " ".join(res.output.split()), res.output  # as asked
    (tmp_path / "named.csv").write_text("a,b,c\n1,2,3\n4,5,6\n")  # a header row: read as before
    assert ingest(str(tmp_path / "named.csv"), tmp_path / "n.zarr").rows_written == 2
    with pytest.raises(ConfigError, match=r"header must be true or false, got 'maybe'"):
        ingest(str(path), tmp_path / "m.zarr", header="maybe")
    with pytest.raises(InputError, match=r"no column 'f1' for labels \(columns: \['a', 'b', 'c'\]\)"):
        ingest(str(tmp_path / "named.csv"), tmp_path / "l.zarr", labels="f1", header="yes")
    (tmp_path / "lab.csv").write_text("0.5,1.5,3\n2.5,0.25,7\n")
    ingest(str(tmp_path / "lab.csv"), tmp_path / "lab.zarr", header="no", labels="f2")  # a generated name
    np.testing.assert_array_equal(FeatureStore.open(tmp_path / "lab.zarr").read_labels(), [3, 7])


# ---- item 5: image names that are not one line of UTF-8 ------------------------------------------
def _png(path) -> None:
    from PIL import Image

    Image.fromarray(np.full((8, 8, 3), 120, np.uint8)).save(path)


@pytest.mark.parametrize("name, shown, what", [
    (b"a\tb.png", r"a\tb.png", "a tab"),
    (b"c\nd.png", r"c\nd.png", "a newline"),
    (b"\xffbad.png", r"\xffbad.png", "a byte that is not UTF-8"),
])
def test_image_names_that_break_ids_are_refused_naming_the_file(tmp_path, name, shown, what):
    import os

    src = tmp_path / "imgs"
    (src / "cat").mkdir(parents=True)
    _png(src / "cat" / "ok.png")
    _png(os.fsdecode(os.fsencode(src / "cat") + b"/" + name))
    res = runner.invoke(app, ["ingest", str(src), "--out", str(tmp_path / "s.zarr"),
                              "-o", "extractor=color-hog", "-o", "size=16", "-q"])
    lines = _lines(res)
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].endswith(f"imgs/cat/{shown}: the image's name holds {what}; image ids are one line "
                             "of UTF-8 text: rename the file"), lines[0]
    assert not (tmp_path / "s.zarr").exists()


def test_a_manifest_holding_a_tab_still_reads(tmp_path):
    """A store ingested before tabs were refused: its manifest's ids may hold one."""
    from pipeline.extract.image_store import MANIFEST, read_manifest

    np.save(tmp_path / "x.npy", np.zeros((2, 2)))
    ingest(str(tmp_path / "x.npy"), tmp_path / "s.zarr")
    s = FeatureStore.open(tmp_path / "s.zarr", "r+")
    arr = s.group.create_array(MANIFEST, shape=(2,), chunks=(2,), dtype=str)
    arr[:] = np.array(["cat/a\tb.png\t10\t20", "cat/c.png\t30\t40"])
    assert read_manifest(s) == {"cat/a\tb.png": (10, 20), "cat/c.png": (30, 40)}


# ---- item 17: appends of synthetic rows continue the store's classes -----------------------------
def test_synthetic_append_continues_the_same_classes(tmp_path):
    out = tmp_path / "syn.zarr"
    ingest("synthetic", out, rows=3000, dim=48, classes=6, seed=0, chunk_rows=1024)
    rep = ingest("synthetic", out, rows=1200, seed=1, append=True)  # dim and classes: the store's
    assert rep.n_rows == 4200
    s = FeatureStore.open(out)
    X, y = s.read().astype(np.float64), s.read_labels()
    old, new = slice(0, 3000), slice(3000, 4200)
    means = np.stack([X[old][y[old] == c].mean(0) for c in range(6)])
    for c in range(6):  # each appended class sits on the store's class of the same label
        m = X[new][y[new] == c].mean(0)
        assert np.argmin(((means - m) ** 2).sum(1)) == c
    assert not np.array_equal(X[new][:10], X[old][:10])  # new rows, not the store's again
    with pytest.raises(ConfigError, match=r"synthetic --append continues the store's classes 6 \(its class "
                                          r"model is reused\), got classes=7; leave classes out"):
        ingest("synthetic", out, rows=100, classes=7, seed=2, append=True)
    again = tmp_path / "again.zarr"  # a new store from the same parameters: the same rows as before
    ingest("synthetic", again, rows=3000, dim=48, classes=6, seed=0, chunk_rows=1024)
    np.testing.assert_array_equal(FeatureStore.open(again).read(), s.read(slice(0, 3000)))


# ---- item 15: a source of no rows ----------------------------------------------------------------
def test_a_source_of_no_rows_is_refused(tmp_path):
    np.save(tmp_path / "empty.npy", np.zeros((0, 5), np.float32))
    res = runner.invoke(app, ["ingest", str(tmp_path / "empty.npy"), "--out", str(tmp_path / "e.zarr"), "-q"])
    lines = _lines(res)
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].endswith("empty.npy: the source holds no rows; nothing to ingest")
    assert not (tmp_path / "e.zarr").exists() and not list(tmp_path.glob(".e.zarr*"))
    np.save(tmp_path / "x.npy", np.ones((3, 5), np.float32))
    ingest(str(tmp_path / "x.npy"), tmp_path / "s.zarr")
    with pytest.raises(InputError, match=r"empty.npy: the source holds no rows"):
        ingest(str(tmp_path / "empty.npy"), tmp_path / "s.zarr", append=True)
    s = FeatureStore.open(tmp_path / "s.zarr")
    assert s.n_rows == 3 and len(s.attrs["appends"]) == 1  # no empty append recorded


# ---- item 16: a store as a source of its own -------------------------------------------------------
def test_a_store_is_copied_with_a_new_normalisation_chunking_and_level(tmp_path):
    from vbcore.data.normalize import normalize_rows

    rng = np.random.default_rng(0)
    X = np.abs(rng.normal(size=(300, 6))).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 300))
    np.save(tmp_path / "w.npy", rng.integers(1, 4, 300).astype(np.float64))
    ingest(str(tmp_path / "x.npy"), tmp_path / "fm.zarr", labels=str(tmp_path / "y.npy"),
           weights=str(tmp_path / "w.npy"), chunk_rows=64)
    res = runner.invoke(app, ["ingest", str(tmp_path / "fm.zarr"), "--out", str(tmp_path / "x.zarr"),
                              "--normalize", "power-l2", "--chunk-rows", "100", "-o", "codec=zstd",
                              "-o", "compression_level=3"])
    assert res.exit_code == 0 and "wrote 300 rows x 6 features" in " ".join(res.output.split()), res.output
    src, got = FeatureStore.open(tmp_path / "fm.zarr"), FeatureStore.open(tmp_path / "x.zarr")
    assert (got.normalize, got.chunk_rows, got.n_rows) == ("power-l2", 100, 300)
    np.testing.assert_array_equal(got.read(), normalize_rows(X, "power-l2", dtype=np.float32))
    np.testing.assert_array_equal(got.read_labels(), src.read_labels())
    np.testing.assert_array_equal(got.read_weights(), src.read_weights())
    assert got.attrs["extractor_params"]["copied_from"]["fingerprint"] == src.fingerprint
    assert '"level": 3' in (tmp_path / "x.zarr" / "features" / "zarr.json").read_text()
    with pytest.raises(StoreError, match=r"fm.zarr was already appended to this store"):  # its fingerprint
        ingest(str(tmp_path / "fm.zarr"), tmp_path / "x.zarr", append=True)
    with pytest.raises(ConfigError, match=r"x.zarr: its rows are normalised 'power-l2' \(the raw rows are "
                                          r"not held\), so they cannot be normalised again"):
        ingest(str(tmp_path / "x.zarr"), tmp_path / "z.zarr", normalize="l2")
    with pytest.raises(ConfigError, match=r"fm.zarr: the source and --out are the same store"):
        ingest(str(tmp_path / "fm.zarr"), tmp_path / "fm.zarr", append=True)
    with pytest.raises(ConfigError, match=r"carries its own labels, ids and weights"):
        ingest(str(tmp_path / "fm.zarr"), tmp_path / "l.zarr", labels="y")
    for ids in (None, "str"):  # integer ids (digits) and text ids
        np.save(tmp_path / "ids.npy", np.array([f"r{i}" for i in range(300)]))
        src_path = tmp_path / f"ids-{ids}.zarr"
        if ids is None:
            ingest("digits", src_path)
        else:
            ingest(str(tmp_path / "x.npy"), src_path, ids=str(tmp_path / "ids.npy"))
        ingest(str(src_path), tmp_path / f"copy-{ids}.zarr", chunk_rows=128)
        a, b = FeatureStore.open(src_path), FeatureStore.open(tmp_path / f"copy-{ids}.zarr")
        np.testing.assert_array_equal(a.read_ids(), b.read_ids())
        np.testing.assert_array_equal(a.read(), b.read())
