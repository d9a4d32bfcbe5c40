"""Progress and structured logs: `vbcluster fit` shows a rich bar (ELBO, clusters alive, s/iter) and
writes one JSON object per iteration; --quiet prints only the summary."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.runs import read_result

runner = CliRunner()


def test_fit_progress_bar_log_and_quiet(tmp_path):
    store = str(tmp_path / "d.zarr")
    res = runner.invoke(app, ["ingest", "digits", "--out", store, "--chunk-rows", "500"])
    assert res.exit_code == 0 and "ingest digits" in res.output and "1,797 rows" in res.output
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "a"), "-k", "8", "--max-iter", "12",
                              "--tol", "0"])
    assert res.exit_code == 0, res.output
    assert "vbem a" in res.output and "12/12" in res.output and "s/iter" in res.output
    records = [json.loads(x) for x in (tmp_path / "a" / "iterations.jsonl").read_text().splitlines()]
    r = read_result(tmp_path / "a")
    assert [x["elbo"] for x in records] == r["elbo_history"]
    assert records[-1]["n_effective"] == r["n_effective"]
    assert all(x["seconds"] > 0 and x["learner"] == "vbem" for x in records)
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "b"), "-k", "8", "--max-iter", "12",
                              "-q"])
    assert res.exit_code == 0 and "s/iter" not in res.output and "vbcluster fit" in res.output
    res = runner.invoke(app, ["ingest", "digits", "--out", str(tmp_path / "e.zarr"), "-q"])
    assert res.exit_code == 0 and "ingest digits" not in res.output and "wrote 1797 rows" in res.output
