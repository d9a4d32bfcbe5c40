"""Real Prefect flow runs (one ephemeral API per session, see conftest.prefect_api): cluster_flow end
to end, a retried flow run and a SIGKILLed flow run both resuming from their checkpoints to the same
bits as an uninterrupted run, cluster_flow on a LocalCluster from cluster_config/local.yaml,
ingest_flow, study_flow."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from prefect.client.orchestration import get_client

from flows.cluster import cluster_flow
from flows.ingest import ingest_flow, ingest_source
from flows.study import available_studies, run_studies
from pipeline.estimator import load_model
from pipeline.ingest import ingest
from pipeline.runs.directory import read_result
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError, StoreError

pytestmark = pytest.mark.usefixtures("prefect_api")
ROOT = Path(__file__).resolve().parents[1]
KW = dict(learner="vbem", components=15, covariance="diag", max_iter=20, tol=0.0, seed=0,
          checkpoint_every=5, quiet=True)


@pytest.fixture(scope="module")
def digits_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("flows") / "digits.zarr"
    ingest("digits", path, chunk_rows=400)
    return str(path)


@pytest.fixture(scope="module")
def reference(digits_store, tmp_path_factory):
    """An uninterrupted cluster_flow run."""
    run = tmp_path_factory.mktemp("ref") / "run"
    cluster_flow(digits_store, str(run), assign_labels=False, write_report=False, **KW)
    return run


def _arrays(run: Path) -> dict[str, np.ndarray]:
    with np.load(run / "posterior.npz") as z:
        return {k: z[k] for k in z.files if k != "meta"}


def _same_bits(a: Path, b: Path) -> None:
    x, y = _arrays(a), _arrays(b)
    assert sorted(x) == sorted(y)
    for k in x:
        assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k
    assert read_result(a)["elbo_history"] == read_result(b)["elbo_history"]


def _flow_run(flow_run_id):
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def test_cluster_flow_fits_assigns_and_reports(digits_store, reference, tmp_path):
    run = tmp_path / "run"
    state = cluster_flow(digits_store, str(run), return_state=True, **KW)
    assert state.is_completed(), state
    out = state.result()
    r = read_result(run)
    assert out["n_iter"] == r["n_iter"] == 20 and r["n_rows"] == 1797 and 1 <= r["n_effective"] <= 15
    assert 0.5 < r["metrics"]["nmi"] <= 1
    _same_bits(run, reference)  # the flow's fit is the plain fit
    # assignments next to the store are the model's MAP labels
    g = zarr.open_group(out["assignments"], mode="r")
    X = FeatureStore.open(digits_store).read()
    np.testing.assert_array_equal(g["labels"][:], load_model(run).predict(X))
    # the report, with its PNGs beside it and embedded
    html = Path(out["report"]).read_text()
    assert "clusters read from" in html  # the report used the assignments the flow wrote
    assert html.count("data:image/png;base64,") == 4  # ELBO, sizes, contingency, PCA
    assert {p.name for p in Path(out["report"]).parent.glob("*.png")} == {
        "elbo.png", "run0-sizes.png", "run0-contingency.png", "run0-pca.png"}
    # the structured per-iteration log
    records = [json.loads(line) for line in (run / "iterations.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in records] == list(range(1, 21))
    assert [x["elbo"] for x in records] == r["elbo_history"]
    assert all(x["learner"] == "vbem" and 1 <= x["n_effective"] <= 15 and x["seconds"] > 0 for x in records)
    fr = _flow_run(state.state_details.flow_run_id)
    assert fr.state.is_completed() and fr.run_count == 1


def test_a_retried_flow_run_resumes_from_its_checkpoint(digits_store, reference, tmp_path, monkeypatch):
    """The first attempt fails mid-fit (disk full while writing the checkpoint of iteration 10);
    Prefect retries the flow run, whose fit resumes from the checkpoint of iteration 5 and ends with
    the uninterrupted run's bits."""
    real = np.savez
    calls = []

    def disk_full_once(*a, **k):
        calls.append(1)
        if len(calls) == 2:  # the second checkpoint (iteration 10) of the first attempt
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*a, **k)

    monkeypatch.setattr(np, "savez", disk_full_once)
    run = tmp_path / "run"
    state = cluster_flow(digits_store, str(run), assign_labels=False, write_report=False,
                         return_state=True, **KW)
    monkeypatch.setattr(np, "savez", real)
    assert state.is_completed(), state
    fr = _flow_run(state.state_details.flow_run_id)
    assert fr.run_count == 2  # one failed attempt, one retry, one flow run
    r = read_result(run)
    assert Path(r["resumed_from"]).name == "ckpt-00000005"
    _same_bits(run, reference)


def test_a_killed_flow_run_resumes_when_run_again(digits_store, reference, tmp_path, prefect_api):
    """A flow run in its own process is SIGKILLed mid-fit (while a checkpoint is being written);
    running the flow again on the same run directory takes over the stale lock, resumes from the
    newest valid checkpoint and ends with the uninterrupted run's bits."""
    run = tmp_path / "run"
    code = ("import sys; from flows.cluster import cluster_flow; "
            f"cluster_flow(sys.argv[1], sys.argv[2], assign_labels=False, write_report=False, **{KW!r})")
    env = dict(os.environ, PREFECT_API_URL=prefect_api, VBCLUSTER_CHECKPOINT_PAUSE="1.0")
    proc = subprocess.Popen([sys.executable, "-c", code, digits_store, str(run)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    try:
        while not (run / "checkpoints" / "ckpt-00000005").is_dir():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.05)
        time.sleep(0.5)  # inside the pause of the next checkpoint's write (state written, no manifest)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (run / "result.json").exists()  # it really died mid-fit
    assert (run / ".lock").exists()  # ... holding the run's lock
    out = cluster_flow(digits_store, str(run), assign_labels=False, write_report=False, **KW)
    assert Path(out["resumed_from"]).name in ("ckpt-00000005", "ckpt-00000010")
    assert out["took_over_lock_of"]["pid"] == proc.pid
    _same_bits(run, reference)


def test_cluster_flow_on_a_local_cluster_from_cluster_config(digits_store, tmp_path, capfd):
    run = tmp_path / "run"
    out = cluster_flow(digits_store, str(run), cluster=str(ROOT / "cluster_config" / "local.yaml"),
                       write_report=False, **dict(KW, max_iter=8, quiet=False))
    err = capfd.readouterr().err
    assert "Dask cluster (distributed.LocalCluster): tcp://127.0.0.1:" in err and "dashboard: http" in err
    r = read_result(run)
    assert r["n_iter"] == 8 and r["metrics"]["nmi"] > 0.3
    assert zarr.open_group(out["assignments"], mode="r")["labels"].shape == (1797,)


def test_cluster_flow_refuses_a_missing_store(tmp_path):
    with pytest.raises(StoreError, match=r"no such feature store"):
        cluster_flow(str(tmp_path / "nope.zarr"), str(tmp_path / "run"), **KW)
    assert not (tmp_path / "run").exists()


def test_ingest_flow_creates_then_appends_and_a_retry_does_not_append_twice(tmp_path):
    X = np.random.default_rng(0).normal(size=(500, 6)).astype(np.float32)
    np.save(tmp_path / "a.npy", X[:300])
    np.save(tmp_path / "b.npy", X[300:])
    out = str(tmp_path / "s.zarr")
    res = ingest_flow([str(tmp_path / "a.npy"), str(tmp_path / "b.npy")], out, chunk_rows=64, quiet=True)
    assert res["n_rows"] == 500 and [s["rows_written"] for s in res["sources"]] == [300, 200]
    np.testing.assert_array_equal(FeatureStore.open(out).read(), X)

    from prefect import flow

    @flow
    def retry_after_commit() -> dict:
        # what a retried task sees when its first attempt committed the append and then failed
        return ingest_source(str(tmp_path / "b.npy"), out, 1, True, False, {"chunk_rows": 64}, True)

    again = retry_after_commit()
    assert again["already_done"] and FeatureStore.open(out).n_rows == 500


def test_study_flow_refuses_an_unknown_study(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown study 'no_such_study': no module pipeline\.studies"):
        run_studies("no_such_study", str(tmp_path))
    with pytest.raises(ConfigError, match=r"study name '../x' is not a module name"):
        run_studies("../x", str(tmp_path))
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif("seed001" not in available_studies(),
                    reason="pipeline.studies.seed001 is not on this branch (it lands with issue 5b)")
def test_study_flow_runs_a_quick_study(tmp_path):
    (path,) = run_studies(["seed001"], str(tmp_path), quick=True, seed=0)
    assert Path(path).is_dir() and any(Path(path).iterdir())


@pytest.mark.skipif("seed001" not in available_studies(),
                    reason="pipeline.studies.seed001 is not on this branch (it lands with issue 5b)")
def test_study_flow_spreads_studies_over_a_dask_cluster(tmp_path):
    """prefect-dask's DaskTaskRunner on a LocalCluster from cluster_config/local.yaml."""
    (path,) = run_studies("seed001", str(tmp_path), quick=True, seed=0,
                          cluster=str(ROOT / "cluster_config" / "local.yaml"))
    assert Path(path).is_dir() and any(Path(path).iterdir())
