"""The run lock under a race (issue 14): processes released together by a barrier, 50 trials each on a
run directory (the CLI's lock), on a checkpoint_dir (the estimator's lock, taken by a real fit) and on
a directory holding a stale lock of a dead process; exactly one holder every time."""

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from pipeline.files.locks import RunLock, RunLockedError

N_PROCS = 3
TRIALS = 50
TIMEOUT = 60


def _race_runlock(root, barrier, results, stale_pid):
    """One competitor: per trial, wait for all, try the lock, wait until all tried, release."""
    held = []
    for t in range(TRIALS):
        d = os.path.join(root, f"t{t}")
        barrier.wait(TIMEOUT)
        lock = RunLock(d)
        try:
            lock.acquire()
            ok = True
        except RunLockedError:
            ok = False
        barrier.wait(TIMEOUT)  # every competitor has tried while the winner still holds it
        if ok:  # (the next trial uses another directory: no third barrier needed)
            took = lock.taken_over
            lock.release()
            held.append((t, took is not None and took.get("pid") == stale_pid))
    results.put((os.getpid(), held))


def _race_estimator(root, barrier, results):
    """One competitor fitting with checkpoint_dir: the fit's callback waits until all have tried."""
    from pipeline import VBMixture

    X = np.random.default_rng(0).normal(size=(20, 2))
    held = []
    for t in range(TRIALS):
        waited = []

        def hold(_info, waited=waited):
            if not waited:
                waited.append(1)
                barrier.wait(TIMEOUT)

        barrier.wait(TIMEOUT)
        try:
            VBMixture(2, max_iter=1, init_params="random", random_state=0, checkpoint_every=100,
                      checkpoint_dir=os.path.join(root, f"t{t}", "ckpt")).fit(X, callback=hold)
            held.append(t)
        except RunLockedError:
            barrier.wait(TIMEOUT)
    results.put((os.getpid(), held))


def _run(target, *args):
    # spawn, not fork: a child forked from a pytest process that runs Dask clusters and a Prefect
    # server inherits their threads and atexit handlers, and exited 1 at shutdown in the full suite
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(N_PROCS), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args[:1], barrier, results, *args[1:]))
             for _ in range(N_PROCS)]
    for p in procs:
        p.start()
    out = [results.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return out


def _holders(out):
    per_trial = {}
    for pid, held in out:
        for h in held:
            t = h[0] if isinstance(h, tuple) else h
            per_trial.setdefault(t, []).append(pid)
    return per_trial


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_one_holder_on_a_run_directory(tmp_path):
    per_trial = _holders(_run(_race_runlock, str(tmp_path), None))
    assert sorted(per_trial) == list(range(TRIALS))  # someone won every trial ...
    assert all(len(v) == 1 for v in per_trial.values()), per_trial  # ... and only one


def test_one_holder_when_racing_to_take_over_a_stale_lock(tmp_path):
    dead = _dead_pid()
    for t in range(TRIALS):
        (tmp_path / f"t{t}").mkdir()
        (tmp_path / f"t{t}" / ".lock").write_text(json.dumps(
            {"pid": dead, "host": socket.gethostname(), "started": 0, "token": "x"}))
    out = _run(_race_runlock, str(tmp_path), dead)
    per_trial = _holders(out)
    assert sorted(per_trial) == list(range(TRIALS))
    assert all(len(v) == 1 for v in per_trial.values()), per_trial
    assert not list(tmp_path.rglob(".lock*"))  # released, no temp or guard files left


def test_one_holder_on_a_checkpoint_dir_of_real_fits(tmp_path):
    per_trial = _holders(_run(_race_estimator, str(tmp_path)))
    assert sorted(per_trial) == list(range(TRIALS))
    assert all(len(v) == 1 for v in per_trial.values()), per_trial


def test_lock_file_is_complete_when_it_appears(tmp_path):
    with RunLock(tmp_path) as lock:
        body = json.loads((tmp_path / ".lock").read_text())
        assert body["pid"] == os.getpid() and body["token"] == lock._token
        assert [p.name for p in tmp_path.iterdir()] == [".lock"]  # the temp file is gone
        assert RunLock(tmp_path).is_held()
    assert not (tmp_path / ".lock").exists() and not RunLock(tmp_path).is_held()


def test_unreadable_lock_is_respected_until_its_grace_has_passed(tmp_path):
    (tmp_path / ".lock").write_text("")  # what an older vbcluster left while writing
    with pytest.raises(RunLockedError, match=r"being written or unreadable; if no vbcluster process"):
        RunLock(tmp_path).acquire()
    old = time.time() - RunLock.UNREADABLE_GRACE_S - 5
    os.utime(tmp_path / ".lock", (old, old))
    lock = RunLock(tmp_path).acquire()
    assert lock.taken_over == {"pid": None, "host": None}
    lock.release()


def test_release_leaves_another_holders_lock(tmp_path):
    a = RunLock(tmp_path).acquire()
    (tmp_path / ".lock").unlink()  # someone removed it by hand ...
    b = RunLock(tmp_path).acquire()  # ... and another run took it
    a.release()
    assert RunLock(tmp_path).is_held() and json.loads((tmp_path / ".lock").read_text())["token"] == b._token
    b.release()
    assert not (tmp_path / ".lock").exists()


def test_file_systems_without_hard_links_fall_back_to_exclusive_create(tmp_path, monkeypatch):
    import errno

    def no_link(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    with RunLock(tmp_path) as lock:
        assert json.loads((tmp_path / ".lock").read_text())["token"] == lock._token
        with pytest.raises(RunLockedError, match=r"in use by pid"):
            RunLock(tmp_path).acquire()
    assert not (tmp_path / ".lock").exists()


def test_a_reused_pid_does_not_keep_the_lock(tmp_path):
    """A lock left by a dead process whose pid now belongs to another, live process (issue 29): the
    start time recorded in the lock differs from the live process's, so the lock is stale."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(f"/proc/{other.pid}/stat") as f:  # field 22: start time in clock ticks since boot
            start = f.read().rsplit(")", 1)[1].split()[19]
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        same = {"host": socket.gethostname(), "pid": other.pid, "start": start, "boot": boot, "started": 0,
                "token": "x"}
        (tmp_path / ".lock").write_text(json.dumps(same))  # the live process itself: respected
        with pytest.raises(RunLockedError, match=rf"in use by pid {other.pid} on host"):
            RunLock(tmp_path).acquire()
        reused = dict(same, start=str(int(same["start"]) - 1))  # an earlier process under that pid
        (tmp_path / ".lock").write_text(json.dumps(reused))
        assert not RunLock(tmp_path).is_held()
        lock = RunLock(tmp_path).acquire()
        assert lock.taken_over == reused
        body = json.loads((tmp_path / ".lock").read_text())
        assert body["pid"] == os.getpid() and body["start"] and body["boot"]
        lock.release()
    finally:
        other.kill()
        other.wait()
