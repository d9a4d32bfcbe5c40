"""Progress and structured logs: `vbcluster fit` shows a rich bar (ELBO, clusters found, s/iter, ETA),
prints its stages before the first iteration (reading, initialising) and writes one JSON object per
iteration; --quiet prints only the summary."""

from __future__ import annotations

import io
import json

from rich.console import Console
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.fit.progress import FitProgress, eta
from pipeline.runs.directory import read_result

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
    # the same command again continues the finished run from its last checkpoint: no iteration is
    # timed, and the bar says so instead of 'nan s/iter'
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "a"), "-k", "8", "--max-iter", "12",
                              "--tol", "0"])
    assert res.exit_code == 0 and "continuing it" in res.output, res.output
    assert "- s/iter" in res.output and "nan" not in res.output
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "b"), "-k", "8", "--max-iter", "12",
                              "-q"])
    assert res.exit_code == 0 and "s/iter" not in res.output and "vbcluster fit" in res.output
    res = runner.invoke(app, ["ingest", "digits", "--out", str(tmp_path / "e.zarr"), "-q"])
    assert res.exit_code == 0 and "ingest digits" not in res.output and "wrote 1797 rows" in res.output


def test_stages_and_eta_are_shown_unless_quiet(tmp_path):
    out = io.StringIO()
    with FitProgress(10, "fit", console=Console(file=out, width=200)) as bar:
        bar.stage("initialising (kmeans, K = 200)")
        bar.stage("iterating")
        bar({"iteration": 1, "elbo": -5.0, "n_effective": 3, "seconds": 4.0})
        bar({"iteration": 2, "elbo": -4.0, "n_effective": 3, "seconds": 2.0})
        status = bar._progress.tasks[0].fields["status"]  # while it runs: 8 iterations at 3 s
    text = out.getvalue()
    assert status == "<= 0:00:24 left"
    assert "initialising (kmeans, K = 200) ..." in text and "initialising (kmeans, K = 200): " in text
    assert eta(3, [600.0, 600.0]) == "<= 0:30:00 left" and eta(0, [1.0]) == "done"
    assert eta(5, []) == ""
    quiet = io.StringIO()
    with FitProgress(10, "fit", quiet=True, console=Console(file=quiet)) as bar:
        bar.stage("initialising (kmeans, K = 200)")
        bar({"iteration": 1, "elbo": -5.0, "n_effective": 3, "seconds": 4.0})
    assert quiet.getvalue() == ""


def test_the_cli_shows_the_initialisation_and_an_eta(tmp_path):
    store = str(tmp_path / "d.zarr")
    assert runner.invoke(app, ["ingest", "digits", "--out", store, "-q"]).exit_code == 0
    args = ["fit", store, "-k", "30", "--max-iter", "5", "--tol", "0", "--init", "kmeans"]
    res = runner.invoke(app, [*args, "--run-dir", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "reading the rows (chunks, moments, prior) ..." in res.output
    start = "initialising (kmeans, K = 30)"
    assert f"{start} ..." in res.output and f"{start}: " in res.output  # its start, then its seconds
    lines = res.output.splitlines()
    assert lines.index(f"{start} ...") < next(i for i, x in enumerate(lines) if "5/5" in x)
    res = runner.invoke(app, [*args, "--run-dir", str(tmp_path / "b"), "-q"])
    assert res.exit_code == 0 and "initialising" not in res.output and "reading the rows" not in res.output


def test_a_log_gets_every_figure_uncut():
    """Issue 53, item 12: in a log (no terminal, 40 columns) the bar's frame was cut to
    'vbem digits-vbem ━ 6… ELBO … 0… finished'; the plain last line keeps every figure."""
    out = io.StringIO()
    with FitProgress(10, "vbem digits-vbem", console=Console(file=out, width=40)) as bar:
        bar({"iteration": 1, "elbo": -51234.5, "n_effective": 13, "seconds": 0.5})
        bar({"iteration": 2, "elbo": -50000.25, "n_effective": 12, "seconds": 0.25})
    assert ("vbem digits-vbem: 2/10 iterations, ELBO -50000.2, clusters found 12, 0.375 s/iter, finished"
            in out.getvalue())


def test_the_projection_pass_shows_its_passes_not_an_empty_bar_of_iterations(tmp_path, monkeypatch):
    """Issue 53, item 12: while `fit --pca` projected the rows, the bar showed `0/200` iterations
    beside its stage; now each stage shows its own progress (the randomized solver's passes over the
    chunks: 'projection pass 2/3', a bar of passes) or none, and the bar of iterations appears when
    they start. Every frame is rendered as a terminal would show it, at each stage."""
    from pipeline.fit import progress

    frames = []

    class Recording(progress.FitProgress):
        def stage(self, text, step=None):
            super().stage(text, *([] if step is None else [step]))
            shot = Console(file=io.StringIO(), width=160, color_system="standard")  # (bars need colour)
            shot.print(self._progress.get_renderable())
            task = self._progress.tasks[0]
            frames.append((text, shot.file.getvalue(), (task.completed, task.total)))

    monkeypatch.setattr(progress, "FitProgress", Recording)
    store = str(tmp_path / "d.zarr")
    assert runner.invoke(app, ["ingest", "digits", "--out", store, "-q"]).exit_code == 0
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "a"), "-k", "5", "--max-iter", "7",
                              "--tol", "0", "--pca", "8", "--pca-solver", "randomized"])
    assert res.exit_code == 0, res.output
    stages = [text for text, _, _ in frames]
    passes = [f"projection pass {i}/3 (randomized, P = 8): 1,797 rows x 64" for i in (1, 2, 3)]
    assert stages[:4] == [*passes, "reading the rows (chunks, moments, prior)"], stages
    for i, (text, frame, bar) in enumerate(frames[:3]):
        assert f"{text} ..." in frame and "/7" not in frame and "ELBO" not in frame, frame
        assert "━" in frame and bar == (i, 3)  # the bar of the passes: i of 3 done
    assert "━" not in frames[3][1] and "/7" not in frames[3][1]  # a stage without passes: no bar
    assert stages[-1] == "iterating" and "0/7" in frames[-1][1]  # the iterations' bar, from here on
    assert "7/7" in res.output and "projection pass 3/3 (randomized, P = 8): 1,797 rows x 64: " in res.output
    exact = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "b"), "-k", "5", "--max-iter", "3",
                                "--pca", "8"])
    assert exact.exit_code == 0, exact.output
    assert "projection pass (exact, P = 8): mean and scatter of 1,797 rows x 64 ..." in exact.output
    assert "projection: eigendecomposition of the 64 x 64 scatter ..." in exact.output
