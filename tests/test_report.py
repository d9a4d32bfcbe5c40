"""`vbcluster report`: one self-contained HTML file with its PNGs; runs of one model and kind of bound on
one ELBO plot, others side by side; the x axis in data passes; "used of K" with K the truncation asked
for; empty clusters in their own colour; a layout for narrow screens; the segmentation of an image
store; a run directory without results refused with nothing written."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from PIL import Image
from typer.testing import CliRunner

from pipeline import VBMixture
from pipeline.cli import app
from pipeline.ingest import ingest
from pipeline.runs.directory import assign_store, read_result, save_run
from pipeline.runs.report import write_report
from pipeline.runs.report_curves import bound_kind, comparable_groups, data_passes, minibatch_step
from pipeline.runs.report_plots import EMPTY_COLOUR, USED_COLOUR, sizes_plot, sizes_title
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
    return (store, _fit(store, tmp / "diag"), _fit(store, tmp / "spherical", covariance_type="spherical"),
            _fit(store, tmp / "diag-seed1", random_state=1))


def _pngs(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)]


def test_one_run_report_is_self_contained(runs):
    store, run, *_ = runs
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


def test_runs_of_one_model_share_the_elbo_plot_others_side_by_side(runs, tmp_path):
    _, diag, spherical, diag1 = runs
    path = write_report([diag, diag1], tmp_path / "same")
    html = path.read_text()
    assert len(_pngs(html)) == 1 + 2 * 3  # one ELBO plot for both; sizes, contingency, PCA per run
    assert (tmp_path / "same" / "elbo.png").is_file() and "panel A" not in html
    # diag and spherical are two models: two ELBO panels, the table says which run is in which
    path = write_report([diag, spherical, diag1], tmp_path / "cmp")
    html = path.read_text()
    assert sorted(p.name for p in path.parent.glob("elbo*.png")) == ["elbo-A.png", "elbo-B.png"]
    assert len(_pngs(html)) == 2 + 3 * 3
    rows = re.findall(r"<tr>(.*?)</tr>", html)[1:]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    assert [c[2].split(",")[0] for c in cells] == ["diag", "spherical", "diag"]  # model column
    assert [c[3] for c in cells] == ["exact"] * 3  # bound kind
    assert [c[4] for c in cells] == ["A", "B", "A"]  # ELBO panel
    assert "panel A: diag (vbem), diag-seed1 (vbem)" in html and "panel B: spherical (vbem)" in html
    assert "distance to the best" not in html  # no plot of a gap that is 0 at its own best point
    # a second report into the same place replaces it whole
    write_report([diag], tmp_path / "cmp")
    assert len(_pngs((tmp_path / "cmp" / "report.html").read_text())) == 4
    assert not list(tmp_path.glob(".cmp.*"))


def test_the_page_reads_on_a_narrow_screen(runs, tmp_path):
    _, diag, spherical, _ = runs
    html = write_report([diag, spherical], tmp_path / "r").read_text()
    assert "<meta name='viewport' content='width=device-width, initial-scale=1'>" in html
    assert "<div class='scroll'><table>" in html and ".scroll{overflow-x:auto" in html  # the table scrolls
    assert "img{max-width:100%;height:auto;min-width:var(--minw,0)}" in html
    assert "@media (max-width:700px)" in html
    assert "<div class='panels'>" in html  # ELBO panels side by side when wide, stacked when narrow


def test_used_of_k_counts_against_the_truncation_asked_for():
    r = {"counts": [300.0, 12.0, 1.0, 0.4, 0.0], "n_components": 80}
    assert sizes_title(r) == "3 clusters found of K = 80 components, 75 pruned during the fit"
    assert sizes_title({"counts": [5.0, 2.0], "n_components": 2}) == "2 clusters found of K = 2 components"
    assert sizes_title(dict(r, n_effective=3)) == sizes_title(r)  # result.json's n_effective when written


def test_empty_clusters_have_their_own_colour(tmp_path):
    def colours(counts):
        sizes_plot({"counts": counts, "n_components": 10}, "t", tmp_path / "s.png")
        rgb = np.asarray(Image.open(tmp_path / "s.png").convert("RGB")).reshape(-1, 3)
        return {tuple(int(round(c * 255)) for c in to_rgb(x)) for x in (USED_COLOUR, EMPTY_COLOUR)} & \
            {tuple(v) for v in np.unique(rgb, axis=0)}

    used, empty = (tuple(int(round(c * 255)) for c in to_rgb(x)) for x in (USED_COLOUR, EMPTY_COLOUR))
    assert colours([50.0, 20.0, 3.0, 0.5, 0.01]) == {used, empty}
    assert colours([50.0, 20.0, 3.0]) == {used}


def test_x_axis_in_data_passes(tmp_path):
    vbem = {"learner": "vbem", "elbo_history": [-3.0, -2.0, -1.0], "elbo": -1.0, "n_rows": 1000,
            "settings": {}}
    x, how = data_passes(tmp_path, vbem)
    assert list(x) == [1, 2, 3] and how == "one pass per iteration"
    ncg = dict(vbem, learner="ncg")
    assert "passes per iteration unknown" in data_passes(tmp_path, ncg)[1]
    # iterations.jsonl: cumulative engine passes; a resumed run repeats iterations (the last one counts)
    lines = [{"iteration": 1, "passes": 3}, {"iteration": 2, "passes": 6}, {"iteration": 2, "passes": 5},
             {"iteration": 3, "passes": 8}]
    (tmp_path / "iterations.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    x, how = data_passes(tmp_path, ncg)
    assert list(x) == [3, 5, 8] and "iterations.jsonl" in how
    # a minibatch step reads minibatch / N of the data (plus a full pass for the exact bound)
    sga = dict(vbem, learner="sga-f", settings={"learner_options": {"minibatch": 250}})
    assert list(data_passes(tmp_path, sga)[0]) == [0.25, 0.5, 0.75]
    assert bound_kind(sga) == "minibatch estimate" and minibatch_step(sga) == 0.25
    assert minibatch_step(vbem) is None and minibatch_step(ncg) is None
    full = dict(sga, settings={"learner_options": {"minibatch": 250, "elbo": "full"}})
    assert list(data_passes(tmp_path, full)[0]) == [1.25, 2.5, 3.75] and bound_kind(full) == "exact"


def test_runs_of_different_truncations_share_an_axis_when_alpha0_does_not_depend_on_k(runs, tmp_path):
    store, *_ = runs
    a = _fit(store, tmp_path / "k6", n_components=6, prior_defaults="empirical", grow=True, max_iter=15)
    b = _fit(store, tmp_path / "k20", n_components=20, prior_defaults="empirical", grow=True, max_iter=15)
    sk = _fit(store, tmp_path / "k6-sk", n_components=6, max_iter=15)
    sk2 = _fit(store, tmp_path / "k20-sk", n_components=20, max_iter=15)
    html = write_report([a, b, sk, sk2], tmp_path / "rep").read_text()
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", html)[1:]]
    # alpha0 = 1 and fitted hyperparameters: one model whatever K; scikit-learn's alpha0 = 1/K: two
    assert [c[4] for c in rows] == ["A", "A", "B", "C"]
    assert "empirical Bayes" in rows[0][2]


def test_a_run_whose_answer_touched_a_limit_is_marked(runs, tmp_path):
    store, *_ = runs
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = _fit(store, tmp_path / "lim", n_components=3, prior_defaults="empirical", grow=True,
                   max_components=3, max_iter=10)
    r = read_result(run)
    assert r["truncation"]["limit_hit"]
    html = write_report([run], tmp_path / "rep").read_text()
    assert "warning: the fit uses 3 of its 3 components and the upper limit --max-components 3" in html
    assert "3 (limit)" in html


def test_groups_split_by_data_model_prior_and_bound():
    base = {"store_fingerprint": "f1", "learner": "vbem", "settings": {"covariance_type": "diag"}}
    prior = {"weight_concentration": 0.1, "fixed_variance": None}
    runs_ = [base, dict(base, learner="ncg"), dict(base, store_fingerprint="f2"),
             dict(base, settings={"covariance_type": "full"}), base,
             dict(base, learner="svi", settings={"covariance_type": "diag"}), base]
    priors = [prior, prior, prior, prior, dict(prior, weight_concentration=0.2), prior, prior]
    assert comparable_groups(runs_, priors) == [[0, 1, 6], [2], [3], [4], [5]]


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
    _, good, *_ = runs
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
    _, a, b, _ = runs
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


def test_minibatch_estimates_show_their_standard_error(tmp_path):
    """The bound cell gives the estimates' median standard error per row; the panel draws a band."""
    from pipeline.runs.report_curves import bound_label, elbo_figures, history_se

    base = {"learner": "sga-f", "elbo_history": [-3.0, -2.0, -1.5], "elbo": -1.4, "n_rows": 1000,
            "settings": {"learner_options": {"minibatch": 250}}}
    sga = dict(base, bound={"history": "minibatch estimate", "final": "exact",
                            "history_se": [40.0, None, 20.0]})
    assert list(history_se(sga)[[0, 2]]) == [40.0, 20.0] and np.isnan(history_se(sga)[1])
    assert bound_label(sga) == "minibatch estimate (SE 0.03/row)"
    assert bound_label(base) == "minibatch estimate" and history_se(base) is None  # older runs
    (tmp_path / "with").mkdir()
    (tmp_path / "without").mkdir()
    [(name, _, members)] = elbo_figures([tmp_path], [sga], ["a"], tmp_path / "with")
    assert name == "elbo.png" and members == [0]
    elbo_figures([tmp_path], [base], ["a"], tmp_path / "without")
    band = np.asarray(Image.open(tmp_path / "with" / name).convert("RGB"), dtype=np.int16)
    plain = np.asarray(Image.open(tmp_path / "without" / name).convert("RGB"), dtype=np.int16)
    assert band.shape == plain.shape and np.any(band != plain)  # the +-2 SE band is drawn
