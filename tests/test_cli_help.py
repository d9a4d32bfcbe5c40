"""What a new user sees first (issue 29): plain `vbcluster --help` loads none of the heavy libraries
(it took 2.4 s), and at 80 columns neither the help of any command nor the fit summary cuts a word
short with '…'."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from rich.console import Console

from pipeline.cli import fit_table

HEAVY = ("sklearn", "scipy", "pandas", "dask", "distributed", "zarr", "matplotlib", "prefect")
CODE = """
import sys
from flows.cli import app
try:
    app(args=sys.argv[1:])
except SystemExit:
    pass
print("LOADED", sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[0].split(','))))
"""


def _cli(*args: str, columns: int = 80) -> str:
    env = dict(os.environ, COLUMNS=str(columns), TERMINAL_WIDTH=str(columns))
    out = subprocess.run([sys.executable, "-c", CODE, *args], capture_output=True, text=True, env=env,
                         timeout=300)
    return out.stdout + out.stderr


def test_plain_help_loads_no_heavy_library():
    code = CODE.replace("set(sys.argv[0].split(','))", repr(set(HEAVY)))
    out = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=300)
    assert "Usage: " in out.stdout and "LOADED []" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("command", ["fit", "ingest", "deploy", "assign", "report"])
def test_help_at_80_columns_is_whole(command):
    out = _cli(command, "--help")
    assert "Usage: " in out and "…" not in out, out


def test_fit_summary_at_80_columns_is_whole():
    spec = SimpleNamespace(store="/data/features/fashion-mnist-effnet112.zarr", learner="vbem",
                           components=200)
    result = {"n_iter": 137, "converged": True, "n_effective": 187, "elbo": -123456789.123,
              "metrics": {"nmi": 0.61234, "acc": 0.5}, "seconds": 1234.5}
    console = Console(width=80, record=True)
    console.print(fit_table(spec, result))
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    for value in ("vbem", "137", "True", "200", "187", "-1.23457e+08", "0.612", "0.500", "1234.5"):
        assert value in text


def test_the_onnx_output_named_everywhere_is_the_one_the_export_makes():
    """README, `deploy --help` and docs/ingest.md name the tensor docs/ingest.md's VGG16 export makes
    (they said `output=fc7`, a name no exporter gives it); local.yaml does not call itself the default."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    ingest_doc = (root / "docs/ingest.md").read_text()
    assert "`/classifier/classifier.4/Relu_output_0`" in ingest_doc  # the export section's tensor
    texts = {"README.md": (root / "README.md").read_text(), "docs/ingest.md": ingest_doc}
    deploy = _cli("deploy", "--help", columns=200)
    assert "output=fc7" not in deploy
    assert "output=TENSOR (for VGG16's fc7: the tensor docs/ingest.md" in deploy
    for where, text in texts.items():
        names = set(re.findall(r"output=(\S+?)[\s.`)]*(?:\s|$)", text.replace("│", " ")))
        names -= {"NAME,", "None,"}  # the API's signature in docs/ingest.md
        assert names == {"/classifier/classifier.4/Relu_output_0"}, (where, names)
    head = (root / "cluster_config/local.yaml").read_text().splitlines()[:3]
    assert "the default" not in head[0] and "Not the default" in head[1]
    readme = " ".join((root / "cluster_config/README.md").read_text().split())
    assert "Without a config, vbcluster starts no Dask cluster: the chunks run in its own process" in readme
    assert "Without a config, vbcluster uses the settings of `local.yaml`" not in readme  # it said so


def test_defaults_lists_both_faces_and_why_they_differ():
    """`vbcluster defaults`: the command line's and VBMixture's defaults side by side (issue 29)."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    res = CliRunner().invoke(app, ["defaults"], terminal_width=200, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:5]]
            for line in res.output.splitlines() if line.count("│") >= 5 and line.split("│")[1].strip()}
    assert rows["components"][:2] == ["50", "1"] and rows["covariance"][:2] == ["'diag'", "'full'"]
    assert rows["tol"][:2] == ["0.0001", "0.001"] and rows["max_iter"][:2] == ["200", "100"]
    assert rows["n_init"][1] == "same" and all(r[2] for r in rows.values() if r[1] != "same")


def test_study_help_names_every_study():
    """`vbcluster study --help` once named three of the five studies (moves and real were missing)."""
    from pipeline.studies import STUDIES

    said = " ".join(_cli("study", "--help", columns=200).split())
    for name in STUDIES:
        assert f" {name} (" in said, (name, said)


def test_learners_table_shows_no_rest_markup():
    """The learners' one-line descriptions come from their docstrings, whose ``code`` markup the table
    once printed as it was ("Gradient descent along ``-g``")."""
    said = _cli("learners", columns=200)
    assert "Gradient descent along -g" in said and "``" not in said, said


@pytest.mark.parametrize("command", ["learners", "defaults"])
def test_tables_into_a_pipe_fit_80_columns(command):
    """Issue 53, item 15: `learners` and `defaults` printed 110 columns into a pipe; without a terminal
    and without COLUMNS they keep to 80, and COLUMNS is respected."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "LINES")}
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", command], capture_output=True, text=True,
                         env=env, timeout=300)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) > 5, out.stdout + out.stderr
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    wide = _cli(command, columns=150)
    assert max(len(line) for line in wide.splitlines() if "LOADED" not in line) > 80  # COLUMNS respected


def test_fit_help_of_k_names_the_no_grow_flag():
    """Issue 53, item 15: `fit -k`'s help said "see grow", a setting the command line calls --no-grow."""
    said = " ".join(_cli("fit", "--help", columns=200).replace("│", " ").split())
    assert "see grow" not in said
    assert "nearly all of it; --no-grow, grow=False in VBMixture, keeps it)" in said
