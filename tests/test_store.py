"""The Zarr feature store: layout, validation, atomic appends (also under SIGKILL)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import zarr

from pipeline.store.features import FORMAT, SCHEMA_VERSION, FeatureStore
from vbcore.errors import InputError, StoreError


def _rows(n, d=5, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


@pytest.fixture
def store(tmp_path):
    s = FeatureStore.create(tmp_path / "s.zarr", 5, chunk_rows=8, labels=True, ids="str",
                            source="test", extractor="none")
    s.append(_rows(20), labels=np.arange(20) % 3, ids=[f"r{i}" for i in range(20)])
    return s


def test_layout_and_attributes(store, tmp_path):
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    assert g["features"].dtype == np.float32 and g["features"].chunks == (8, 5)
    assert g["labels"].dtype == np.int64
    a = dict(g.attrs)
    assert a["format"] == FORMAT and a["schema_version"] == SCHEMA_VERSION
    assert (a["n_rows"], a["n_features"], a["source"], a["extractor"]) == (20, 5, "test", "none")
    assert a["appends"][0]["rows"] == 20 and len(a["fingerprint"]) == 64
    s = FeatureStore.open(tmp_path / "s.zarr")
    np.testing.assert_array_equal(s.read(), _rows(20))
    assert [(c.start, c.stop) for c in s.chunk_slices()] == [(0, 8), (8, 16), (16, 20)]
    assert s.read_ids()[19] == "r19" and s.read_labels()[4] == 1


def test_append_changes_fingerprint_and_keeps_rows(store):
    s = FeatureStore.open(store.path, "r+")
    fp = s.fingerprint
    s.append(_rows(3, seed=1), labels=[0, 1, 2], ids=["a", "b", "c"])
    s2 = FeatureStore.open(store.path)
    assert s2.n_rows == 23 and s2.fingerprint != fp
    np.testing.assert_array_equal(s2.read(slice(20, 23)), _rows(3, seed=1))
    np.testing.assert_array_equal(s2.read(slice(0, 20)), _rows(20))


def test_streaming_batches_are_one_transaction(store):
    s = FeatureStore.open(store.path, "r+")
    fp = s.fingerprint
    bad = _rows(4, seed=2)
    bad[2, 3] = np.inf
    batches = [(_rows(6, seed=1), [0] * 6, ["x"] * 6), (bad, [1] * 4, ["y"] * 4)]
    with pytest.raises(InputError, match=r"non-finite value at row 8, column 3"):
        s.append_batches(batches, source="two batches")
    s2 = FeatureStore.open(store.path)
    assert s2.n_rows == 20 and s2.fingerprint == fp  # the first batch was rolled back too
    np.testing.assert_array_equal(s2.read(), _rows(20))


def test_drop_nonfinite_counts_rows(store):
    s = FeatureStore.open(store.path, "r+")
    X = _rows(5, seed=3)
    X[1, 0] = np.nan
    assert s.append(X, labels=[0, 1, 2, 0, 1], ids=list("abcde"), on_nonfinite="drop") == 4
    s2 = FeatureStore.open(store.path)
    assert s2.n_rows == 24 and s2.attrs["appends"][-1]["dropped_nonfinite"] == 1
    assert list(s2.read_ids()[20:]) == ["a", "c", "d", "e"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(X=_rows(2, d=4), labels=[0, 1], ids=["a", "b"]), r"rows have 4 features but the store has 5"),
        (dict(X=_rows(2), labels=[0, 1, 2], ids=["a", "b"]), r"labels has length 3 but there are 2 rows"),
        (dict(X=_rows(2), labels=None, ids=["a", "b"]), r"the store has 'labels'"),
        (dict(X=_rows(2), labels=[0.5, 1], ids=["a", "b"]), r"labels must be integers"),
        (dict(X=_rows(2), labels=[0, 1], ids=["a"]), r"ids has length 1"),
        (dict(X=_rows(2)[0], labels=[0], ids=["a"]), r"must be 2-D"),
    ],
)
def test_bad_appends_change_nothing(store, kwargs, match):
    s = FeatureStore.open(store.path, "r+")
    fp = s.fingerprint
    with pytest.raises(InputError, match=match):
        s.append(kwargs["X"], labels=kwargs["labels"], ids=kwargs["ids"])
    s2 = FeatureStore.open(store.path)
    assert s2.n_rows == 20 and s2.fingerprint == fp


def test_open_errors(tmp_path, store):
    with pytest.raises(StoreError, match=r"no such feature store"):
        FeatureStore.open(tmp_path / "missing.zarr")
    (tmp_path / "plain").mkdir()
    with pytest.raises(StoreError, match=r"plain is not a feature store \(no zarr.json"):
        FeatureStore.open(tmp_path / "plain")
    zarr.open_group(str(tmp_path / "other.zarr"), mode="w").attrs["x"] = 1
    with pytest.raises(StoreError, match=r"not a vbcluster feature store"):
        FeatureStore.open(tmp_path / "other.zarr")
    g = zarr.open_group(store.path, mode="r+")
    g.attrs["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(StoreError, match=rf"schema version {SCHEMA_VERSION + 1}.*upgrade vbcluster"):
        FeatureStore.open(store.path)
    with pytest.raises(StoreError, match=r"open it with mode='r\+'"):
        g.attrs["schema_version"] = SCHEMA_VERSION
        FeatureStore.open(store.path).append(_rows(1), labels=[0], ids=["a"])
    with pytest.raises(StoreError, match=r"already exists and is not empty"):
        FeatureStore.create(store.path, 5)


_APPENDER = textwrap.dedent("""
    import sys, numpy as np
    from pipeline.store.features import FeatureStore
    path, n_batches = sys.argv[1], int(sys.argv[2])
    s = FeatureStore.open(path, "r+")
    def batches():
        for b in range(n_batches):
            X = np.full((37, 5), 1000.0 + b, dtype=np.float32)
            yield X, np.full(37, b), [f"new{b}"] * 37
    print("start", flush=True)
    s.append_batches(batches(), source="killed")
    print("done", flush=True)
""")


@pytest.mark.parametrize("seed", range(6))
def test_sigkill_during_append_leaves_the_store_as_it_was(store, tmp_path, seed):
    script = tmp_path / "appender.py"
    script.write_text(_APPENDER)
    before = FeatureStore.open(store.path)
    fp, rows, ids = before.fingerprint, before.read(), before.read_ids()
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, str(script), store.path, "400"], stdout=subprocess.PIPE,
                            env=env, text=True)
    assert proc.stdout.readline().strip() == "start"
    time.sleep(np.random.default_rng(seed).uniform(0.0, 0.8))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    after = FeatureStore.open(store.path)  # rolls back what the killed append left
    if after.n_rows == 20:
        assert after.fingerprint == fp
    else:  # the kill came after the commit: then everything is there
        assert after.n_rows == 20 + 400 * 37
    np.testing.assert_array_equal(after.read(slice(0, 20)), rows)
    np.testing.assert_array_equal(after.read_ids(slice(0, 20)), ids)
    assert not any(p.name.endswith((".append-journal", ".append-journal.tmp"))
                   for p in tmp_path.iterdir())
    # and the store still takes appends
    FeatureStore.open(store.path, "r+").append(_rows(2), labels=[0, 0], ids=["z", "z"])
    assert FeatureStore.open(store.path).n_rows == after.n_rows + 2


def test_journal_metadata_is_json(store, tmp_path):
    """A journal left by a kill is plain files; rollback restores the old shape from them."""
    from pipeline.store.journal import begin, journal_path

    s = FeatureStore.open(store.path, "r+")
    begin(tmp_path / "s.zarr", s.group, 20, 8)
    s.features.resize((64, 5))
    s.features[20:64] = 7.0
    info = json.loads((journal_path(tmp_path / "s.zarr") / "journal.json").read_text())
    assert info == {"old_n_rows": 20, "tail_start": 16}
    s2 = FeatureStore.open(store.path)
    assert s2.features.shape == (20, 5)
    np.testing.assert_array_equal(s2.read(), _rows(20))
    assert sorted(p.name for p in (tmp_path / "s.zarr" / "features" / "c").iterdir()) == ["0", "1", "2"]


@pytest.mark.parametrize("suffix", [".tmp", ".done"])
def test_a_writable_open_removes_a_journal_left_before_the_start_or_in_the_commit(store, tmp_path, suffix):
    """A kill between creating ``.append-journal.tmp`` and renaming it leaves the ``.tmp``; a kill in
    the commit leaves ``.done``. Neither describes the store: the next writable open removes it and
    the rows stay as they are."""
    from pipeline.store.journal import journal_paths

    fp = FeatureStore.open(store.path).fingerprint
    left = tmp_path / f"s.zarr.append-journal{suffix}"
    assert left in journal_paths(store.path)
    (left / "meta").mkdir(parents=True)
    (left / "journal.json").write_text("{\"old_n_rows\": 3")  # cut short by the kill
    s = FeatureStore.open(store.path, "r+")
    assert not left.exists() and s.n_rows == 20 and s.fingerprint == fp
    s.append(_rows(2), labels=[0, 0], ids=["z", "z"])
    assert FeatureStore.open(store.path).n_rows == 22
