"""`vbcluster report`: one self-contained HTML file with its PNGs; several runs on one ELBO plot; the
segmentation of an image store; a run directory without results refused with nothing written."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from pipeline import VBMixture
from pipeline.cli import app
from pipeline.ingest import ingest
from pipeline.report import write_report
from pipeline.runs import assign_store, read_result, save_run
from vbcore.errors import InputError

runner = CliRunner()


def _fit(store: str, run: Path, **kw) -> Path:
    model = VBMixture(**dict(dict(n_components=12, covariance_type="diag", max_iter=30, random_state=0),
                             **kw))
    model.fit(store)
    save_run(run, model, store)
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    store = str(tmp / "digits.zarr")
    ingest("digits", store, chunk_rows=500)
    return store, _fit(store, tmp / "diag"), _fit(store, tmp / "spherical", covariance_type="spherical")


def _pngs(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)]


def test_one_run_report_is_self_contained(runs):
    store, run, _ = runs
    path = write_report([run])
    assert path == run / "report" / "report.html"
    html = path.read_text()
    embedded = _pngs(html)
    files = sorted(p.name for p in path.parent.glob("*.png"))
    assert files == ["elbo.png", "run0-contingency.png", "run0-pca.png", "run0-sizes.png"]
    # each PNG beside the HTML is the one embedded in it, and is a real image of a readable size
    assert sorted(embedded) == sorted((path.parent / f).read_bytes() for f in files)
    for f in files:
        w, h = Image.open(path.parent / f).size
        assert w >= 600 and h >= 350, (f, w, h)
    # the summary table holds the run's numbers
    r = read_result(run)
    assert f"{r['metrics']['nmi']:.3f}" in html and str(r["n_effective"]) in html
    assert "<script" not in html and "src=\"http" not in html  # nothing fetched from elsewhere


def test_several_runs_share_the_elbo_plot(runs, tmp_path):
    _, a, b = runs
    path = write_report([a, b], tmp_path / "cmp")
    html = path.read_text()
    assert len(_pngs(html)) == 1 + 2 * 3  # one ELBO plot for both; sizes, contingency, PCA per run
    assert "diag (vbem)" in html and "spherical (vbem)" in html
    # a second report into the same place replaces it whole
    write_report([a], tmp_path / "cmp")
    assert len(_pngs((tmp_path / "cmp" / "report.html").read_text())) == 4
    assert not list(tmp_path.glob(".cmp.*"))


def test_image_store_report_has_the_segmentation(tmp_path):
    store = str(tmp_path / "img.zarr")
    ingest("image:astronaut", store, downsample=8)
    run = _fit(store, tmp_path / "img", n_components=8, max_iter=20)
    path = write_report([run])
    names = sorted(p.name for p in path.parent.glob("*.png"))
    assert names == ["elbo.png", "run0-pca.png", "run0-segmentation.png", "run0-sizes.png"]
    assert "the store has no labels" in path.read_text()
    seg = np.asarray(Image.open(path.parent / "run0-segmentation.png").convert("RGB"))
    assert len(np.unique(seg.reshape(-1, 3), axis=0)) > 8  # the image and its segmentation are drawn


def test_a_run_without_results_is_refused_and_nothing_is_written(runs, tmp_path):
    _, good, _ = runs
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=r"empty: no result\.json or posterior\.npz: not a finished "
                                         r"vbcluster run directory"):
        write_report([good, empty], tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    res = runner.invoke(app, ["report", str(empty)])
    assert res.exit_code == 2 and "not a finished vbcluster run directory" in res.output
    assert list(empty.iterdir()) == []


def test_cli_report(runs, tmp_path):
    _, a, b = runs
    res = runner.invoke(app, ["report", str(a), str(b), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r" / "report.html").is_file() and "wrote" in res.output


def test_report_reads_the_runs_own_assignments_only(tmp_path):
    store = str(tmp_path / "d.zarr")
    ingest("digits", store, chunk_rows=900)
    run = _fit(store, tmp_path / "run", max_iter=10)
    assign_store(run)
    html = write_report([run]).read_text()
    assert "clusters read from" in html
    _fit(store, run, max_iter=10, random_state=1)  # a new fit into the same directory
    html = write_report([run]).read_text()
    assert "clusters read from" not in html  # the old labels belong to the old posterior
