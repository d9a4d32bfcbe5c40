"""Honest bounds and interrupts: minibatch learners report estimates as such, never converge on them,
and end with an exact bound; SIGINT/SIGTERM finish the iteration, write a checkpoint and print the
resume command (exit 130/143); resume continues bit for bit, keeps the total wall time, and says
when there is no checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipeline import VBMixture
from pipeline.fit.driver import stop_on_signals
from pipeline.fit.progress import FitProgress
from pipeline.ingest import ingest
from vbcore.errors import FitInterrupted


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    centres = rng.normal(scale=5.0, size=(4, 6))
    return np.concatenate([c + rng.normal(size=(500, 6)) for c in centres])


@pytest.fixture(scope="module")
def store(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("intr") / "s.zarr"
    np.save(path.with_suffix(".npy"), data)
    ingest(str(path.with_suffix(".npy")), path, chunk_rows=500)
    return str(path)


# ---- honest bounds --------------------------------------------------------------------------------
@pytest.mark.parametrize("learner", ["sga-f", "svi"])
def test_minibatch_learners_never_converge_on_estimates_and_end_exact(data, learner):
    kw = dict(n_components=8, learner=learner, random_state=0, learner_options={"minibatch": 200})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = VBMixture(max_iter=6, tol=1e9, **kw).fit(data)  # any change is "under tol": no convergence
    assert m.bound_kind_ == "minibatch estimate" and not m.converged_ and m.n_iter_ == 6
    if learner == "svi":  # the final bound is the exact ELBO of the final posterior: one E-step of it
        check = VBMixture(max_iter=0, warm_start=True, **kw)
        check.posterior_, check.prior_ = m.posterior_, m.prior_
        check.fit(data)
        assert m.lower_bound_ == pytest.approx(check.lower_bound_, rel=1e-12)
    exact = VBMixture(max_iter=6, tol=1e9, **{**kw, "learner_options": {"minibatch": 200, "elbo": "full"}})
    assert exact.fit(data).bound_kind_ == "exact" and exact.converged_


def test_result_and_iteration_log_name_the_bound(store, tmp_path):
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(run), "--learner", "sga-f", "-k", "6",
                                   "--max-iter", "4", "-o", "minibatch=300", "-q"])
    assert res.exit_code == 0, res.output
    result = json.loads((run / "result.json").read_text())
    se = result["bound"].pop("history_se")
    assert result["bound"] == {"history": "minibatch estimate", "final": "exact"}
    lines = [json.loads(line) for line in (run / "iterations.jsonl").read_text().splitlines()]
    assert [r["bound"] for r in lines] == ["minibatch estimate"] * 4
    assert len(se) == 4 and [r.get("elbo_se") for r in lines] == se  # null on a merge round


# ---- interrupts -----------------------------------------------------------------------------------
def test_stop_request_checkpoints_and_resume_is_bitwise(data, tmp_path):
    kw = dict(n_components=6, covariance_type="diag", max_iter=12, tol=0.0, random_state=0,
              checkpoint_every=100)
    full = VBMixture(**kw).fit(data)

    def stop_at_5(info):
        if info["iteration"] == 5:
            stop(signal.SIGINT)  # what the SIGINT handler does

    with stop_on_signals() as stop, pytest.raises(FitInterrupted,
                                                  match="interrupted after iteration 5; checkpoint"):
        VBMixture(checkpoint_dir=str(tmp_path / "ck"), **kw).fit(data, callback=stop_at_5, stop=stop)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.startswith("ckpt"))[-1].endswith("05")
    resumed = VBMixture(checkpoint_dir=str(tmp_path / "ck"), **kw).fit(data)
    assert resumed.resumed_from_ and np.array_equal(resumed.means_, full.means_)
    assert np.array_equal(resumed.lower_bounds_, full.lower_bounds_)


def test_a_resumed_log_holds_each_iteration_once_and_counts_passes_on(data, tmp_path):
    """SIGINT then resume (issue 29): iterations.jsonl held the interrupted iteration twice (the
    resume's record) and ``passes`` restarted at 0, so the report counted fewer data passes than
    iterations. Now the log and ``n_passes_`` are those of the uninterrupted fit."""
    kw = dict(n_components=6, covariance_type="diag", max_iter=12, tol=0.0, random_state=0,
              checkpoint_every=100, learner="ncg")  # ncg: line searches, more than one pass per iteration
    full_log, log = tmp_path / "full.jsonl", tmp_path / "run" / "iterations.jsonl"
    with FitProgress(12, log_path=full_log, quiet=True) as bar:
        full = VBMixture(**kw).fit(data, callback=bar)

    def stop_at_5(info):
        bar(info)
        if info.get("iteration") == 5:
            stop(signal.SIGINT)

    with FitProgress(12, log_path=log, quiet=True) as bar, stop_on_signals() as stop, \
            pytest.raises(FitInterrupted):
        VBMixture(checkpoint_dir=str(tmp_path / "ck"), **kw).fit(data, callback=stop_at_5, stop=stop)
    with FitProgress(12, log_path=log, quiet=True) as bar:
        resumed = VBMixture(checkpoint_dir=str(tmp_path / "ck"), **kw).fit(data, callback=bar)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    want = [(r["iteration"], r["passes"]) for r in map(json.loads, full_log.read_text().splitlines())]
    assert [(r["iteration"], r["passes"]) for r in records if "iteration" in r] == want
    assert want[-1][1] > 12 and resumed.n_passes_ == full.n_passes_ == want[-1][1]
    event = [r for r in records if "iteration" not in r]
    assert [(r["event"], r["after_iteration"], r["passes"]) for r in event] == [("resumed", 5, want[4][1])]
    from pipeline.runs.report_curves import data_passes

    x, how = data_passes(log.parent, {"elbo_history": list(resumed.lower_bounds_), "learner": "ncg"})
    assert how == "engine passes from iterations.jsonl" and x.tolist() == [p for _, p in want]


def _start_fit(store: str, run: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "pipeline.cli", "fit", store, "--run-dir", str(run), "-k", "6",
            "--max-iter", "1000000", "--tol", "0", "--checkpoint-every", "100000", "-q"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_finishes_the_iteration_writes_a_checkpoint_and_prints_resume(store, tmp_path, sig, code):
    """The fit cannot end by itself (10^6 iterations); the signal comes once 3 iterations are logged."""
    run = tmp_path / "run"
    proc = _start_fit(store, run)
    log = run / "iterations.jsonl"
    deadline = time.monotonic() + 120
    while not (log.exists() and len(log.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.05)
    proc.send_signal(sig)
    out = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == code, out
    done = len(log.read_text().splitlines())
    assert f"interrupted after iteration {done}; checkpoint" in out
    assert f"vbcluster resume {run}" in " ".join(out.split())
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("ckpt"))
    assert ckpts[-1] == f"ckpt-{done:08d}"
    manifest = json.loads((run / "checkpoints" / ckpts[-1] / "manifest.json").read_text())
    assert manifest["wall_seconds"] > 0


def test_resume_without_checkpoint_says_so_and_keeps_total_seconds(store, tmp_path):
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(run), "-k", "4", "--max-iter", "3",
                                   "--checkpoint-every", "1", "-q"])
    assert res.exit_code == 0, res.output
    first = json.loads((run / "result.json").read_text())["seconds"]
    for name in ("result.json", "posterior.npz"):  # killed after its last checkpoint
        (run / name).unlink()
    res = CliRunner().invoke(app, ["resume", str(run), "-q"])  # nothing left to iterate
    assert res.exit_code == 0, res.output
    again = json.loads((run / "result.json").read_text())["seconds"]
    assert again >= first * 0.5 and again > 0  # the checkpoint's total, not this attempt's 0.x s
    other = tmp_path / "other"
    other.mkdir()
    (other / "run.json").write_text((run / "run.json").read_text())
    res = CliRunner().invoke(app, ["resume", str(other), "-q"])
    assert "no checkpoint yet; the fit starts from the beginning" in " ".join(res.output.split())
