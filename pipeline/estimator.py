"""``VBMixture``: the scikit-learn face of vbcluster.

Parameters mean what they mean in scikit-learn's ``BayesianGaussianMixture``; the additions are
``learner``, ``learner_options``, ``fixed_variance``, the engine and checkpoint settings. The
settings are a :class:`pipeline.fit.spec.FitSpec` (validated there before any data is read); ``fit``
calls the fit service (:func:`pipeline.service.fit`: ``n_init`` restarts, warm starts, the
checkpoint lock), whose loop, checkpoints and resume are :mod:`pipeline.fit.driver`'s. The fitted
attributes (:class:`pipeline.fit.fitted.FittedMixture`'s) carry scikit-learn's names, plus
``lower_bounds_`` (the ELBO after every iteration: exact, or for the minibatch learners an estimate
whose standard error is in ``lower_bounds_se_``; ``bound_kind_`` says which), ``elbo_terms_``
(always exact) and ``learner_options_`` (every learner option as the fit used it, automatic values
such as ``candidates=-1`` resolved).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from string import Template
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from pipeline.engine.engines import split_rows
from pipeline.engine.sources import is_store_path
from pipeline.fit.fitted import FittedMixture
from pipeline.fit.setup import open_source
from pipeline.fit.spec import FitSpec
from pipeline.store import CHUNK_ROWS
from vbcore.data.validation import check_array_2d, check_weights
from vbcore.errors import ConfigError, InputError, TruncationWarning, truncation_message
from vbcore.kernels.estep import estep_params, prepare_chunk, responsibilities
from vbcore.kernels.projection import Projection
from vbcore.model.elbo import ElboTerms
from vbcore.model.posterior import Posterior
from vbcore.model.predictive import posterior_predictive_logpdf
from vbcore.model.priors import Prior

__all__ = ["VBMixture", "check_array_2d", "load_model", "posterior_predictive_logpdf"]


class VBMixture(DensityMixin, BaseEstimator):
    """Variational Bayesian Gaussian mixture with the exact ELBO.

    The settings are those of :class:`pipeline.fit.spec.FitSpec` under scikit-learn's names; they are
    resolved and validated there before any data is read.

    Where it differs from scikit-learn's ``BayesianGaussianMixture`` (docs/decisions.md, items 1-4):
    ``tol`` is per row (the change of the bound over the rows' count; scikit-learn compares the
    total, so ``tol=t / n_samples`` stops where it does); the covariance prior's variances are floored
    at 1e-6 times the mean variance (a constant feature would make it singular); the diag E-step's
    expectation is exact; and ``score`` / ``score_samples`` are the posterior predictive density (a
    mixture of Student-t, a density of the rows), where scikit-learn's add the E-step's expectation
    terms to plug-in Gaussians (no density: it does not integrate to 1 and falls steeply on held-out
    rows in features without spread), so cross-validation scores of the two do not compare
    (tests/test_score_meaning.py).

    Parameters
    ----------
    n_components : int, default=1
        Number of components ``K`` (the truncation level for the Dirichlet process).
    covariance_type : {'full', 'tied', 'diag', 'spherical', 'fixed'} or None, default=None
        None is scikit-learn's 'full' for the learners that fit it, and the learner's own otherwise
        ('fixed' for the point learners: $point). 'fixed' is a known isotropic variance
        ``fixed_variance`` with a Gaussian prior on the means.
    tol : float, default=1e-3
        Convergence threshold on the change of the ELBO *per sample* between iterations.
    reg_covar : float, default=1e-6
        Added to the diagonal of each component's sample covariance (scikit-learn's meaning).
    max_iter : int, default=100
    n_init : int, default=1
        Restarts (each from its own seed derived from ``random_state``); the fit with the best ELBO
        is kept.
    init_params : {'kmeans', 'k-means++', 'random', 'random_from_data', 'k-means++-projected'}
        Default 'kmeans' (scikit-learn's k-means on ``max(10000, 20 K)`` sample rows)
        (the pipeline's default is 'k-means++-projected': seeds among sample rows, nearest seed in a
        random projection, no Lloyd iterations)
    weight_concentration_prior_type : {'dirichlet_process', 'dirichlet_distribution'}
    weight_concentration_prior, mean_precision_prior, mean_prior, degrees_of_freedom_prior,
    covariance_prior : priors, as in scikit-learn; None takes the data-dependent defaults.
    prior_defaults : {'sklearn', 'empirical', 'bound'}, default='sklearn'
        Unset priors filled as scikit-learn does (``alpha0 = 1/K``, ``nu0 = D``, fixed), or as the pipeline
        (DP ``alpha0 = 1``, diag/spherical ``nu0 = 4 D``, at most 512, whatever the number of rows, a
        prior variance equal to the data's, ``beta0`` re-estimated from the bound; ``'bound'``: ``nu0``
        re-estimated too; docs/guide.md "Choosing
        K"). Every
        default of the command line at once: ``VBMixture(K, covariance_type='diag',
        **pipeline.fit.spec.estimator_params())``.
    grow : bool, default=False
        Grow the truncation (learners $growing; DP weights) while the fit ends with nearly every
        component in use (the pipeline's default is True); ``n_components`` is then the start.
    max_components : int, optional
        Upper limit of a growing truncation; default ``max(4 n_components, 1024)``.
    fixed_variance : float, optional
        ``sigma^2`` for covariance_type='fixed'; default: the learner's estimate (split-coordinate
        nearest neighbours for the point learners), else the mean per-dimension within-cluster variance
        of k-means with ``n_components`` clusters on (a sample of) X.
    pca : int, optional
        Fit on the rows projected onto their ``pca`` leading principal components (computed in one
        pass over the data on the engine; :mod:`pipeline.fit.projection`). The fitted means and
        covariances live in that space; ``projection_`` holds the projection, and ``predict``,
        ``predict_proba``, ``score_samples`` and warm starts apply it (``sample`` maps its draws
        back to the input space).
    whiten : bool, default=False
        With ``pca``: scale every principal component to unit variance.
    pca_solver : {'exact', 'randomized'}, default='exact'
        With ``pca``: the D x D covariance in one pass ('exact'), or three passes of randomized
        subspace iteration on ``pca + 32`` vectors (:mod:`vbcore.kernels.sketch`; cheaper where D
        is large, about 99% of the exact components' variance), started from ``random_state``.
    learner : str, default='vbem'
        A registered learner (``pipeline.fit.learners.LEARNERS``: $learners; docs/algorithms.md).
        ``set_params(learner=..., warm_start=True)`` switches learners and
        continues from the current posterior.
    learner_options : dict, optional
        Options of the learner (step sizes, minibatch size, ...); each learner declares its own
        with their defaults in ``LEARNERS[name].options`` (``vbcluster learners NAME`` lists their
        types, accepted values and help).
    chunk_rows : int, default=8192
        Rows per chunk for the map-reduce passes over in-memory arrays (stores and dask arrays
        keep their own chunking); the default is the chunking `vbcluster ingest` writes.
    engine : 'local', distributed.Client, 'tcp://host:port' or a cluster config path, default='local'
        Where the passes run. Engines give bitwise-identical results.
    persist : {'auto', 'always', 'never'}, default='auto'
        Keep prepared chunks in (worker) memory; 'auto' does when they fit in half of it.
    checkpoint_dir : str, optional
        Write checkpoints here, and resume from the newest valid one when the directory already
        holds a run with the same settings and data (bit for bit the uninterrupted result).
    checkpoint_every : int, default=10
        Iterations between checkpoints (the last iteration is always checkpointed).
    checkpoint_seconds : float, optional
        Also checkpoint when this many seconds have passed since the last checkpoint.
    checkpoint_keep : int, default=3
        Checkpoints kept.
    random_state : int, RandomState or None
    warm_start : bool, default=False
        Start the next ``fit`` from the current posterior.
    verbose : int, default=0
        1 prints each restart and its end; 2 also every ``verbose_interval`` iterations.
    verbose_interval : int, default=10
    """

    def __init__(
        self,
        n_components: int = 1,
        *,
        covariance_type: str | None = None,
        tol: float = 1e-3,
        reg_covar: float = 1e-6,
        max_iter: int = 100,
        n_init: int = 1,
        init_params: str = "kmeans",
        weight_concentration_prior_type: str = "dirichlet_process",
        weight_concentration_prior: float | None = None,
        mean_precision_prior: float | None = None,
        mean_prior: Any = None,
        degrees_of_freedom_prior: float | None = None,
        covariance_prior: Any = None,
        prior_defaults: str = "sklearn",
        grow: bool = False,
        max_components: int | None = None,
        fixed_variance: float | None = None,
        pca: int | None = None,
        whiten: bool = False,
        pca_solver: str = "exact",
        learner: str = "vbem",
        learner_options: dict[str, Any] | None = None,
        chunk_rows: int = CHUNK_ROWS,
        engine: Any = "local",
        persist: str = "auto",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 10,
        checkpoint_seconds: float | None = None,
        checkpoint_keep: int = 3,
        random_state: Any = None,
        warm_start: bool = False,
        verbose: int = 0,
        verbose_interval: int = 10,
    ) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weight_concentration_prior_type = weight_concentration_prior_type
        self.weight_concentration_prior = weight_concentration_prior
        self.mean_precision_prior = mean_precision_prior
        self.mean_prior = mean_prior
        self.degrees_of_freedom_prior = degrees_of_freedom_prior
        self.covariance_prior = covariance_prior
        self.prior_defaults = prior_defaults
        self.grow = grow
        self.max_components = max_components
        self.fixed_variance = fixed_variance
        self.pca = pca
        self.whiten = whiten
        self.pca_solver = pca_solver
        self.learner = learner
        self.learner_options = learner_options
        self.chunk_rows = chunk_rows
        self.engine = engine
        self.persist = persist
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.checkpoint_seconds = checkpoint_seconds
        self.checkpoint_keep = checkpoint_keep
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval

    # ---- settings -----------------------------------------------------------------------------
    def spec(self, store: str | None = None) -> FitSpec:
        """The resolved, validated fit specification of these parameters (reads no data)."""
        if self.learner_options is not None and not isinstance(self.learner_options, dict):
            raise ConfigError(f"learner_options must be a dict, got {self.learner_options!r}")
        for name in ("verbose", "verbose_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
        return FitSpec.from_estimator(self.get_params(), store).resolved("estimator")

    # ---- fitting ------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None, resp_init: Any = None, *, sample_weight: Any = None,
            callback: Callable[[dict[str, Any]], None] | None = None, stop: Any = None) -> VBMixture:
        """Fit with the chosen learner (``n_init`` restarts; the best ELBO is kept).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), dask array or feature-store path
        y : ignored
        resp_init : array of shape (n_samples, n_components), optional
            Initial responsibilities: the fit starts with one M-step from them, then runs up to
            ``max_iter`` iterations (so runs can be compared with another implementation).
        sample_weight : array-like of shape (n_samples,), optional
            Row weights, finite and >= 0: every statistic, the bound and every learner count row n
            ``w_n`` times (an integer weight gives the posterior of the row repeated, 0 that of the
            row dropped). ``tol`` and the bound per row are per unit of weight. A feature store
            carries its own (``vbcluster ingest --weights``).
        callback : callable, optional
            Called after every iteration with a dict: ``iteration``, ``elbo``, ``n_effective``
            (clusters alive), ``n_components`` (components kept), ``seconds`` (of that iteration),
            ``passes`` (engine passes so far, all attempts) and ``learner``; a resumed fit first calls it
            with ``event='resumed'`` and ``after_iteration`` (the checkpoint's) instead of ``iteration``.
        stop : pipeline.fit.driver.StopRequest, optional
            A stop request (``with stop_on_signals() as stop:``, :mod:`pipeline.fit.driver`): once set
            (SIGINT/SIGTERM) the fit writes a checkpoint after the current iteration and raises
            FitInterrupted.
        """
        self._fit(X, resp_init, callback, sample_weight, stop)
        return self

    def partial_fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> VBMixture:
        """Fold one batch of rows into memoized statistics and update the posterior (VB EM; earlier
        batches are not read again). ``n_iter_``, ``converged_`` and ``lower_bounds_`` describe this
        call; ``lower_bound_`` is the exact bound over every row seen so far; with ``pca`` every batch
        is projected onto the first batch's principal components (pipeline/fit/partial.py)."""
        from pipeline.fit.partial import partial_fit

        state = getattr(self, "partial_state_", None)
        fitted = hasattr(self, "posterior_")
        if fitted:
            self._check_X(X)  # the fitted number of features, feature names
        else:
            self._check_names(X, reset=True)
        out, self.partial_state_ = partial_fit(
            self.spec(), X, sample_weight, self.engine, state, self.posterior_ if fitted else None,
            self.prior_ if fitted else None, self.random_state,
            getattr(self, "projection_", None) if fitted else None)
        self.set_fitted(out.post, self.partial_state_.prior, out.terms, out.history, out.converged,
                        out.n_iter, projection=self.partial_state_.projection)
        return self

    def fit_predict(self, X: Any, y: Any = None, resp_init: Any = None, *,
                    sample_weight: Any = None) -> np.ndarray:
        self._fit(X, resp_init, None, sample_weight)
        return self.predict(X)

    def _fit(self, X: Any, resp_init: Any, callback: Callable[[dict[str, Any]], None] | None,
             sample_weight: Any = None, stop: Any = None) -> None:
        from pipeline.service import Warm, check_warm, fit

        spec = self.spec()
        warm = None
        if self.warm_start and hasattr(self, "posterior_"):
            warm = Warm(self.posterior_, self.prior_, getattr(self, "projection_", None),
                        getattr(self, "lower_bound_", None), getattr(self, "warm_state_", None))
        if resp_init is not None and warm is not None:
            raise ConfigError("pass either resp_init or warm_start=True with a fitted model, not both")
        if not is_store_path(X):
            self._check_names(X, reset=warm is None)
        source = open_source(X, int(spec.chunk_rows), sample_weight)
        if warm is not None:
            check_warm(warm, spec, source.n_features)
        best = fit(spec, source, self.engine, random_state=self.random_state,
                   checkpoint_dir=self.checkpoint_dir, warm=warm, resp_init=resp_init, callback=callback,
                   verbose=int(self.verbose), log_every=int(self.verbose_interval), stop=stop)
        #: the store a store fit read, as it was when the fit opened it (row count, fingerprint): what
        #: save_run records, whatever an append did to the store meanwhile; None for arrays
        self.fitted_store_ = source if is_store_path(X) else None
        self.set_fitted(best.post, best.prior, best.terms, best.history, best.converged, best.n_iter,
                        best.history_se, projection=best.projection)
        self.n_passes_ = best.passes
        #: what lower_bounds_ holds ('exact' or 'minibatch estimate'); lower_bound_ is always exact
        self.bound_kind_ = best.bound_kind
        #: the learner options the fit used: defaults filled in, automatic values (candidates=-1) resolved
        self.learner_options_ = best.options
        #: the truncation: start, final, limit, used, saturated, limit_hit, max_iter_hit
        #: (docs/guide.md "Choosing K")
        self.truncation_ = dict(best.truncation)
        if self.truncation_.get("limit_hit"):
            warnings.warn(truncation_message(self.truncation_, face="python"), TruncationWarning,
                          stacklevel=2)
        self.wall_seconds_ = best.wall_seconds  # summed over the attempts a resume continued
        self.resumed_from_ = best.resumed_from
        self.skipped_checkpoints_ = best.skipped
        #: what a warm-started fit adopts (memoized statistics, learner option ``memo``), and the
        #: chunks this fit adopted from its own warm start
        self.warm_state_ = best.kept or None
        self.adopted_chunks_ = best.adopted
        if not best.converged and int(spec.max_iter) > 0:
            warnings.warn(
                "Best performing initialization did not converge. Try different init parameters, "
                "or increase max_iter, tol, or check for degenerate data.", ConvergenceWarning, stacklevel=3)

    def set_fitted(self, post: Posterior, prior: Prior, terms: ElboTerms, history: list[float],
                   converged: bool, n_iter: int, history_se: list[float | None] | None = None,
                   projection: Projection | None = None) -> None:
        """Set the fitted attributes from a posterior and its prior (a fit, or a saved run);
        ``history_se``: the standard errors of ``history``'s minibatch estimates (None: exact);
        ``projection``: the projection of the rows (``pca``), None without one. The attributes are
        :class:`pipeline.fit.fitted.FittedMixture`'s (``posterior_``, ``weights_``, ``means_``, ...)."""
        fitted = FittedMixture(post, prior, terms, history, converged, n_iter, history_se, projection)
        vars(self).update(fitted.attributes())

    # ---- prediction ---------------------------------------------------------------------------
    def _check_names(self, X: Any, reset: bool) -> None:
        """scikit-learn's column-name bookkeeping (``feature_names_in_``) for DataFrames."""
        validate_data(self, X, reset=reset, skip_check_array=True, ensure_2d=False)

    def _check_X(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "posterior_")
        if is_store_path(X):
            raise InputError(f"{X}: a feature store; this method takes arrays (predict(STORE) gives the "
                             "labels of a store chunk by chunk, `vbcluster assign` writes them)")
        self._check_names(X, reset=False)
        X = check_array_2d(X)
        if X.shape[1] != self.n_features_in_:
            raise InputError(
                f"X has {X.shape[1]} features, but VBMixture is expecting {self.n_features_in_} "
                "features as input (the number it was fitted with)"
            )
        return X

    def predict_proba(self, X: Any) -> np.ndarray:
        """Responsibilities of the VB E-step (Kuusela et al. 2009, eq. 35), shape (n_samples,
        n_components)."""
        X = self._check_X(X)
        shift = self.prior_.mean
        params = estep_params(self.posterior_, shift)
        out = []
        for c in split_rows(X, int(self.chunk_rows)):
            chunk = prepare_chunk(c, shift, self.posterior_.covariance_type, projection=self.projection_)
            out.append(np.asarray(responsibilities(chunk, params), dtype=np.float64))
        resp = np.concatenate(out)
        k = int(self.prior_.n_components)
        if resp.shape[1] < k:  # pruned components have probability 0 (columns k >= n_components_)
            resp = np.concatenate((resp, np.zeros((resp.shape[0], k - resp.shape[1]))), axis=1)
        return resp

    def predict(self, X: Any) -> np.ndarray:
        """The most responsible component of each row; ``X`` may also be a feature store (a path, as
        :meth:`fit` takes), read chunk by chunk."""
        if is_store_path(X):
            check_is_fitted(self, "posterior_")
            src = open_source(X, int(self.chunk_rows))
            parts = [self.predict(src.load(i)) for i in range(len(src.chunk_slices()))]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return self.predict_proba(X).argmax(axis=1)

    def score_samples(self, X: Any) -> np.ndarray:
        """Log density of the posterior predictive (a mixture of Student-t), per sample."""
        X = self._check_X(X).astype(np.float64)
        if self.projection_ is not None:  # the density of the projected rows
            X = self.projection_.apply(X)
        return posterior_predictive_logpdf(X, self.posterior_, self.prior_)

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Mean log density of the posterior predictive per row (weighted by ``sample_weight``)."""
        ll = self.score_samples(X)
        if sample_weight is None:
            return float(np.mean(ll))
        w = check_weights(sample_weight, ll.shape[0])
        if not w.sum() > 0:
            raise InputError("sample_weight: the weights sum to 0; nothing to score")
        return float(np.sum(w * ll) / w.sum())

    def sample(self, n_samples: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Draw rows from the fitted mixture (weights ``weights_``, Gaussians with ``means_`` and
        ``covariances_``), as scikit-learn's ``sample``; returns ``(X, y)``, sorted by component.
        With ``pca``, the draws are mapped back to the input space (they lie in the principal
        subspace)."""
        check_is_fitted(self, "posterior_")
        if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) or n_samples < 1:
            raise ValueError(f"Invalid value for 'n_samples': {n_samples!r} . The sampling requires at "
                             "least one sample.")
        rng = check_random_state(self.random_state)
        counts = rng.multinomial(int(n_samples), self.weights_)
        ct, cov, d = self.posterior_.covariance_type, self.covariances_, self.posterior_.n_features
        parts = []
        for k, (mean, n) in enumerate(zip(self.means_, counts, strict=True)):
            if ct == "full":
                parts.append(rng.multivariate_normal(mean, cov[k], int(n)))
            elif ct == "tied":
                parts.append(rng.multivariate_normal(mean, cov, int(n)))
            else:  # diag (D,) or spherical/fixed scalar per component
                parts.append(mean + rng.standard_normal(size=(int(n), d)) * np.sqrt(cov[k]))
        X = np.vstack(parts)
        if self.projection_ is not None:
            X = self.projection_.inverse(X)
        y = np.concatenate([np.full(n, k, dtype=int) for k, n in enumerate(counts)])
        return X, y



def _learners_doc(doc: str) -> str:
    """``doc`` with the registry's names filled in ($point, $growing, $learners): written once, at import,
    from :data:`pipeline.fit.learners.LEARNERS` (the package imports every learner module)."""
    from pipeline.fit.learners import LEARNERS, learner_names, names_text

    return Template(doc).substitute(point=names_text(learner_names(family="point")),
                                    growing=names_text(learner_names(grows=True)),
                                    learners=names_text(tuple(LEARNERS)))


VBMixture.__doc__ = _learners_doc(VBMixture.__doc__ or "")

def load_model(run_dir: Any) -> VBMixture:
    """A fitted ``VBMixture`` from a run directory (its posterior verified against result.json;
    :func:`pipeline.runs.directory.load_fitted`), built with the run's settings."""
    from pipeline.runs.directory import load_fitted

    fitted = load_fitted(run_dir)
    params = VBMixture().get_params()
    model = VBMixture(**{k: v for k, v in fitted.get_params().items() if k in params})
    vars(model).update(fitted.attributes())
    return model
