"""The default fixed variance of the DP-mixture learners (issue 6 item 5): split-coordinate nearest
neighbours (vbcore/learners/sigma2.py, pipeline.fit.learners.point.base.estimate_fixed_variance)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2
from sklearn.metrics import normalized_mutual_info_score

from pipeline.estimator import VBMixture
from pipeline.fit.learners.point.base import estimate_fixed_variance
from vbcore.learners.sigma2 import nearest_neighbours, split_nn_variance


def _model(n: int, k: int, d: int, sigma2: float, seed: int, sep: float = 1.0,
           imbalance: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Rows of x | z=k ~ N(mu_k, sigma2 I), mu_k ~ N(0, sep^2 sigma2 I), P(z=k) ~ (k+1)^-imbalance."""
    r = np.random.default_rng(seed)
    mu = r.standard_normal((k, d)) * sep * np.sqrt(sigma2)
    p = np.arange(1, k + 1, dtype=np.float64) ** -imbalance
    z = r.choice(k, n, p=p / p.sum())
    return (mu[z] + np.sqrt(sigma2) * r.standard_normal((n, d))).astype(np.float32), z


def test_nearest_neighbours_match_brute_force():
    x = np.random.default_rng(0).standard_normal((300, 7)).astype(np.float32)
    d2 = ((x[:, None].astype(np.float64) - x[None]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    assert np.array_equal(nearest_neighbours(x, block=64), d2.argmin(1))


def test_one_cluster_is_exactly_a_chi2_median():
    # one Gaussian cluster: every neighbour is a same-cluster partner, so the B-distances are
    # 2 sigma^2 chi^2_|B| draws and the estimate is unbiased up to the median's sampling error
    x, _ = _model(3000, 1, 128, 0.7, seed=1)
    est = split_nn_variance(x, np.random.default_rng(0))
    # sd of the median of chi^2_64 / 64 over 3000 rows: ~1.25 sqrt(2/64) / sqrt(3000) = 0.4%
    assert est == pytest.approx(0.7, rel=0.02)
    # the plain nearest-neighbour distance (same coordinates for choosing and measuring) is biased low:
    # measured 0.46 (0.66 x)
    nn = nearest_neighbours(x)
    plain = np.median(((x - x[nn]).astype(np.float64) ** 2).sum(1) / 2) / chi2.median(128)
    assert plain < 0.9 * 0.7


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("k_true,sep,imbalance", [(10, 1.0, 0.0), (10, 0.5, 0.0), (30, 1.0, 1.0)])
def test_estimate_is_the_model_variance_for_any_truncation(d, k_true, sep, imbalance):
    x, _ = _model(6000, k_true, d, 2.0, seed=d + k_true, sep=sep, imbalance=imbalance)
    ests = [estimate_fixed_variance(x, k, 0) for k in (k_true, 3 * k_true, 10 * k_true)]
    # measured: 2.00-2.01 at D=256 and 1.98-2.16 at D=64 (sep 0.5 at D=64 is the worst: cross-cluster
    # neighbours); tolerance 10%
    for e in ests:
        assert e == pytest.approx(2.0, rel=0.10)
    assert ests[0] == ests[1] == ests[2]  # K is not used
    assert estimate_fixed_variance(x, k_true, 0) == ests[0]  # deterministic from the seed


def test_estimate_ignores_duplicates_and_scale():
    x, _ = _model(2000, 5, 64, 1.0, seed=3)
    base = estimate_fixed_variance(x, 5, 0)
    assert estimate_fixed_variance(np.concatenate([x, x[:500]]), 5, 0) == pytest.approx(base, rel=0.05)
    assert estimate_fixed_variance(9.0 * x, 5, 0) == pytest.approx(81.0 * base, rel=1e-4)
    assert estimate_fixed_variance(np.ones((50, 8)), 5, 0) == 1.0  # no spread at all: the fallback


def test_low_dimension_is_biased_up_not_down():
    # documented limit (vbcore/learners/sigma2.py): at D = 8 with 100 clusters many A-neighbours are in other
    # clusters; measured 3.68 for truth 2.0. The old k-means++ estimate gave 1.61 at K = 100 and 0.82
    # at K = 1000. Assert the direction and a bound on the bias, so a change of it is seen.
    x, _ = _model(8000, 100, 8, 2.0, seed=8)
    assert 2.0 < estimate_fixed_variance(x, 100, 0) < 4.5


@pytest.mark.parametrize("learner", ["mm", "sga-f"])
def test_default_sigma2_fit_at_the_true_truncation(learner):
    # data from the model, K = the true number of clusters: measured NMI 0.950 (mm) and 0.951 (sga-f):
    # the k-means++ start puts two seeds in one cluster and none in another, and MAP learners keep that
    x, z = _model(3000, 8, 64, 2.0, seed=5)
    m = VBMixture(8, covariance_type="fixed", weight_concentration_prior_type="dirichlet_process",
                  learner=learner, random_state=0, max_iter=60).fit(x)
    assert m.prior_.fixed_variance == pytest.approx(2.0, rel=0.05)
    assert normalized_mutual_info_score(z, m.predict(x)) > 0.9


@pytest.mark.parametrize("learner", ["mm", "sga-f"])
def test_default_sigma2_fit_with_truncation_far_above_truth(learner):
    # Same data, K = 5 x truth: sigma^2 is unchanged (K does not enter), but the hard-assignment
    # learners keep the clusters their k-means++ start made (a MAP split of a Gaussian cluster of n rows
    # gains about n / pi nats, more than a cluster's prior costs), so the count stays at K: measured
    # mm 40 of 40 used, NMI 0.806, sga-f 40 of 40, NMI 0.792, homogeneity 1.0 for both. (The old
    # k-means++ default, 3.15 here, about 1.6 x the truth, gave 36 and 38 clusters, NMI 0.960 and 0.922.)
    # Asserted: sigma^2 is the truth, every cluster is pure, NMI above 0.75.
    from sklearn.metrics import homogeneity_score

    x, z = _model(3000, 8, 64, 2.0, seed=5)
    m = VBMixture(40, covariance_type="fixed", weight_concentration_prior_type="dirichlet_process",
                  learner=learner, random_state=0, max_iter=60).fit(x)
    lab = m.predict(x)
    assert m.prior_.fixed_variance == pytest.approx(2.0, rel=0.05)
    assert homogeneity_score(z, lab) > 0.99
    assert normalized_mutual_info_score(z, lab) > 0.75
