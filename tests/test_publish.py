"""Versioned run directories, the atomic `latest` link, and the refresh plan (cold / warm / skip)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.estimator import load_model
from pipeline.runs.directory import read_result
from pipeline.runs.publish import claim_version, latest, plan_refresh, publish, version_dirs
from pipeline.service import fit_run, make_spec, warm_start_problem
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError, InputError, StoreError


def _store(path, rows, seed=0):
    rng = np.random.default_rng(seed)
    s = FeatureStore.create(path, 3, chunk_rows=128, labels=True)
    y = rng.integers(0, 3, size=rows)
    s.append((np.eye(3)[y] * 8 + rng.normal(size=(rows, 3))).astype(np.float32), labels=y)
    return str(path)


def test_claim_version_numbers_and_reuses_keys(tmp_path):
    a = claim_version(tmp_path, "run-a")
    b = claim_version(tmp_path, "run-b")
    assert (a.name, b.name) == ("v0001-run-a", "v0002-run-b")
    assert claim_version(tmp_path, "run-a") == a  # a retried run gets its directory back
    assert claim_version(tmp_path, "x/../y").name == "v0003-x-..-y"
    assert [p.name for p in version_dirs(tmp_path)] == ["v0001-run-a", "v0002-run-b", "v0003-x-..-y"]


def test_publish_moves_latest_only_to_finished_runs(tmp_path):
    store = _store(tmp_path / "s.zarr", 300)
    out = tmp_path / "out"
    v1 = claim_version(out, "a")
    fit_run(v1, make_spec(store, components=4, max_iter=20))
    publish(out, v1)
    assert latest(out) == v1.resolve() and (out / "latest").is_symlink()
    v2 = claim_version(out, "b")  # not fitted yet
    with pytest.raises(InputError, match=r"v0002-b: no result\.json; only a finished run can be published"):
        publish(out, v2)
    assert latest(out) == v1.resolve()
    other = tmp_path / "elsewhere"
    fit_run(other, make_spec(store, components=4, max_iter=5))
    with pytest.raises(InputError, match=r"elsewhere is not a version directory of"):
        publish(out, other)
    assert latest(out) == v1.resolve()


def test_plan_refresh_and_warm_start(tmp_path):
    store = _store(tmp_path / "s.zarr", 300)
    out = tmp_path / "out"
    with pytest.raises(StoreError, match=r"no such feature store"):
        plan_refresh(out, str(tmp_path / "nope.zarr"))
    assert plan_refresh(out, store).action == "cold"
    v1 = claim_version(out, "a")
    spec = make_spec(store, components=4, max_iter=30)
    fit_run(v1, spec)
    publish(out, v1)
    p = plan_refresh(out, store)
    assert p.action == "skip" and "unchanged" in p.reason
    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, size=100)
    FeatureStore.open(store, "r+").append((np.eye(3)[y] * 8 + rng.normal(size=(100, 3))).astype(np.float32),
                                          labels=y)
    p = plan_refresh(out, store)
    assert (p.action, p.previous_n_rows, p.n_rows) == ("warm", 300, 400) and p.previous == str(v1.resolve())
    # the warm start begins from the published posterior exactly (max_iter=0: no update yet)
    v0 = tmp_path / "zero"
    kept = dict(covariance=None, priors=None, reg_covar=None)  # None: v1's (kept) model (make_spec)
    r0 = fit_run(v0, make_spec(store, v1, components=4, max_iter=0, **kept), warm_from=v1)
    assert r0["warm_start_from"] == str(v1.resolve()) and r0["n_iter"] == 0
    np.testing.assert_array_equal(load_model(v0).means_, load_model(v1).means_)
    v2 = claim_version(out, "b")
    r2 = fit_run(v2, make_spec(store, v1, components=4, max_iter=30, **kept), warm_from=v1)
    assert r2["n_rows"] == 400 and read_result(v2)["warm_start_from"] == str(v1.resolve())
    # settings that do not fit the previous posterior are refused for a warm start, with the reason
    assert "n_components 4 -> 5" in warm_start_problem(v1, make_spec(store, components=5))
    with pytest.raises(ConfigError, match=r"cannot warm-start from .*n_components 4 -> 5"):
        fit_run(tmp_path / "bad", make_spec(store, components=5), warm_from=v1)


def test_a_latest_that_vbcluster_did_not_write_is_refused(tmp_path):
    """`latest` dangling, pointing out of OUT/versions, or a plain directory (issue 29): the refresh
    plan refuses in one line naming it, instead of a cold fit, a skip for ever or an unpublished version."""
    import os

    store = _store(tmp_path / "s.zarr", 300)
    out = tmp_path / "out"
    v1 = claim_version(out, "a")
    fit_run(v1, make_spec(store, components=4, max_iter=10))
    link = out / "latest"
    # a finished run elsewhere whose store matches: the plan said "skip" for ever
    other = tmp_path / "elsewhere"
    fit_run(other, make_spec(store, components=4, max_iter=5))
    os.symlink(other, link)
    with pytest.raises(InputError, match=r"out/latest points at .*elsewhere, which is not a version "
                                         r"directory of .*out/versions; point it at one"):
        plan_refresh(out, store)
    link.unlink()
    os.symlink("versions/v0009-gone", link)  # dangling: the plan said "cold"
    with pytest.raises(InputError, match=r"out/latest points at versions/v0009-gone, which does not exist"):
        plan_refresh(out, store)
    link.unlink()
    link.mkdir()  # a plain directory: a cold fit, and a publication that failed
    (link / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"out/latest is a directory, not the symbolic link vbcluster "
                                         r"publishes; move it away"):
        plan_refresh(out, store)
    with pytest.raises(InputError, match=r"out/latest is a directory"):
        publish(out, v1)
    assert (link / "notes.txt").read_text() == "mine"
    link.joinpath("notes.txt").unlink()
    link.rmdir()
    publish(out, v1)  # the link vbcluster writes is accepted
    assert latest(out) == v1.resolve() and plan_refresh(out, store).action == "skip"
