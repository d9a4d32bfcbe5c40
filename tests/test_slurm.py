"""The HPC path on a real scheduler (issue 56): Dask workers as batch jobs of a throwaway SLURM on this
machine (the session fixture ``slurm``, tests/_slurm.py; skipped, with the reason, where it cannot
start), through ``cluster_config/slurm-local.yaml``:

* a fit on two SLURM jobs equals the in-process fit bit for bit, and slurmctld allocated the jobs;
* a worker job ``scancel``-ed mid-fit is submitted again (vbcluster keeps a batch-job cluster at its
  planned size), the fit goes on over the survivor and the new job, with the same bits;
* an extraction of an image folder on SLURM workers writes the store that the in-process one writes;
* ``vbcluster deploy`` with the SLURM config, on a real ``prefect server``, publishes one refresh.

The references run with one BLAS thread, as the workers do (a nanny sets OPENBLAS_NUM_THREADS=1).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import dask
import httpx
import numpy as np
import pytest
import yaml
from threadpoolctl import threadpool_limits

from pipeline import VBMixture
from pipeline.engine.cluster import close_client, load_cluster_config
from pipeline.ingest import ingest
from pipeline.store.features import FeatureStore

ROOT = Path(__file__).resolve().parents[1]
N_ROWS, N_FEATURES, CHUNK_ROWS = 12_000, 16, 1_000
FIT = dict(n_components=8, covariance_type="diag", max_iter=12, tol=0.0, random_state=0)
POSTERIOR = ("means_", "covariances_", "weights_", "precisions_cholesky_", "lower_bounds_")
WAIT_S = 120.0  # a job's worker joins in 3-5 s here


def slurm_config(tmp_path: Path, **kwargs: Any) -> Path:
    """cluster_config/slurm-local.yaml with its job logs under ``tmp_path`` (and ``kwargs`` on top)."""
    doc = yaml.safe_load((ROOT / "cluster_config" / "slurm-local.yaml").read_text())
    doc["cluster_kwargs"].update(log_directory=str(tmp_path / "slurm-logs"), **kwargs)
    path = tmp_path / "slurm.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def on_slurm(slurm):
    """The session's SLURM, idle, with SLURM_CONF set for dask-jobqueue's sbatch / scancel calls."""
    slurm.wait_idle()
    with slurm.use():
        yield slurm


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    rng = np.random.default_rng(7)
    centres = rng.normal(0.0, 0.25, size=(12, N_FEATURES))
    rows = (centres[rng.integers(0, 12, N_ROWS)] + rng.normal(size=(N_ROWS, N_FEATURES))).astype(np.float32)
    path = tmp_path_factory.mktemp("slurm-data") / "blobs.zarr"
    FeatureStore.create(path, N_FEATURES, chunk_rows=CHUNK_ROWS, labels=False).append(rows)
    return str(path)


@pytest.fixture(scope="module")
def reference(store: str) -> VBMixture:
    with threadpool_limits(limits=1, user_api="blas"):
        return VBMixture(engine="local", **FIT).fit(store)


def _assert_same_bits(got: VBMixture, want: VBMixture) -> None:
    for name in POSTERIOR:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert got.n_iter_ == want.n_iter_ == FIT["max_iter"] and got.lower_bound_ == want.lower_bound_


def _allocated(slurm) -> list[str]:
    return sorted(slurm.started(), key=int)


def _job_ids(client) -> set[str]:
    """The SLURM job of every worker of ``client``."""
    return set(client.run(lambda: os.environ.get("SLURM_JOB_ID", "")).values())


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.timeout(300)
def test_a_fit_on_slurm_jobs_equals_the_in_process_fit(on_slurm, store, reference, tmp_path):
    before = set(_allocated(on_slurm))
    model = VBMixture(engine=str(slurm_config(tmp_path)), **FIT).fit(store)
    _assert_same_bits(model, reference)
    jobs = sorted(set(_allocated(on_slurm)) - before, key=int)
    assert len(jobs) == 2, jobs  # scale: {jobs: 2}, one worker each
    logs = sorted(p.name for p in (tmp_path / "slurm-logs").iterdir())  # log_directory: dask-worker-<jobid>
    assert logs == sorted(f"dask-worker-{j}.{ext}" for j in jobs for ext in ("err", "out")), logs


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.timeout(400)
def test_a_job_scancelled_mid_fit_is_replaced_with_the_same_bits(on_slurm, store, reference, tmp_path):
    """``scancel`` of one worker job after iteration 3: the pass in flight goes on over the survivor;
    the lost job is submitted again (``distributed.deploy.lost-worker-timeout`` after its worker left,
    1 s here, 15 s by default) and its worker joins; iterations 7 to 12 run on the survivor and the new
    job. The posterior is the uninterrupted fit's."""
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1s"}):
        client = load_cluster_config(slurm_config(tmp_path)).connect()
    try:
        client.wait_for_workers(2, timeout=WAIT_S)
        first = _job_ids(client)
        state: dict[str, Any] = {}

        def callback(info: dict[str, Any]) -> None:
            it = info.get("iteration")
            if it == 3:
                state["victim"] = victim = sorted(first, key=int)[0]
                on_slurm.run("scancel", victim)
            elif it == 6:  # hold the fit until the replacement's worker has joined
                deadline = time.monotonic() + WAIT_S
                while not (len(ids := _job_ids(client)) == 2 and not ids & {state["victim"]}):
                    assert time.monotonic() < deadline, f"no replacement job: workers on {ids}"
                    time.sleep(0.5)
                state["after"] = ids

        model = VBMixture(engine=client, **FIT).fit(store, callback=callback)
        survivor, replacement = first - {state["victim"]}, state["after"] - first
        assert survivor < state["after"] and len(replacement) == 1, state
        assert int(next(iter(replacement))) > max(int(j) for j in first)
        _assert_same_bits(model, reference)
    finally:
        close_client(client)


@pytest.mark.timeout(300)
def test_an_extraction_on_slurm_workers_equals_the_in_process_one(on_slurm, tmp_path):
    from tests._extract_helpers import make_images, write_tiny_cnn

    model = tmp_path / "tiny.onnx"
    write_tiny_cnn(model, seed=0)
    make_images(tmp_path / "imgs", 40, seed=3, classes=3)
    opts = dict(extractor="onnx", model=str(model), output="feat", labels="folders", chunk_rows=16,
                batch_images=4, shard_images=8)
    local = ingest(str(tmp_path / "imgs"), tmp_path / "local", **opts)
    remote = ingest(str(tmp_path / "imgs"), tmp_path / "slurm", cluster=str(slurm_config(tmp_path)), **opts)
    assert (local.workers, remote.shards, remote.rows_written) == (0, 5, 40) and remote.workers >= 1
    a, b = FeatureStore.open(tmp_path / "local"), FeatureStore.open(tmp_path / "slurm")
    np.testing.assert_array_equal(a.read(), b.read())
    np.testing.assert_array_equal(a.read_labels(), b.read_labels())
    assert list(a.read_ids()) == list(b.read_ids()) and a.fingerprint == b.fingerprint


@pytest.mark.prefect_server
@pytest.mark.timeout(400)
def test_vbcluster_deploy_with_a_slurm_config_publishes_a_refresh(on_slurm, tmp_path):
    """A real ``prefect server`` and ``vbcluster deploy --cluster slurm.yaml`` serving its schedule (as
    tests/test_deploy.py does on a LocalCluster): the first scheduled refresh fits on SLURM jobs and
    publishes a version (about 30 s for the server, 40 s for the refresh here)."""
    from pipeline.runs.directory import read_result
    from pipeline.runs.publish import latest
    from tests._dask_procs import free_port
    from tests.test_deploy import _stop, _wait

    rng = np.random.default_rng(1)
    store = tmp_path / "s.zarr"
    FeatureStore.create(store, 4, chunk_rows=500, labels=False).append(
        (rng.normal(size=(1500, 4)) + 6 * rng.integers(0, 3, (1500, 1))).astype(np.float32))
    cfg, out, port = slurm_config(tmp_path), tmp_path / "pub", free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in on_slurm.env.items() if not k.startswith("PREFECT_")}
    (tmp_path / "home").mkdir()
    env.update(PREFECT_HOME=str(tmp_path / "home"), PREFECT_API_URL=api,
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2",
               PREFECT_RUNNER_POLL_FREQUENCY="1", PREFECT_SERVER_UI_ENABLED="false", MPLBACKEND="Agg")
    bin_dir = Path(sys.executable).parent
    logs = [tmp_path / "server.log", tmp_path / "serve.log"]
    procs: list[subprocess.Popen] = []
    before = set(_allocated(on_slurm))
    try:
        server = [str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port),
                  "--no-ui", "--analytics-off"]
        with open(logs[0], "wb") as f:
            procs.append(subprocess.Popen(server, env=env, stdout=f, stderr=subprocess.STDOUT,
                                          start_new_session=True, cwd=tmp_path))

        def healthy() -> bool:
            try:
                return httpx.get(f"{api}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait("the Prefect server's /api/health", healthy, 150, procs, logs[:1])
        deploy = [str(bin_dir / "vbcluster"), "deploy", str(store), "--out", str(out), "--interval", "10",
                  "-k", "4", "--max-iter", "5", "--cluster", str(cfg), "--name", "slurm-refresh"]
        with open(logs[1], "wb") as f:
            procs.append(subprocess.Popen(deploy, env=env, stdout=f, stderr=subprocess.STDOUT,
                                          start_new_session=True, cwd=tmp_path))
        _wait("the first published version", lambda: latest(out) is not None, 240, procs, logs)
        result = read_result(latest(out))
        assert result["n_rows"] == 1500 and result["refresh"]["action"] == "cold"
        assert len(set(_allocated(on_slurm)) - before) >= 2  # the refresh's fit ran on SLURM jobs
    finally:
        for p in reversed(procs):
            _stop(p)


def test_the_harness_stops_by_pid(slurm):
    """The daemons are this process's children, stopped by their ids (tests/_slurm.py)."""
    assert set(slurm.procs) == {"munged", "slurmctld", "slurmd"}
    assert all(p.poll() is None for p in slurm.procs.values())
    out = subprocess.run(["sinfo", "-h", "-o", "%P %a %D"], env=slurm.env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["debug*", "up", "1"]
    assert threading.current_thread() is threading.main_thread()


def test_without_slurm_the_harness_says_why(monkeypatch, tmp_path):
    """Where slurm-wlm is missing (or this is not root) the fixture skips with this reason."""
    from tests import _slurm

    monkeypatch.setattr(_slurm, "SBIN", ())
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = _slurm.unavailable_reason()
    assert reason is not None
    assert ("munged, slurmctld, slurmd, sbatch, squeue, scancel, sinfo not installed (Debian: apt-get "
            "install -y slurm-wlm munge" in reason) or "not root" in reason
