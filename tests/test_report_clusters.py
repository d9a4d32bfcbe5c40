"""The report's clusters: per cluster its size and its most typical rows (pipeline/runs/typical.py, found
in one pass over the chunks, on both engines), shown by id, with thumbnails for a store ingested from
images, by id only (and saying why) when the images are gone or changed; every id escaped."""

from __future__ import annotations

import base64
import html
import io
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits
from typer.testing import CliRunner

from pipeline import VBMixture
from pipeline.cli import app
from pipeline.engine.engines import DaskEngine, LocalEngine
from pipeline.engine.sources import ArraySource
from pipeline.ingest import ingest
from pipeline.runs.directory import assign_rows, save_run
from pipeline.runs.report import write_report
from pipeline.runs.typical import top_per_cluster, typical_rows
from pipeline.store.features import FeatureStore
from vbcore.kernels.estep import estep_params, log_rho, prepare_chunk


@pytest.fixture(scope="module")
def digits_model():
    X = load_digits().data.astype(np.float64)
    model = VBMixture(n_components=8, covariance_type="diag", max_iter=15, random_state=0).fit(X)
    return X, model


def _brute_force(model, X: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Every row's ln rho (one chunk, float64, all N x K at once: fine at 1,797 x 8) and, per
    cluster, its rows sorted in Python by (-score, row)."""
    shift = model.prior_.mean
    lr = np.asarray(log_rho(prepare_chunk(X, shift, "diag"), estep_params(model.posterior_, shift)))
    lab = lr.argmax(1)
    k = lr.shape[1]
    rows = np.full((k, m), -1)
    for c in range(k):
        mine = sorted(np.flatnonzero(lab == c), key=lambda n: (-lr[n, c], n))[:m]
        rows[c, :len(mine)] = mine
    return rows, lab


def test_typical_rows_match_a_brute_force_reference_whatever_the_chunking(digits_model):
    X, model = digits_model
    want, lab = _brute_force(model, X, 5)
    for chunk_rows in (100, 257, 1797):
        t = typical_rows(model, ArraySource(X, chunk_rows), 5)
        np.testing.assert_array_equal(t.rows, want)
        np.testing.assert_array_equal(t.labels, lab)
        np.testing.assert_array_equal(t.sizes, np.bincount(lab, minlength=8))
        assert np.all(np.diff(t.scores, axis=1)[t.rows[:, 1:] >= 0] <= 0)  # most typical first
    assert (t.labels == assign_rows(model, ArraySource(X, 300))[0]).all()  # the label assign writes


def test_equal_scores_go_to_the_lower_row():
    """Every row twice (two identical chunks, so identical bits): each cluster's list holds a row,
    then its copy, and the first copy always comes first."""
    X = load_digits().data.astype(np.float32)[:600]
    model = VBMixture(n_components=5, covariance_type="diag", max_iter=10, random_state=0).fit(X)
    t = typical_rows(model, ArraySource(np.concatenate([X, X]), 600), 6)
    for k in range(5):
        r = t.rows[k][t.rows[k] >= 0]
        assert len(r) == 6 and (r[0::2] < 600).all() and (r[1::2] == r[0::2] + 600).all()
    # the reduction alone: ties by row, clusters without candidates padded
    rows, scores = top_per_cluster(np.array([1, 1, 1, 0]), np.array([2.0, 5.0, 5.0, 1.0]),
                                   np.array([9, 7, 3, 4]), 3, 2)
    assert rows.tolist() == [[4, -1], [3, 7], [-1, -1]] and scores[1].tolist() == [5.0, 5.0]
    assert np.isneginf(scores[2]).all()


def test_dask_workers_find_the_same_rows(digits_model, client):
    X, model = digits_model
    local = typical_rows(model, ArraySource(X, 200), 4, LocalEngine(persist="never"))
    dask = typical_rows(model, ArraySource(X, 200), 4, DaskEngine(client))
    for name in ("rows", "scores", "labels", "sizes"):
        np.testing.assert_array_equal(getattr(local, name), getattr(dask, name))


def test_report_shows_sizes_and_ids_of_a_feature_store(tmp_path):
    store = str(tmp_path / "d.zarr")
    ingest("digits", store, chunk_rows=500)
    model = VBMixture(n_components=6, covariance_type="diag", max_iter=15, random_state=0).fit(store)
    save_run(tmp_path / "run", model, store)
    page = write_report([tmp_path / "run"]).read_text()
    t = typical_rows(model, ArraySource(load_digits().data.astype(np.float32), 500), 6)
    biggest = int(np.argmax(t.sizes))
    head = f"cluster {biggest}: {t.sizes[biggest]:,} rows, {model.counts_[biggest]:.1f} expected"
    assert head in page
    held = FeatureStore.open(store).read_ids()
    ids = ", ".join(str(held[r]) for r in t.rows[biggest])  # the store's ids of the rows
    assert f"{head}</h3><p class='ids'>{ids}</p>" in page
    assert "data:image/png;base64" not in page.split("<div class='clusters'>")[1]  # no thumbnails


def _colour_folder(root: Path) -> None:
    rng = np.random.default_rng(0)
    for name, rgb in (("red", (220, 30, 30)), ("blue", (30, 30, 220))):
        (root / name).mkdir(parents=True)
        for i in range(12):
            img = np.clip(np.array(rgb) + rng.integers(-20, 20, (16, 16, 3)), 0, 255).astype(np.uint8)
            fname = f"a<b>&{i}.png" if name == "red" else f"{i}.png"  # markup in file names
            Image.fromarray(img).save(root / name / fname)


def _thumbs(page: str) -> list[np.ndarray]:
    part = page.split("<div class='clusters'>")[1]
    return [np.asarray(Image.open(io.BytesIO(base64.b64decode(m))).convert("RGB"))
            for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", part)]


def test_image_store_report_has_thumbnails_then_ids_when_the_images_are_gone(tmp_path):
    src = tmp_path / "imgs"
    _colour_folder(src)
    store = str(tmp_path / "s.zarr")
    ingest(str(src), store, labels="folders", extractor="color-hog", size=16, chunk_rows=8)
    model = VBMixture(n_components=2, covariance_type="spherical", max_iter=20, random_state=0).fit(store)
    save_run(tmp_path / "run", model, store)
    page = write_report([tmp_path / "run"]).read_text()
    thumbs = _thumbs(page)
    assert len(thumbs) == 12 and all(t.shape == (16, 16, 3) for t in thumbs)  # 6 per cluster, 16 px
    reds = sum(t[..., 0].mean() > t[..., 2].mean() for t in thumbs)
    assert reds == 6  # one cluster's thumbnails are red, the other's blue: the images of its rows
    assert page.count('alt="red/a&lt;b&gt;&amp;') == 6 and "a<b>" not in page  # ids escaped
    assert f"thumbnails from {html.escape(str(src))}" in page
    # one image changed since the ingest: shown by its id only, and the page says so
    one = re.search(r'alt="(blue/\d+\.png)"', page)[1]
    os.utime(src / one, ns=(1, 1))
    page = write_report([tmp_path / "run"]).read_text()
    assert len(_thumbs(page)) == 11 and "1 changed since they were ingested" in page
    assert f"<figcaption>{one}</figcaption></figure>" in page
    shutil.move(src, tmp_path / "elsewhere")  # the images are gone: ids only, and why
    page = write_report([tmp_path / "run"]).read_text()
    assert _thumbs(page) == [] and "cannot be located" in page and "without thumbnails" in page
    assert re.search(r"<p class='ids'>blue/\d+\.png, ", page) and "red/a&lt;b&gt;&amp;" in page


def test_a_replaced_image_of_the_same_size_and_time_is_not_shown(tmp_path):
    """Issue 53, item 7: an image replaced after the ingest by a link to a file outside the folder, or
    by other pixels, both of the same size and modification time, is shown by its id only."""
    src = tmp_path / "imgs"
    _colour_folder(src)
    store = str(tmp_path / "s.zarr")
    ingest(str(src), store, labels="folders", extractor="color-hog", size=16, chunk_rows=8)
    model = VBMixture(n_components=2, covariance_type="spherical", max_iter=20, random_state=0).fit(store)
    save_run(tmp_path / "run", model, store)
    page = write_report([tmp_path / "run"]).read_text()
    first, second = re.findall(r'alt="(blue/\d+\.png)"', page)[:2]
    assert len(_thumbs(page)) == 12
    st = os.stat(src / first)
    secret = tmp_path / "outside" / "secret.png"  # a file outside the folder, made the same size
    secret.parent.mkdir()
    Image.fromarray(np.full((16, 16, 3), 7, np.uint8)).save(secret)
    secret.write_bytes(secret.read_bytes()[: st.st_size].ljust(st.st_size, b"\0"))
    os.utime(secret, ns=(st.st_atime_ns, st.st_mtime_ns))
    (src / first).unlink()
    os.symlink(secret, src / first)
    other = src / second  # other pixels (a flat blue, padded) in a file of the same size and time
    st2 = os.stat(other)
    Image.fromarray(np.full((16, 16, 3), (30, 30, 220), np.uint8)).save(other)
    other.write_bytes(other.read_bytes().ljust(st2.st_size, b"\0"))  # Pillow ignores bytes after IEND
    os.utime(other, ns=(st2.st_atime_ns, st2.st_mtime_ns))
    assert os.stat(other).st_size == st2.st_size
    page = write_report([tmp_path / "run"]).read_text()
    assert "1 whose pixels changed since they were ingested (same size and time)" in page
    assert f"<figcaption>{second}</figcaption></figure>" in page
    assert "1 links out of the source folder" in page
    assert f"<figcaption>{first}</figcaption></figure>" in page  # by its id only
    assert len(_thumbs(page)) == 10 and all(t.mean() > 8 for t in _thumbs(page))  # never the outside file


def test_a_store_from_idx_files_shows_its_images(tmp_path):
    """MNIST-format files (ids PREFIX/INDEX): the thumbnails are the grey images of the rows."""
    rng = np.random.default_rng(1)
    dark = rng.integers(0, 40, (12, 8, 8))
    bright = rng.integers(200, 256, (12, 8, 8))
    images = np.concatenate([dark, bright]).astype(np.uint8)
    head = bytes([0, 0, 8, 3]) + b"".join(int(v).to_bytes(4, "big") for v in images.shape)
    (tmp_path / "idx").mkdir()
    (tmp_path / "idx" / "train-images-idx3-ubyte").write_bytes(head + images.tobytes())
    store = str(tmp_path / "s.zarr")
    ingest(str(tmp_path / "idx"), store, extractor="color-hog", size=16, chunk_rows=8)
    model = VBMixture(n_components=2, covariance_type="spherical", max_iter=20, random_state=0).fit(store)
    save_run(tmp_path / "run", model, store)
    page = write_report([tmp_path / "run"]).read_text()
    thumbs = _thumbs(page)
    assert len(thumbs) == 12 and all(t.shape == (8, 8, 3) for t in thumbs)
    shown = re.findall(r'alt="train/(\d+)"', page)
    for index, thumb in zip(shown, thumbs, strict=True):
        np.testing.assert_array_equal(thumb[..., 0], images[int(index)])  # the row's own image


def test_the_report_pass_runs_on_dask_workers(tmp_path, client):
    """`write_report(engine=DaskEngine)` (`vbcluster report --cluster`, and cluster_flow's report on
    the flow's cluster) maps the pass over the chunks on the workers: the same page section."""
    store = str(tmp_path / "d.zarr")
    ingest("digits", store, chunk_rows=300)
    model = VBMixture(n_components=6, covariance_type="diag", max_iter=10, random_state=0).fit(store)
    save_run(tmp_path / "run", model, store)
    local = write_report([tmp_path / "run"], tmp_path / "local").read_text()
    on_dask = write_report([tmp_path / "run"], tmp_path / "dask", engine=DaskEngine(client)).read_text()
    section = "<div class='clusters'>"
    assert section in local and local.split(section)[1] == on_dask.split(section)[1]
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--out", str(tmp_path / "cli"),
                                   "--cluster", client.scheduler.address])
    assert res.exit_code == 0 and f"Dask cluster: {client.scheduler.address}" in res.output, res.output
    assert (tmp_path / "cli" / "report.html").read_text().split(section)[1] == local.split(section)[1]


def test_rows_of_weight_zero_are_no_clusters_rows(tmp_path):
    """A store with weights: a row of weight 0 keeps its label (assign writes every row's) but is
    neither counted in its cluster's size nor shown as one of its most typical rows, even where it
    sits at the cluster's centre (here: one such row per blob, exactly at its mean)."""
    from pipeline.engine.sources import StoreSource

    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [8.0, 8.0]])
    X = np.concatenate([rng.normal(c, 1.0, (200, 2)) for c in centres] + [centres])  # rows 400, 401
    w = np.r_[np.ones(400), 0.0, 0.0]
    path = tmp_path / "w.zarr"
    FeatureStore.create(path, 2, chunk_rows=64, weights=True).append(X, weights=w)
    model = VBMixture(2, covariance_type="diag", random_state=0).fit(str(path))
    typical = typical_rows(model, StoreSource(str(path)), m=3)
    assert typical.labels.shape == (402,) and typical.sizes.sum() == 400
    assert not np.isin(typical.rows, [400, 401]).any()
    unweighted = typical_rows(model, ArraySource(X, 64), m=3)  # the same rows without weights: shown
    assert np.isin(unweighted.rows[:, 0], [400, 401]).all() and unweighted.sizes.sum() == 402


def test_the_reports_plots_of_a_weighted_store_leave_rows_of_weight_zero_out(tmp_path, monkeypatch):
    """The PCA plot's sample and the contingency hold only rows the fit counted: rows of weight 0
    (here far away and labelled 9) are in neither."""
    import pipeline.runs.report as report

    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(c, 1.0, (100, 2)) for c in (0.0, 8.0)] + [np.full((20, 2), 100.0)])
    labels = np.r_[np.zeros(100), np.ones(100), np.full(20, 9)].astype(np.int64)
    w = np.r_[np.ones(200), np.zeros(20)]
    path = tmp_path / "w.zarr"
    FeatureStore.create(path, 2, chunk_rows=64, weights=True, labels=True).append(X, labels=labels, weights=w)
    model = VBMixture(2, covariance_type="diag", random_state=0).fit(str(path))
    save_run(tmp_path / "run", model, str(path))
    seen, pca, table = {}, report._pca_plot, report.contingency_plot

    def pca_plot(X, *args):
        seen["pca"] = X
        pca(X, *args)

    def contingency_plot(lab, pred, title, path, weights=None, names=None):
        seen["classes"] = set(lab[weights > 0].tolist())
        return table(lab, pred, title, path, weights, names)

    monkeypatch.setattr(report, "_pca_plot", pca_plot)
    monkeypatch.setattr(report, "contingency_plot", contingency_plot)
    write_report([tmp_path / "run"])
    assert seen["pca"].shape[0] == 200 and seen["pca"].max() < 50.0
    assert seen["classes"] == {0, 1}


def test_class_axis_shows_the_folder_names_and_six_thumbnails_fit_a_cell(tmp_path):
    """Issue 53, item 15: the contingency's class axis showed 0-9 where the store records folder names;
    a cluster's six thumbnails wrapped as 5 + 1 in a 300 px cell."""
    from pipeline.runs.report_clusters import CSS, EXEMPLARS
    from pipeline.runs.report_plots import contingency_plot

    y = np.array([0, 0, 1, 1, 2, 2])
    ticks = contingency_plot(y, np.array([0, 0, 1, 1, 1, 0]), "t", tmp_path / "c.png",
                             names=["cat", "dog", "emu"])
    assert ticks == ["cat", "dog", "emu"] and (tmp_path / "c.png").stat().st_size > 0
    assert contingency_plot(y, y, "t", tmp_path / "d.png") == ["0", "1", "2"]  # no names: the codes
    assert contingency_plot(y, y, "t", tmp_path / "e.png", names=["cat"]) == ["0", "1", "2"]  # too few
    src = tmp_path / "imgs"
    _colour_folder(src)
    store = str(tmp_path / "s.zarr")
    ingest(str(src), store, labels="folders", extractor="color-hog", size=16, chunk_rows=8)
    assert FeatureStore.open(store).attrs["extractor_params"]["classes"] == ["blue", "red"]
    model = VBMixture(n_components=2, covariance_type="spherical", max_iter=5, random_state=0).fit(store)
    save_run(tmp_path / "run", model, store)
    page = write_report([tmp_path / "run"]).read_text()
    assert "run0-contingency.png" in page and "store plots skipped" not in page
    cell = int(re.search(r"minmax\(min\(100%,(\d+)px\)", CSS)[1])
    figure = int(re.search(r"\.ex figure\{margin:0;width:(\d+)px\}", CSS)[1])
    gap = int(re.search(r"\.ex\{display:flex;flex-wrap:wrap;gap:(\d+)px\}", CSS)[1])
    assert cell >= EXEMPLARS * figure + (EXEMPLARS - 1) * gap  # six on one line


def test_a_synthetic_store_whose_classes_is_a_count_reports_label_codes(tmp_path):
    """``make demo`` failed: a synthetic store records ``classes`` as the number of classes, not
    their names; the report then shows the label codes."""
    store = str(tmp_path / "s.zarr")
    ingest("synthetic", store, rows=300, dim=4, classes=3, seed=0)
    model = VBMixture(n_components=3, covariance_type="diag", max_iter=5, random_state=0).fit(store)
    save_run(tmp_path / "run", model, store)
    page = write_report([tmp_path / "run"]).read_text()
    assert "class (label)" in page or "contingency" in page


def test_ingest_refuses_an_image_linked_from_outside_the_folder(tmp_path):
    """Issue 53, item 7: ingest (an extraction from a folder) does not follow a link out of the folder;
    it names the link and its target in one line and writes nothing. A link inside the folder is read."""
    src = tmp_path / "imgs"
    _colour_folder(src)
    first = sorted((src / "blue").glob("*.png"))[0]
    n_images = len(list(src.rglob("*.png")))
    os.symlink(first, src / "blue" / "inner-link.png")  # inside: read like any image
    ingest(str(src), str(tmp_path / "ok.zarr"), labels="folders", extractor="color-hog", size=16, chunk_rows=8)
    assert FeatureStore.open(tmp_path / "ok.zarr").n_rows == n_images + 1
    outside = tmp_path / "outside.png"
    shutil.copy(first, outside)
    os.symlink(outside, src / "red" / "outer-link.png")
    res = CliRunner().invoke(app, ["ingest", str(src), "--out", str(tmp_path / "s.zarr"), "--labels", "folders",
                                   "-o", "extractor=color-hog", "-o", "size=16", "-q"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert re.search(r"outer-link\.png: a symbolic link out of the image folder \(to .*outside\.png\); "
                     r"vbcluster reads only files inside the folder", lines[0]), lines[0]
    assert not (tmp_path / "s.zarr").exists()
