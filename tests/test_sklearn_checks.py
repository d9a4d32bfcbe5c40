"""scikit-learn's own estimator checks (API conventions, cloning, input validation messages)."""

import warnings

from sklearn.utils.estimator_checks import parametrize_with_checks

from pipeline import VBMixture


@parametrize_with_checks(
    [VBMixture(n_components=2, max_iter=20, covariance_type=ct) for ct in ("full", "diag")]
)
def test_sklearn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)
