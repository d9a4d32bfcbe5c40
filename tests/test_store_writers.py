"""One writer at a time on a feature store (issue 29): a reader never rolls back a live append, two
appends at once never break the store, a crashed writer's lock and journal are taken over.

Real processes (spawned, released together by events or a barrier), real Zarr stores on disk, the
real CLI. The tests assert only what the code guarantees: the loser of a race is refused in one line
naming the append in progress (or, when it came late, succeeds after the other), and the store is
whole afterwards (``vbcluster check`` ok, every committed row present, nothing else)."""

import json
import multiprocessing as mp
import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr

from pipeline.store.features import AppendLock, FeatureStore
from pipeline.store.integrity import check
from vbcore.errors import StoreError

TIMEOUT = 600  # a safety bound only: under a load of 40 on 2 cores a spawned child took minutes to start
IN_PROGRESS = r"an append by pid \d+ on host \S+ \(since [0-9T:-]+\) is in progress; wait for it to finish"


def _rows(n, d=4, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def _store(path, n=20, chunk_rows=8):
    s = FeatureStore.create(path, 4, chunk_rows=chunk_rows, labels=True)
    s.append(_rows(n), labels=np.zeros(n, dtype=np.int64))
    return s


def _slow_append(path, n, label, started, go, out):
    """Append ``n`` rows labelled ``label``: once the transaction has begun (the journal is in place),
    set ``started`` and wait for ``go`` before writing the rows."""
    def batches():
        started.set()
        go.wait(TIMEOUT)
        yield _rows(n, seed=label), np.full(n, label, dtype=np.int64), None

    try:
        out.put(("ok", FeatureStore.open(path, "r+").append_batches(batches(), source=f"src{label}")))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put((type(exc).__name__, str(exc)))


def _open_during(path, started, go, out):
    """Wait until an append is under way, then open the store (with write access) and check it."""
    started.wait(TIMEOUT)
    try:
        s = FeatureStore.open(path)
        out.put(("opened", s.n_rows))
    except StoreError as exc:
        out.put(("refused", str(exc)))
    try:
        check(path)
        out.put(("checked", None))
    except StoreError as exc:
        out.put(("refused", str(exc)))
    go.set()


def _procs(*targets):
    ctx = mp.get_context("spawn")  # not fork: the pytest process may hold Dask/Prefect threads
    started, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=t, args=(*a, started, go, out)) for t, a in targets]
    for p in procs:
        p.start()
    return procs, out, (started, go)  # kept referenced until the children have them


def _join(procs):
    for p in procs:
        p.join(TIMEOUT)
        assert p.exitcode == 0


def test_a_reader_never_rolls_back_a_live_append(tmp_path):
    """The attack of issue 29: `vbcluster check` (or a fit) while an append's journal exists rolled the
    live append back and broke the store for good. Now the reader is refused and the append commits."""
    path = str(tmp_path / "s.zarr")
    _store(path)
    assert os.access(path, os.W_OK)  # the reader could write: the old code rolled back in this case
    procs, out, _sync = _procs((_slow_append, (path, 30, 1)), (_open_during, (path,)))
    got = [out.get(timeout=TIMEOUT) for _ in range(3)]
    _join(procs)
    refused = [m for kind, m in got if kind == "refused"]
    assert len(refused) == 2, got  # the open and the check, both refused ...
    for m in refused:
        assert m.startswith(f"{path}: ") and "\n" not in m
        assert re.search(IN_PROGRESS, m), m
    assert ("ok", 30) in got  # ... and the append committed
    s = FeatureStore.open(path)
    assert s.n_rows == 50
    np.testing.assert_array_equal(s.read(), np.concatenate([_rows(20), _rows(30, seed=1)]))
    assert check(path).n_rows == 50
    assert not any(p.name.startswith((".s.zarr.lock", "s.zarr.append-journal")) for p in tmp_path.iterdir())


def test_a_second_append_is_refused_while_one_runs(tmp_path):
    """Two appends at once: the second is refused in one line naming the first; the first commits."""
    path = str(tmp_path / "s.zarr")
    _store(path)
    procs, out, _sync = _procs((_slow_append, (path, 30, 1)), (_second_append, (path,)))
    got = [out.get(timeout=TIMEOUT) for _ in range(2)]
    _join(procs)
    assert ("ok", 30) in got, got
    (kind, message), = [g for g in got if g[0] != "ok"]
    assert kind == "StoreError" and re.search(IN_PROGRESS, message), got
    s = FeatureStore.open(path)
    assert s.n_rows == 50 and list(np.unique(s.read_labels())) == [0, 1]
    assert check(path).n_rows == 50


def _second_append(path, started, go, out):
    started.wait(TIMEOUT)
    try:
        FeatureStore.open(path, "r+").append(_rows(5, seed=2), labels=np.full(5, 2))
        out.put(("ok", 5))
    except StoreError as exc:
        out.put(("StoreError", str(exc)))
    go.set()


def test_appends_opened_together_write_one_after_the_other(tmp_path):
    """Two handles opened before either appends: the second writer re-reads the store under the lock,
    so it appends after the first one's rows instead of over them."""
    path = str(tmp_path / "s.zarr")
    _store(path)
    a, b = FeatureStore.open(path, "r+"), FeatureStore.open(path, "r+")
    a.append(_rows(5, seed=1), labels=np.ones(5))
    b.append(_rows(7, seed=2), labels=np.full(7, 2))
    s = FeatureStore.open(path)
    assert s.n_rows == 32 and b.n_rows == 32
    np.testing.assert_array_equal(s.read(), np.concatenate([_rows(20), _rows(5, seed=1), _rows(7, seed=2)]))
    np.testing.assert_array_equal(s.read_labels(), [0] * 20 + [1] * 5 + [2] * 7)


_CLI = """
import os, sys, time
from pipeline.cli import app
open(sys.argv[1] + ".ready", "w").close()
while not os.path.exists(sys.argv[2]):  # the barrier: released together once both are ready
    time.sleep(0.005)
sys.argv = ["vbcluster", *sys.argv[3:]]
app()
"""


def test_two_cli_appends_released_together(tmp_path):
    """Two `vbcluster ingest --append` processes released by one barrier (issue 29 saw both exit 2, the
    store broken, and `check` saying ok). Each exits 0, or exits 2 refused in one line because the other
    is appending; the store then holds its rows and the successful sources' rows, whole."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    path = str(tmp_path / "s.zarr")
    _store(path, chunk_rows=1000)
    n = {1: 30_000, 2: 20_000}
    go = tmp_path / "go"
    env = dict(os.environ, COLUMNS="500", PYTHONPATH=os.getcwd())
    procs = {}
    for k in n:
        np.save(tmp_path / f"x{k}.npy", _rows(n[k], seed=k))
        np.save(tmp_path / f"y{k}.npy", np.full(n[k], k, dtype=np.int64))
        procs[k] = subprocess.Popen(
            [sys.executable, "-c", _CLI, str(tmp_path / f"p{k}"), str(go), "ingest",
             str(tmp_path / f"x{k}.npy"), "--out", path, "--append", "--labels", str(tmp_path / f"y{k}.npy")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.time() + TIMEOUT
    while not all((tmp_path / f"p{k}.ready").exists() for k in n) and time.time() < deadline:
        time.sleep(0.01)
    go.touch()
    done = []
    for k, p in procs.items():
        text = p.communicate(timeout=TIMEOUT)[0]
        if p.returncode == 0:
            done.append(k)
            continue
        assert p.returncode == 2, text
        line, = [ln for ln in text.splitlines() if ln.startswith("error:")]
        assert line.startswith(f"error: {path}: an append by pid"), text
        assert re.search(IN_PROGRESS, line), text
    assert done  # at least one wins
    s = FeatureStore.open(path)
    labels = s.read_labels()
    assert s.n_rows == 20 + sum(n[k] for k in done)
    for k in done:  # each source's rows whole, in one piece
        rows = np.flatnonzero(labels == k)
        assert len(rows) == n[k] and rows[-1] - rows[0] == n[k] - 1
        np.testing.assert_array_equal(s.read(slice(int(rows[0]), int(rows[-1]) + 1)), _rows(n[k], seed=k))
    r = CliRunner().invoke(app, ["check", path])
    assert r.exit_code == 0 and ": ok, " in r.output, r.output


def test_a_crashed_writers_lock_is_taken_over(tmp_path):
    """A writer SIGKILLed mid-append leaves its lock and journal: the next open rolls the append back
    (its writer is gone) and the next append takes the lock over."""
    path = str(tmp_path / "s.zarr")
    _store(path)
    code = ("import sys, numpy as np\n"
            "from pipeline.store.features import FeatureStore\n"
            "def b():\n"
            "    yield np.ones((9, 4), np.float32), np.ones(9, np.int64), None\n"
            "    print('started', flush=True); sys.stdin.readline()\n"
            "    yield np.ones((9, 4), np.float32), np.ones(9, np.int64), None\n"
            f"FeatureStore.open({path!r}, 'r+').append_batches(b())\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert proc.stdout.readline().strip() == "started"
    lock = tmp_path / ".s.zarr.lock"
    assert json.loads(lock.read_text())["pid"] == proc.pid
    proc.kill()
    proc.wait()
    assert (tmp_path / "s.zarr.append-journal").exists() and lock.exists()
    assert not AppendLock(path).is_held()
    s = FeatureStore.open(path)  # rolled back: its writer is gone
    assert s.n_rows == 20 and not (tmp_path / "s.zarr.append-journal").exists()
    s = FeatureStore.open(path, "r+")
    s.append(_rows(3), labels=[5, 5, 5])
    assert FeatureStore.open(path).n_rows == 23 and not lock.exists()


def test_a_lock_on_another_host_is_respected(tmp_path):
    """A lock naming another host cannot be checked from here: the append is refused, naming it."""
    path = str(tmp_path / "s.zarr")
    _store(path)
    (tmp_path / ".s.zarr.lock").write_text(json.dumps(
        {"pid": 1, "host": socket.gethostname() + "-other", "started": time.time(), "token": "x"}))
    with pytest.raises(StoreError, match=rf"^{path}: an append by pid 1 on host \S+-other .* is in progress"):
        FeatureStore.open(path, "r+").append(_rows(2), labels=[0, 0])
    assert FeatureStore.open(path).n_rows == 20


def test_check_refuses_a_row_count_its_appends_do_not_explain(tmp_path):
    """A store whose attributes count rows that no append wrote (what two unlocked appends left in
    issue 29, rows of zeros under the other source's labels) is not 'ok'."""
    path = str(tmp_path / "s.zarr")
    _store(path, n=16)
    g = zarr.open_group(path, mode="r+")
    for name in ("features", "labels"):
        a = g[name]
        a.resize((24, *a.shape[1:]))
        a[16:24] = 1
    g.attrs["n_rows"] = 24
    with pytest.raises(StoreError, match=rf"^{path}: the store counts 24 rows but its append records "
                       r"add up to 16 \(1 appends\); rows were written outside an append"):
        check(path)
    from typer.testing import CliRunner

    from pipeline.cli import app

    r = CliRunner().invoke(app, ["check", path])
    assert r.exit_code == 2 and "add up to 16" in r.output


def test_a_reused_pid_does_not_keep_the_append_lock(tmp_path):
    """The lock records the writer's start time (the run lock's record): a live process that now has
    the dead writer's pid is another process, so its lock is stale and the journal is rolled back."""
    from pathlib import Path

    from pipeline.files.leftovers import process_record
    from pipeline.store.journal import begin

    path = str(tmp_path / "s.zarr")
    _store(path)
    s = FeatureStore.open(path, "r+")
    begin(Path(path), s.group, 20, 8)  # an append's journal ...
    s.features.resize((40, 4))  # ... half-way through
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        start = open(f"/proc/{other.pid}/stat").read().rsplit(")", 1)[1].split()[19]
        rec = {**process_record(), "pid": other.pid, "started": time.time(), "token": "x"}
        lock = tmp_path / ".s.zarr.lock"
        lock.write_text(json.dumps(dict(rec, start=start)))  # that very process: a live writer
        with pytest.raises(StoreError, match=rf"an append by pid {other.pid} on host .* is in progress"):
            FeatureStore.open(path)
        lock.write_text(json.dumps(dict(rec, start=str(int(start) - 1))))  # an earlier process, that pid
        assert not AppendLock(path).is_held()
        s = FeatureStore.open(path)  # the writer is gone: rolled back
        assert s.n_rows == 20 and s.features.shape == (20, 4) and not lock.exists()
    finally:
        other.kill()
        other.wait()
