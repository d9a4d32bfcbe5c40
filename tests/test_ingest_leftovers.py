"""Leftovers of killed ingests (real processes killed with SIGKILL) are cleaned by the next ingest or
writable open, only when their writer is gone; duplicate appends of one source are refused."""

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.files import leftovers
from pipeline.ingest import ingest
from pipeline.store.features import FeatureStore
from vbcore.errors import StoreError

_INGESTER = textwrap.dedent("""
    import os, signal, sys
    from pipeline.ingest import ingest
    src, out, mode = sys.argv[1:4]
    seen = []
    def progress(n):
        seen.append(n)
        print("batch", flush=True)
        if mode == "stop" and len(seen) == 3:  # a live writer, stopped in the middle of its ingest
            os.kill(os.getpid(), signal.SIGSTOP)
    ingest(src, out, chunk_rows=8, overwrite=mode != "new", progress=progress)
    print("done", flush=True)
""")


def _source(tmp_path: Path, rows: int = 16_000, seed: int = 0) -> Path:
    path = tmp_path / f"src{seed}.npy"
    np.save(path, np.random.default_rng(seed).normal(size=(rows, 4)).astype(np.float32))
    return path


def _start(tmp_path: Path, src: Path, out: Path, mode: str = "new") -> subprocess.Popen:
    """A real ``ingest`` in another process, stopped reading after it wrote three batches."""
    script = tmp_path / "ingester.py"
    script.write_text(_INGESTER)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, str(script), str(src), str(out), mode],
                            stdout=subprocess.PIPE, env=env, text=True)
    for _ in range(3):
        assert proc.stdout.readline().strip() == "batch"
    return proc


def _temps(out: Path) -> list[Path]:
    return sorted(p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def test_a_killed_ingest_leaves_a_temporary_that_the_next_ingest_removes(tmp_path):
    src, out = _source(tmp_path), tmp_path / "s.zarr"
    proc = _start(tmp_path, src, out)
    time.sleep(float(np.random.default_rng().uniform(0.0, 0.3)))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = _temps(out)
    tmp = [p for p in left if p.is_dir() and ".tmp-" in p.name and "journal" not in p.name]
    assert len(tmp) == 1 and leftovers.record_path(tmp[0]).is_file() and not out.exists()
    assert json.loads(leftovers.record_path(tmp[0]).read_text())["pid"] == proc.pid
    rep = ingest(str(src), out, chunk_rows=1000)  # the next ingest: its writer is gone, so it goes
    assert rep.n_rows == 16_000 and _temps(out) == []
    np.testing.assert_array_equal(FeatureStore.open(out).read(), np.load(src))


def test_a_killed_overwrite_is_cleaned_by_a_writable_open(tmp_path):
    src, out = _source(tmp_path), tmp_path / "s.zarr"
    ingest(str(_source(tmp_path, 100, seed=1)), out, chunk_rows=50)
    proc = _start(tmp_path, src, out, "overwrite")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _temps(out) != []
    assert FeatureStore.open(out).n_rows == 100 and _temps(out) != []  # read-only opens leave them
    assert FeatureStore.open(out, "r+").n_rows == 100 and _temps(out) == []


def test_a_live_writers_temporary_is_left_alone_and_mentioned(tmp_path, caplog):
    src, out = _source(tmp_path, 2000), tmp_path / "s.zarr"
    ingest(str(_source(tmp_path, 100, seed=1)), out, chunk_rows=50)
    proc = _start(tmp_path, src, out, "stop")  # it stops itself after its third batch
    try:
        deadline = time.monotonic() + 60
        while (state := Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "T":
            assert state != "Z" and time.monotonic() < deadline, "the ingester did not stop itself"
            time.sleep(0.01)
        before = _temps(out)
        with caplog.at_level(logging.WARNING, logger="pipeline.files.leftovers"):
            FeatureStore.open(out, "r+")
        assert _temps(out) == before
        assert f"its writer is still running: pid {proc.pid} on host {socket.gethostname()}" in caplog.text
    finally:
        proc.send_signal(signal.SIGCONT)
    out_text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out_text.rstrip().endswith("done")
    assert FeatureStore.open(out).n_rows == 2000 and _temps(out) == []


def _fake_temp(out: Path, record: dict) -> Path:
    tmp = out.parent / f".{out.name}.tmp-0123456789ab"
    (tmp / "features").mkdir(parents=True)
    (out.parent / f"{tmp.name}.append-journal").mkdir()
    leftovers.record_path(tmp).write_text(json.dumps(record))
    return tmp


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("case", ["dead", "reused", "rebooted", "other-host", "no-record"])
def test_which_writers_count_as_gone(tmp_path, case):
    out = tmp_path / "s[1]*.zarr"  # glob characters in the name change nothing
    rec = {"host": socket.gethostname(), "pid": os.getpid(), "start": None, "boot": None,
           "created": "2026-01-01T00:00:00+00:00"}
    if case == "dead":
        rec["pid"] = _dead_pid()
    elif case == "reused":  # this process's pid, but another start time: a different process
        rec["start"] = "1"
    elif case == "rebooted":
        rec["boot"] = "another-boot"
    elif case == "other-host":
        rec["host"] = "some-other-host.example"
    tmp = _fake_temp(out, rec)
    if case == "no-record":
        leftovers.record_path(tmp).unlink()
    done = leftovers.clean(out)
    gone = case in ("dead", "reused", "rebooted")
    assert (not tmp.exists()) == gone
    assert (not (tmp.parent / f"{tmp.name}.append-journal").exists()) == gone
    assert (not leftovers.record_path(tmp).exists()) == (gone or case == "no-record")
    if not gone:
        assert [p for p, _ in done.kept] == [str(tmp)]
        assert ("another host" if case == "other-host" else "no writer record") in done.kept[0][1]


def test_the_replaced_store_of_a_killed_overwrite_goes_when_no_writer_is_left(tmp_path):
    out = tmp_path / "s.zarr"
    ingest(str(_source(tmp_path, 100)), out, chunk_rows=50)
    old = tmp_path / ".s.zarr.old-0a1b2c3d"
    (old / "features").mkdir(parents=True)  # renamed aside, then the writer was killed in the discard
    rec = {"host": socket.gethostname(), "pid": _dead_pid()}
    leftovers.record_path(tmp_path / ".s.zarr.tmp-aaaaaaaaaaaa").write_text(json.dumps(rec))
    live = tmp_path / "t.zarr"
    leftovers.make_temp(live)  # a live writer (this process) of another store: not ours to judge
    leftovers.clean(out)
    assert _temps(out) == [] and len(_temps(live)) == 2


# ---- duplicates ---------------------------------------------------------------------------------
def test_a_second_append_of_the_same_source_is_refused(tmp_path):
    src, out = _source(tmp_path, 50), tmp_path / "s.zarr"
    ingest(str(src), out, chunk_rows=16)
    copy = tmp_path / "copy.npy"
    copy.write_bytes(src.read_bytes())  # the same content under another name is the same source
    rec = FeatureStore.open(out).attrs["appends"][0]
    with pytest.raises(StoreError, match=rf"s.zarr: {re.escape(str(copy))} was already appended to this "
                       rf"store on {re.escape(rec['time'])} \(50 rows, as '{re.escape(str(src))}'; same "
                       r"source fingerprint [0-9a-f]{12}\); pass --allow-duplicate \(allow_duplicate=True\)"):
        ingest(str(copy), out, append=True)
    assert FeatureStore.open(out).n_rows == 50
    ingest(str(_source(tmp_path, 30, seed=2)), out, append=True)  # another source: fine
    rep = ingest(str(copy), out, append=True, allow_duplicate=True)
    assert rep.n_rows == 130


_SYN = {"rows": 40, "dim": 3, "classes": 2, "seed": 0}


@pytest.mark.parametrize("first, second, same", [
    (_SYN, {**_SYN, "rows": "40"}, True),
    (_SYN, {**_SYN, "seed": 1}, False),
])
def test_synthetic_sources_are_told_apart_by_their_parameters(tmp_path, first, second, same):
    out = tmp_path / "s.zarr"
    ingest("synthetic", out, chunk_rows=16, **first)
    if same:
        with pytest.raises(StoreError, match=r"synthetic was already appended"):
            ingest("synthetic", out, chunk_rows=16, append=True, **second)
    else:
        assert ingest("synthetic", out, chunk_rows=16, append=True, **second).n_rows == 80


def test_image_stores_record_and_release_their_writer_too(tmp_path):
    """Image folders are built through the same temporaries (pipeline.extract.image_store): nothing is left
    beside the store after a create and an overwrite, and a killed one's temporary is cleaned."""
    from _extract_helpers import make_images, write_tiny_cnn

    model = tmp_path / "tiny.onnx"
    write_tiny_cnn(model)
    root, out = tmp_path / "imgs", tmp_path / "img.zarr"
    make_images(root, 6, seed=0)
    opts = dict(extractor="onnx", model=str(model), chunk_rows=4, batch_images=4, shard_images=4)
    dead = _fake_temp(out, {"host": socket.gethostname(), "pid": _dead_pid()})
    assert ingest(str(root), out, **opts).n_rows == 6 and not dead.exists()
    assert ingest(str(root), out, overwrite=True, **opts).n_rows == 6
    assert [p.name for p in _temps(out)] == []
