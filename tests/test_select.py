"""Model selection by the exact bound (issue 51; pipeline/fit/select.py): every candidate's bound is
the exact one, the model kept is the highest full bound among those fitted in full, the parts given by
hand are not selected, and selection keeps the bits across engines and resume."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from threadpoolctl import threadpool_limits
from typer.testing import CliRunner

import pipeline.fit.select as select
from pipeline.engine.engines import LocalEngine
from pipeline.fit.select import candidates, screen
from pipeline.fit.setup import open_source
from pipeline.fit.spec import FitSpec
from pipeline.service import fit
from tests._reference import (
    log_evidence_normal_gamma_shared,
    log_evidence_normal_wishart,
    planted_small_classes,
)
from vbcore.model.priors import default_prior


def _spec(**kw) -> FitSpec:
    base = dict(components=6, max_iter=30, tol=1e-6, seed=0, chunk_rows=100, select="auto")
    return FitSpec(**{**base, **kw}).resolved()


def _evidence(x: np.ndarray, ct: str, priors: str, beta0: float, nu0: float) -> float:
    """The exact log evidence of one Gaussian of family ``ct`` under the prior ``priors`` fills."""
    d = x.shape[1]
    p = default_prior(covariance_type=ct, weight_type="dirichlet_distribution", n_components=1,
                      data_mean=x.mean(0), data_covariance=np.cov(x.T), defaults=priors,
                      mean_precision=beta0, degrees_of_freedom=nu0)
    if ct in ("full", "tied"):
        return log_evidence_normal_wishart(x, p.mean, beta0, nu0, p.covariance)
    if ct == "diag":
        return sum(log_evidence_normal_wishart(x[:, [j]], p.mean[[j]], beta0, nu0,
                                               np.array([[p.covariance[j]]])) for j in range(d))
    return log_evidence_normal_gamma_shared(x, p.mean, beta0, nu0 * d / 2, d * float(p.covariance) / 2)


def test_screen_bounds_are_the_exact_evidence(monkeypatch) -> None:
    """One component, finite weights: the bound is the evidence, in closed form for every family
    (diag: a product of one-dimensional Normal-Gamma evidences; spherical: the shared Gamma's; full and
    tied: the Normal-Wishart's), under each way of filling the priors (the plain bound: resolution 0;
    the bound at a resolution: tests/test_projected_bound.py)."""
    monkeypatch.setattr(select, "RESOLUTION", 0.0)
    monkeypatch.setattr(select, "LOWRANK_RANKS", ())  # (its bound: tests/test_mfa.py, test_lowrank_select.py)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 3)) @ np.array([[1.0, 0.3, 0], [0, 0.7, 0.2], [0, 0, 1.5]]) + 2.0
    spec = _spec(components=1, weights="dirichlet", grow=False, reg_covar=0.0, max_iter=3, tol=0.0,
                 mean_precision_prior=0.7, degrees_of_freedom_prior=4.5, init="kmeans")
    sel = screen(spec, open_source(x, 100), LocalEngine(), 0)
    assert sel.screen_rows == 80 and len(sel.candidates) == 10  # 4 x 3 less 'bound' of full, tied
    for c in sel.candidates:
        exact = _evidence(x, c.covariance, c.priors, 0.7, 4.5)
        assert c.screen_bound * 80 == pytest.approx(exact, rel=1e-9), (c.covariance, c.priors)
    bounds = [c.screen_bound for c in sel.candidates]
    assert bounds == sorted(bounds, reverse=True)  # best first


def test_the_kept_model_has_the_highest_full_bound(tmp_path) -> None:
    x, _ = planted_small_classes(n_classes=8, d=4, lo=40, hi=120, seed=2)
    spec = _spec(select_fits=3)
    out = fit(spec, open_source(x, 100), "local", random_state=0)
    sel = out.selection
    assert sel is not None and sel["parts"] == "covariance+priors"
    fitted = [c for c in sel["candidates"] if c["full_bound"] is not None]
    assert len(fitted) == 3 and fitted == sel["candidates"][:3]  # the three best screened
    kept = [c for c in sel["candidates"] if c["chosen"]]
    assert len(kept) == 1 and kept[0]["full_bound"] == max(c["full_bound"] for c in fitted)
    # the kept fit's bound of the rows at the selection's resolution (fitted with its reg_covar)
    eps = select.resolution_of([x], select.RESOLUTION)
    assert select.original_bound(out, [x], eps) / len(x) == pytest.approx(kept[0]["full_bound"], rel=1e-12)
    assert kept[0]["reg_covar"] == pytest.approx(float(eps[0]) ** 2 / 12)
    if kept[0]["covariance"] == "lowrank":  # (a mixture of factor analysers of the kept rank)
        assert out.post.rank == kept[0]["rank"]
    else:
        assert out.post.covariance_type == kept[0]["covariance"]


def test_every_part_can_be_fixed_by_hand(tmp_path) -> None:
    assert _spec(covariance="full").select == "priors"
    assert _spec(priors="sklearn").select == "covariance"
    assert _spec(covariance="full", priors="sklearn").select == "none"
    assert _spec(select="none").select == "none" and FitSpec().resolved().select == "none"
    assert _spec(select="priors").select == "priors"
    assert _spec().resolved().select == "covariance+priors"  # resolving again keeps it
    assert candidates(_spec(covariance="full"), 3) == [("full", "empirical"), ("full", "sklearn")]
    assert candidates(_spec(covariance="diag"), 3) == [("diag", p) for p in ("empirical", "bound", "sklearn")]
    assert candidates(_spec(priors="sklearn"), 3) == [(f, "sklearn") for f in select.FAMILIES]
    assert [c for c, _ in candidates(_spec(), 300)][::3] == ["diag", "spherical"]  # no D x D above 256
    from pipeline.cli import app
    from pipeline.ingest import ingest
    from pipeline.runs.directory import read_result

    x, _ = planted_small_classes(n_classes=4, d=3, lo=40, hi=60, seed=1)
    np.save(tmp_path / "x.npy", x)
    store = str(tmp_path / "s.zarr")
    ingest(str(tmp_path / "x.npy"), store)
    runner = CliRunner()
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "a"), "--select", "auto",
                              "--covariance", "diag", "--priors", "sklearn", "-q"])
    assert res.exit_code == 0, res.output
    assert "selection" not in read_result(tmp_path / "a") and "model selection" not in res.output
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "b"), "--select", "auto",
                              "--covariance", "spherical", "-k", "5", "-q"])
    assert res.exit_code == 0, res.output
    r = read_result(tmp_path / "b")
    assert [c["covariance"] for c in r["selection"]["candidates"]] == ["spherical"] * 3
    assert "model selection: priors" in res.output and "<- kept" in res.output
    assert r["settings"]["covariance_type"] == "spherical"
    from pipeline.runs.report import write_report

    page = write_report([tmp_path / "b"]).read_text()
    assert "model selection (priors; exact bound per row" in page and "(kept)" in page


def test_selection_keeps_the_bits_across_engines_and_resume(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(select, "SCREEN_MAX_ITER", 8)
    x, _ = planted_small_classes(n_classes=6, d=4, lo=40, hi=100, seed=3)
    spec = replace(_spec(components=4, tol=0.0, max_iter=6), checkpoint_every=2)
    with threadpool_limits(limits=1, user_api="blas"):
        ref = fit(spec, open_source(x, 100), LocalEngine(threads=1), random_state=0)
        fit(replace(spec, max_iter=2), open_source(x, 100), LocalEngine(threads=1), random_state=0,
            checkpoint_dir=str(tmp_path / "ck"))
    resumed = fit(spec, open_source(x, 100), LocalEngine(threads=2), random_state=0,
                  checkpoint_dir=str(tmp_path / "ck"))
    assert resumed.resumed_from is not None
    assert resumed.selection["parts"] == ref.selection["parts"] == "covariance+priors"
    strip = [{k: v for k, v in c.items() if k != "screen_seconds"} for c in ref.selection["candidates"]]
    assert strip == [{k: v for k, v in c.items() if k != "screen_seconds"}
                     for c in resumed.selection["candidates"]]
    assert resumed.terms.total == ref.terms.total and resumed.history == ref.history
    assert np.array_equal(resumed.post.means, ref.post.means)
