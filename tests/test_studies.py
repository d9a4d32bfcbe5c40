"""Studies (`vbcluster study`): data generators, the seed 001 lambda estimate, quick runs of both
studies, the CLI command and its errors."""

import csv
import math
import warnings

import numpy as np
import pytest
from scipy.stats import multivariate_normal
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.estimator import VBMixture
from pipeline.studies import available_learners, read_table, run_study, seed000, seed001, write_table
from pipeline.studies.data import (
    CLUSTER_STD,
    cluster_centres,
    cluster_data,
    image_data,
    image_features,
    spiral_data,
    watanabe_data,
    watanabe_logpdf,
)
from vbcore.errors import ConfigError, TruncationWarning


# ---- data generators --------------------------------------------------------------------------
def test_cluster_data_shapes_and_centres():
    X, y = cluster_data(0.3, n=2000, seed=1)
    assert X.shape == (2000, 2) and y.shape == (2000,)
    assert set(np.unique(y)) == set(range(5))
    counts = np.bincount(y) / len(y)
    assert np.all(np.abs(counts - 0.2) < 0.04)  # pi_k = 0.2
    for k, c in enumerate(cluster_centres(0.3)):
        assert np.allclose(X[y == k].mean(0), c, atol=0.03)
        assert np.allclose(X[y == k].std(0), CLUSTER_STD, rtol=0.15)


def test_cluster_data_R_controls_separation():
    def between_over_within(R):
        X, y = cluster_data(R, n=3000, seed=2)
        means = np.array([X[y == k].mean(0) for k in range(5)])
        within = np.mean([X[y == k].var(0).sum() for k in range(5)])
        return ((means - X.mean(0)) ** 2).sum(1).mean() / within

    ratios = [between_over_within(R) for R in (0.0, 0.1, 0.3, 0.6)]
    assert ratios[0] < 0.01  # R = 0: one blob, labels carry no information
    assert all(a < b for a, b in zip(ratios, ratios[1:], strict=False))
    # the between-cluster spread grows as R^2: 0.6 vs 0.3 -> about 4x
    assert 3.0 < ratios[3] / ratios[2] < 5.0


def test_cluster_data_rejects_bad_settings():
    with pytest.raises(ValueError, match="need R >= 0"):
        cluster_data(-1.0)


def test_spiral_data_is_a_helix():
    X = spiral_data(1000, noise=0.0, seed=3)
    assert X.shape == (1000, 3)
    assert np.allclose(X[:, 0] ** 2 + X[:, 1] ** 2, 1.0)
    assert np.allclose(np.arctan2(X[:, 1], X[:, 0]), np.angle(np.exp(1j * np.pi * X[:, 2])))
    assert X[:, 2].min() < -1.5 and X[:, 2].max() > 1.5  # z spans more than [-1, 1]


def test_image_data_scaled_into_the_cube():
    X, img = image_data()
    assert img.shape == (66, 100, 3) and img.dtype == np.uint8
    assert X.shape == (6600, 5)
    assert np.allclose(X.min(0), -1.0) and np.allclose(X.max(0), 1.0)
    # row-major pixel order: row 1 of the features is pixel (0, 1)
    assert X[1, 3] > X[0, 3] and X[1, 4] == X[0, 4]
    small = image_features(np.zeros((2, 3, 3), dtype=np.uint8))
    assert small.shape == (6, 5) and np.all(small[:, :3] == -1.0)


def test_watanabe_logpdf_matches_scipy():
    X = watanabe_data(50, seed=4)
    ref = np.log(0.5 * multivariate_normal([2, 2], np.eye(2)).pdf(X)
                 + 0.5 * multivariate_normal([-2, -2], np.eye(2)).pdf(X))
    assert np.allclose(watanabe_logpdf(X), ref, rtol=0, atol=1e-12)


# ---- seed 001 ---------------------------------------------------------------------------------
def test_lambda_bar_eq18():
    assert seed001.lambda_bar(2, 2, 1.0) == 2.5  # regular: (M K0 + K0 - 1) / 2
    assert seed001.lambda_bar(4, 2, 1.0) == 4.5  # (K - K0) phi0 + 5/2
    assert seed001.lambda_bar(4, 2, 2.0) == 5.5  # phi0 > (M + 1)/2: (M K + K - 1)/2
    assert seed001.lambda_bar(4, 2, 1.5) == seed001.lambda_bar(4, 2, 1.5 + 1e-12)  # continuous


def test_kl_of_one_component_is_the_closed_form():
    """K = 1: q(theta) is the exact posterior N(n xbar/(n+1), I/(n+1)); its KL to N(0, I) in closed form."""
    X = watanabe_data(200, means=np.zeros((1, 2)), seed=5)
    res = seed001.fit_one(X, X[:10], 1, 1.0, 2, np.random.default_rng(0), np.zeros((1, 2)))
    n, m = len(X), X.sum(0) / (len(X) + 1)
    kl = 0.5 * 2 * (1 / (n + 1) - 1 + np.log(n + 1)) + 0.5 * m @ m
    assert res.kl == pytest.approx(kl, rel=1e-10)


def test_the_study_fits_raise_no_advice_on_a_k_the_study_fixes():
    """seed001's K is the study's (redundant components on purpose): its fits use all K and must not
    advise raising it (issue 53: `vbcluster study seed001` printed '... or -k', a flag it has not)."""
    X = watanabe_data(200, seed=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = seed001.fit_one(X, X[:10], 2, 1.0, 2, np.random.default_rng(0))
    assert res.n_effective == 2  # all K in use: what drew the warning
    said = [str(w.message) for w in caught if issubclass(w.category, TruncationWarning)]
    assert not said, said


def test_lambda_below_bound_for_one_true_component():
    """Data from K0 = 1 component: lambda_hat of K = 1 is the regular M/2 = 1; for K = 2 from
    initialisation (2) it reaches lambda_bar = (K - K0) phi_0 + 1 (eq. 18) from below, for two phi_0."""
    truth = np.zeros((1, 2))
    draws = seed001.make_draws(6, 100, 1000, seed=6, true_means=truth)
    X_test = watanabe_data(2000, truth, seed=7)
    one = seed001.estimate_lambda(draws, X_test, 1, 1.0, 2, true_means=truth, tol=1e-8)
    assert math.isfinite(one["lambda"]) and one["lambda"] == pytest.approx(1.0, abs=0.05)
    for phi0 in (0.5, 1.0):
        two = seed001.estimate_lambda(draws, X_test, 2, phi0, 2, true_means=truth, tol=1e-7)
        bar = seed001.lambda_bar(2, 1, phi0)
        assert math.isfinite(two["lambda"]) and two["non_converged"] == 0
        assert bar - 0.1 < two["lambda"] <= bar + 2 * two["lambda_se"] + 0.02, (phi0, two)
        assert math.isfinite(two["gen"]) and abs(two["gen"]) < 0.05  # KL to the truth: small


def test_initial_responsibilities_of_the_paper():
    X = watanabe_data(30, seed=8)
    r2 = seed001.initial_responsibilities(X, 4, 2, seed001.WATANABE_MEANS, np.random.default_rng(0))
    assert r2.shape == (30, 4) and np.allclose(r2.sum(1), 1.0)
    assert np.all(r2[:, 2:] == 0.0)  # a_k = 0 for k >= 3
    r1 = seed001.initial_responsibilities(X, 3, 1, seed001.WATANABE_MEANS, np.random.default_rng(0))
    assert np.allclose(r1, 1 / 3, atol=0.05) and not np.allclose(r1, 1 / 3, atol=1e-9)  # broken symmetry
    with pytest.raises(ValueError, match="init must be 1 or 2"):
        seed001.initial_responsibilities(X, 3, 3, seed001.WATANABE_MEANS, np.random.default_rng(0))


# ---- seed 000 ---------------------------------------------------------------------------------
def test_seed000_priors_and_initialisation_reach_the_estimator():
    X, _ = cluster_data(0.3, n=300, seed=9)
    r = seed000.paper_resp_init(X, 8, np.random.default_rng(0))
    assert r.shape == (300, 8) and np.allclose(r.sum(1), 1.0)
    model = VBMixture(8, tol=1e-8, max_iter=200, **seed000.paper_prior(2)).fit(X, resp_init=r)
    p = model.prior_
    assert (p.weight_concentration, p.mean_precision, p.degrees_of_freedom) == (1.0, 1.0, 2.0)
    assert np.array_equal(p.covariance, 0.5 * np.eye(2)) and np.array_equal(p.mean, np.zeros(2))
    assert np.all(np.diff(model.lower_bounds_) >= -1e-9 * len(X))  # VB EM never lowers the bound


def test_a_failing_learner_is_recorded_not_fatal():
    """A learner that raises mid-fit becomes a failed run with its message; the others still count."""
    from pipeline.fit.learners import LEARNERS, register
    from pipeline.fit.learners.vbem.learner import VBEM

    class Failing(VBEM):
        def step(self, iteration):
            if iteration == 3:
                raise FloatingPointError("diverged | at step 3")
            return super().step(iteration)

    register("test-failing")(Failing)
    try:
        X, _ = cluster_data(0.3, n=100, seed=10)
        by = {"vbem": seed000.fit_runs(X, "vbem", 2, 8, 1e-6, 10, 0)}
        with pytest.warns(UserWarning, match=r"test-failing run [01] failed after 2 iterations"):
            by["test-failing"] = seed000.fit_runs(X, "test-failing", 2, 8, 1e-6, 10, 0)
    finally:
        del LEARNERS["test-failing"]
    bad = by["test-failing"]
    assert all(r.failed and math.isnan(r.cost) and r.n_iter == 2 for r in bad)
    assert "FloatingPointError: diverged / at step 3" in bad[0].error  # no Markdown pipes
    best = min(r.cost for r in by["vbem"])
    rows = {r[0]: dict(zip(seed000.SUMMARY_COLS, r, strict=True))
            for r in seed000.summary_rows(by, best, 1e-3)}
    assert rows["vbem"]["failed"] == 0 and rows["vbem"]["runs_at_best"] >= 1
    assert rows["test-failing"]["failed"] == 2 and rows["test-failing"]["runs_at_best"] == 0
    assert list(seed000.ok_runs(by)) == ["vbem"]
    assert "test-failing init 1 after 2 iterations" in seed000.failures_text(by)


def test_optima_groups_costs():
    levels = seed000.optima(np.array([3.0, 1.0, 1.0005, 2.0, 1.0009]), tol=0.001)
    assert np.allclose(levels, [1.0, 2.0, 3.0])


# ---- study runs and the CLI -------------------------------------------------------------------
def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_seed001_quick_through_the_cli(tmp_path):
    result = CliRunner().invoke(app, ["study", "seed001", "--out", str(tmp_path), "--quick", "--seed", "1"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "seed001"
    assert "study seed001: wrote" in result.output
    for name in ("README.md", "lambda_vs_K.csv", "lambda_vs_phi0.csv", "fig1_lambda_vs_K.png",
                 "fig2_errors_vs_K.png", "fig3_lambda_vs_phi0.png", "fig4_train_vs_phi0.png",
                 "fig5_gen_vs_phi0.png"):
        assert (folder / name).stat().st_size > 0, name
    by_k = _rows(folder / "lambda_vs_K.csv")
    assert [(r["K"], r["init"]) for r in by_k] == [("2", "1"), ("2", "2"), ("3", "1"), ("3", "2")]
    for r in by_k + _rows(folder / "lambda_vs_phi0.csv"):
        lam, bar = float(r["lambda_hat"]), float(r["lambda_bar"])
        assert math.isfinite(lam) and lam > 0
        assert bar == seed001.lambda_bar(int(r["K"]), 2, float(r["phi0"]))
        assert math.isfinite(float(r["gen_error_x_n"])) and r["non_converged"] == "0"
    assert "| 2 | 1 | 1 |" in (folder / "README.md").read_text()


def test_seed000_quick_run(tmp_path):
    folder = run_study("seed000", tmp_path, quick=True, seed=0)
    text = (folder / "README.md").read_text()
    have = set(available_learners())
    for part in ("fig4a_summary", "fig4d_time_vs_R", "spiral_summary", "image_summary", "image_runs"):
        assert (folder / f"{part}.csv").is_file(), part
    for png in ("fig4a_cost.png", "fig4d_time_vs_R.png", "fig4b_spiral_cost.png", "fig4e_spiral_final.png",
                "fig4c_image_cost.png", "fig4f_image_final.png", "fig5_segmentation.png"):
        assert (folder / png).stat().st_size > 0, png
    summary = _rows(folder / "image_summary.csv")
    assert {r["learner"] for r in summary} == {n for n in seed000.MAIN_LEARNERS if n in have}
    for name in seed000.MAIN_LEARNERS + seed000.GRADIENT_LEARNERS:
        if name not in have:
            assert "Skipped (not registered in this installation)" in text and name in text
    runs = _rows(folder / "image_runs.csv")
    assert len(runs) == 2 * len(summary)  # quick: 2 initialisations per learner
    costs = np.array([float(r["cost"]) for r in runs])
    assert np.all(np.isfinite(costs))
    assert sum(int(r["runs_at_best"]) for r in summary) >= 1
    assert min(float(r["cost_minus_best"]) for r in runs) == 0.0
    rows_d = _rows(folder / "fig4d_time_vs_R.csv")
    assert sorted({float(r["R"]) for r in rows_d}) == [0.2, 0.5]


def test_unknown_study_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown study 'seed999'; known studies: seed000, seed001"):
        run_study("seed999", tmp_path)
    result = CliRunner().invoke(app, ["study", "seed999", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown study 'seed999'" in result.output
    with pytest.raises(ConfigError, match="seed must be an integer >= 0, got -1"):
        run_study("seed001", tmp_path, seed=-1)


def test_write_table_round_trip(tmp_path):
    md = write_table(tmp_path / "t", ["a", "b"], [[1, 0.5], ["x", float("nan")]], "T")
    assert md.splitlines()[0] == "**T** (t.csv)" and "| x | nan |" in md
    cols, rows = read_table(tmp_path / "t")
    assert cols == ["a", "b"] and rows == [["1", "0.5"], ["x", "nan"]]
    with pytest.raises(ValueError, match="has 1 values for 2 columns"):
        write_table(tmp_path / "u", ["a", "b"], [[1]])
