"""A fitted mixture under scikit-learn's attribute names: what a fit ends with, what a run holds.

:class:`FittedMixture` derives every fitted attribute (``weights_``, ``counts_``, ``means_``,
``precisions_``, the prior under scikit-learn's names, ...) from the posterior and its prior, in one
place. The estimator (:class:`pipeline.estimator.VBMixture`) takes its fitted attributes from it;
the fit service (:mod:`pipeline.service`) hands one to the run directory
(:func:`pipeline.runs.directory.save_run`), which reads a ``FittedMixture`` and a fitted
``VBMixture`` alike: the same attributes under the same names, and ``get_params()`` for the settings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.fit.driver import FitOutcome, n_effective
from vbcore.kernels.projection import Projection
from vbcore.model.elbo import ElboTerms
from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior


class FittedMixture:
    """The fitted attributes of a mixture (the names of scikit-learn's ``BayesianGaussianMixture``,
    plus vbcluster's), from a posterior and its prior.

    Parameters
    ----------
    post, prior : the variational posterior and the prior it was fitted under
    terms : the exact ELBO's terms at the end of the fit
    history : the bound after every iteration (``lower_bounds_``)
    converged, n_iter : as scikit-learn's ``converged_`` and ``n_iter_``
    history_se : the standard error of each ``history`` entry that is a minibatch estimate (None: exact)
    projection : the projection the rows go through before the model (``pca``), or None
    settings : the estimator parameters of the fit (``VBMixture.get_params()``), for
        :meth:`get_params`

    The fit service adds, as the estimator does: ``fitted_store_`` (the store as the fit opened
    it), ``learner_options_`` (the options as the fit used them) and ``truncation_``
    (:func:`fitted_model`).
    """

    def __init__(self, post: Posterior, prior: Prior, terms: ElboTerms, history: list[float],
                 converged: bool, n_iter: int, history_se: list[float | None] | None = None,
                 projection: Projection | None = None, settings: dict[str, Any] | None = None) -> None:
        self.settings = dict(settings or {})
        self.posterior_ = post
        self.prior_ = prior
        #: the projection the rows go through before the model (``pca``), or None
        self.projection_ = projection
        self.n_features_in_ = post.n_features if projection is None else projection.n_features_in
        self.converged_ = converged
        self.n_iter_ = n_iter
        self.lower_bound_ = terms.total
        self.lower_bounds_ = np.asarray(history)
        se = history_se if history_se is not None and len(history_se) == len(history) else []
        se = se or [None] * len(history)
        #: the standard error of each lower_bounds_ entry that is a minibatch estimate (NaN: exact)
        self.lower_bounds_se_ = np.array([np.nan if v is None else v for v in se], dtype=np.float64)
        self.elbo_terms_ = terms.as_dict()
        w = post.expected_weights()
        self.weights_ = w / w.sum()
        self.weight_concentration_ = (
            tuple(post.weight_concentration) if post.weight_type == "dirichlet_process"
            else post.weight_concentration
        )
        wc = post.weight_concentration
        self.counts_ = (wc[0] - 1.0) if post.weight_type == "dirichlet_process" else (
            wc - prior.weight_concentration)
        self.n_effective_ = n_effective(post, prior)
        self.n_components_ = post.n_components  # components kept (DP learners prune)
        self.mean_precision_ = post.mean_precision
        self.means_ = post.means
        nu = post.degrees_of_freedom
        self.degrees_of_freedom_ = float(nu) if nu is not None and np.ndim(nu) == 0 else nu  # tied: one
        self.covariances_ = post.covariances
        self.precisions_cholesky_ = post.precisions_cholesky
        self.precisions_ = post.precisions()
        # the prior, under scikit-learn's names
        self.weight_concentration_prior_ = prior.weight_concentration
        self.mean_precision_prior_ = prior.mean_precision
        self.mean_prior_ = prior.mean
        self.degrees_of_freedom_prior_ = prior.degrees_of_freedom
        self.covariance_prior_ = prior.covariance if prior.covariance is not None else prior.fixed_variance

    def attributes(self) -> dict[str, Any]:
        """Every fitted attribute (the names ending in ``_``), for an estimator to take over."""
        return {k: v for k, v in vars(self).items() if k.endswith("_")}

    def get_params(self) -> dict[str, Any]:
        """The estimator parameters of the fit, as ``VBMixture.get_params()`` gives them."""
        return dict(self.settings)

    @property
    def learner(self) -> str:
        return str(self.settings.get("learner", "vbem"))

    @property
    def n_components(self) -> int:
        """The truncation the fit was asked for (the estimator's ``n_components``)."""
        return int(self.settings.get("n_components", self.prior_.n_components))


def fitted_model(out: FitOutcome, settings: dict[str, Any], source: Any) -> FittedMixture:
    """The :class:`FittedMixture` of a fit's outcome, with the attributes a run directory records."""
    model = FittedMixture(out.post, out.prior, out.terms, out.history, out.converged, out.n_iter,
                          out.history_se, out.projection, settings=settings)
    model.fitted_store_ = source  # the store as the fit opened it (row count, fingerprint)
    model.learner_options_ = out.options
    model.truncation_ = dict(out.truncation)
    return model
