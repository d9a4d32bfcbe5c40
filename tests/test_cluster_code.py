"""Issue 53 items 3 and 4: a cluster config runs no code of its own unless the user opts in
(``VBCLUSTER_ALLOW_CODE=1``), on ``fit --cluster`` and on ``resume`` of an edited ``run.json``; a batch-job
cluster on a host without its submit command fails in one line; SIGTERM ends a wait for workers
that never come."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipeline.engine.cluster import load_cluster_config
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
runner = CliRunner()
LOCAL = "cluster_class: distributed.LocalCluster\n"
SLURM = "cluster_class: dask_jobqueue.SLURMCluster\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("code") / "s.zarr"
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(400, 4)).astype(np.float32)
    FeatureStore.create(path, 4, chunk_rows=200, labels=False).append(rows)
    return str(path)


@pytest.mark.parametrize(("text", "key"), [
    (LOCAL + "cluster_kwargs: {preload: [evil.py]}", "cluster_kwargs.preload"),
    (LOCAL + "cluster_kwargs: {scheduler_kwargs: {preload: [evil.py]}}",
     "cluster_kwargs.scheduler_kwargs.preload"),
    (LOCAL + "cluster_kwargs: {preload_nanny: [evil.py]}", "cluster_kwargs.preload_nanny"),
    (LOCAL + "cluster_kwargs: {env: {LD_PRELOAD: /tmp/evil.so}}", "cluster_kwargs.env.LD_PRELOAD"),
    (LOCAL + "cluster_kwargs: {env: {PYTHONPATH: /tmp/evil}}", "cluster_kwargs.env.PYTHONPATH"),
    (SLURM + "cluster_kwargs: {scheduler_options: {preload: [evil.py]}}",
     "cluster_kwargs.scheduler_options.preload"),
    (SLURM + "cluster_kwargs: {worker_extra_args: [--preload, evil.py]}", "cluster_kwargs.worker_extra_args"),
    (SLURM + "cluster_kwargs: {worker_extra_args: [--worker-class=subprocess.Popen]}",
     "cluster_kwargs.worker_extra_args"),
    (SLURM + "cluster_kwargs: {job_script_prologue: ['python evil.py']}",
     "cluster_kwargs.job_script_prologue"),
    (SLURM + "cluster_kwargs: {job_script_prologue: ['module load x; sh evil']}",
     "cluster_kwargs.job_script_prologue"),
    (SLURM + "cluster_kwargs: {job_script_prologue: ['export PATH=/tmp/evil:$PATH']}",
     "cluster_kwargs.job_script_prologue"),
    (SLURM + "cluster_kwargs: {env_extra: ['curl x | sh']}", "cluster_kwargs.env_extra"),
    (SLURM + "cluster_kwargs: {python: /tmp/evil}", "cluster_kwargs.python"),
    (SLURM + "cluster_kwargs: {shebang: '#!/tmp/evil'}", "cluster_kwargs.shebang"),
    (SLURM + "cluster_kwargs: {job_cls: subprocess.Popen}", "cluster_kwargs.job_cls"),
])
def test_code_loading_keys_are_refused_in_one_line(tmp_path, monkeypatch, text, key):
    monkeypatch.delenv("VBCLUSTER_ALLOW_CODE", raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text + "\n")
    msg = (rf"^{re.escape(str(cfg))}: key '{re.escape(key)}': .*a cluster config runs no code of its own "
           r"unless you opt in with VBCLUSTER_ALLOW_CODE=1")
    with pytest.raises(ConfigError, match=msg) as info:
        load_cluster_config(cfg)
    assert "\n" not in str(info.value)
    monkeypatch.setenv("VBCLUSTER_ALLOW_CODE", "1")
    load_cluster_config(cfg)  # the user's opt-in


def test_site_setup_needs_no_opt_in(tmp_path, monkeypatch):
    """What a site's job script needs (environment modules, a conda environment, plain variables,
    the worker lifetime of a walltime) loads without VBCLUSTER_ALLOW_CODE."""
    monkeypatch.delenv("VBCLUSTER_ALLOW_CODE", raising=False)
    cfg = tmp_path / "site.yaml"
    cfg.write_text(SLURM + "cluster_kwargs:\n  job_script_prologue: ['module purge', "
                   "'module load python/3.11', 'conda activate vbc-env', 'export OMP_NUM_THREADS=1']\n"
                   "  worker_extra_args: [--lifetime, 55m, --lifetime-stagger=4m, --lifetime-restart]\n"
                   "  env_extra: ['ml gcc/12']\n")
    assert load_cluster_config(cfg).cluster_kwargs["worker_extra_args"][0] == "--lifetime"
    load_cluster_config(ROOT / "cluster_config" / "slurm-local.yaml")


def _preload(tmp_path: Path) -> tuple[Path, Path]:
    pwned = tmp_path / "PWNED"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(pwned)!r}, 'w').write('ran')\n")
    cfg = tmp_path / "preload.yaml"
    cfg.write_text(LOCAL + f"cluster_kwargs: {{n_workers: 1, processes: false, dashboard_address: null, "
                   f"preload: [{evil}]}}\n")
    return cfg, pwned


def test_fit_refuses_a_preload_and_runs_it_only_with_the_opt_in(store, tmp_path, monkeypatch):
    monkeypatch.delenv("VBCLUSTER_ALLOW_CODE", raising=False)
    cfg, pwned = _preload(tmp_path)
    args = ["fit", store, "--run-dir", str(tmp_path / "run"), "-k", "2", "--max-iter", "2", "-q", "--cluster",
            str(cfg)]
    res = runner.invoke(app, args)
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "key 'cluster_kwargs.preload': loads code" in said, res.output
    assert not pwned.exists() and not (tmp_path / "run").exists()
    monkeypatch.setenv("VBCLUSTER_ALLOW_CODE", "1")
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert pwned.read_text() == "ran"  # the opt-in runs it: the refusal above was the only guard


def test_resume_of_a_run_json_edited_to_a_preload_config_is_refused(store, tmp_path, monkeypatch):
    monkeypatch.delenv("VBCLUSTER_ALLOW_CODE", raising=False)
    run = tmp_path / "run"
    res = runner.invoke(app, ["fit", store, "--run-dir", str(run), "-k", "2", "--max-iter", "2", "-q"])
    assert res.exit_code == 0, res.output
    for name in ("result.json", "posterior.npz"):
        (run / name).unlink()  # an unfinished run, as a killed fit leaves it
    cfg, pwned = _preload(tmp_path)
    spec = json.loads((run / "run.json").read_text())
    spec["cluster"] = str(cfg)
    (run / "run.json").write_text(json.dumps(spec))
    res = runner.invoke(app, ["resume", str(run)])
    assert res.exit_code == 2 and "key 'cluster_kwargs.preload': loads code" in " ".join(res.output.split())
    assert not pwned.exists()


# ---- issue 53 item 4: no sbatch on the host; a wait for workers that never come -------------------
def _fit_cli(store: str, run: Path, env: dict[str, str], cfg: Path) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "vbcluster"), "fit", store, "--run-dir", str(run), "-k", "2",
                             "--max-iter", "2", "--cluster", str(cfg)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=run.parent)


def _path_with(tmp_path: Path, programs: dict[str, str]) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in programs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    # only the virtual environment and the fakes: no system sbatch, whatever this host has
    # (/bin is /usr/bin on Debian, where slurm-wlm puts sbatch)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{BIN}", "MPLBACKEND": "Agg"}


def test_slurm_without_sbatch_fails_in_one_line(store, tmp_path, monkeypatch):
    cfg = ROOT / "cluster_config" / "slurm-local.yaml"
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    with pytest.raises(ConfigError, match=r"slurm-local\.yaml: key 'cluster_class': "
                       r"dask_jobqueue\.SLURMCluster submits its workers as batch jobs with 'sbatch', "
                       r"which is not on PATH"):
        load_cluster_config(cfg).make_cluster()
    monkeypatch.undo()
    start = time.monotonic()
    proc = _fit_cli(store, tmp_path / "run", _path_with(tmp_path, {}), cfg)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and time.monotonic() - start < 60, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    assert "'sbatch', which is not on PATH" in lines[0], out


def test_sigterm_ends_a_wait_for_workers_that_never_come(store, tmp_path):
    """An sbatch that accepts the jobs, which then never start: the fit waits, saying so, and a
    SIGTERM ends it (exit 143) after cancelling its jobs."""
    cancelled = tmp_path / "cancelled"
    env = _path_with(tmp_path, {"sbatch": "echo 'Submitted batch job 4242'",
                                "scancel": f"echo \"$@\" >> {cancelled}", "squeue": "exit 0"})
    proc = _fit_cli(store, tmp_path / "run", env, ROOT / "cluster_config" / "slurm-local.yaml")
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "waiting for the cluster's first worker" in line:
            break
    assert any("waiting" in s for s in seen), "".join(seen)
    proc.send_signal(signal.SIGTERM)
    try:
        rest, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("SIGTERM did not end the wait within 30 s") from None
    assert proc.returncode == 143, "".join(seen) + rest
    assert "Traceback" not in rest, rest
    assert "4242" in cancelled.read_text()  # the cluster's close cancelled the queued jobs
