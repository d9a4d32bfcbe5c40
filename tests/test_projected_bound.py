"""The bound of the original rows for projected fits, and the bound at a stated resolution
(vbcore/model/projected.py; issue 51): against float64 brute force on small data."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import scipy.optimize
import scipy.stats

import pipeline.fit.select as select
from pipeline.engine.engines import LocalEngine
from pipeline.fit.driver import run_fit
from pipeline.fit.select import original_bound, screen
from pipeline.fit.setup import open_source
from pipeline.fit.spec import FitSpec
from tests._reference import planted_small_classes, stats_of
from vbcore.errors import ConfigError
from vbcore.kernels.projection import fit_projection, row_moments
from vbcore.model.elbo import elbo_terms
from vbcore.model.mstep import m_step
from vbcore.model.priors import default_prior
from vbcore.model.projected import complement, log_jacobian, noise_covariance, resolution_penalty


def _rows(n: int = 60, d: int = 4, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + 3.0


def _cube(d: int, eps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two-point Gauss-Legendre nodes and weights of the uniform cell [-eps/2, eps/2]^d: exact for the
    expectation of any quadratic in u."""
    g = np.array([-1.0, 1.0]) / np.sqrt(3.0)
    grid = np.array(np.meshgrid(*[g] * d, indexing="ij")).reshape(d, -1).T
    return grid * (eps / 2.0)[None, :], np.full(len(grid), 1.0 / len(grid))


@pytest.mark.parametrize("whiten", [False, True])
def test_projected_density_is_the_original_rows_density(whiten) -> None:
    """log N(y | mu, S) + log-Jacobian + the complement's density (at its s^2) is the log density of x
    under the D-dimensional Gaussian the projection maps back: N(m + A mu, A S A^T + s^2 V_perp V_perp^T)."""
    x = _rows()
    proj = fit_projection(row_moments(x, x[0]), 2, whiten)
    y = proj.apply(x)
    mu, s = np.array([0.1, -0.2]), np.array([[0.8, 0.1], [0.1, 0.5]]) * (1.0 if whiten else 4.0)
    comp = complement(x, proj.mean, proj.components)
    s2 = comp.variance()
    vals, vecs = np.linalg.eigh(np.cov(x.T))
    perp = vecs[:, :2]  # the two dropped directions (smallest eigenvalues)
    a = proj.components * (np.sqrt(proj.variances)[None, :] if whiten else 1.0)
    cov_x = a @ s @ a.T + s2 * perp @ perp.T
    brute = scipy.stats.multivariate_normal(proj.mean + a @ mu, cov_x).logpdf(x).sum()
    ours = (scipy.stats.multivariate_normal(mu, s).logpdf(y).sum()
            + len(x) * log_jacobian(proj.variances, whiten) + comp.log_likelihood())
    assert ours == pytest.approx(brute, rel=1e-10)
    # the complement at its type-II maximum: the direct density of z, maximised over s^2
    z = (x - proj.mean) @ perp
    direct = scipy.stats.multivariate_normal(np.zeros(2), s2 * np.eye(2)).logpdf(z).sum()
    assert comp.log_likelihood() == pytest.approx(direct, rel=1e-12)
    assert s2 == pytest.approx(vals[:2].mean() * (len(x) - 1) / len(x), rel=1e-10)  # PPCA's sigma^2


def test_complement_at_resolution_is_the_expected_density_at_its_maximum() -> None:
    """E_u ln N(z + V_perp^T u | 0, s^2 I) over the uniform cell (exact quadrature), maximised over s^2."""
    x = _rows(d=3)
    eps = np.array([0.3, 0.7, 0.2])
    proj = fit_projection(row_moments(x, x[0]), 1, False)
    perp = np.linalg.eigh(np.cov(x.T))[1][:, :2]
    nodes, w = _cube(3, eps)

    def negative(log_s2: float) -> float:
        mvn = scipy.stats.multivariate_normal(np.zeros(2), np.exp(log_s2) * np.eye(2))
        return -sum(wi * mvn.logpdf((x + u - proj.mean) @ perp).sum() for u, wi in zip(nodes, w, strict=True))

    best = scipy.optimize.minimize_scalar(negative, bracket=(-3.0, 3.0), tol=1e-12)
    comp = complement(x, proj.mean, proj.components, eps)
    assert comp.log_likelihood() == pytest.approx(-best.fun, rel=1e-9)


@pytest.mark.parametrize("ct", ["diag", "spherical", "full", "tied"])
@pytest.mark.parametrize("whiten", [None, True])
def test_resolution_penalty_is_the_dequantized_bound(ct, whiten) -> None:
    """With q held, E_u ELBO(x + u) - ELBO(x) = -resolution_penalty, u uniform on the cell (through the
    projection when projected): the ELBO of each quadrature node's rows, averaged."""
    x = planted_small_classes(n_classes=3, d=3, lo=20, hi=30, seed=4)[0].astype(np.float64)
    eps = np.array([0.5, 0.2, 0.9])
    proj = None if whiten is None else fit_projection(row_moments(x, x[0]), 2, True)
    def space(rows: np.ndarray) -> np.ndarray:
        return rows if proj is None else proj.apply(rows)
    y = space(x)
    resp = np.random.default_rng(1).dirichlet(np.ones(3), size=len(x))
    prior = default_prior(covariance_type=ct, weight_type="dirichlet_distribution", n_components=3,
                          data_mean=y.mean(0), data_covariance=np.cov(y.T), defaults="sklearn")
    post = m_step(stats_of(y, resp, ct, y[0]), prior)
    base = elbo_terms(stats_of(y, resp, ct, y[0]), post, prior).total
    nodes, w = _cube(3, eps)
    mean = sum(wi * elbo_terms(stats_of(space(x + u), resp, ct, y[0]), post, prior).total
               for u, wi in zip(nodes, w, strict=True))
    noise = noise_covariance(eps, None if proj is None else proj.matrix())
    assert mean - base == pytest.approx(-resolution_penalty(post, resp.sum(0), noise), rel=1e-9)


def test_with_p_equal_d_the_bound_is_the_rotated_fit_plus_the_jacobian() -> None:
    """P = D: nothing is dropped; the original rows' bound is that of a plain fit of the whitened rows
    plus N times the log-Jacobian."""
    x, _ = planted_small_classes(n_classes=4, d=3, lo=30, hi=50, seed=5)
    base = dict(components=4, max_iter=20, tol=0.0, seed=0, chunk_rows=100, covariance="full",
                priors="sklearn")
    out = run_fit(FitSpec(pca=3, whiten=True, **base).resolved(), open_source(x, 100), LocalEngine(),
                  random_state=0)
    y = out.projection.apply(x)
    plain = run_fit(FitSpec(**base).resolved(), open_source(y, 100), LocalEngine(), random_state=0)
    ours = original_bound(out, [x], None)
    assert ours == pytest.approx(plain.terms.total + len(x) * log_jacobian(out.projection.variances, True),
                                 rel=1e-9)
    assert ours != pytest.approx(plain.terms.total)  # the Jacobian counts


def test_projected_candidates_are_screened_on_the_original_rows(monkeypatch) -> None:
    monkeypatch.setattr(select, "PROJECTED", (("full", 2, True),))
    monkeypatch.setattr(select, "SCREEN_MAX_ITER", 10)
    x, _ = planted_small_classes(n_classes=4, d=4, lo=30, hi=50, seed=6)
    spec = FitSpec(components=4, max_iter=10, seed=0, chunk_rows=100, select="auto").resolved()
    sel = screen(spec, open_source(x, 100), LocalEngine(), 0)
    proj = [c for c in sel.candidates if c.pca is not None]
    assert sorted((c.covariance, c.priors, c.pca, c.whiten) for c in proj) == [
        ("full", "empirical", 2, True), ("full", "sklearn", 2, True)]
    assert select.label({"covariance": "full", "pca": 2, "whiten": True}) == "full on pca 2 whitened"
    eps = select.resolution_of([x], select.RESOLUTION)
    for c in proj:
        out = run_fit(replace(select.chosen_spec(spec, c), max_iter=10), open_source(x, 100), LocalEngine(),
                      random_state=0)
        assert c.screen_bound == pytest.approx(original_bound(out, [x], eps) / len(x), rel=1e-12)
    assert not select.projected(FitSpec(select="auto", covariance="diag").resolved(), 4)
    assert not select.projected(FitSpec(select="auto", pca=2).resolved(), 4)


def test_resolution_is_pooled_or_per_feature_and_scored(monkeypatch) -> None:
    """eps = r sqrt(mean variance) for every feature (pooled: a constant feature gets the others'), or
    r std_d; a screen at a resolution scores each candidate by original_bound at that eps."""
    x = _rows(d=3) * np.array([1.0, 2.0, 0.0])  # a constant feature
    var = x.var(0)
    assert np.allclose(select.resolution_of([x[:25], x[25:]], 0.1, True), 0.1 * np.sqrt(var.mean()))
    assert np.allclose(select.resolution_of([x], 0.1, False), 0.1 * np.sqrt(var))
    assert select.resolution_of([x], 0.0) is None
    monkeypatch.setattr(select, "RESOLUTION", 0.2)
    monkeypatch.setattr(select, "SCREEN_MAX_ITER", 5)
    x, _ = planted_small_classes(n_classes=3, d=3, lo=30, hi=40, seed=7)
    spec = FitSpec(components=3, max_iter=5, seed=0, chunk_rows=100, select="auto",
                   covariance="diag").resolved()
    sel = screen(spec, open_source(x, 100), LocalEngine(), 0)
    assert sel.resolution == 0.2 and sel.to_dict()["resolution"] == 0.2
    eps = select.resolution_of([x], 0.2)
    for c in sel.candidates:
        out = run_fit(replace(select.chosen_spec(spec, c), max_iter=5), open_source(x, 100), LocalEngine(),
                      random_state=0)
        plain = original_bound(out, [x], None)
        assert c.screen_bound == pytest.approx(original_bound(out, [x], eps) / len(x), rel=1e-12)
        assert c.screen_bound * len(x) < plain  # the dequantization costs


def test_projected_candidates_show_in_the_summary_and_report() -> None:
    from rich.console import Console

    from pipeline.cli_format import selection_table
    from pipeline.runs.report_curves import selection_note

    cand = {"covariance": "full", "priors": "sklearn", "screen_bound": -1.5, "screen_clusters": 3,
            "screen_seconds": 0.1, "full_bound": -1.25, "chosen": True, "pca": 64, "whiten": True,
            "reg_covar": None}
    sel = {"parts": "covariance+priors", "screen_rows": 100, "screen_seconds": 1.0, "resolution": 0.03,
           "candidates": [cand, {**cand, "pca": None, "chosen": False, "full_bound": None}]}
    console = Console(width=200, record=True)
    console.print(selection_table(sel))
    text = console.export_text()
    assert "full on pca 64 whitened" in text and "resolution 0.03" in text and "<- kept" in text
    note = selection_note({"selection": sel})
    assert "full on pca 64 whitened/sklearn: screen -1.5000, all rows -1.2500 (kept)" in note


def test_a_projected_winner_keeps_the_bits_across_engines_and_resume(tmp_path, monkeypatch) -> None:
    """Only projected candidates (the unprojected ones left out): the kept model is a projected fit,
    recorded with its projection, and a resumed run on another thread count ends with the same bits."""
    from threadpoolctl import threadpool_limits

    from pipeline.service import fit

    monkeypatch.setattr(select, "PROJECTED", (("full", 2, True),))
    monkeypatch.setattr(select, "SCREEN_MAX_ITER", 8)
    monkeypatch.setattr(select, "candidates", lambda spec, d: [])
    monkeypatch.setattr(select, "LOWRANK_RANKS", ())
    x, _ = planted_small_classes(n_classes=5, d=4, lo=40, hi=90, seed=8)
    spec = replace(FitSpec(components=4, tol=0.0, max_iter=6, seed=0, chunk_rows=100, select="auto",
                           select_fits=2).resolved(), checkpoint_every=2)
    with threadpool_limits(limits=1, user_api="blas"):
        ref = fit(spec, open_source(x, 100), LocalEngine(threads=1), random_state=0)
        fit(replace(spec, max_iter=2), open_source(x, 100), LocalEngine(threads=1), random_state=0,
            checkpoint_dir=str(tmp_path / "ck"))
    resumed = fit(spec, open_source(x, 100), LocalEngine(threads=2), random_state=0,
                  checkpoint_dir=str(tmp_path / "ck"))
    assert resumed.resumed_from is not None
    kept = [c for c in ref.selection["candidates"] if c["chosen"]]
    assert len(kept) == 1 and kept[0]["pca"] == 2 and kept[0]["whiten"] is True
    assert ref.projection is not None and ref.projection.n_components == 2
    eps = select.resolution_of([x], select.RESOLUTION)
    assert kept[0]["full_bound"] == pytest.approx(original_bound(ref, [x], eps) / len(x), rel=1e-12)
    assert kept[0]["full_bound"] == max(c["full_bound"] for c in ref.selection["candidates"])
    assert resumed.terms.total == ref.terms.total and resumed.history == ref.history
    assert np.array_equal(resumed.post.means, ref.post.means)


def test_a_projected_winner_is_recorded_in_the_run(tmp_path, monkeypatch) -> None:
    """result.json's settings are the projected model's (a VBMixture of them refits it), the summary
    and the report name it."""
    from typer.testing import CliRunner

    from pipeline.cli import app
    from pipeline.ingest import ingest
    from pipeline.runs.directory import read_result
    from pipeline.runs.report import write_report

    monkeypatch.setattr(select, "PROJECTED", (("full", 2, True),))
    monkeypatch.setattr(select, "SCREEN_MAX_ITER", 8)
    monkeypatch.setattr(select, "candidates", lambda spec, d: [])
    monkeypatch.setattr(select, "LOWRANK_RANKS", ())
    x, _ = planted_small_classes(n_classes=4, d=4, lo=40, hi=60, seed=9)
    np.save(tmp_path / "x.npy", x)
    ingest(str(tmp_path / "x.npy"), str(tmp_path / "s.zarr"))
    res = CliRunner().invoke(app, ["fit", str(tmp_path / "s.zarr"), "--run-dir", str(tmp_path / "r"),
                                   "--select", "auto", "-k", "4", "--max-iter", "10"])
    assert res.exit_code == 0, res.output
    r = read_result(tmp_path / "r")
    assert r["settings"]["pca"] == 2 and r["settings"]["whiten"] is True
    assert r["settings"]["covariance_type"] == "full"
    assert "full on pca 2 whitened" in res.output and "<- kept" in res.output
    assert "full on pca 2 whitened/" in write_report([tmp_path / "r"]).read_text()


def test_a_model_the_rows_refuse_is_not_screened(monkeypatch) -> None:
    """Rows spanning fewer dimensions than P: whitening refuses the projection (and full and tied their
    singular covariance prior), and the screen goes on without them; all refused: the error."""
    monkeypatch.setattr(select, "PROJECTED", (("full", 3, True),))
    monkeypatch.setattr(select, "SCREEN_MAX_ITER", 5)
    x, _ = planted_small_classes(n_classes=3, d=2, lo=30, hi=40, seed=10)
    x = np.concatenate([x, x[:, :1] + x[:, 1:], 2 * x[:, :1]], axis=1)  # 4 features, rank 2
    spec = FitSpec(components=3, max_iter=5, seed=0, chunk_rows=100, select="auto",
                   priors="sklearn").resolved()
    sel = screen(spec, open_source(x, 100), LocalEngine(), 0)
    assert [c.covariance for c in sel.candidates if c.pca is None] and all(
        c.pca is None and c.covariance in ("diag", "spherical", "lowrank") for c in sel.candidates)
    monkeypatch.setattr(select, "candidates", lambda spec, d: [("full", "sklearn")])
    monkeypatch.setattr(select, "PROJECTED", ())
    monkeypatch.setattr(select, "LOWRANK_RANKS", ())
    with pytest.raises(ConfigError, match="singular"):
        screen(spec, open_source(x, 100), LocalEngine(), 0)
