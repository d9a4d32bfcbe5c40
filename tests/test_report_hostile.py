"""`vbcluster report` on hostile or damaged run directories (issue 29): strings from result.json are
escaped (no script runs in the browser), numbers it computes with are checked, a log with bytes that
are not UTF-8 and a run directory whose name is not UTF-8 (or holds TeX) still give a report, and a
report killed while writing leaves nothing behind once the next one ran."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import VBMixture
from pipeline.ingest import ingest
from pipeline.runs.directory import save_run
from pipeline.runs.report import write_report
from vbcore.errors import InputError

SCRIPT = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    store = str(tmp / "d.zarr")
    ingest("digits", store, chunk_rows=900)
    model = VBMixture(6, covariance_type="diag", max_iter=5, random_state=0).fit(store)
    save_run(tmp / "run", model, store)
    return tmp / "run"


def _copy(run: Path, dest: Path, **edit) -> Path:
    shutil.copytree(run, dest)
    r = json.loads((dest / "result.json").read_text())
    r.update(edit)
    (dest / "result.json").write_text(json.dumps(r))
    return dest


def test_strings_from_result_json_are_escaped(run, tmp_path):
    settings = json.loads((run / "result.json").read_text())["settings"]
    d = _copy(run, tmp_path / "r<svg onload=alert(2)>", learner=SCRIPT, bound_kind=SCRIPT,
              warm_start_from=f"/x/{SCRIPT}", settings=dict(settings, covariance_type=SCRIPT))
    page = write_report([d]).read_text()
    assert "<script" not in page and "<svg" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;svg onload=alert(2)&gt;" in page


@pytest.mark.parametrize("key", ["n_rows", "n_features"])
def test_non_numeric_sizes_are_refused_in_one_line(run, tmp_path, key):
    d = _copy(run, tmp_path / "r", **{key: SCRIPT})
    with pytest.raises(InputError, match=rf"r/result\.json: {key} must be a positive integer, got "
                                         r"'<script>alert\(1\)</script>'; the file was edited or damaged"):
        write_report([d], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_log_with_bytes_that_are_not_utf8_still_gives_a_report(run, tmp_path):
    d = _copy(run, tmp_path / "r")
    with open(d / "iterations.jsonl", "ab") as f:
        f.write(b'{"iteration": 1, "passes": 1}\n\xff\xfe{"iteration": 2\n')
    page = write_report([d]).read_text()
    assert "ELBO per row" in page


def test_a_run_directory_named_in_other_bytes_than_utf8(run, tmp_path):
    raw = os.fsencode(tmp_path) + b"/run-\xe9t\xe9-$\\nosuchmacro$"  # Latin-1 bytes, and TeX
    d = Path(os.fsdecode(raw))
    _copy(run, d)
    page = write_report([d]).read_text(encoding="utf-8")
    assert "run-\ufffdt\ufffd-$\\nosuchmacro$" in page  # undecodable bytes shown as U+FFFD


def test_a_killed_report_leaves_nothing_once_the_next_one_ran(run, tmp_path):
    """SIGKILL while the report's temporary directory exists; the next report removes it."""
    d = _copy(run, tmp_path / "r")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "report", str(d)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(p.is_dir() for p in d.glob(".report.tmp-*")):  # the writer record comes first
        assert proc.poll() is None and time.monotonic() < deadline, "the report ended before it was killed"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(d.glob(".report.tmp-*"))  # what the killed report left
    write_report([d])
    assert not list(d.glob(".report.*")) and (d / "report" / "report.html").is_file()

