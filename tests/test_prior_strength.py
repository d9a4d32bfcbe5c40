"""Issue 51, deliver 3: the prior's weight does not grow with the number of rows.

'empirical' (the pipeline's): the diagonal families' ``nu0`` is ``min(4 D, 512)`` whatever N (before:
1% of the rows, which outweighed the classes of a large store of small classes and merged them).
'bound': it starts there and is re-estimated from the exact bound with the prior's variance held at
the data's (:func:`vbcore.model.empirical.best_strength`, at least ``STRENGTH_FLOOR``), a candidate
of ``--select auto``, which picks it by its bound where the classes are small."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from tests._reference import planted_small_classes, stats_of
from vbcore.model.elbo import elbo_terms
from vbcore.model.empirical import STRENGTH_FLOOR, best_strength, empirical_update
from vbcore.model.mstep import m_step
from vbcore.model.priors import default_prior


@pytest.mark.parametrize("ct", ["diag", "spherical"])
def test_the_strength_update_is_the_bounds_maximum(ct: str) -> None:
    """Against a scalar search of the exact ELBO over nu0 (prior variance held, q fixed)."""
    x, lab = planted_small_classes(n_classes=6, d=5, lo=20, hi=60, seed=3)
    x = x.astype(np.float64)
    k = 6
    stats = stats_of(x, np.eye(k)[lab], ct, x.mean(0))
    var = x.var(0, ddof=1) if ct == "diag" else float(x.var(0, ddof=1).mean())
    prior = default_prior(covariance_type=ct, weight_type="dirichlet_process", n_components=k,
                          data_mean=x.mean(0), data_covariance=x.var(0, ddof=1), defaults="empirical")
    post = m_step(stats, prior)

    def bound(nu0: float) -> float:
        return elbo_terms(stats, post, replace(prior, degrees_of_freedom=nu0,
                                               covariance=np.asarray(nu0 * np.asarray(var)))).total

    best = minimize_scalar(lambda t: -bound(float(np.exp(t))), bounds=(-8, 8), method="bounded",
                           options={"xatol": 1e-10})
    nu0 = best_strength(post, prior)
    assert nu0 == pytest.approx(max(STRENGTH_FLOOR, float(np.exp(best.x))), rel=1e-4)
    new = empirical_update(replace(prior, empirical=("strength",)), post)
    assert new.degrees_of_freedom == nu0 and bound(nu0) >= bound(prior.degrees_of_freedom)
    assert np.allclose(new.covariance / nu0, var)


def _fit(x: np.ndarray, priors: str = "bound"):
    from pipeline.estimator import VBMixture
    from pipeline.fit.spec import estimator_params

    m = VBMixture(50, covariance_type="diag", **{**estimator_params(), "prior_defaults": priors})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return m.fit(x)


def test_the_prior_weighs_the_same_at_n_and_10n() -> None:
    """The same classes with ten times the rows: the same starting prior, and the bound's nu0 within
    a few percent (it depends on the classes' spreads, not on how many rows there are)."""
    small, _ = planted_small_classes(n_classes=12, d=8, lo=40, hi=120, seed=1)
    large, _ = planted_small_classes(n_classes=12, d=8, lo=40, hi=120, seed=1, copies=10)
    starts = [default_prior(covariance_type="diag", weight_type="dirichlet_process", n_components=50,
                            data_mean=v.mean(0), data_covariance=v.var(0), defaults="empirical",
                            n_rows=len(v)).degrees_of_freedom for v in (small, large)]
    assert starts[0] == starts[1] == 32.0
    a, b = _fit(small, "empirical"), _fit(large, "empirical")
    assert a.prior_.degrees_of_freedom == b.prior_.degrees_of_freedom == 32.0
    a, b = _fit(small), _fit(large)
    assert a.n_effective_ == b.n_effective_ == 12
    assert a.prior_.degrees_of_freedom == pytest.approx(b.prior_.degrees_of_freedom, rel=0.05)
    assert a.prior_.degrees_of_freedom < 0.1 * 40  # lighter than the smallest class


def test_the_bounds_prior_finds_many_small_classes_and_selection_picks_it() -> None:
    """100 classes of 25-400 rows in 32 dimensions, a third near another (issue 51's set, small): the
    'empirical' prior (nu0 = 4 D = 128 rows at the data's variance, as 1% of the rows was) merges them
    (67 clusters, NMI 0.958); the bound's weight finds them, and ``--select auto`` passes over the
    'empirical' prior by the bound (it keeps scikit-learn's, whose bound is higher still)."""
    from sklearn.metrics import normalized_mutual_info_score

    from pipeline.fit.setup import open_source
    from pipeline.fit.spec import FitSpec
    from pipeline.service import fit

    x, lab = planted_small_classes(n_classes=100, d=32, lo=25, hi=400, seed=0)
    m = _fit(x)
    assert abs(m.n_effective_ - 100) <= 3
    assert normalized_mutual_info_score(lab, m.predict(x)) > 0.99
    old = _fit(x, "empirical")
    assert old.n_effective_ < 80 and old.lower_bound_ < m.lower_bound_
    out = fit(FitSpec(covariance="diag", select="auto", seed=0, select_fits=3).resolved(),
              open_source(x, 4096), "local", random_state=0)
    assert out.selection is not None and out.selection["parts"] == "priors"
    by = {c["priors"]: c for c in out.selection["candidates"]}
    assert by["empirical"]["full_bound"] < min(by["bound"]["full_bound"], by["sklearn"]["full_bound"]) - 20
    assert not by["empirical"]["chosen"]  # scikit-learn's light prior, -49.9 per row, or the bound's, -50.5
    from pipeline.fit.driver import n_effective

    assert abs(n_effective(out.post, out.prior) - 100) <= 3
