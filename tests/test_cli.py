"""The console script: `vbcluster demo` runs the embedded default job end to end."""

import re
import subprocess
import sys

from typer.testing import CliRunner

from pipeline.cli import app


def test_demo_prints_clusters_elbo_and_metrics():
    result = CliRunner().invoke(app, ["demo", "--n-components", "12", "--max-iter", "50"])
    assert result.exit_code == 0, result.output
    assert "digits: 1797 rows x 64 features, 10 classes" in result.output
    rows = [line for line in result.output.splitlines() if re.search(r"\b(full|diag|spherical)\b", line)]
    assert len(rows) == 3
    header = next(line for line in result.output.splitlines() if "NMI" in line)
    col = [c.strip() for c in header.split("┃")].index("NMI")
    nmis = [float(row.split("│")[col]) for row in rows]
    assert all(0.4 < v <= 1 for v in nmis), nmis  # digits clusters carry real class information


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "version"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.startswith("vbcluster 0.")
