"""The fit-time row normalisation (``--normalize``, kept with the projection) and ``vbcluster fit``'s
default on wide stores of non-negative rows (issue 51; :mod:`pipeline.fit.wide`): the transform
against NumPy, the projection and every reader of a run applying it, the rule triggering only where it
should, and a small wide non-negative store fitted end to end through the command line."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import pipeline.fit.select as select
import pipeline.fit.wide as wide
from pipeline.engine.engines import LocalEngine
from pipeline.engine.sources import ArraySource
from pipeline.fit.projection import projection_pass
from pipeline.fit.spec import FitSpec
from pipeline.store.features import FeatureStore
from vbcore.data.normalize import normalize_chunk, normalize_rows
from vbcore.errors import ConfigError
from vbcore.kernels.projection import Projection


def _rows(n=500, d=7, seed=0, negative=False):
    """Rows with exact zeros (a third of the values), a large spread of scales and one all-zero row."""
    rng = np.random.default_rng(seed)
    x = rng.gamma(0.5, 1.0, size=(n, d)) * rng.uniform(0.01, 100, d)
    x[rng.random((n, d)) < 0.33] = 0.0
    x[3] = 0.0
    if negative:
        x[7, 2] = -1e-3
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ["l2", "power-l2"])
def test_normalize_chunk_equals_numpy(dtype, method):
    x = _rows(negative=True).astype(dtype)
    ref = np.asarray(x, dtype=np.longdouble)  # extended precision, then rounded
    if method == "power-l2":
        ref = np.sign(ref) * np.sqrt(np.abs(ref))
    norm = np.sqrt((ref * ref).sum(1))
    ref = np.where(norm[:, None] > 0, ref / np.where(norm > 0, norm, 1)[:, None], 0.0)
    got = normalize_chunk(x, method)
    assert got.dtype == dtype and got.shape == x.shape
    tol = 4 * np.finfo(dtype).eps
    assert np.abs(got - ref.astype(np.float64)).max() <= tol
    assert np.array_equal(got, normalize_rows(x, method, dtype=dtype))  # one transform, ingest's too
    assert not got[3].any() and np.isfinite(got).all()  # an all-zero row stays zeros
    assert normalize_chunk(x, "none") is x


def test_the_projection_applies_its_normalisation_and_keeps_it():
    x = _rows()
    plain = projection_pass(LocalEngine(threads=1), ArraySource(normalize_rows(x, "power-l2"), 128), 3, True)
    proj = projection_pass(LocalEngine(threads=1), ArraySource(x, 128), 3, True, normalize="power-l2")
    assert proj.normalize == "power-l2" and plain.normalize == "none"
    for k, v in plain.to_arrays().items():  # the pass on the normalised rows: the same bits
        assert np.array_equal(v, proj.to_arrays()[k]), k
    want = (normalize_rows(x, "power-l2") - proj.mean) @ proj.matrix()
    np.testing.assert_allclose(proj.apply(x), want, rtol=0, atol=1e-12 * np.abs(want).max())
    back = Projection.from_arrays(proj.to_arrays())
    assert back is not None and back.normalize == "power-l2"
    assert np.array_equal(back.apply(x), proj.apply(x))
    old = {k: v for k, v in plain.to_arrays().items()}  # a run saved before the setting: none
    assert "projection_normalize" not in old and Projection.from_arrays(old).normalize == "none"
    rnd = projection_pass(LocalEngine(threads=1), ArraySource(x, 128), 3, True, "randomized", 0, None,
                          "power-l2")
    ref = projection_pass(LocalEngine(threads=1), ArraySource(normalize_rows(x, "power-l2"), 128), 3, True,
                          "randomized", 0)
    assert rnd.normalize == "power-l2" and np.array_equal(rnd.components, ref.components)


def test_normalize_is_checked_with_one_line():
    with pytest.raises(ConfigError, match=r"normalize \(--normalize\) needs pca \(--pca\)"):
        FitSpec(normalize="power-l2").resolved()
    with pytest.raises(ConfigError, match=r"\(--normalize\) must be one of none, l2, power-l2, got 'sqrt'"):
        FitSpec(normalize="sqrt", pca=3).resolved()
    assert FitSpec(normalize="l2", pca=3).resolved().normalize == "l2"
    assert FitSpec(normalize="l2", select="covariance").resolved().normalize == "l2"  # the wide space


def _store(path, x, normalize="none"):
    FeatureStore.create(str(path), x.shape[1], chunk_rows=200, normalize=normalize).append(x)
    return str(path)


@pytest.fixture
def narrow_wide(monkeypatch):
    """Stores of more than 4 dimensions count as wide; the rule switched on."""
    monkeypatch.setattr(select, "FULL_MAX_FEATURES", 4)
    monkeypatch.setattr(wide, "WIDE_DEFAULT", True)


def test_the_wide_default_triggers_only_where_it_should(tmp_path, narrow_wide, monkeypatch):
    from pipeline.service import make_spec

    x = _rows()
    pos = _store(tmp_path / "pos.zarr", x)
    spec = make_spec(pos)
    assert (spec.normalize, spec.select, spec.priors) == ("power-l2", "covariance", "empirical")
    assert spec.pca is None  # the selection's space (select_pca) is the projection
    assert spec.select_pca == wide.WIDE_SPACE != FitSpec().select_pca
    assert make_spec(pos, select_pca=5).select_pca == 5  # the space given by hand: kept
    assert spec.learner_options["accelerate"] is True
    assert make_spec(pos, learner_options={"accelerate": "false"}).learner_options["accelerate"] is False
    assert make_spec(pos, priors="sklearn").priors == "sklearn"  # priors by hand: kept, family selected
    plain = make_spec(pos, select="none")
    assert (plain.normalize, plain.select, plain.covariance) == ("none", "none", "diag")
    assert plain.learner_options["accelerate"] is False
    for given in ({"covariance": "full"}, {"pca": 3}, {"normalize": "none"}, {"learner": "sga-f"}):
        got = make_spec(pos, **given)
        assert got.normalize == "none" and got.select == "none", given
    neg = make_spec(_store(tmp_path / "neg.zarr", _rows(negative=True)))  # one negative value
    assert neg == replace(plain, store=neg.store)
    narrow = make_spec(_store(tmp_path / "narrow.zarr", x[:, :4]))
    # not the wide rule: the narrow stores' own default (the model selected by its bound, no normalisation)
    assert (narrow.normalize, narrow.select) == ("none", "covariance+priors")
    pl2 = make_spec(_store(tmp_path / "pl2.zarr", x, normalize="power-l2"))  # normalised at ingest
    assert (pl2.normalize, pl2.select) == ("none", "covariance")
    monkeypatch.setattr(wide, "WIDE_DEFAULT", False)
    assert make_spec(pos) == replace(plain, store=make_spec(pos).store)


def test_a_wide_nonnegative_store_fits_end_to_end_through_the_command_line(tmp_path, monkeypatch):
    """300 dimensions (the real threshold), non-negative rows: ``vbcluster fit`` with the defaults (K and
    the space made small for time) normalises, selects in the whitened space, records it; ``assign``
    applies the same normalisation and projection as the fit."""
    import json

    import zarr
    from typer.testing import CliRunner

    from pipeline.cli import app
    from pipeline.estimator import load_model
    from pipeline.runs.directory import assign_store

    assert wide.WIDE_DEFAULT  # the shipped default, not switched on here
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 600)
    x = np.maximum(rng.normal(size=(3, 300))[y] * 2 + rng.normal(size=(600, 300)), 0).astype(np.float32)
    store = _store(tmp_path / "s.zarr", x)
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(run), "-k", "6", "--select-pca", "6"])
    assert res.exit_code == 0, res.output
    assert "power-l2-normalised rows" in " ".join(res.output.split())
    spec = json.loads((run / "run.json").read_text())
    assert (spec["normalize"], spec["select"]) == ("power-l2", "covariance")
    sel = json.loads((run / "result.json").read_text())["selection"]
    assert sel["normalize"] == "power-l2" and {c["pca"] for c in sel["candidates"]} == {6}
    assert {c["covariance"] for c in sel["candidates"]} == set(select.FAMILIES)
    assert [c["chosen"] for c in sel["candidates"]].count(True) == 1
    model = load_model(run)
    assert model.projection_.normalize == "power-l2" and model.projection_.n_components == 6
    res = CliRunner().invoke(app, ["assign", str(run)])
    assert res.exit_code == 0, res.output
    labels = zarr.open_group(str(assign_store(run)), mode="r")["labels"][:]
    np.testing.assert_array_equal(labels, model.predict(x))
    by_hand = replace(model.projection_, normalize="none")  # the rows normalised here instead
    model.projection_ = by_hand
    np.testing.assert_array_equal(labels, model.predict(normalize_rows(x, "power-l2", dtype=np.float32)))


def test_the_wide_space_screens_from_at_most_screen_wide_k_components(tmp_path, monkeypatch):
    """``-k`` above ``SCREEN_WIDE_K``: every candidate of the wide space starts its screen from
    ``SCREEN_WIDE_K`` components (held here by ``--no-grow``), the winner's full fit from ``-k``."""
    import json

    from typer.testing import CliRunner

    from pipeline.cli import app

    rng = np.random.default_rng(2)
    y = rng.integers(0, 6, 900)
    x = np.maximum(rng.normal(size=(6, 300))[y] * 4 + rng.normal(size=(900, 300)), 0).astype(np.float32)
    store = _store(tmp_path / "s.zarr", x)

    def clusters(cap):
        monkeypatch.setattr(select, "SCREEN_WIDE_K", cap)
        run = tmp_path / f"run{cap}"
        res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(run), "-k", "8", "--no-grow",
                                       "--select-pca", "8"])
        assert res.exit_code == 0, res.output
        result = json.loads((run / "result.json").read_text())
        return [c["screen_clusters"] for c in result["selection"]["candidates"]], result["n_effective"]

    screened, fitted = clusters(3)
    assert max(screened) <= 3 < fitted  # the screen from 3 components, the full fit from 8
    assert max(clusters(50)[0]) > 3  # the cap above -k: the screen from -k, as before


def _bench_dimension():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "bench_wide_dimension.py"
    spec = importlib.util.spec_from_file_location("bench_wide_dimension", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("rank", [3, 7, 12])
def test_the_spectrum_dimensions_against_scikit_learn_and_a_planted_spectrum(rank):
    """bench/bench_wide_dimension.py (the measurement that left the wide default's space at 64:
    docs/decisions.md): Minka's evidence against scikit-learn's ``PCA(n_components='mle')`` on rows of
    a planted rank over unit white noise, and the Marchenko-Pastur count and noise variance (the
    planted rank, the noise's variance within 5%)."""
    from sklearn.decomposition import PCA

    b = _bench_dimension()
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((400, rank)) @ rng.standard_normal((rank, 30)) * 2
    x += rng.standard_normal((400, 30))
    lam = PCA(svd_solver="full").fit(x).explained_variance_
    assert b.minka_dimension(lam, 400, 29) == PCA(n_components="mle", svd_solver="full").fit(x).n_components_
    assert b.minka_dimension(lam, 400, 29) == rank
    assert b.minka_dimension(lam, 400, rank - 1) == rank - 1  # the cap holds
    k, sigma2 = b.mp_dimension(np.linalg.eigvalsh(np.cov(x.T)), 400)
    assert k == rank and abs(sigma2 - 1.0) < 0.05
    flat = np.full(30, 2.0)  # white noise's spectrum exactly: nothing above the edge
    assert b.mp_dimension(flat, 400) == (0, 2.0)
