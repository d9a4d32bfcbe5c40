"""The standard error of the minibatch learners' bound estimates (sga, sga-m, sga-f, svi with
``elbo='minibatch'``): the formula against finite-population sampling theory, the per-row sums the
kernels return against float64 brute force (and against the ELBO's own data terms), the reported
errors calibrated against the exact bound, and where they are reported."""

from __future__ import annotations

import functools
import json
import warnings

import numpy as np
import pytest
from scipy.special import logsumexp
from typer.testing import CliRunner

from flows.cli import app
from pipeline import VBMixture
from pipeline.ingest import ingest
from vbcore.kernels.estep import Chunk, estep_params, merge_spread, row_spread
from vbcore.kernels.sga_stats import (
    DPPoint,
    hard_kernel,
    log_stick_weights,
    map_params,
    row_bound,
    scale_stats,
)
from vbcore.learners.svi import minibatch_vbem_kernel
from vbcore.model.elbo import elbo_terms, minibatch_standard_error


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    centres = rng.normal(scale=4.0, size=(5, 4))
    return np.concatenate([c + rng.normal(size=(600, 4)) for c in centres])


@pytest.fixture(scope="module")
def fitted(data):
    """An svi fit: its posterior ('fixed', DP) and prior are the distribution the tests evaluate."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return VBMixture(n_components=8, learner="svi", max_iter=5, random_state=0,
                         learner_options={"minibatch": 300}).fit(data)


def _chunk(data, shift):
    return Chunk(x=data - shift[None, :], feats=None, shift=shift)


def _row_log_rho(data, post):
    """float64 ``ln rho_nk`` (Kuusela et al. 2009 eq. 36) of every row, brute force."""
    p = estep_params(post, np.zeros(data.shape[1]))
    feats = np.concatenate((data * data, data), axis=1)
    return feats @ p.weights + p.const


# ---- the formula --------------------------------------------------------------------------------
def test_formula_is_the_finite_population_standard_error():
    rng = np.random.default_rng(0)
    values = rng.gamma(2.0, 3.0, size=500)
    n, m = values.size, 60
    sample = values[rng.choice(n, size=m, replace=False)]
    want = n * np.sqrt((1 - m / n) * np.var(sample, ddof=1) / m)
    m2 = np.sum((sample - sample.mean()) ** 2)
    assert minibatch_standard_error(n, m, m2) == pytest.approx(want, rel=1e-12)
    assert minibatch_standard_error(n, n, 1.0) == 0.0
    assert np.isnan(minibatch_standard_error(n, 1, 0.0))


def test_spreads_of_blocks_combine_exactly():
    """Blocks' (count, sum, squared deviations) merge into the whole's, also for values whose
    squares would cancel (mean 1e6, spread 1)."""
    rng = np.random.default_rng(2)
    values = 1e6 + rng.normal(size=1000)
    parts = [(b - a, *row_spread(values[a:b])) for a, b in ((0, 1), (1, 300), (300, 1000))]
    n, total, m2 = functools.reduce(merge_spread, parts)
    assert n == 1000 and total == pytest.approx(values.sum(), rel=1e-15)
    assert m2 == pytest.approx(np.sum((values - values.mean()) ** 2), rel=1e-9)
    assert merge_spread((0, 0.0, 0.0), parts[1]) == parts[1]


def test_formula_matches_the_spread_of_repeated_minibatches():
    """Over 4,000 minibatches the estimates' standard deviation equals the population formula
    ``N sqrt((1 - M/N) S^2 / M)`` within 4%, and the mean reported error within 4% of it."""
    rng = np.random.default_rng(1)
    values = rng.normal(-50.0, 7.0, size=400) + rng.gamma(1.0, 10.0, size=400)
    n, m = values.size, 40
    est, se = [], []
    for _ in range(4000):
        s = values[rng.choice(n, size=m, replace=False)]
        est.append(n / m * s.sum())
        se.append(minibatch_standard_error(n, m, np.sum((s - s.mean()) ** 2)))
    truth = n * np.sqrt((1 - m / n) * np.var(values, ddof=1) / m)
    assert np.std(est) == pytest.approx(truth, rel=0.04)
    assert np.sqrt(np.mean(np.square(se))) == pytest.approx(truth, rel=0.04)


# ---- the kernels' per-row sums --------------------------------------------------------------------
def test_vbem_kernel_row_sums_against_brute_force(data, fitted):
    post, prior = fitted.posterior_, fitted.prior_
    shift = data.mean(axis=0)
    rows = np.arange(0, data.shape[0], 7)
    res = minibatch_vbem_kernel(_chunk(data, shift), rows, estep_params(post, shift))
    ln_norm = logsumexp(_row_log_rho(data[rows], post), axis=1)
    assert res.log_norm == pytest.approx(ln_norm.sum(), rel=1e-10)
    assert res.log_norm_m2 == pytest.approx(np.sum((ln_norm - ln_norm.mean()) ** 2), rel=1e-9)
    # a chunk of several blocks (more than BLOCK_ROWS rows) merges its blocks' spreads
    big = np.tile(data, (2, 1))
    res2 = minibatch_vbem_kernel(_chunk(big, shift), np.arange(big.shape[0]), estep_params(post, shift))
    all_norm = logsumexp(_row_log_rho(big, post), axis=1)
    assert res2.log_norm_m2 == pytest.approx(np.sum((all_norm - all_norm.mean()) ** 2), rel=1e-9)
    # the rows' sums are exactly the bound's data terms (ln p(X, Z) - ln q(Z)): the estimate is
    # (N/M) sum_n l_n plus the exact global terms
    t = elbo_terms(res.stats, post, prior)
    assert t.log_likelihood - t.kl_assignments == pytest.approx(res.log_norm, rel=1e-10)


def test_hard_kernel_row_sums_against_brute_force(data, fitted):
    """One-hot q(z_n) at the MAP label of a point: ``l_n = ln rho_{n z_n}`` under the point's
    posterior (its means, variance sigma^2), from the MAP scores the assignment computes."""
    post, prior = fitted.posterior_, fitted.prior_
    a, b = post.weight_concentration
    point = DPPoint(post.means, a / (a + b))
    sigma2 = float(prior.fixed_variance)
    shift = data.mean(axis=0)
    rows = np.arange(3, data.shape[0], 5)
    params = map_params(point, sigma2, shift, np.float64, bound=row_bound(point, sigma2, post, shift))
    hs = hard_kernel(_chunk(data, shift), rows, params)
    x = data[rows]
    lab = np.argmax(x @ point.means.T / sigma2 - 0.5 * np.sum(point.means**2, axis=1) / sigma2
                    + log_stick_weights(point.sticks), axis=1)
    ell = _row_log_rho(x, post)[np.arange(x.shape[0]), lab]
    assert hs.bound[0] == pytest.approx(ell.sum(), rel=1e-10)
    assert hs.bound[1] == pytest.approx(np.sum((ell - ell.mean()) ** 2), rel=1e-9)
    t = elbo_terms(hs.to_stats(), post, prior)
    assert t.log_likelihood - t.kl_assignments == pytest.approx(ell.sum(), rel=1e-9)
    # a multi-block pass (all rows, more than one block) sums the same way
    full = hard_kernel(_chunk(np.tile(data, (2, 1)), shift), None, params)
    all_ell = _row_log_rho(data, post)[np.arange(data.shape[0]), np.argmax(
        data @ point.means.T / sigma2 - 0.5 * np.sum(point.means**2, axis=1) / sigma2
        + log_stick_weights(point.sticks), axis=1)]
    assert full.bound[0] == pytest.approx(2 * all_ell.sum(), rel=1e-10)
    both = np.concatenate((all_ell, all_ell))
    assert full.bound[1] == pytest.approx(np.sum((both - both.mean()) ** 2), rel=1e-9)
    # without ``bound`` nothing is summed; a posterior that is not the point's is refused
    assert hard_kernel(_chunk(data, shift), rows, map_params(point, sigma2, shift)).bound == (0.0, 0.0)
    with pytest.raises(ValueError, match="the point's own 'fixed' posterior"):
        row_bound(DPPoint(post.means + 0.3, point.sticks), sigma2, post, shift)


def test_reported_errors_are_calibrated(data, fitted):
    """Minibatch estimates of one distribution's bound, through the kernels the learners use, fall
    around its exact bound with the spread their standard errors report: mean z^2 in [0.75, 1.25]
    over 300 minibatches (the exact bound from one full pass)."""
    post, prior = fitted.posterior_, fitted.prior_
    shift = data.mean(axis=0)
    chunk, params = _chunk(data, shift), estep_params(post, shift)
    n, m = data.shape[0], 150
    exact = elbo_terms(minibatch_vbem_kernel(chunk, np.arange(n), params).stats, post, prior).total
    rng = np.random.default_rng(5)
    z = []
    for _ in range(300):
        rows = np.sort(rng.choice(n, size=m, replace=False))
        res = minibatch_vbem_kernel(chunk, rows, params)
        est = elbo_terms(scale_stats(res.stats, n / m), post, prior).total
        z.append((est - exact) / minibatch_standard_error(n, m, res.log_norm_m2))
    assert 0.75 < float(np.mean(np.square(z))) < 1.25
    assert abs(float(np.mean(z))) < 0.2  # unbiased


# ---- where the errors are reported ----------------------------------------------------------------
@pytest.mark.parametrize("learner", ["sga-f", "svi"])
def test_estimator_reports_an_error_per_estimate(data, learner):
    kw = dict(n_components=8, learner=learner, random_state=0, max_iter=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = VBMixture(learner_options={"minibatch": 300}, **kw).fit(data)
        exact = VBMixture(learner_options={"minibatch": 300, "elbo": "full"}, **kw).fit(data)
    assert m.lower_bounds_se_.shape == m.lower_bounds_.shape == (5,)
    assert np.all(np.isfinite(m.lower_bounds_se_)) and np.all(m.lower_bounds_se_ > 0)
    # an estimate from 300 of 3,000 rows: its error is a small fraction of the bound, not zero
    assert np.all(m.lower_bounds_se_ < 0.05 * np.abs(m.lower_bounds_))
    assert np.all(np.isnan(exact.lower_bounds_se_))
    vb = VBMixture(n_components=4, max_iter=3, random_state=0).fit(data)
    assert vb.bound_kind_ == "exact" and np.all(np.isnan(vb.lower_bounds_se_))


def test_cli_result_and_log_carry_the_errors(data, tmp_path):
    np.save(tmp_path / "d.npy", data)
    ingest(str(tmp_path / "d.npy"), tmp_path / "s.zarr", chunk_rows=1000)
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["fit", str(tmp_path / "s.zarr"), "--run-dir", str(run), "--learner",
                                   "svi", "-k", "6", "--max-iter", "4", "-o", "minibatch=500", "-q"])
    assert res.exit_code == 0, res.output
    assert "minibatch estimates" in res.output and "+-" in res.output
    result = json.loads((run / "result.json").read_text())
    se = result["bound"]["history_se"]
    assert len(se) == 4 and all(v > 0 for v in se)
    lines = [json.loads(line) for line in (run / "iterations.jsonl").read_text().splitlines()]
    assert [r["elbo_se"] for r in lines] == se
