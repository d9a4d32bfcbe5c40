""""Clusters found" has one definition (docs/guide.md section 5, pipeline.runs.directory.CLUSTERS_FOUND): the
components holding at least one expected row, result.json's n_effective. The fit summary, result.json,
the report (table, sizes plot title, clusters section) and `vbcluster demo` give the same number."""

from __future__ import annotations

import re

import numpy as np
from sklearn.datasets import load_digits
from typer.testing import CliRunner

from pipeline import VBMixture
from pipeline.cli import app
from pipeline.ingest import ingest
from pipeline.runs.directory import CLUSTERS_FOUND, read_result
from pipeline.runs.report import COLUMNS, write_report
from pipeline.runs.report_plots import sizes_title

runner = CliRunner()


def _clusters_found_cell(output: str) -> str:
    """The fit summary's value under its right-justified header 'clusters found' (which may wrap at
    its space): the value row is the line after the rule, the cell the one ending where the header
    ends."""
    lines = output.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) <= {"─", " "} and line.strip())
    found = next(line for line in lines[:rule] if re.search(r"\bfound\b", line))
    end = re.search(r"\bfound\b", found).end()
    assert any(line[:end].endswith("clusters") or line[:end].endswith("clusters found")
               for line in lines[:rule]), lines[:rule]
    return lines[rule + 1][:end].split()[-1]


def test_fit_summary_result_json_and_report_agree(tmp_path):
    store = str(tmp_path / "d.zarr")
    ingest("digits", store, chunk_rows=500)
    run = tmp_path / "run"
    res = runner.invoke(app, ["fit", store, "--run-dir", str(run), "-k", "30", "--max-iter", "25", "-q"])
    assert res.exit_code == 0, res.output
    r = read_result(run)
    found = r["n_effective"]
    assert found == int(np.sum(np.asarray(r["counts"]) >= 1.0))  # the definition: >= 1 expected row
    assert _clusters_found_cell(res.output) == str(found)
    page = write_report([run]).read_text()
    cells = re.findall(r"<td[^>]*>(.*?)</td>", page.split("<table>")[1].split("</table>")[0])
    assert "clusters used" not in COLUMNS and "effective K" not in COLUMNS
    assert cells[COLUMNS.index("clusters found")] == str(found)
    assert f"<h3>{found} clusters found" in page  # the clusters section lists exactly those
    assert len(re.findall(r"<div class='cl'><h3>cluster \d+:", page)) == found
    assert sizes_title(r).startswith(f"{found} clusters found of K = ")
    assert CLUSTERS_FOUND in page.replace("&gt;", ">").replace("&#x27;", "'")


def test_demo_counts_clusters_found(tmp_path):
    res = runner.invoke(app, ["demo", "--n-components", "6", "--max-iter", "8"])
    assert res.exit_code == 0, res.output
    X, _ = load_digits(return_X_y=True)
    for ct in ("full", "diag", "spherical"):
        row = next(line for line in res.output.splitlines() if line.strip("│ ").startswith(ct))
        cells = [c.strip() for c in row.strip("│").split("│")]
        model = VBMixture(6, covariance_type=ct, max_iter=8, random_state=0).fit(X)
        assert cells[3] == str(model.n_effective_), (ct, cells)
    assert "clusters found: components holding at least one expected row" in res.output
