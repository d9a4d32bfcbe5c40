"""The low-rank family in model selection (issue 51; pipeline/fit/select.py): its candidates (one per
rank), their bounds at the screen's resolution (vbcore.model.mfa.dequantized: exact against quadrature
in tests/test_mfa.py), a low-rank winner fitted in full and recorded with its rank, the same bits across
engines and resume."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import pipeline.fit.select as select
from pipeline.engine.engines import DaskEngine, LocalEngine
from pipeline.engine.sources import StoreSource
from pipeline.fit.lowrank import run_lowrank
from pipeline.fit.select import lowrank_bound, lowrank_ranks, screen
from pipeline.fit.setup import open_source
from pipeline.fit.spec import FitSpec
from pipeline.service import fit
from pipeline.store.features import FeatureStore
from vbcore.model import mfa


def _planes(n_per: int = 200, d: int = 12, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Three classes, each its own mean and 2-dimensional subspace, plus isotropic noise."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in range(3):
        lam = rng.normal(size=(d, 2)) * 2.0
        xs.append(rng.normal(size=(n_per, 2)) @ lam.T + rng.normal(size=d) * 4.0
                  + 0.3 * rng.normal(size=(n_per, d)))
        ys.append(np.full(n_per, c))
    order = rng.permutation(3 * n_per)
    return np.concatenate(xs)[order].astype(np.float32), np.concatenate(ys)[order]


def _spec(**kw) -> FitSpec:
    base = dict(components=5, max_iter=30, tol=1e-6, seed=0, chunk_rows=100, select="auto")
    return FitSpec(**{**base, **kw}).resolved()


def test_the_ranks_screened() -> None:
    """2 and 8 below D when the covariance is selected and the family fits the spec; --rank when
    --covariance lowrank is given; none otherwise (priors have no low-rank variants)."""
    assert lowrank_ranks(_spec(), 12) == [2, 8]
    assert lowrank_ranks(_spec(), 8) == [2] and lowrank_ranks(_spec(), 2) == []
    assert lowrank_ranks(_spec(covariance="lowrank", rank=3), 12) == [3]
    assert lowrank_ranks(_spec(covariance="lowrank", rank=3, select="none"), 12) == []
    for other in ({"covariance": "diag"}, {"pca": 4}, {"learner": "sga"}, {"n_init": 2},
                  {"select": "priors"}):
        assert lowrank_ranks(_spec(**other), 12) == [], other
    assert select.candidates(_spec(covariance="lowrank"), 12) == []  # (no Gaussian family given lowrank)
    assert select.label({"covariance": "lowrank", "rank": 8, "pca": None}) == "lowrank Q=8"


def test_a_lowrank_candidate_is_scored_at_the_resolution(monkeypatch) -> None:
    """Each low-rank candidate is the fit of ``--covariance lowrank --rank Q`` with reg_covar eps^2/12 (the
    dequantized rows' M-step), scored by the bound at the resolution (its plain bound less the penalty
    with q(x | z) free: vbcore.model.mfa.resolution_penalty; exact against quadrature in test_mfa.py); a
    fit at another reg_covar is moved to the resolution the same way."""
    monkeypatch.setattr(select, "SCREEN_MAX_ITER", 12)
    monkeypatch.setattr(select, "candidates", lambda spec, d: [])
    monkeypatch.setattr(select, "PROJECTED", ())
    x, _ = _planes()
    sel = screen(_spec(), open_source(x, 100), LocalEngine(), 0)
    assert sorted(c.rank for c in sel.candidates) == [2, 8]
    eps = select.resolution_of([x], select.RESOLUTION)
    for c in sel.candidates:
        assert c.covariance == "lowrank" and c.reg_covar == pytest.approx(float(eps[0]) ** 2 / 12, rel=1e-12)
        out = run_lowrank(replace(select.chosen_spec(_spec(), c), max_iter=12), open_source(x, 100),
                          LocalEngine(), random_state=0)
        assert out.post.rank == c.rank and out.options["reg_covar"] == c.reg_covar
        assert c.screen_bound == pytest.approx(lowrank_bound(out, eps) / len(x), rel=1e-12)
        assert c.screen_bound * len(x) >= out.terms.total  # (q(x | z) free: the marginal precisions' penalty)
        assert c.screen_clusters == out.n_effective
    out = run_lowrank(replace(_spec(covariance="lowrank", rank=2, select="none"), max_iter=12),
                      open_source(x, 100), LocalEngine(), random_state=0)
    n, psi = float(out.counts.sum()), out.post.noise
    assert n == pytest.approx(len(x), rel=1e-9)
    moved = (out.terms.total + mfa.held_penalty(psi, n, 1e-6)
             - mfa.resolution_penalty(out.post, out.counts, eps ** 2 / 12))
    assert lowrank_bound(out, eps) == pytest.approx(moved, rel=1e-12)
    assert lowrank_bound(out, None) > out.terms.total > lowrank_bound(out, eps)


def test_lowrank_fit_at_a_resolution_never_decreases() -> None:
    x, _ = _planes()
    spec = _spec(covariance="lowrank", rank=2, select="none", components=6, reg_covar=0.05, max_iter=40)
    out = run_lowrank(spec, open_source(x, 100), LocalEngine(), random_state=0)
    assert np.all(np.diff(out.history) >= 0.0) and np.all(out.post.noise >= 0.05)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    x, y = _planes()
    path = tmp_path_factory.mktemp("stores") / "planes.zarr"
    s = FeatureStore.create(path, 12, chunk_rows=100, labels=True)
    s.append(x, labels=y)
    return str(path)


def test_a_lowrank_winner_is_fitted_and_recorded(store, tmp_path) -> None:
    """Planted rank-2 classes: a low-rank candidate has the highest bound and is kept; result.json is a
    low-rank run of its rank and reg_covar with every candidate's bound; the summary names it. With
    --covariance lowrank given: one candidate, of --rank."""
    from typer.testing import CliRunner

    from pipeline.cli import app
    from pipeline.runs.directory import read_result

    runner = CliRunner()
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "a"), "--select", "auto", "-k", "5",
                              "--seed", "0", "--select-fits", "2", "-q"])
    assert res.exit_code == 0, res.output
    r = read_result(tmp_path / "a")
    cands = r["selection"]["candidates"]
    assert sorted(c["rank"] for c in cands if c["covariance"] == "lowrank") == [2, 8]
    assert {c["covariance"] for c in cands} >= {"diag", "full", "tied", "spherical", "lowrank"}
    kept = next(c for c in cands if c["chosen"])
    assert kept["covariance"] == "lowrank" and r["covariance"] == "lowrank" and r["rank"] == kept["rank"]
    assert kept["full_bound"] == max(c["full_bound"] for c in cands if c["full_bound"] is not None)
    assert r["settings"]["reg_covar"] == kept["reg_covar"] and r["metrics"]["nmi"] > 0.95
    assert f"lowrank Q={kept['rank']}" in res.output and "<- kept" in res.output
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "b"), "--select", "auto", "-k", "5",
                              "--covariance", "lowrank", "--rank", "3", "--seed", "0", "-q"])
    assert res.exit_code == 0, res.output
    r = read_result(tmp_path / "b")
    assert [(c["covariance"], c["rank"]) for c in r["selection"]["candidates"]] == [("lowrank", 3)]
    assert r["rank"] == 3 and r["selection"]["parts"] == "priors"


def test_a_lowrank_winner_keeps_the_bits_across_engines_and_resume(store, tmp_path, monkeypatch,
                                                                   client) -> None:
    """Only the low-rank candidates (Q = 2, 8), both fitted in full: the same winner and bits on the
    in-process engine, on Dask, and resumed (after 2 iterations, another thread count)."""
    monkeypatch.setattr(select, "SCREEN_MAX_ITER", 8)
    monkeypatch.setattr(select, "candidates", lambda spec, d: [])
    monkeypatch.setattr(select, "PROJECTED", ())
    spec = replace(_spec(tol=0.0, max_iter=6, select_fits=2), checkpoint_every=2)
    with threadpool_limits(limits=1, user_api="blas"):
        ref = fit(spec, StoreSource(store), LocalEngine(threads=1), random_state=0)
        fit(replace(spec, max_iter=2), StoreSource(store), LocalEngine(threads=1), random_state=0,
            checkpoint_dir=str(tmp_path / "ck"))
    resumed = fit(spec, StoreSource(store), LocalEngine(threads=2), random_state=0,
                  checkpoint_dir=str(tmp_path / "ck"))
    dask = fit(spec, StoreSource(store), DaskEngine(client, persist="always"), random_state=0)
    assert resumed.resumed_from is not None
    kept = [c for c in ref.selection["candidates"] if c["chosen"]]
    assert len(kept) == 1 and kept[0]["rank"] == ref.post.rank
    strip = [{k: v for k, v in c.items() if k != "screen_seconds"} for c in ref.selection["candidates"]]
    for other in (resumed, dask):
        assert strip == [{k: v for k, v in c.items() if k != "screen_seconds"}
                         for c in other.selection["candidates"]]
        assert other.terms.total == ref.terms.total and other.history == ref.history
        assert np.array_equal(other.post.loadings, ref.post.loadings)
        assert np.array_equal(other.labels, ref.labels)
