"""`vbcluster deploy`: bad input refused with nothing changed; and (marked prefect_server, about a
minute or two) a real `prefect server start` on 127.0.0.1, the deployment served with a short
interval, rows appended between scheduled runs: at least two runs complete, the first publishes a
cold-started version, a later one warm-starts from it after the append, `latest` follows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.schedule import deploy
from pipeline.runs.directory import read_result
from pipeline.runs.publish import latest, version_dirs
from pipeline.store.features import FeatureStore
from tests._dask_procs import free_port
from vbcore.errors import ConfigError, StoreError

runner = CliRunner()
BIN = Path(sys.executable).parent


def _store(path: Path, rows: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=6.0, size=(4, 5))
    y = rng.integers(0, 4, size=rows)
    s = FeatureStore.create(path, 5, chunk_rows=256, labels=True)
    s.append((centres[y] + rng.normal(size=(rows, 5))).astype(np.float32), labels=y)
    return str(path)


def _append(path: str, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(scale=6.0, size=(4, 5))
    y = rng.integers(0, 4, size=rows)
    FeatureStore.open(path, "r+").append((centres[y] + rng.normal(size=(rows, 5))).astype(np.float32),
                                         labels=y)


def test_bad_cron_missing_store_and_no_schedule_are_refused(tmp_path):
    store = _store(tmp_path / "s.zarr", 300)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ConfigError, match=r"--cron '0 2 \* \*' does not parse as a cron schedule"):
        deploy(store, cron="0 2 * *")
    with pytest.raises(ConfigError, match=r"--cron '61 \* \* \* \*' does not parse"):
        deploy(store, cron="61 * * * *")
    with pytest.raises(StoreError, match=r"nope\.zarr: no such feature store"):
        deploy(str(tmp_path / "nope.zarr"), cron="0 2 * * *")
    with pytest.raises(ConfigError, match=r"give exactly one schedule"):
        deploy(store, cron="0 2 * * *", interval=60)
    with pytest.raises(ConfigError, match=r"--interval must be a positive number of seconds, got -1"):
        deploy(store, interval=-1)
    with pytest.raises(ConfigError, match=r"nope\.yaml.*no such cluster config file"):
        deploy(store, cron="0 2 * * *", cluster=str(tmp_path / "nope.yaml"))
    res = runner.invoke(app, ["deploy", store, "--cron", "every day"])
    assert res.exit_code == 2 and "does not parse as a cron schedule" in res.output
    res = runner.invoke(app, ["deploy", str(tmp_path / "nope.zarr"), "--interval", "60"])
    assert res.exit_code == 2 and "no such feature store" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written anywhere
    ok = deploy(store, cron="0 2 * * *", dry_run=True, components=4)
    assert ok["parameters"]["out"] == str((tmp_path / "s.zarr.versions").resolve())
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_refresh_flow_cold_skip_warm(tmp_path, prefect_api):
    """The scheduled flow itself, run three times on the session's ephemeral API."""
    from flows.schedule import refresh_flow

    store = _store(tmp_path / "s.zarr", 600)
    out = str(tmp_path / "pub")
    kw = dict(components=6, max_iter=40)
    first = refresh_flow(store, out, **kw)
    assert first["action"] == "cold" and latest(out) == Path(first["version"]).resolve()
    assert refresh_flow(store, out, **kw)["action"] == "skip"  # nothing new: nothing published
    assert len(version_dirs(out)) == 1
    _append(store, 200, seed=3)
    third = refresh_flow(store, out, **kw)
    assert third["action"] == "warm" and third["warm_start_from"] == first["version"]
    assert latest(out) == Path(third["version"]).resolve() and read_result(third["version"])["n_rows"] == 800
    assert [p.name[:5] for p in version_dirs(out)] == ["v0001", "v0002"]


def test_deploy_takes_priors_init_max_components_and_no_grow(tmp_path, prefect_api):
    """Issue 53, item 15: deploy lacked --priors, --init, --max-components and --no-grow; they come from
    the one fit specification, are checked before anything is registered, and reach the refits."""
    from flows.schedule import refresh_flow

    store = _store(tmp_path / "s.zarr", 600)
    res = runner.invoke(app, ["deploy", store, "--interval", "60", "--dry-run", "-k", "6", "--priors",
                              "sklearn", "--init", "kmeans", "--max-components", "8", "--no-grow"])
    assert res.exit_code == 0 and "ok: would refresh" in res.output, res.output
    got = deploy(store, interval=60, dry_run=True, components=6, priors="sklearn", init="kmeans",
                 max_components=8, grow=False)["parameters"]
    assert (got["priors"], got["init"], got["max_components"], got["grow"]) == ("sklearn", "kmeans", 8, False)
    res = runner.invoke(app, ["deploy", store, "--interval", "60", "--dry-run", "--init", "bogus"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "init" in lines[0] and "bogus" in lines[0], res.output
    done = refresh_flow(store, str(tmp_path / "pub"), components=6, max_iter=20, priors="sklearn",
                        init="kmeans", max_components=8, grow=False)
    ran = json.loads((Path(done["version"]) / "run.json").read_text())
    assert (ran["priors"], ran["init"], ran["max_components"], ran["grow"]) == ("sklearn", "kmeans", 8, False)


def test_the_next_refresh_resumes_a_refresh_that_died(tmp_path, prefect_api, monkeypatch):
    """A refresh dies mid-fit before publishing (disk full at its second checkpoint); the next
    scheduled run finds its version directory, resumes it from the checkpoint and publishes it, with
    the bits of a refresh that never died."""
    import errno

    from flows.schedule import refresh_flow, refresh_options
    from pipeline.runs.publish import claim_version
    from pipeline.service import fit_run, make_spec
    from vbcore.errors import CheckpointError

    store = _store(tmp_path / "s.zarr", 600)
    kw = dict(components=6, max_iter=25, tol=0.0)
    clean = refresh_flow(store, str(tmp_path / "clean"), **kw)
    out = str(tmp_path / "pub")
    dead = claim_version(out, "dead")
    real, calls = np.savez, []

    def disk_full_once(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*a, **k)

    monkeypatch.setattr(np, "savez", disk_full_once)
    with pytest.raises(CheckpointError, match="No space left on device"):
        # the refresh's own settings (its memoized VB EM), as a refresh that died would have them
        opts = refresh_options(None, None, cold=True)  # (the first run of this output: a cold start)
        fit_run(dead, make_spec(store, checkpoint_every=5, learner_options=opts, **kw))
    monkeypatch.setattr(np, "savez", real)
    assert latest(out) is None and not (dead / "result.json").exists()
    res = refresh_flow(store, out, **kw)
    assert Path(res["version"]) == dead and latest(out) == dead.resolve()
    r = read_result(dead)
    assert Path(r["resumed_from"]).name == "ckpt-00000005" and len(version_dirs(out)) == 1
    with np.load(dead / "posterior.npz") as a, np.load(Path(clean["version"]) / "posterior.npz") as b:
        for k in a.files:
            if k != "meta":
                assert np.array_equal(a[k], b[k]), k


def _wait(what: str, cond, timeout: float, procs: list[subprocess.Popen], logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for p, log in zip(procs, logs, strict=True):
            if p.poll() is not None:
                raise AssertionError(f"{p.args[:3]} exited with {p.returncode} while waiting for {what}:\n"
                                     + log.read_text()[-5000:])
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}:\n"
                                 + "\n".join(log.read_text()[-4000:] for log in logs))
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.prefect_server
@pytest.mark.timeout(400)
def test_scheduled_runs_publish_versions_and_warm_start_after_an_append(tmp_path):
    store = _store(tmp_path / "s.zarr", 800)
    out = tmp_path / "published"
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    home = tmp_path / "prefect-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_API_URL=api, PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2", PREFECT_RUNNER_POLL_FREQUENCY="1",
               PREFECT_SERVER_UI_ENABLED="false", MPLBACKEND="Agg")
    server_log, serve_log = tmp_path / "server.log", tmp_path / "serve.log"
    procs: list[subprocess.Popen] = []
    try:
        with open(server_log, "wb") as f:
            procs.append(subprocess.Popen(
                [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port),
                 "--no-ui", "--analytics-off"],
                env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path))

        def healthy() -> bool:
            try:
                return httpx.get(f"{api}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait("the Prefect server's /api/health", healthy, 150, procs, [server_log])
        with open(serve_log, "wb") as f:
            procs.append(subprocess.Popen(
                [str(BIN / "vbcluster"), "deploy", store, "--out", str(out), "--interval", "4",
                 "-k", "6", "--max-iter", "40", "--name", "test-refresh"],
                env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path))
        logs = [server_log, serve_log]
        _wait("the first published version", lambda: latest(out) is not None, 180, procs, logs)
        first = latest(out)
        assert read_result(first)["n_rows"] == 800 and "warm_start_from" not in read_result(first)
        _append(store, 300, seed=1)

        def warm_published() -> bool:
            cur = latest(out)
            return cur is not None and cur != first and "warm_start_from" in read_result(cur)

        _wait("a warm-started version after the append", warm_published, 180, procs, logs)
        second = latest(out)
        r2 = read_result(second)
        assert r2["n_rows"] == 1100 and Path(r2["warm_start_from"]) == first.resolve()
        assert r2["refresh"]["action"] == "warm" and r2["refresh"]["previous_n_rows"] == 800
        assert (second / "report" / "report.html").is_file()
        names = [p.name for p in version_dirs(out)]
        assert names.index(second.name) > names.index(first.name)
        # the server recorded the scheduled runs of the deployment: at least two completed
        runs = httpx.post(f"{api}/flow_runs/filter", json={
            "flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}},
            "deployments": {"name": {"any_": ["test-refresh"]}}}, timeout=10).json()
        assert len(runs) >= 2, json.dumps(runs)[:2000]
        assert all(r["auto_scheduled"] for r in runs)
        # SIGTERM (issue 53, item 15) stops it as Ctrl-C does, without "coroutine 'Runner.astop' was
        # never awaited", and the schedule is paused
        os.kill(procs[1].pid, signal.SIGTERM)
        assert procs[1].wait(timeout=60) is not None
        said = serve_log.read_text()
        assert "never awaited" not in said and "stopped serving 'test-refresh'" in said, said[-3000:]
        query = {"deployments": {"name": {"any_": ["test-refresh"]}}}
        deps = httpx.post(f"{api}/deployments/filter", json=query, timeout=10).json()
        assert deps and all(d["paused"] for d in deps), json.dumps(deps)[:2000]
    finally:
        for p in reversed(procs):
            _stop(p)
