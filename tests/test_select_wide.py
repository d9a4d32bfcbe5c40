"""Model selection on wide stores (issue 51; pipeline/fit/select.py ``wide_space``): every candidate is
fitted and compared within one space, the rows' ``select_pca`` leading principal components whitened;
each candidate is the fit of its model in that space, the kept model has the highest full bound, the
space can be fixed or turned off by hand, the bits hold across engines and resume, and the wide-store
default of ``vbcluster fit`` is one switch. Small stores stand in for wide ones (``FULL_MAX_FEATURES``
lowered)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import pipeline.fit.select as select
from pipeline.engine.engines import DaskEngine, LocalEngine
from pipeline.fit.driver import run_fit
from pipeline.fit.select import screen, screened, wide_space
from pipeline.fit.setup import open_source
from pipeline.fit.spec import FitSpec
from pipeline.service import fit
from tests._reference import planted_small_classes
from vbcore.errors import ConfigError


def _spec(**kw) -> FitSpec:
    base = dict(components=5, max_iter=20, tol=1e-6, seed=0, chunk_rows=100, select="auto", select_pca=3)
    return FitSpec(**{**base, **kw}).resolved()


def _rows(seed: int = 4) -> np.ndarray:
    x, _ = planted_small_classes(n_classes=5, d=6, lo=40, hi=90, seed=seed)
    return x


@pytest.fixture
def wide(monkeypatch):
    """Stores of more than 4 dimensions count as wide; short screens."""
    monkeypatch.setattr(select, "FULL_MAX_FEATURES", 4)
    monkeypatch.setattr(select, "SCREEN_MAX_ITER", 10)


def test_every_family_is_screened_within_one_whitened_space(wide, monkeypatch) -> None:
    """Every candidate (full and tied too: the space has 3 dimensions) is on the 3 whitened components,
    its screen bound is its own fit's (the shared projection is the pass each would make), and the
    bounds of the original rows differ from the projected rows' by one constant (the whitening's
    log-Jacobian and the dropped dimensions' Gaussian): the ranking is the projected rows'."""
    monkeypatch.setattr(select, "RESOLUTION", 0.0)
    x = _rows()
    spec = _spec()
    sel = screen(spec, open_source(x, 100), LocalEngine(), 0)
    assert {(c.pca, c.whiten, c.reg_covar) for c in sel.candidates} == {(3, True, None)}
    assert {c.covariance for c in sel.candidates} == set(select.FAMILIES)
    assert len(sel.candidates) == 10  # 4 families x 3 priors less 'bound' of full and tied
    bounds = [c.screen_bound for c in sel.candidates]
    assert bounds == sorted(bounds, reverse=True)
    gaps = []
    for c in sel.candidates:
        own = run_fit(replace(select.chosen_spec(spec, c), max_iter=select.SCREEN_MAX_ITER),
                      open_source(x, 100), LocalEngine(), random_state=0)  # its own projection pass
        assert select.original_bound(own, [x], None) / len(x) == c.screen_bound, (c.covariance, c.priors)
        gaps.append(c.screen_bound * len(x) - own.terms.total)
    assert np.ptp(gaps) < 1e-9 * abs(gaps[0])


def test_the_space_is_fixed_or_turned_off_by_hand(wide, monkeypatch) -> None:
    monkeypatch.setattr(select, "PROJECTED", (("full", 2, True),))
    assert wide_space(_spec(), 6) == 3 and wide_space(_spec(), 4) is None  # narrow: the rows
    assert wide_space(_spec(select_pca=0), 6) is None  # off: the rows, and PROJECTED as before
    assert {c.pca for c in screened(_spec(select_pca=0), 6, None)} == {None, 2}
    assert wide_space(_spec(select_pca=6), 6) is None  # no smaller space
    assert wide_space(_spec(covariance="diag"), 6) is None  # nothing to compare across families
    assert all(c.pca == 3 for c in screened(_spec(priors="sklearn"), 6, None))
    given = screened(_spec(pca=2, whiten=True), 6, None)  # the user's own space: full, tied in it
    assert {c.pca for c in given} == {None} and {"full", "tied"} <= {c.covariance for c in given}
    with pytest.raises(ConfigError, match="select_pca"):
        _spec(select_pca=-1)


def test_the_kept_model_has_the_highest_full_bound(wide) -> None:
    x = _rows(5)
    out = fit(_spec(select_fits=3), open_source(x, 100), "local", random_state=0)
    cands = out.selection["candidates"]
    fitted = [c for c in cands if c["full_bound"] is not None]
    assert len(fitted) == 3 and fitted == cands[:3]
    kept = [c for c in cands if c["chosen"]]
    assert len(kept) == 1 and kept[0]["full_bound"] == max(c["full_bound"] for c in fitted)
    assert out.projection is not None and out.projection.n_components == 3 and out.projection.whiten
    eps = select.resolution_of([x], select.RESOLUTION)
    assert select.original_bound(out, [x], eps) / len(x) == pytest.approx(kept[0]["full_bound"], rel=1e-12)


def test_a_wide_selection_keeps_the_bits_across_engines_and_resume(wide, client, tmp_path) -> None:
    """Screened and fitted on one thread, interrupted and resumed on a 2-worker Dask engine: the same
    candidates, bounds and final bits."""
    x = _rows(6)
    spec = replace(_spec(components=4, tol=0.0, max_iter=6, select_fits=2), checkpoint_every=2)
    with threadpool_limits(limits=1, user_api="blas"):
        ref = fit(spec, open_source(x, 100), LocalEngine(threads=1), random_state=0)
        fit(replace(spec, max_iter=2), open_source(x, 100), LocalEngine(threads=1), random_state=0,
            checkpoint_dir=str(tmp_path / "ck"))
    resumed = fit(spec, open_source(x, 100), DaskEngine(client), random_state=0,
                  checkpoint_dir=str(tmp_path / "ck"))
    assert resumed.resumed_from is not None
    strip = [{k: v for k, v in c.items() if k != "screen_seconds"} for c in ref.selection["candidates"]]
    assert strip == [{k: v for k, v in c.items() if k != "screen_seconds"}
                     for c in resumed.selection["candidates"]]
    assert all(c["pca"] == 3 for c in strip)
    assert resumed.terms.total == ref.terms.total and resumed.history == ref.history
    assert np.array_equal(resumed.post.means, ref.post.means)


def test_the_wide_store_default_is_one_switch(wide, monkeypatch, tmp_path) -> None:
    """``vbcluster fit`` without --select on a wide store: none (the switch off); with the switch on,
    auto, and a --select given is kept."""
    from pipeline.ingest import ingest
    from pipeline.service import make_spec

    stores = {}
    for d in (6, 3):
        np.save(tmp_path / f"x{d}.npy", _rows()[:, :d])
        stores[d] = str(tmp_path / f"s{d}.zarr")
        ingest(str(tmp_path / f"x{d}.npy"), stores[d])
    assert make_spec(stores[6]).select == "none"
    monkeypatch.setattr(select, "SELECT_WIDE_BY_DEFAULT", True)
    assert make_spec(stores[6]).select == "covariance+priors"
    assert make_spec(stores[3]).select == "covariance+priors"  # narrow stores select by default (issue 51)
    assert make_spec(stores[6], select="none").select == "none"
    assert make_spec(stores[6], covariance="full").select == "priors"


def test_the_space_is_set_on_the_command_line(wide, tmp_path) -> None:
    """``--select-pca P`` chooses the space, the run records the kept model on it; 0 screens the rows."""
    from typer.testing import CliRunner

    from pipeline.cli import app
    from pipeline.ingest import ingest
    from pipeline.runs.directory import read_result

    np.save(tmp_path / "x.npy", _rows(7))
    ingest(str(tmp_path / "x.npy"), str(tmp_path / "s.zarr"))
    for p in (2, 0):
        res = CliRunner().invoke(app, ["fit", str(tmp_path / "s.zarr"), "--run-dir", str(tmp_path / f"r{p}"),
                                       "--select", "auto", "--select-pca", str(p), "-k", "4",
                                       "--max-iter", "5", "--priors", "sklearn", "-q"])
        assert res.exit_code == 0, res.output
        r = read_result(tmp_path / f"r{p}")
        assert {c["pca"] for c in r["selection"]["candidates"]} == ({2} if p else {None})
        assert r["settings"]["pca"] == (2 if p else None)
