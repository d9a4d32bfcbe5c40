"""Run integrity and bad files (issue 14): readers of a run verify the recorded sha256; every damaged
file, bad config and failed write is one line naming the file (exit 2 bad input, 1 environment);
values too large for float32 accumulation are refused at ingest with the source's own value (every
reader), and in arrays given to the estimator by the limit of their own dtype; a duplicate append is
one line."""

import errno
import json
import re
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from pipeline.cli import app, exit_code
from pipeline.engine.cluster import load_cluster_config
from pipeline.estimator import load_model
from pipeline.files.atomic import write_file as write_atomic
from pipeline.runs.directory import RESULT, assign_store, read_result
from pipeline.runs.publish import VERSIONS, plan_refresh, publish
from pipeline.runs.report import write_report
from pipeline.store import integrity
from pipeline.store.features import FeatureStore
from vbcore.data.limits import max_abs_value
from vbcore.errors import ConfigError, InputError, StoreError

runner = CliRunner()


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A small store and two finished runs of it (different K: different posteriors)."""
    root = tmp_path_factory.mktemp("bad")
    store = root / "s.zarr"
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(40, 3)) - 3, rng.normal(size=(40, 3)) + 3])
    FeatureStore.create(store, 3, chunk_rows=30).append(X)
    for name, k in (("a", "2"), ("b", "3")):
        res = runner.invoke(app, ["fit", str(store), "--run-dir", str(root / name), "-k", k,
                                  "--max-iter", "5", "-q"])
        assert res.exit_code == 0, res.output
    return root


@pytest.fixture
def run(fitted, tmp_path):
    """A private copy of run 'a' (in a versions/ folder, so it can be published)."""
    d = tmp_path / "out" / VERSIONS / "v0001-a"
    shutil.copytree(fitted / "a", d)
    return d


# One process runs every CLI case below through the console script's entry point (`app`, as the
# `vbcluster` script calls it), so the one-line handling of uncaught errors is exercised for real.
BATCH = r"""
import contextlib, io, json, sys
from pipeline.cli import app
out = {}
for name, argv in json.loads(sys.argv[1]).items():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            app(args=argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
    out[name] = [code, [ln for ln in buf.getvalue().splitlines() if ln.strip()]]
print(json.dumps(out))
"""


def _copy_run(fitted, dst):
    shutil.copytree(fitted / "a", dst)
    return dst


@pytest.fixture(scope="module")
def cli(fitted):
    """Bad inputs of every class, and what the CLI printed and returned for each."""
    d = fitted / "cli"
    d.mkdir()
    swapped = _copy_run(fitted, d / "swapped")
    shutil.copy2(fitted / "b" / "posterior.npz", swapped / "posterior.npz")
    trunc = _copy_run(fitted, d / "trunc")
    (trunc / RESULT).write_text((trunc / RESULT).read_text()[:40])
    meta = shutil.copytree(fitted / "s.zarr", d / "meta.zarr") / "features" / "zarr.json"
    meta.write_text(meta.read_text()[:50])
    (d / "empty.npy").write_bytes(b"")
    X = np.random.default_rng(0).normal(size=(20, 4))
    X[7, 2] = 2 * max_abs_value(4)  # finite even in float32, but its square sums overflow
    np.save(d / "big.npy", X)
    (d / "bad.yaml").write_text("cluster_class: distributed.LocalCluster\ncluster_kwargs:\n  n_worker: 1\n")
    with pytest.MonkeyPatch.context() as mp:  # a store as an older vbcluster wrote it (no checksums)
        mp.setattr(integrity, "compressors", lambda level, codec="zstd": [zarr.codecs.ZstdCodec(level=level)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", integrity.StoreIntegrityWarning)
            old = FeatureStore.create(d / "old.zarr", 3, chunk_rows=30)
            old.append(np.random.default_rng(1).normal(size=(40, 3)))
    (d / "resume").mkdir()
    (d / "resume" / "run.json").write_text('{"store": ')
    _value_sources(d)
    from pipeline.ingest import ingest

    np.save(d / "small.npy", np.random.default_rng(2).normal(size=(30, 3)))
    ingest(str(d / "small.npy"), d / "dup.zarr", chunk_rows=8)
    cases = {
        "swapped": ["assign", str(swapped)],
        "trunc": ["assign", str(trunc)],
        "meta": ["fit", str(d / "meta.zarr"), "--run-dir", str(d / "r1")],
        "empty": ["ingest", str(d / "empty.npy"), "--out", str(d / "e.zarr"), "-q"],
        "big": ["ingest", str(d / "big.npy"), "--out", str(d / "big.zarr"), "-q"],
        "yaml": ["fit", str(fitted / "s.zarr"), "--run-dir", str(d / "r2"), "--cluster", str(d / "bad.yaml"),
                 "-q"],
        "resume": ["resume", str(d / "resume")],
        "old": ["fit", str(d / "old.zarr"), "--run-dir", str(d / "r3"), "-k", "2", "--max-iter", "3", "-q"],
        "dup": ["ingest", str(d / "small.npy"), "--out", str(d / "dup.zarr"), "--append", "-q"],
        "dup_allowed": ["ingest", str(d / "small.npy"), "--out", str(d / "dup.zarr"), "--append",
                        "--allow-duplicate", "-q"],
        **{f"big_{kind}": ["ingest", str(d / f"big.{kind}"), "--out", str(d / f"big_{kind}.zarr"), "-q"]
           for kind in ("h5", "parquet", "csv")},
    }
    res = subprocess.run([sys.executable, "-c", BATCH, json.dumps(cases)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


def _value_sources(d):
    """HDF5, Parquet and CSV sources holding a float64 1e300 at row 7, column 2 (20 x 4)."""
    import h5py
    import pyarrow as pa
    import pyarrow.parquet as pq

    X = np.random.default_rng(3).normal(size=(20, 4))
    X[7, 2] = 1e300
    with h5py.File(d / "big.h5", "w") as f:
        f["x"] = X
    pq.write_table(pa.table({f"c{j}": X[:, j] for j in range(4)}), d / "big.parquet", row_group_size=5)
    np.savetxt(d / "big.csv", X, delimiter=",", header="c0,c1,c2,c3", comments="", fmt="%.17g")


def _one_line(cli, name, code=2):
    got_code, lines = cli[name]
    assert got_code == code and len(lines) == 1, (got_code, lines)
    return lines[0]


# ---- run integrity ------------------------------------------------------------------------------
def test_posterior_of_another_run_is_refused_by_every_reader(fitted, run, cli):
    out = run.parent.parent
    publish(out, run)  # published while intact
    assert plan_refresh(out, str(fitted / "s.zarr")).action == "skip"
    shutil.copy2(fitted / "b" / "posterior.npz", run / "posterior.npz")
    msg = r"posterior.npz does not match the posterior_sha256 recorded in .*result.json"
    with pytest.raises(InputError, match=msg):
        load_model(run)  # warm starts (pipeline.service) load through this
    with pytest.raises(InputError, match=msg):
        assign_store(run)
    with pytest.raises(InputError, match=msg):
        write_report([run])
    with pytest.raises(InputError, match=msg):
        publish(out, run)
    with pytest.raises(InputError, match=msg):  # the scheduled refresh does not skip over it either
        plan_refresh(out, str(fitted / "s.zarr"))
    assert "posterior.npz does not match the posterior_sha256" in _one_line(cli, "swapped")
    load_model(fitted / "a")  # the intact run still loads


def test_truncated_result_json_is_one_line(run, cli):
    text = (run / RESULT).read_text()
    (run / RESULT).write_text(text[: len(text) // 2])
    with pytest.raises(InputError, match=r"result.json: unreadable \(JSONDecodeError: .*\); the file is "
                       r"truncated or damaged"):
        read_result(run)
    assert "result.json: unreadable (JSONDecodeError" in _one_line(cli, "trunc")


def test_truncated_posterior_is_named(run):
    data = (run / "posterior.npz").read_bytes()
    (run / "posterior.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"posterior.npz does not match the posterior_sha256"):
        load_model(run)
    (run / RESULT).unlink()  # without result.json there is no digest: the load itself fails, named
    with pytest.raises(InputError, match=r"posterior.npz: unreadable posterior \(BadZipFile"):
        load_model(run)


# ---- bad stores ---------------------------------------------------------------------------------
def _store(tmp_path, fitted):
    s = tmp_path / "s.zarr"
    shutil.copytree(fitted / "s.zarr", s)
    return s


def test_truncated_array_metadata_is_one_line(fitted, tmp_path, cli):
    s = _store(tmp_path, fitted)
    meta = s / "features" / "zarr.json"
    meta.write_text(meta.read_text()[:50])
    with pytest.raises(StoreError, match=r"features/zarr.json: unreadable Zarr metadata \(JSONDecodeError"):
        FeatureStore.open(s)
    assert "features/zarr.json: unreadable Zarr metadata" in _one_line(cli, "meta")


def test_bad_size_attribute_is_named(fitted, tmp_path):
    s = _store(tmp_path, fitted)
    body = json.loads((s / "zarr.json").read_text())
    body["attributes"]["n_rows"] = "abc"
    (s / "zarr.json").write_text(json.dumps(body))
    with pytest.raises(StoreError, match=r"zarr.json: attribute 'n_rows' must be an integer >= 0, got 'abc'"):
        FeatureStore.open(s)
    res = runner.invoke(app, ["check", str(s)])
    assert res.exit_code == 2 and "'n_rows' must be an integer" in res.output


def test_empty_npy_is_one_line(fitted, cli):
    assert _one_line(cli, "empty") == (f"error: {fitted / 'cli' / 'empty.npy'}: the file is empty (0 bytes); "
                                       "it was not written completely")


# ---- cluster configs ------------------------------------------------------------------------------
def test_misspelt_cluster_kwargs_key_fails_before_any_worker_starts(tmp_path, fitted, cli):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("cluster_class: distributed.LocalCluster\ncluster_kwargs:\n  n_worker: 1\n"
                   "  processes: false\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: key 'cluster_kwargs.n_worker': not an argument of "
                       r"distributed.LocalCluster or its workers \(did you mean 'n_workers'\?\)"):
        load_cluster_config(cfg).make_cluster()
    assert "key 'cluster_kwargs.n_worker': not an argument" in _one_line(cli, "yaml")
    # keys the workers take are accepted
    from pipeline.engine.cluster import ClusterConfig

    ok = ClusterConfig.from_dict({"cluster_class": "distributed.LocalCluster", "cluster_kwargs": {
        "n_workers": 1, "processes": False, "memory_limit": "1GB", "nthreads": 1, "local_directory": "/tmp"}})
    cluster = ok.make_cluster()
    cluster.close()


# ---- failed writes (disk full, permission) --------------------------------------------------------
def test_disk_full_while_writing_a_run_file_names_it(tmp_path):
    def full(f):
        f.write(b"{")
        raise OSError(errno.ENOSPC, "No space left on device")  # what write(2) raises on a full disk

    with pytest.raises(OSError, match=r"No space left on device \(writing .*result.json\)") as info:
        write_atomic(tmp_path / RESULT, full)
    assert info.value.filename == str(tmp_path / RESULT) and exit_code(info.value) == 1
    assert list(tmp_path.iterdir()) == []  # no temp file left
    assert exit_code(PermissionError(errno.EACCES, "Permission denied", "/x")) == 1
    assert exit_code(FileNotFoundError(errno.ENOENT, "No such file", "/x")) == 2
    assert exit_code(StoreError("bad")) == 2


def test_disk_full_while_appending_names_the_store_and_rolls_back(fitted, tmp_path):
    s = _store(tmp_path, fitted)
    store = FeatureStore.open(s, "r+")
    before = store.fingerprint

    def batches():
        yield np.zeros((5, 3)), None, None
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match=rf"No space left on device \(appending to the store; rolled back\): "
                       rf"'{s}'"):
        store.append_batches(batches())
    after = FeatureStore.open(s)
    assert after.n_rows == 80 and after.fingerprint == before


# ---- values near the float32 limit --------------------------------------------------------------
def test_values_beyond_float32_accumulation_are_refused_with_the_source_value(tmp_path, cli):
    from pipeline.ingest import ingest

    X = np.random.default_rng(0).normal(size=(20, 4))
    X[7, 2] = 1e300  # finite in float64, inf in float32
    np.save(tmp_path / "big.npy", X)
    with pytest.raises(InputError, match=r"value 1e\+300 at row 7, column 2 is too large"):
        ingest(str(tmp_path / "big.npy"), tmp_path / "big.zarr")
    line = _one_line(cli, "big")  # (2 x the limit: finite even in float32, but its square sums overflow)
    assert "at row 7, column 2 is too large" in line and "inf" not in line
    X[7, 2] = 0.5 * max_abs_value(4)  # within the limit: ingested
    np.save(tmp_path / "big.npy", X)
    ingest(str(tmp_path / "big.npy"), tmp_path / "ok.zarr")
    assert FeatureStore.open(tmp_path / "ok.zarr").n_rows == 20


@pytest.mark.parametrize("kind", ["h5", "parquet", "csv"])
def test_readers_report_the_source_value_not_its_float32_cast(fitted, cli, kind):
    """HDF5, Parquet and CSV are checked before the cast to float32: 1e300, not "inf"."""
    from pipeline.ingest import ingest

    d = fitted / "cli"
    with pytest.raises(InputError, match=rf"big\.{kind}: value 1e\+300 at row 7, column 2 is too large"):
        ingest(str(d / f"big.{kind}"), d / f"big_{kind}_api.zarr", chunk_rows=4)  # (several batches)
    assert not (d / f"big_{kind}_api.zarr").exists()
    line = _one_line(cli, f"big_{kind}")
    assert re.search(rf"big\.{kind}: value 1e\+300 at row 7, column 2 is too large: float32 "
                     r"accumulation over 4 features overflows beyond \|x\| = 2\.55e\+16", line), line


def test_values_at_the_limit_fit_and_beyond_it_do_not(monkeypatch):
    """The limit is real: float32 rows as large as the limit fit; 100 times larger, float32 sums
    overflow (unchecked, the fit fails with a misleading prior error), so they are refused naming row,
    column and value; as float64 the same rows compute in float64 and fit."""
    from pipeline import VBMixture

    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(100, 8)) * 0.1 + 0.5, rng.normal(size=(100, 8)) * 0.1 - 0.5])
    X = X / np.abs(X).max()
    lim = max_abs_value(8)
    m = VBMixture(3, covariance_type="diag", max_iter=20, random_state=0).fit((X * lim).astype(np.float32))
    assert np.isfinite(m.lower_bound_)
    big = (X * lim * 100).astype(np.float32)
    with monkeypatch.context() as mp, np.errstate(all="ignore"):  # what the refusal prevents
        mp.setattr("vbcore.data.validation.check_magnitude", lambda *a, **k: None)
        with pytest.raises(ConfigError, match="non-finite"):
            VBMixture(3, covariance_type="diag", max_iter=20, random_state=0).fit(big)
    row, col = np.unravel_index(np.argmax(np.abs(big) > lim), big.shape)
    with pytest.raises(InputError, match=rf"X: value {re.escape(repr(big[row, col].item()))} at row {row}, "
                       rf"column {col} is too large: float32 accumulation over 8 features .* or pass "
                       r"float64 data \(X\.astype\(np\.float64\)\)"):
        VBMixture(3, covariance_type="diag", max_iter=20, random_state=0).fit(big)
    with pytest.raises(InputError, match=r"too large: float32 accumulation"):
        m.predict(big)
    m64 = VBMixture(3, covariance_type="diag", max_iter=20, random_state=0).fit(big.astype(np.float64))
    assert np.isfinite(m64.lower_bound_)
    np.testing.assert_array_equal(m64.predict(big.astype(np.float64)), m.predict(X * lim))


@pytest.mark.parametrize("value, dtype, shown", [
    (1e100, np.float64, None), (1e200, np.float64, "1e+200"), (10**200, object, "1e+200"),
    (1e20, np.float32, "1.0000000200408773e+20"),
])
def test_arrays_meet_the_limit_of_their_own_dtype(value, dtype, shown):
    """float64 arrays (and others, converted to float64) compute in float64: 1e100 fits, beyond about
    1e150 (float64's largest over the accumulation, 3 features) is refused naming the value; float32
    arrays meet the float32 limit."""
    from vbcore.data.validation import check_array_2d

    X = np.random.default_rng(0).normal(size=(6, 3)).astype(dtype)
    X[4, 1] = value
    if shown is None:
        assert check_array_2d(X)[4, 1] == value
        return
    acc = "float32" if dtype == np.float32 else "float64"
    limit = max_abs_value(3, acc)
    assert limit < abs(float(value))
    with pytest.raises(InputError, match=rf"X: value {re.escape(shown)} at row 4, column 1 is too large: "
                       rf"{acc} accumulation over 3 features overflows beyond \|x\| = "
                       rf"{re.escape(f'{limit:.3g}')}; rescale"):
        check_array_2d(X)


def test_truncated_run_json_is_one_line_naming_it(fitted, cli):
    line = _one_line(cli, "resume")
    assert "run.json: unreadable" in line and str(fitted / "cli" / "resume") in line


UNHANDLED = """
import sys
from pipeline.cli import app

@app.command()
def boom() -> None:
    raise RuntimeError("an error no command handles")

sys.argv = ["vbcluster", *sys.argv[1:]]
app()
"""


def test_debug_shows_the_traceback():
    """An error no command handles is one line; --debug shows the traceback instead."""
    res = subprocess.run([sys.executable, "-c", UNHANDLED, "boom"], capture_output=True, text=True)
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "run with --debug" in res.stderr
    res = subprocess.run([sys.executable, "-c", UNHANDLED, "boom", "--debug"], capture_output=True, text=True)
    assert "Traceback" in res.stderr and "an error no command handles" in res.stderr


def test_store_without_checksums_warns_once_in_one_line(fitted, cli):
    code, lines = cli["old"]
    warned = [ln for ln in lines if ln.startswith("warning:") and "checksums" in ln]
    assert code == 0 and len(warned) == 1, lines
    old = fitted / "cli" / "old.zarr"
    assert warned[0] == (f"warning: {old} has no chunk checksums (written by an older vbcluster): "
                         f"corrupted chunks cannot be detected; run `vbcluster check {old} --upgrade` "
                         "to add them")


def test_a_duplicate_append_is_one_line_through_the_cli(fitted, cli):
    d = fitted / "cli"
    line = _one_line(cli, "dup")
    assert re.fullmatch(rf"error: {re.escape(str(d / 'dup.zarr'))}: {re.escape(str(d / 'small.npy'))} was "
                        r"already appended to this store on \S+ \(30 rows, as '.*small\.npy'; same source "
                        r"fingerprint [0-9a-f]{12}\); pass --allow-duplicate \(allow_duplicate=True\) to "
                        r"append it again", line), line
    assert cli["dup_allowed"][0] == 0 and FeatureStore.open(d / "dup.zarr").n_rows == 60
