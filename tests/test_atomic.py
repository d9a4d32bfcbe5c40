"""pipeline.files.atomic: write-then-rename files, directories and links; modes follow the umask."""

import os
import shutil
import stat
import tempfile

import numpy as np
import pytest

from pipeline.files import atomic
from pipeline.fit.checkpoint import Checkpointer


@pytest.fixture(params=[0o022, 0o077, 0o002])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_current_umask_reads_without_changing_it(umask):
    assert atomic.current_umask() == umask
    assert atomic.current_umask() == umask  # unchanged by the first read
    assert atomic.file_mode() == 0o666 & ~umask and atomic.dir_mode() == 0o777 & ~umask


def test_write_file_replaces_atomically_with_the_umask_mode(tmp_path, umask):
    p = tmp_path / "out.json"
    atomic.write_bytes(p, "old")
    atomic.write_file(p, lambda f: f.write(b"new"))
    assert p.read_bytes() == b"new"
    assert _mode(p) == 0o666 & ~umask  # 0o644 under 022, 0o600 under 077 (mkstemp alone: 0o600)
    assert sorted(q.name for q in tmp_path.iterdir()) == ["out.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "out.bin"
    atomic.write_bytes(p, b"good")

    def broken(f):
        f.write(b"half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic.write_file(p, broken)
    assert p.read_bytes() == b"good"
    assert [q.name for q in tmp_path.iterdir()] == ["out.bin"]


def test_replace_dir_publishes_whole_and_removes_the_old_one(tmp_path, umask):
    target = tmp_path / "sub" / "report"
    tmp = atomic.temp_dir(target)
    assert tmp.parent == target.parent and tmp.name.startswith(".report.tmp-")
    assert _mode(tmp) == 0o777 & ~umask
    (tmp / "a.txt").write_text("1")
    atomic.replace_dir(tmp, target)
    assert (target / "a.txt").read_text() == "1" and not tmp.exists()
    # a directory made by mkdtemp (0o700) gets the umask's mode when it is published
    tmp2 = tempfile.mkdtemp(dir=tmp_path / "sub")
    open(os.path.join(tmp2, "b.txt"), "w").close()
    gone = []

    def discard(old):
        gone.append(old.name)
        shutil.rmtree(old)

    atomic.replace_dir(tmp2, target, discard=discard)
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert _mode(target) == 0o777 & ~umask
    assert len(gone) == 1 and gone[0].startswith(".report.old-")
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["report"]


def test_replace_symlink_points_at_the_new_target(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    link = tmp_path / "latest"
    atomic.replace_symlink(link, "v1")
    assert os.readlink(link) == "v1"
    atomic.replace_symlink(link, "v2")
    assert os.readlink(link) == "v2" and link.resolve() == (tmp_path / "v2").resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "v1", "v2"]


def test_rename_moves_a_directory(tmp_path):
    (tmp_path / "a").mkdir()
    atomic.rename(tmp_path / "a", tmp_path / "b")
    assert [p.name for p in tmp_path.iterdir()] == ["b"]


def test_checkpoints_honour_the_umask(tmp_path, umask):
    ck = Checkpointer(tmp_path / "ck")
    path = ck.save(1, {"a": np.ones(3)}, {"learner": "vbem"})
    path = ck.save(1, {"a": np.zeros(3)}, {"learner": "vbem"})  # the same iteration again: replaced
    assert _mode(path) == 0o777 & ~umask
    assert {q.name: _mode(q) for q in path.iterdir()} == {"state.npz": 0o666 & ~umask,
                                                          "manifest.json": 0o666 & ~umask}
    np.testing.assert_array_equal(ck.load_latest().state["a"], np.zeros(3))
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["ckpt-00000001"]


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_run_outputs_store_and_report_honour_the_umask(tmp_path, mask):
    """Outputs are 0o666 & ~umask and folders 0o777 & ~umask: readable by colleagues under 022."""
    from pipeline.estimator import VBMixture
    from pipeline.ingest import ingest
    from pipeline.runs.directory import assign_store, save_run
    from pipeline.runs.report import write_report

    x = np.random.default_rng(0).normal(size=(120, 2)).astype(np.float32)
    x[:60] += 6.0
    np.save(tmp_path / "x.npy", x)
    old = os.umask(mask)
    try:
        ingest(str(tmp_path / "x.npy"), tmp_path / "s.zarr", chunk_rows=64)
        model = VBMixture(n_components=2, max_iter=3, random_state=0).fit(str(tmp_path / "s.zarr"))
        run = tmp_path / "run"
        save_run(run, model, str(tmp_path / "s.zarr"))
        target = assign_store(run)
        page = write_report(run, sample=50)
    finally:
        os.umask(old)
    files, dirs = 0o666 & ~mask, 0o777 & ~mask
    assert {p.name: _mode(p) for p in run.iterdir() if p.is_file()} == {"result.json": files,
                                                                       "posterior.npz": files}
    assert _mode(tmp_path / "s.zarr") == dirs and _mode(tmp_path / "s.zarr" / "zarr.json") == files
    assert _mode(target) == dirs
    assert _mode(page.parent) == dirs and _mode(page) == files


def test_a_failed_replace_puts_the_old_directory_back(tmp_path, monkeypatch):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    tmp = atomic.temp_dir(target)
    real = os.replace

    def failing(src, dst):
        if os.fspath(src) == os.fspath(tmp):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", failing)
    with pytest.raises(OSError, match="No space left"):
        atomic.replace_dir(tmp, target)
    assert (target / "old.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [tmp.name, "out"]
