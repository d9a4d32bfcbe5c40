"""Checkpoints, resume and faults: a killed run ends bit for bit where an uninterrupted run ends.

Every learner joins ``test_sigkill_and_resume_is_bitwise`` (parametrised over LEARNERS)."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from sklearn.datasets import load_wine

from pipeline import VBMixture
from pipeline.files.locks import RunLock
from pipeline.fit.checkpoint import PAUSE_ENV, Checkpointer, sha256_file
from pipeline.fit.learners import learner_class
from pipeline.store.features import FeatureStore
from vbcore.errors import CheckpointError, ConfigError, RunLockedError

LEARNERS = ["vbem", "ncg", "sga-m"]  # ncg: per-chunk logits/directions; sga-m: minibatch draws, momentum


def _same_bits(a, b):
    for name in ("means_", "covariances_", "weights_", "lower_bounds_", "precisions_cholesky_"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.n_iter_ == b.n_iter_ and a.converged_ == b.converged_


@pytest.fixture
def X():
    return load_wine().data


KW = dict(n_components=5, covariance_type="full", tol=0.0, random_state=0)


@pytest.mark.parametrize("ct", ["full", "diag", "spherical", "fixed"])
def test_resume_continues_bitwise(tmp_path, X, ct):
    kw = dict(KW, covariance_type=ct)
    VBMixture(max_iter=10, checkpoint_dir=str(tmp_path), checkpoint_every=3, **kw).fit(X)
    resumed = VBMixture(max_iter=25, checkpoint_dir=str(tmp_path), checkpoint_every=3, **kw).fit(X)
    assert resumed.resumed_from_.endswith("ckpt-00000010")
    _same_bits(resumed, VBMixture(max_iter=25, **kw).fit(X))
    # a finished run resumes to itself without iterating
    again = VBMixture(max_iter=25, checkpoint_dir=str(tmp_path), **kw).fit(X)
    _same_bits(again, resumed)


def test_manifest_and_pruning(tmp_path, X):
    m = VBMixture(max_iter=12, checkpoint_dir=str(tmp_path), checkpoint_every=2, checkpoint_keep=3,
                  **KW).fit(X)
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt-"))
    assert names == ["ckpt-00000008", "ckpt-00000010", "ckpt-00000012"]
    man = json.loads((tmp_path / "ckpt-00000012" / "manifest.json").read_text())
    assert man["iteration"] == 12 and man["learner"] == "vbem" and len(man["config_hash"]) == 64
    assert man["elbo_history"] == list(m.lower_bounds_)
    assert man["rng"]["entropy"] == 0 and man["settings"]["components"] == 5
    assert man["files"]["state.npz"] == sha256_file(tmp_path / "ckpt-00000012" / "state.npz")
    assert len(man["store_fingerprint"]) == 64


def test_corrupted_newest_checkpoint_falls_back_and_says_so(tmp_path, X):
    VBMixture(max_iter=9, checkpoint_dir=str(tmp_path), checkpoint_every=3, **KW).fit(X)
    state = tmp_path / "ckpt-00000009" / "state.npz"
    state.write_bytes(state.read_bytes()[:100])  # truncated
    msg = r"skipped checkpoint ckpt-00000009: state.npz does not match its sha256"
    with pytest.warns(UserWarning, match=msg):
        m = VBMixture(max_iter=20, checkpoint_dir=str(tmp_path), checkpoint_every=3, **KW).fit(X)
    assert m.resumed_from_.endswith("ckpt-00000006")
    _same_bits(m, VBMixture(max_iter=20, **KW).fit(X))


def test_all_checkpoints_bad_is_an_error(tmp_path, X):
    VBMixture(max_iter=3, checkpoint_dir=str(tmp_path), checkpoint_every=3, checkpoint_keep=1, **KW).fit(X)
    (tmp_path / "ckpt-00000003" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"no usable checkpoint.*ckpt-00000003: no manifest"):
        VBMixture(max_iter=5, checkpoint_dir=str(tmp_path), **KW).fit(X)


def test_resume_refuses_other_settings_or_data(tmp_path, X):
    VBMixture(max_iter=4, checkpoint_dir=str(tmp_path), checkpoint_every=2, **KW).fit(X)
    with pytest.raises(ConfigError, match=r"settings differ from the checkpoint's \(components 5 -> 6\)"):
        VBMixture(max_iter=8, checkpoint_dir=str(tmp_path), **dict(KW, n_components=6)).fit(X)
    with pytest.raises(ConfigError, match=r"the data changed since this checkpoint was written"):
        VBMixture(max_iter=8, checkpoint_dir=str(tmp_path), **KW).fit(X[:-1])
    # max_iter and tol may change on resume
    VBMixture(max_iter=8, checkpoint_dir=str(tmp_path), **dict(KW, tol=1e-3)).fit(X)


def test_disk_full_while_checkpointing_keeps_the_previous_one(tmp_path, X, monkeypatch):
    VBMixture(max_iter=4, checkpoint_dir=str(tmp_path), checkpoint_every=2, **KW).fit(X)
    before = sha256_file(tmp_path / "ckpt-00000004" / "state.npz")
    real = np.savez

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "savez", full)
    msg = r"No space left on device; the previous checkpoint \(ckpt-00000004\) is intact"
    with pytest.raises(CheckpointError, match=msg):
        VBMixture(max_iter=8, checkpoint_dir=str(tmp_path), checkpoint_every=2, **KW).fit(X)
    monkeypatch.setattr(np, "savez", real)
    assert sha256_file(tmp_path / "ckpt-00000004" / "state.npz") == before
    assert not list(tmp_path.glob(".ckpt-*"))  # no half-written leftovers
    assert not (tmp_path / ".lock").exists()  # the lock was released
    m = VBMixture(max_iter=8, checkpoint_dir=str(tmp_path), **KW).fit(X)
    _same_bits(m, VBMixture(max_iter=8, **KW).fit(X))


def test_permission_denied_is_a_clear_error(tmp_path, monkeypatch):
    ck = Checkpointer(tmp_path)
    ck.save(1, {"a": np.ones(2)}, {})

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr("tempfile.mkdtemp", denied)
    msg = r"Permission denied; the previous checkpoint \(ckpt-00000001\) is intact"
    with pytest.raises(CheckpointError, match=msg):
        ck.save(2, {"a": np.ones(2)}, {})


def test_run_lock_refuses_a_live_holder_and_takes_over_a_stale_one(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunLockedError, match=rf"in use by pid {os.getpid()} on host"):
            RunLock(tmp_path).acquire()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "started": 0}))
    lock = RunLock(tmp_path).acquire()
    assert lock.taken_over["pid"] == dead.pid
    lock.release()
    assert not (tmp_path / ".lock").exists()


def test_two_fits_into_one_checkpoint_dir(tmp_path, X):
    with RunLock(tmp_path):
        with pytest.raises(RunLockedError, match=r"is in use by pid"):
            VBMixture(max_iter=2, checkpoint_dir=str(tmp_path), **KW).fit(X)


def test_failed_output_write_keeps_the_old_result(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import pipeline.runs.directory as runs
    from pipeline.cli import app

    path = tmp_path / "s.zarr"
    FeatureStore.create(path, 4, chunk_rows=64).append(np.random.default_rng(0).normal(size=(300, 4)))
    run = tmp_path / "run"
    r = CliRunner().invoke(app, ["fit", str(path), "--run-dir", str(run), "-k", "3", "-q", "--max-iter", "5"])
    assert r.exit_code == 0, r.output
    good = (run / "result.json").read_bytes(), (run / "posterior.npz").read_bytes()

    def full(f):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(runs, "_write_posterior", lambda f, m: full(f))
    r = CliRunner().invoke(app, ["fit", str(path), "--run-dir", str(run), "-k", "3", "-q", "--max-iter", "5"])
    assert r.exit_code == 1 and "No space left on device (writing" in r.output  # 1: the environment
    assert ((run / "result.json").read_bytes(), (run / "posterior.npz").read_bytes()) == good
    assert not [p for p in run.iterdir() if p.name.startswith(".posterior")]


# ---- real processes killed with SIGKILL ---------------------------------------------------------
def _cli(*args, env=None):
    return [sys.executable, "-m", "pipeline.cli", *args]


def _newest_checkpoint(ckdir):
    names = sorted(p.name for p in ckdir.glob("ckpt-*")) if ckdir.exists() else []
    return names[-1] if names else ""


def _posterior(run):
    with np.load(run / "posterior.npz") as z:
        return {k: z[k] for k in z.files if k != "meta"}


@pytest.mark.parametrize("learner", LEARNERS)
def test_sigkill_and_resume_is_bitwise(tmp_path, learner):
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(c, 1.0, size=(1500, 8)) for c in (-3.0, 0.0, 3.0, 6.0)]).astype(np.float32)
    store = tmp_path / "s.zarr"
    FeatureStore.create(store, 8, chunk_rows=500).append(X)
    args = ["--learner", learner, "-k", "8", "--max-iter", "30", "--tol", "0", "--checkpoint-every", "1",
            "-q", "--covariance", learner_class(learner).default_covariance or "diag"]
    ref = tmp_path / "ref"
    subprocess.run(_cli("fit", str(store), "--run-dir", str(ref), *args), check=True, capture_output=True)

    run = tmp_path / "run"
    ckdir = run / "checkpoints"
    env = dict(os.environ, **{PAUSE_ENV: "0.3"})  # widen the checkpoint-write window
    kill_rng = np.random.default_rng(1)
    kills = in_write = 0
    for attempt in range(12):
        cmd = (_cli("fit", str(store), "--run-dir", str(run), *args) if not (run / "run.json").exists()
               else _cli("resume", str(run), "-q"))
        before = _newest_checkpoint(ckdir)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if attempt < 5:
            # kill once this attempt has made progress (a newer checkpoint), at a random moment within
            # about one iteration after it: the kills land while the fit runs whatever the machine's
            # speed or load, and a fit that stops early (ncg: 10 iterations) still takes them all
            deadline = time.monotonic() + 240
            while proc.poll() is None and _newest_checkpoint(ckdir) == before and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(kill_rng.uniform(0.0, 0.3))
            if proc.poll() is None:
                in_write += bool(ckdir.exists() and list(ckdir.glob(".ckpt-*.tmp-*")))
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out.decode()
        break
    assert kills >= 3, "the kills must land while the fit runs"
    assert (run / "result.json").exists()
    ours, theirs = _posterior(run), _posterior(ref)
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert np.array_equal(ours[k], theirs[k]), k
    result = json.loads((run / "result.json").read_text())
    assert result["elbo_history"] == json.loads((ref / "result.json").read_text())["elbo_history"]
    print(f"{kills} kills, {in_write} during a checkpoint write")


def test_an_edited_manifest_is_refused_in_one_line(tmp_path, X):
    """The manifest carries its own sha256 (issue 29): an ELBO history edited by hand is not resumed;
    the previous checkpoint is, and the fit ends where the uninterrupted one does."""
    VBMixture(max_iter=6, checkpoint_dir=str(tmp_path), checkpoint_every=3, **KW).fit(X)
    path = tmp_path / "ckpt-00000006" / "manifest.json"
    man = json.loads(path.read_text())
    assert len(man["manifest_sha256"]) == 64
    man["elbo_history"][-1] += 1.0  # edited, keeping valid JSON and the state's sha256
    path.write_text(json.dumps(man, indent=1))
    msg = (r"skipped checkpoint ckpt-00000006: manifest.json does not match its manifest_sha256 \(edited "
           r"or corrupted")
    with pytest.warns(UserWarning, match=msg):
        m = VBMixture(max_iter=9, checkpoint_dir=str(tmp_path), checkpoint_every=3, **KW).fit(X)
    assert m.resumed_from_.endswith("ckpt-00000003")
    _same_bits(m, VBMixture(max_iter=9, **KW).fit(X))


def test_a_manifest_without_its_own_checksum_still_resumes(tmp_path, X):
    """Checkpoints written before the manifests carried a checksum are read as they are."""
    VBMixture(max_iter=3, checkpoint_dir=str(tmp_path), checkpoint_every=3, **KW).fit(X)
    path = tmp_path / "ckpt-00000003" / "manifest.json"
    man = json.loads(path.read_text())
    del man["manifest_sha256"]
    path.write_text(json.dumps(man))
    m = VBMixture(max_iter=6, checkpoint_dir=str(tmp_path), checkpoint_every=3, **KW).fit(X)
    assert m.resumed_from_.endswith("ckpt-00000003")
