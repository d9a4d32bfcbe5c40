"""A full disk, for real (issue 29): each case runs in a child process that mounts a small tmpfs in its
own user and mount namespace (``unshare -rm``), so the kernel itself answers ENOSPC. Taking the run
lock, `vbcluster assign --format zarr` and `vbcluster report` name the file they were writing in
their one-line error and leave nothing half-made behind (no ``.lock.tmp-*``, no empty
``STORE/assignments``, no ``.report.tmp-*``). Skipped where unprivileged namespaces are not allowed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.runs.directory import save_run
from pipeline.store.features import FeatureStore

ROOT = Path(__file__).resolve().parents[1]
FILL = """
def fill(mnt):  # every page of the tmpfs taken
    with open(os.path.join(mnt, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError as exc:
            assert exc.errno == 28, exc
"""


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_work(), reason="no unprivileged user/mount namespaces "
                                "(unshare -rm) to mount a small tmpfs in")


def _on_small_disk(mnt: Path, size: str, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (Python; ``MNT`` is the mount point) with a ``size`` tmpfs mounted at ``mnt``."""
    mnt.mkdir(exist_ok=True)
    script = f"import os, sys\nMNT = {str(mnt)!r}\n{FILL}\n{textwrap.dedent(code)}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    return subprocess.run(["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs "$0" && '
                           f'exec "$1" -c "$2"', str(mnt), sys.executable, script],
                          capture_output=True, text=True, env=env, timeout=300)


def _ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_taking_the_run_lock_on_a_full_disk(tmp_path):
    out = _ok(_on_small_disk(tmp_path / "mnt", "64k", """
        from pipeline.files.locks import RunLock
        os.mkdir(os.path.join(MNT, "run"))
        fill(MNT)
        try:
            RunLock(os.path.join(MNT, "run")).acquire()
        except OSError as exc:
            print("error:", exc)
        print("left:", sorted(os.listdir(os.path.join(MNT, "run"))))
    """))
    assert f"error: [Errno 28] No space left on device (writing {tmp_path}/mnt/run/.lock)" in out, out
    assert "left: []" in out  # no .lock.tmp-*


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    rng = np.random.default_rng(0)
    s = FeatureStore.create(tmp / "s.zarr", 3, chunk_rows=500)
    s.append(rng.normal(size=(1000, 3)).astype(np.float32))
    save_run(tmp / "run", VBMixture(3, covariance_type="diag", max_iter=5, random_state=0).fit(
        str(tmp / "s.zarr")), str(tmp / "s.zarr"))
    return tmp


def test_assign_zarr_on_a_full_disk(run, tmp_path):
    out = _ok(_on_small_disk(tmp_path / "mnt", "1m", f"""
        import shutil, subprocess
        store = os.path.join(MNT, "s.zarr")
        shutil.copytree({str(run / "s.zarr")!r}, store)
        fill(MNT)
        res = subprocess.run([sys.executable, "-m", "pipeline.cli", "assign", {str(run / "run")!r},
                              "--store", store], capture_output=True, text=True)
        print("exit:", res.returncode)
        print(res.stderr)
        print("store:", sorted(os.listdir(store)))
    """))
    assert "exit: 1" in out, out
    line = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and "No space left on device" in line[0], out
    assert f"{tmp_path}/mnt/s.zarr/assignments/run" in line[0], out
    assert "'assignments'" not in out.split("store:")[1]  # no empty STORE/assignments left


def test_report_on_a_full_disk(run, tmp_path):
    out = _ok(_on_small_disk(tmp_path / "mnt", "48k", f"""
        from pipeline.runs.report import write_report
        try:
            write_report([{str(run / "run")!r}], os.path.join(MNT, "rep"))
        except OSError as exc:
            print("error:", exc)
        print("left:", sorted(os.listdir(MNT)))
    """))
    assert "No space left on device" in out and f"(writing {tmp_path}/mnt/rep)" in out, out
    assert "left: []" in out  # no .rep.tmp-* and no writer record
