"""Store integrity (issue 14): every chunk present and checksummed, damage named by array, chunk and
rows, the fingerprint derived from the chunk checksums, `vbcluster check` and `--upgrade`."""

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from pipeline import VBMixture
from pipeline.cli import app
from pipeline.engine.sources import StoreSource
from pipeline.store import integrity
from pipeline.store.features import FeatureStore
from pipeline.store.integrity import StoreIntegrityWarning
from vbcore.errors import StoreError

runner = CliRunner()


def _rows(n, d=4, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def _make(path, n=40, chunk_rows=8):
    s = FeatureStore.create(path, 4, chunk_rows=chunk_rows, labels=True, ids="str", source="test")
    s.append(_rows(n), labels=np.arange(n) % 3, ids=[f"r{i}" for i in range(n)])
    return str(path)


@pytest.fixture
def store(tmp_path):
    return _make(tmp_path / "s.zarr")


@pytest.fixture
def old_store(tmp_path, monkeypatch):
    """A store as an older vbcluster wrote it: zstd only, no checksum codec."""
    monkeypatch.setattr(integrity, "compressors",
                        lambda level, codec="zstd": [zarr.codecs.ZstdCodec(level=level)])
    path = _make(tmp_path / "old.zarr")
    monkeypatch.undo()
    return path


def _flip(path: Path, offset: int) -> None:
    b = bytearray(path.read_bytes())
    b[offset] ^= 0x10
    path.write_bytes(bytes(b))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True)


def test_new_stores_checksum_every_array(store):
    s = FeatureStore.open(store)
    for name in ("features", "labels", "ids"):
        assert integrity.has_checksums(s.group[name])
    assert s.scan is not None and s.scan.checksummed and len(s.scan.crcs["features"]) == 5


def test_deleted_features_chunk_is_refused_by_open_and_fit(store, tmp_path):
    (Path(store) / "features/c/3/0").unlink()
    msg = r"'features' chunk features/c/3/0 \(rows 24-31\) is missing"
    with pytest.raises(StoreError, match=msg):
        FeatureStore.open(store)
    with pytest.raises(StoreError, match=msg):
        VBMixture(3, max_iter=2, random_state=0).fit(store)
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "run"), "-k", "3", "-q"])
    assert res.exit_code == 2 and "features/c/3/0 (rows 24-31) is missing" in res.output
    assert not (tmp_path / "run").exists()


def test_deleted_labels_and_ids_chunks_are_refused(store):
    (Path(store) / "labels/c/1").unlink()
    with pytest.raises(StoreError, match=r"'labels' chunk labels/c/1 \(rows 8-15\) is missing"):
        FeatureStore.open(store)
    (Path(store) / "labels/c/1").write_bytes(b"")  # an empty file is not a chunk either
    with pytest.raises(StoreError, match=r"'labels' chunk labels/c/1 \(rows 8-15\) is corrupt"):
        FeatureStore.open(store).read_labels()


def test_last_partial_chunk_names_its_real_rows(tmp_path):
    path = _make(tmp_path / "p.zarr", n=37)
    (Path(path) / "ids/c/4").unlink()
    with pytest.raises(StoreError, match=r"'ids' chunk ids/c/4 \(rows 32-36\) is missing"):
        FeatureStore.open(path)


def test_chunk_deleted_or_replaced_after_open_fails_the_read(store, tmp_path):
    src = StoreSource(store)
    other = _make(tmp_path / "other.zarr", n=40)
    for i in range(5):
        np.testing.assert_array_equal(src.load(i), _rows(40)[i * 8:(i + 1) * 8])
    # a valid chunk of another store (its checksum is right, its content is not this store's)
    (Path(store) / "features/c/2/0").write_bytes((Path(other) / "features/c/0/0").read_bytes())
    with pytest.raises(StoreError, match=r"features/c/2/0 \(rows 16-23\) changed since the store was opened"):
        src.load(2)
    (Path(store) / "features/c/4/0").unlink()
    with pytest.raises(StoreError, match=r"features/c/4/0 \(rows 32-39\) is missing"):
        src.load(4)
    with pytest.raises(StoreError, match=r"features/c/4/0 \(rows 32-39\) is missing"):
        FeatureStore.open(store, "r").read()  # (open itself refuses too)


def test_byte_flip_that_still_decodes_is_detected(store, old_store):
    chunk = "features/c/1/0"
    size = (Path(store) / chunk).stat().st_size
    # the premise: without checksums this flip decodes to different, finite numbers, unnoticed
    _flip(Path(old_store) / chunk, size // 2)
    with pytest.warns(StoreIntegrityWarning):
        silently = FeatureStore.open(old_store).read(slice(8, 16))
    assert np.isfinite(silently).all() and not np.array_equal(silently, _rows(40)[8:16])
    # with checksums the same flip fails the read, naming the chunk
    fp = FeatureStore.open(store).fingerprint
    _flip(Path(store) / chunk, size // 2)
    s = FeatureStore.open(store)
    assert s.fingerprint == fp  # the recorded checksum did not change: the read must catch it
    with pytest.raises(StoreError, match=r"'features' chunk features/c/1/0 \(rows 8-15\) is corrupt: its "
                       r"checksum does not match"):
        s.read()
    with pytest.raises(StoreError, match=r"features/c/1/0 \(rows 8-15\) is corrupt"):
        StoreSource(store).load(1)
    np.testing.assert_array_equal(s.read(slice(16, 40)), _rows(40)[16:])  # other chunks still read


def test_flipped_checksum_changes_the_fingerprint(store):
    fp = FeatureStore.open(store).fingerprint
    f = Path(store) / "features/c/0/0"
    _flip(f, f.stat().st_size - 1)
    assert FeatureStore.open(store).fingerprint != fp


def _one_line(res) -> str:
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, res.stdout + res.stderr
    return lines[0]


def test_zstd_header_flip_is_one_line(store, old_store):
    _flip(Path(store) / "features/c/2/0", 0)
    res = _cli("check", store)
    assert res.returncode == 2
    assert "features/c/2/0 (rows 16-23) is corrupt" in _one_line(res)
    # without checksums zstd itself fails: still one line naming the chunk
    _flip(Path(old_store) / "features/c/2/0", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreIntegrityWarning)
        with pytest.raises(StoreError, match=r"features/c/2/0 \(rows 16-23\) is corrupt: it does not decode"):
            FeatureStore.open(old_store).read()


def test_fingerprint_follows_the_content(store, tmp_path):
    fp = FeatureStore.open(store).fingerprint
    assert FeatureStore.open(_make(tmp_path / "twin.zarr")).fingerprint == fp  # same content, same fp
    arr = zarr.open_array(f"{store}/features", mode="r+")
    old = float(arr[13, 2])
    arr[13, 2] = old + 1.0  # a change made behind the store's back, through Zarr
    assert FeatureStore.open(store).fingerprint != fp
    arr[13, 2] = old
    assert FeatureStore.open(store).fingerprint == fp
    lab = zarr.open_array(f"{store}/labels", mode="r+")
    lab[3] = 7
    assert FeatureStore.open(store).fingerprint != fp
    lab[3] = 0
    s = FeatureStore.open(store, "r+")
    s.append(_rows(1, seed=5), labels=[1], ids=["x"])
    assert s.fingerprint != fp and s.fingerprint == FeatureStore.open(store).fingerprint


def test_old_store_warns_and_upgrades(old_store):
    zarr.open_group(f"{old_store}/assignments", mode="a")  # an assignment group inside it, as assign
    g = zarr.open_group(f"{old_store}/assignments/run1", mode="w")  # writes them
    g.create_array("labels", data=np.arange(40))
    before = FeatureStore.open(old_store)
    with pytest.warns(StoreIntegrityWarning, match=r"vbcluster check .*old.zarr --upgrade"):
        FeatureStore.open(old_store)
    res = runner.invoke(app, ["check", old_store])
    assert res.exit_code == 0 and "--upgrade" in res.output and "no checksums" in res.output
    res = runner.invoke(app, ["check", old_store, "--upgrade"])
    assert res.exit_code == 0, res.output
    assert "rewrote every chunk" in res.output and "checksums verified" in res.output
    assert "s/GB" not in res.output  # a tiny store: no rate (integrity.RATE_MIN_BYTES)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreIntegrityWarning)
        after = FeatureStore.open(old_store)
    assert after.scan.checksummed and after.attrs["appends"] == before.attrs["appends"]
    np.testing.assert_array_equal(after.read(), _rows(40))
    np.testing.assert_array_equal(after.read_ids(), [f"r{i}" for i in range(40)])
    np.testing.assert_array_equal(zarr.open_array(f"{old_store}/assignments/run1/labels")[:], np.arange(40))
    assert not list(Path(old_store).parent.glob("*.upgrade-*"))
    res = runner.invoke(app, ["check", old_store, "--upgrade"])
    assert res.exit_code == 0 and "nothing to upgrade" in res.output


def test_upgrade_killed_between_renames_is_finished_by_the_next_open(old_store):
    p = Path(old_store)
    tmp, old = p.with_name(p.name + integrity.UPGRADE_TMP), p.with_name(p.name + integrity.UPGRADE_OLD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreIntegrityWarning)
        integrity._copy_with_checksums(FeatureStore.open(old_store), tmp, ["features", "labels", "ids"])
    p.with_name(p.name + integrity.COMPLETE).write_text("")
    p.rename(old)  # killed here: neither name is the store
    s = FeatureStore.open(old_store)
    assert s.scan.checksummed and not tmp.exists() and not old.exists()
    np.testing.assert_array_equal(s.read(), _rows(40))


def test_check_reports_time_per_gb_and_nonfinite(store):
    rep = integrity.check(store)
    assert rep.chunks == 15 and 0 < rep.n_bytes < integrity.RATE_MIN_BYTES and rep.nonfinite_rows == 0
    assert rep.seconds_per_gb is None  # a tiny store's check time is its start-up, not a rate
    arr = zarr.open_array(f"{store}/features", mode="r+")
    arr[3, 1] = np.nan
    res = runner.invoke(app, ["check", store])
    assert res.exit_code == 2 and "1 rows of 'features' hold NaN/inf" in res.output
    assert json.loads((Path(store) / "zarr.json").read_text())["attributes"]["checksums"] == "crc32c"


def test_fsspec_url_stores_are_scanned_too(store):
    url = f"file://{store}"
    assert FeatureStore.open(url).fingerprint == FeatureStore.open(store).fingerprint
    np.testing.assert_array_equal(StoreSource(url).load(4), _rows(40)[32:40])
    (Path(store) / "features/c/4/0").unlink()
    with pytest.raises(StoreError, match=r"'features' chunk features/c/4/0 \(rows 32-39\) is missing"):
        FeatureStore.open(url)


def test_swapped_chunk_files_fail_check(store):
    """Each chunk's CRC-32C is recorded at its position (issue 29): two chunk files swapped both verify
    on their own, but `check` finds them in each other's place."""
    assert integrity.check(store).chunks == 15  # features, labels and ids: 5 chunks each
    a, b = Path(store) / "features/c/1/0", Path(store) / "features/c/3/0"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    with pytest.raises(StoreError, match=r"'features' chunk features/c/1/0 \(rows 8-15\) is not the chunk "
                                         r"vbcluster wrote at that position \(its CRC-32C differs from the "
                                         r"one recorded; it holds what was written as chunk 3\)"):
        integrity.check(store)
    res = runner.invoke(app, ["check", store])
    assert res.exit_code == 2 and "is not the chunk vbcluster wrote at that position" in res.output
    a.write_bytes(data_a)
    b.write_bytes(data_b)
    s = FeatureStore.open(store, "r+")  # an append records the new chunks' positions too
    s.append(_rows(13, seed=3), labels=np.ones(13, int), ids=[f"n{i}" for i in range(13)])
    assert integrity.check(store).n_rows == 53
    last = Path(store) / "labels/c/6"
    first = Path(store) / "labels/c/0"
    data_last, data_first = last.read_bytes(), first.read_bytes()
    last.write_bytes(data_first)
    first.write_bytes(data_last)
    with pytest.raises(StoreError, match=r"'labels' chunk labels/c/0 \(rows 0-7\) is not the chunk"):
        integrity.check(store)


def test_check_says_a_rate_only_for_a_store_of_some_size(tmp_path):
    """Issue 53, item 15: `check` of an empty store printed "11690331000.0 s/GB"."""
    FeatureStore.create(tmp_path / "empty.zarr", 4)
    res = runner.invoke(app, ["check", str(tmp_path / "empty.zarr")])
    assert res.exit_code == 0 and "ok, 0 rows, 0 chunks, 0.0 MB" in res.output, res.output
    assert "s/GB" not in res.output
    big = FeatureStore.create(tmp_path / "big.zarr", 100, chunk_rows=1000)
    big.append(np.random.default_rng(0).normal(size=(4000, 100)).astype(np.float32))  # about 1.5 MB
    rep = integrity.check(str(tmp_path / "big.zarr"))
    assert rep.n_bytes >= integrity.RATE_MIN_BYTES and rep.seconds_per_gb is not None
    res = runner.invoke(app, ["check", str(tmp_path / "big.zarr")])
    assert res.exit_code == 0 and re.search(r"s = \d+\.\d s/GB", res.output), res.output
