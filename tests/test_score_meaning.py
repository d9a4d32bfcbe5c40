"""What ``VBMixture.score`` is next to scikit-learn's BGM (issue 53, item 11): the posterior predictive
density (a mixture of Student-t), a density of the rows that integrates to 1; BGM's ``score_samples``
adds the E-step's expectation terms to the plug-in Gaussians and is no density, so GridSearchCV
scores of the two do not compare. The stopping rule: ``tol`` per row."""

import warnings

import numpy as np
from sklearn.mixture import BayesianGaussianMixture

from pipeline import VBMixture

rng = np.random.default_rng(0)
X = np.concatenate([rng.normal(-3, 1, 40), rng.normal(4, 0.5, 30)])[:, None]


def _fit(cls, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of either
        return cls(n_components=3, covariance_type="diag", random_state=0, max_iter=200, **kw).fit(X)


def test_score_is_a_density_of_the_rows_and_bgms_is_not():
    grid = np.linspace(-30, 30, 200001)[:, None]
    ours = np.trapezoid(np.exp(_fit(VBMixture).score_samples(grid)), grid[:, 0])
    theirs = np.trapezoid(np.exp(_fit(BayesianGaussianMixture).score_samples(grid)), grid[:, 0])
    assert abs(ours - 1.0) < 1e-3  # (the Student-t tails past +-30 hold the rest)
    assert theirs < 0.99  # E[ln lambda] - 1/beta terms: not normalised


def test_tol_is_per_row():
    """The same fit stops where the bound's change per row falls below ``tol``: the total change at
    the last iteration is below ``tol * N`` and, one iteration earlier, not below ``tol`` per row."""
    m = _fit(VBMixture, tol=1e-4)
    assert m.converged_
    per_row = np.abs(np.diff(m.lower_bounds_)) / X.shape[0]  # lower_bounds_: the total bound
    assert per_row[-1] < 1e-4 and per_row[-2] >= 1e-4
