"""``VBMixture``: a scikit-learn compatible estimator over vbcore's VB EM.

Parameters mean what they mean in scikit-learn's ``BayesianGaussianMixture``; the additions are
``learner``, ``fixed_variance`` and ``chunk_rows``. The fitted attributes carry scikit-learn's names,
plus ``lower_bounds_`` (the exact ELBO after every iteration) and ``elbo_terms_``.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
from scipy.linalg import solve_triangular
from scipy.special import gammaln, logsumexp
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from pipeline.checkpoint import Checkpointer, RunLock, config_hash
from pipeline.engine import PERSIST_MODES, make_engine, split_rows
from pipeline.learners import LEARNERS, FitContext, learner_class, make_learner
from pipeline.learners.vbem import vbem_pass
from pipeline.sources import ArraySource, DaskArraySource, StoreSource, is_dask_array, is_store_path
from vbcore.elbo import ElboTerms, elbo_terms
from vbcore.errors import ConfigError, InputError
from vbcore.kernels import (
    Chunk,
    array_namespace,
    chunk_statistics,
    estep_params,
    prepare_chunk,
    responsibilities,
    to_numpy,
)
from vbcore.mstep import m_step
from vbcore.posterior import Posterior
from vbcore.priors import COVARIANCE_TYPES, WEIGHT_TYPES, Prior, default_prior
from vbcore.stats import SuffStats
from vbcore.validation import as_rows, check_finite

INIT_PARAMS = ("kmeans", "k-means++", "random", "random_from_data")


def check_array_2d(X: Any, name: str = "X") -> np.ndarray:
    """Validate data: dense, 2-D, numeric, at least one row and column, all finite.

    float32 stays float32; other numeric dtypes (and object arrays of numbers) become float64
    (:func:`vbcore.validation.as_rows`).
    """
    return as_rows(X, name)


class VBMixture(DensityMixin, BaseEstimator):
    """Variational Bayesian Gaussian mixture with the exact ELBO.

    Parameters
    ----------
    n_components : int, default=1
        Number of components ``K`` (the truncation level for the Dirichlet process).
    covariance_type : {'full', 'diag', 'spherical', 'fixed'}, default='full'
        'fixed' is a known isotropic variance ``fixed_variance`` with a Gaussian prior on the means.
    tol : float, default=1e-3
        Convergence threshold on the change of the ELBO *per sample* between iterations.
    reg_covar : float, default=1e-6
        Added to the diagonal of each component's sample covariance (scikit-learn's meaning).
    max_iter : int, default=100
    init_params : {'kmeans', 'k-means++', 'random', 'random_from_data'}, default='kmeans'
    weight_concentration_prior_type : {'dirichlet_process', 'dirichlet_distribution'}
    weight_concentration_prior, mean_precision_prior, mean_prior, degrees_of_freedom_prior,
    covariance_prior : priors, as in scikit-learn; None takes the data-dependent defaults.
    fixed_variance : float, optional
        ``sigma^2`` for covariance_type='fixed'; default: the mean per-dimension within-cluster
        variance of k-means with ``n_components`` clusters on (a sample of) X.
    learner : str, default='vbem'
        A registered learner (``pipeline.learners.LEARNERS``): 'vbem', and the others listed in
        docs/algorithms.md. ``set_params(learner=..., warm_start=True)`` switches learners and
        continues from the current posterior.
    learner_options : dict, optional
        Options of the learner (step sizes, minibatch size, ...); each learner lists its own with
        their defaults in ``LEARNERS[name].options``.
    chunk_rows : int, default=65536
        Rows per chunk for the map-reduce passes over in-memory arrays (stores and dask arrays
        keep their own chunking).
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
    """

    def __init__(
        self,
        n_components: int = 1,
        *,
        covariance_type: str = "full",
        tol: float = 1e-3,
        reg_covar: float = 1e-6,
        max_iter: int = 100,
        init_params: str = "kmeans",
        weight_concentration_prior_type: str = "dirichlet_process",
        weight_concentration_prior: float | None = None,
        mean_precision_prior: float | None = None,
        mean_prior: Any = None,
        degrees_of_freedom_prior: float | None = None,
        covariance_prior: Any = None,
        fixed_variance: float | None = None,
        learner: str = "vbem",
        learner_options: dict[str, Any] | None = None,
        chunk_rows: int = 65536,
        engine: Any = "local",
        persist: str = "auto",
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 10,
        checkpoint_seconds: float | None = None,
        checkpoint_keep: int = 3,
        random_state: Any = None,
        warm_start: bool = False,
        verbose: int = 0,
    ) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.init_params = init_params
        self.weight_concentration_prior_type = weight_concentration_prior_type
        self.weight_concentration_prior = weight_concentration_prior
        self.mean_precision_prior = mean_precision_prior
        self.mean_prior = mean_prior
        self.degrees_of_freedom_prior = degrees_of_freedom_prior
        self.covariance_prior = covariance_prior
        self.fixed_variance = fixed_variance
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

    # ---- validation ---------------------------------------------------------------------------
    @staticmethod
    def _integer(name: str, value: Any, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ConfigError(f"{name} must be an integer >= {minimum}, got {_show(value)}")
        return int(value)

    @staticmethod
    def _number(name: str, value: Any) -> float:
        try:
            out = float(value)
        except (TypeError, ValueError):
            out = float("nan")
        if isinstance(value, bool) or not np.isfinite(out) or out < 0:
            raise ConfigError(f"{name} must be a finite number >= 0, got {_show(value)}")
        return out

    def _check_settings(self) -> None:
        self._integer("n_components", self.n_components, 1)
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ConfigError(
                f"covariance_type must be one of {COVARIANCE_TYPES}, got {self.covariance_type!r}"
            )
        if self.weight_concentration_prior_type not in WEIGHT_TYPES:
            raise ConfigError(
                "weight_concentration_prior_type must be one of "
                f"{WEIGHT_TYPES}, got {self.weight_concentration_prior_type!r}"
            )
        if not isinstance(self.learner, str) or self.learner not in LEARNERS:
            raise ConfigError(f"learner must be one of {tuple(LEARNERS)}, got {self.learner!r}")
        if self.learner_options is not None and not isinstance(self.learner_options, dict):
            raise ConfigError(f"learner_options must be a dict, got {_show(self.learner_options)}")
        learner_class(self.learner).parse_options(self.learner_options or {})
        if self.init_params not in INIT_PARAMS:
            raise ConfigError(f"init_params must be one of {INIT_PARAMS}, got {self.init_params!r}")
        self._integer("max_iter", self.max_iter, 0)
        self._number("tol", self.tol)
        self._number("reg_covar", self.reg_covar)
        self._integer("chunk_rows", self.chunk_rows, 1)
        self._integer("checkpoint_every", self.checkpoint_every, 1)
        self._integer("checkpoint_keep", self.checkpoint_keep, 1)
        if self.checkpoint_seconds is not None:
            self._number("checkpoint_seconds", self.checkpoint_seconds)
        if self.persist not in PERSIST_MODES:
            raise ConfigError(f"persist must be one of {PERSIST_MODES}, got {self.persist!r}")

    # ---- fitting ------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None, resp_init: Any = None, *,
            callback: Callable[[dict[str, Any]], None] | None = None) -> VBMixture:
        """Fit with the chosen learner.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), dask array or feature-store path
        y : ignored
        resp_init : array of shape (n_samples, n_components), optional
            Initial responsibilities: the fit starts with one M-step from them, then runs up to
            ``max_iter`` iterations (so runs can be compared with another implementation).
        callback : callable, optional
            Called after every iteration with a dict: ``iteration``, ``elbo``, ``n_effective``
            (clusters alive), ``n_components`` (components kept), ``seconds`` (of that iteration),
            ``passes`` (engine passes so far) and ``learner``.
        """
        self._fit(X, resp_init, callback)
        return self

    def fit_predict(self, X: Any, y: Any = None, resp_init: Any = None) -> np.ndarray:
        self._fit(X, resp_init, None)
        return self.predict(X)

    def _source(self, X: Any) -> Any:
        """Wrap X as a row source: NumPy-like array, dask array, or feature-store path."""
        if is_store_path(X):
            return StoreSource(str(getattr(X, "path", X)))
        if is_dask_array(X):
            return DaskArraySource(X)
        return ArraySource(check_array_2d(X), int(self.chunk_rows))

    def _fit(self, X: Any, resp_init: Any, callback: Callable[[dict[str, Any]], None] | None) -> None:
        self._check_settings()
        if resp_init is not None and self.warm_start and hasattr(self, "posterior_"):
            raise ConfigError("pass either resp_init or warm_start=True with a fitted model, not both")
        source = self._source(X)
        n, d = source.n_rows, source.n_features
        ct = self.covariance_type
        warm = self.warm_start and hasattr(self, "posterior_")
        if warm:
            self._check_warm_start(d)
        lock = RunLock(self.checkpoint_dir).acquire() if self.checkpoint_dir is not None else None
        try:
            engine = make_engine(self.engine, self.persist)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        handles: list[Any] = []
        try:
            # One preparation for the whole fit: rows shifted by the first row (any point near the
            # data keeps float32 GEMMs accurate), [x*x, x] cached for the diagonal families unless
            # the learner says it does not use it (Learner.cache_squares).
            shift = np.asarray(source.load(0)[0], dtype=np.float64)
            squares = ct != "full" and bool(getattr(learner_class(self.learner), "cache_squares", True))
            handles = engine.prepare(source, prepare_chunk, shift, ct, squares,
                                     expansion=3.0 if squares else 1.0)
            if not isinstance(source, ArraySource):  # arrays were checked by check_array_2d
                engine.map(_check_kernel, handles, source.describe(),
                           per_chunk=[s.start for s in source.chunk_slices()])
            moments = engine.map_reduce(_moments_kernel, handles)
            fixed_variance = self.fixed_variance
            if ct == "fixed" and fixed_variance is None:
                # a learner may bring its own (cheaper) estimate (issue 6: seed 003 learners)
                estimate = getattr(learner_class(self.learner), "estimate_fixed_variance", None)
                fixed_variance = (
                    estimate(self._gathered_rows(engine, handles, source), int(self.n_components),
                             self.random_state) if estimate is not None
                    else self._default_fixed_variance(self._sample_rows(source)))
            prior = self._prior_from_moments(moments, d, fixed_variance)
            ckpt = None if self.checkpoint_dir is None else Checkpointer(self.checkpoint_dir,
                                                                         int(self.checkpoint_keep))
            identity = self._run_identity(source) if ckpt is not None else {}
            loaded = self._load_checkpoint(ckpt, identity) if ckpt is not None else None
            ctx = FitContext(engine=engine, handles=handles, source=source, prior=prior, shift=shift,
                             reg_covar=float(self.reg_covar), n_rows=n, n_features=d,
                             covariance_type=ct, weight_type=self.weight_concentration_prior_type,
                             seed=_seed_entropy(self.random_state),
                             chunk_starts=[sl.start for sl in source.chunk_slices()])
            learner = make_learner(self.learner, ctx, self.learner_options)
            history: list[float] = []
            terms: ElboTerms | None = None
            converged = False
            n_iter = 0
            try:
                if loaded is not None:
                    post = _posterior_from_state(loaded.state, ct, self.weight_concentration_prior_type)
                    history = [float(v) for v in loaded.manifest["elbo_history"]]
                    n_iter = int(loaded.manifest["iteration"])
                    converged = bool(loaded.manifest["converged"])
                    terms = (ElboTerms(**loaded.manifest["elbo_terms"]) if loaded.manifest["elbo_terms"]
                             else None)
                    learner.load_state(post, {k[len(_LEARNER_KEY):]: v for k, v in loaded.state.items()
                                              if k.startswith(_LEARNER_KEY)})
                else:
                    initialise = getattr(learner, "initialise", None)  # a learner's own init
                    if warm:
                        post = self.posterior_
                    elif initialise is not None and resp_init is None:
                        post = initialise()
                    else:
                        post = m_step(self._initial_stats(source, engine, handles, resp_init), prior,
                                      self.reg_covar)
                    learner.start(post)
                t0 = last_ckpt = t_iter = time.perf_counter()
                while not converged and n_iter < int(self.max_iter):
                    n_iter += 1
                    post, terms = learner.step(n_iter)
                    history.append(terms.total)
                    converged = learner.converged(history, float(self.tol))
                    now = time.perf_counter()
                    if self.verbose:
                        print(f"iter {n_iter:4d}  ELBO {terms.total:.6e}  per sample {terms.total / n:.6f}  "
                              f"K {post.n_components}  ({now - t0:.2f}s)")
                    if callback is not None:
                        callback({"iteration": n_iter, "elbo": terms.total,
                                  "n_effective": _n_effective(post, prior),
                                  "n_components": post.n_components, "seconds": now - t_iter,
                                  "passes": learner.passes, "learner": self.learner})
                    t_iter = now
                    due = (n_iter % int(self.checkpoint_every) == 0 or converged
                           or n_iter == int(self.max_iter))
                    if self.checkpoint_seconds is not None:
                        due = due or now - last_ckpt >= float(self.checkpoint_seconds)
                    if ckpt is not None and due:
                        state = _posterior_state(post)
                        state.update({_LEARNER_KEY + k: v for k, v in learner.state().items()})
                        ckpt.save(n_iter, state, dict(
                            identity, converged=converged, elbo_history=history, elbo_terms=asdict(terms)))
                        last_ckpt = time.perf_counter()
                if terms is None:  # max_iter == 0: the bound of the initial posterior needs one E-step
                    terms = elbo_terms(vbem_pass(ctx, post).stats, post, prior)
                self.n_passes_ = learner.passes
            finally:
                learner.close()
        finally:
            engine.release(handles)
            if engine is not self.engine:
                engine.close()
            if lock is not None:
                lock.release()
        self.prior_ = prior
        self._set_fitted(post, terms, history, converged, n_iter, n, d)

    #: settings that do not change the trajectory of a fit (a resumed run may change them)
    _RESUMABLE = frozenset({"verbose", "engine", "persist", "max_iter", "tol", "warm_start",
                            "checkpoint_dir", "checkpoint_every", "checkpoint_seconds",
                            "checkpoint_keep"})

    def _run_identity(self, source: Any) -> dict[str, Any]:
        """What a checkpoint must match: learner, settings, data fingerprint, seed."""
        settings = {k: _jsonable(v) for k, v in self.get_params().items() if k not in self._RESUMABLE}
        seed = self.random_state if isinstance(self.random_state, (int, np.integer)) else None
        return {
            "learner": self.learner,
            "settings": settings,
            "config_hash": config_hash(settings),
            "store_fingerprint": source_fingerprint(source),
            "rng": {"entropy": None if seed is None else int(seed),
                    "derivation": "numpy SeedSequence(entropy, spawn_key=(iteration,))"},
        }

    def _load_checkpoint(self, ckpt: Checkpointer, identity: dict[str, Any]) -> Any:
        loaded = ckpt.load_latest()
        if loaded is None:
            return None
        m = loaded.manifest
        if m.get("store_fingerprint") != identity["store_fingerprint"]:
            raise ConfigError(
                f"{loaded.path}: the data changed since this checkpoint was written (fingerprint "
                f"{str(m.get('store_fingerprint'))[:12]}... vs {identity['store_fingerprint'][:12]}...); "
                "use another checkpoint_dir to start a new run"
            )
        if m.get("config_hash") != identity["config_hash"] or m.get("learner") != identity["learner"]:
            old, new = m.get("settings", {}), identity["settings"]
            diff = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
                    if old.get(k) != new.get(k)]
            raise ConfigError(
                f"{loaded.path}: the settings differ from the checkpoint's ({'; '.join(diff) or 'learner'}); "
                "use the same settings to resume, or another checkpoint_dir to start a new run"
            )
        for path, reason in loaded.skipped:
            warnings.warn(f"skipped checkpoint {path.name}: {reason}; resuming from {loaded.path.name}",
                          stacklevel=3)
        self.resumed_from_ = str(loaded.path)
        self.skipped_checkpoints_ = [(str(p), r) for p, r in loaded.skipped]
        return loaded

    def _check_warm_start(self, d: int) -> None:
        post = self.posterior_
        changed = [
            f"{name} {old!r} -> {new!r}"
            for name, old, new in (
                ("n_features", post.n_features, d),
                ("covariance_type", post.covariance_type, self.covariance_type),
                ("n_components", post.n_components, int(self.n_components)),
                ("weight_concentration_prior_type", post.weight_type,
                 self.weight_concentration_prior_type),
            )
            if old != new
        ]
        if changed:
            raise ConfigError(
                "warm_start: the new data or settings do not match the fitted model ("
                + "; ".join(changed) + "); set warm_start=False to start over"
            )

    def _sample_rows(self, source: Any) -> np.ndarray:
        """Whole chunks picked at random (seeded) until ``max(10000, 20 K)`` rows: k-means input."""
        rng = check_random_state(self.random_state)
        target = max(10_000, 20 * int(self.n_components))
        slices = source.chunk_slices()
        if source.n_rows <= target:
            return np.concatenate([source.load(i) for i in range(len(slices))])
        picked, total = [], 0
        for i in rng.permutation(len(slices)):
            picked.append(int(i))
            total += slices[i].stop - slices[i].start
            if total >= target:
                break
        return np.concatenate([source.load(i) for i in sorted(picked)])

    def _gathered_rows(self, engine: Any, handles: list[Any], source: Any) -> np.ndarray:
        """Rows drawn uniformly (seeded) and gathered through the engine from the prepared chunks
        (shifted rows): the sample a learner's own ``sigma^2`` estimate reads (its
        ``sigma2_sample_rows``, else ``max(10000, 20 K)``)."""
        from pipeline.learners.dpm import draw_rows, gather_rows

        n = source.n_rows
        size = getattr(learner_class(self.learner), "sigma2_sample_rows",
                       max(10_000, 20 * int(self.n_components)))
        seq = np.random.SeedSequence(_seed_entropy(self.random_state), spawn_key=(0, 4))
        rng = np.random.default_rng(seq)
        rows = draw_rows(rng, n, int(size))
        bounds = np.asarray([*(sl.start for sl in source.chunk_slices()), n], dtype=np.int64)
        return gather_rows(engine, handles, bounds, rows)

    def _initial_stats(self, source: Any, engine: Any, handles: list[Any], resp_init: Any) -> SuffStats:
        n, k = source.n_rows, int(self.n_components)
        slices = source.chunk_slices()
        if resp_init is not None:
            r = self._check_resp_init(resp_init, n, k)
            return engine.map_reduce(_resp_stats_kernel, handles, per_chunk=[r[s] for s in slices])
        rng = check_random_state(self.random_state)
        if self.init_params == "random":
            seeds = np.random.SeedSequence(int(rng.randint(2**31 - 1))).spawn(len(slices))
            return engine.map_reduce(_random_stats_kernel, handles, k, per_chunk=seeds)
        sample = self._sample_rows(source).astype(np.float64)
        m = min(k, sample.shape[0])
        if self.init_params == "kmeans":
            from sklearn.cluster import KMeans

            centres = KMeans(n_clusters=m, n_init=1, random_state=rng).fit(sample).cluster_centers_
        elif self.init_params == "k-means++":
            from sklearn.cluster import kmeans_plusplus

            centres, _ = kmeans_plusplus(sample, m, random_state=rng)
        else:  # random_from_data
            centres = sample[rng.choice(sample.shape[0], size=m, replace=False)]
        return engine.map_reduce(_nearest_stats_kernel, handles, np.asarray(centres, dtype=np.float64), k)

    @staticmethod
    def _check_resp_init(resp_init: Any, n: int, k: int) -> np.ndarray:
        r = np.asarray(resp_init, dtype=np.float64)
        if r.shape != (n, k):
            raise InputError(
                f"resp_init must have shape (n_samples, n_components) = ({n}, {k}), got {r.shape}"
            )
        if not np.all(np.isfinite(r)) or np.any(r < 0):
            row = int(np.argwhere(~np.isfinite(r) | (r < 0))[0][0])
            raise InputError(f"resp_init must be finite and >= 0; row {row} is not")
        sums = r.sum(1)
        if not np.allclose(sums, 1.0, rtol=0, atol=1e-6):
            row = int(np.flatnonzero(~np.isclose(sums, 1.0, rtol=0, atol=1e-6))[0])
            raise InputError(f"resp_init rows must sum to 1; row {row} sums to {sums[row].item()}")
        return r

    def _default_fixed_variance(self, X: np.ndarray) -> float:
        """Mean per-dimension within-cluster variance of k-means with K clusters on (a sample of
        at most 20,000 rows of) X: the scale of one cluster, not of the whole data set."""
        from sklearn.cluster import KMeans

        rng = check_random_state(self.random_state)
        n, d = X.shape
        rows = np.sort(rng.choice(n, size=20_000, replace=False)) if n > 20_000 else np.arange(n)
        sample = X[rows].astype(np.float64)
        k = min(int(self.n_components), len(np.unique(sample, axis=0)))
        km = KMeans(n_clusters=k, n_init=1, random_state=rng).fit(sample)
        var = km.inertia_ / (len(sample) * d)
        if not var > 0:
            var = float(np.mean(sample.var(0))) or 1.0
        return float(var)

    def _prior_from_moments(self, moments: SuffStats, d: int, fixed_variance: float | None) -> Prior:
        n = max(moments.n_rows - 1, 1)
        mean = moments.raw_mean()[0]
        cov = moments.scatter[0] / n
        mean_prior = None if self.mean_prior is None else _float_array("mean_prior", self.mean_prior)
        if mean_prior is not None and mean_prior.shape != (d,):
            raise ConfigError(
                f"mean_prior must have shape (n_features,) = ({d},), got {mean_prior.shape}"
            )
        weight_concentration = self.weight_concentration_prior
        if weight_concentration is None:  # a learner's default, e.g. a0 = N (seed 003 Algorithm 1)
            default_wc = getattr(learner_class(self.learner), "default_weight_concentration", None)
            weight_concentration = None if default_wc is None else default_wc(moments.n_rows)
        return default_prior(
            covariance_type=self.covariance_type,
            weight_type=self.weight_concentration_prior_type,
            n_components=int(self.n_components),
            data_mean=mean,
            data_covariance=cov,
            weight_concentration=weight_concentration,
            mean_precision=self.mean_precision_prior,
            mean=mean_prior,
            degrees_of_freedom=self.degrees_of_freedom_prior,
            covariance=None if self.covariance_prior is None
            else _float_array("covariance_prior", self.covariance_prior),
            fixed_variance=fixed_variance,
        )

    def _set_fitted(self, post: Posterior, terms: ElboTerms, history: list[float],
                    converged: bool, n_iter: int, n: int, d: int) -> None:
        self.posterior_ = post
        self.n_features_in_ = d
        self.converged_ = converged
        self.n_iter_ = n_iter
        self.lower_bound_ = terms.total
        self.lower_bounds_ = np.asarray(history)
        self.elbo_terms_ = terms.as_dict()
        w = post.expected_weights()
        self.weights_ = w / w.sum()
        self.weight_concentration_ = (
            tuple(post.weight_concentration) if post.weight_type == "dirichlet_process"
            else post.weight_concentration
        )
        wc = post.weight_concentration
        self.counts_ = (wc[0] - 1.0) if post.weight_type == "dirichlet_process" else (
            wc - self.prior_.weight_concentration)
        self.n_effective_ = int(np.sum(self.counts_ >= 1.0))
        self.n_components_ = post.n_components  # components kept (DP learners prune, issue 6)
        self.mean_precision_ = post.mean_precision
        self.means_ = post.means
        self.degrees_of_freedom_ = post.degrees_of_freedom
        self.covariances_ = post.covariances
        self.precisions_cholesky_ = post.precisions_cholesky
        if post.covariance_type == "full":
            self.precisions_ = np.einsum("kij,klj->kil", post.precisions_cholesky,
                                         post.precisions_cholesky)
        else:
            self.precisions_ = post.precisions_cholesky**2
        if self.verbose:
            state = "converged" if converged else "did not converge"
            print(f"VB EM {state} after {n_iter} iterations; ELBO {terms.total:.6e}")

    # ---- prediction ---------------------------------------------------------------------------
    def _check_X(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "posterior_")
        X = check_array_2d(X)
        if X.shape[1] != self.n_features_in_:
            raise InputError(
                f"X has {X.shape[1]} features, but VBMixture is expecting {self.n_features_in_} "
                "features as input (the number it was fitted with)"
            )
        return X

    def predict_proba(self, X: Any) -> np.ndarray:
        """Responsibilities of the VB E-step (seed 000 eq. 35), shape (n_samples, n_components)."""
        X = self._check_X(X)
        shift = self.prior_.mean
        params = estep_params(self.posterior_, shift)
        out = []
        for c in split_rows(X, int(self.chunk_rows)):
            chunk = prepare_chunk(c, shift, self.posterior_.covariance_type)
            out.append(np.asarray(responsibilities(chunk, params), dtype=np.float64))
        resp = np.concatenate(out)
        k = int(self.n_components)
        if resp.shape[1] < k:  # pruned components have probability 0 (columns k >= n_components_)
            resp = np.concatenate((resp, np.zeros((resp.shape[0], k - resp.shape[1]))), axis=1)
        return resp

    def predict(self, X: Any) -> np.ndarray:
        return self.predict_proba(X).argmax(axis=1)

    def score_samples(self, X: Any) -> np.ndarray:
        """Log density of the posterior predictive (a mixture of Student-t), per sample."""
        X = self._check_X(X).astype(np.float64)
        return posterior_predictive_logpdf(X, self.posterior_, self.prior_)

    def score(self, X: Any, y: Any = None) -> float:
        return float(np.mean(self.score_samples(X)))


#: checkpoint keys of learner state (beyond the posterior) carry this prefix
_LEARNER_KEY = "learner."


def _seed_entropy(random_state: Any) -> int | None:
    """The integer seed of a fit (None for unseeded fits and RandomState instances)."""
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return int(random_state)
    return None


def _n_effective(post: Posterior, prior: Prior) -> int:
    """Components holding at least one sample's worth of responsibility."""
    wc = post.weight_concentration
    counts = (wc[0] - 1.0) if post.weight_type == "dirichlet_process" else wc - prior.weight_concentration
    return int(np.sum(counts >= 1.0))


def _posterior_state(post: Posterior) -> dict[str, np.ndarray]:
    state = {"weight_concentration": post.weight_concentration, "mean_precision": post.mean_precision,
             "means": post.means, "covariances": post.covariances}
    if post.degrees_of_freedom is not None:
        state["degrees_of_freedom"] = post.degrees_of_freedom
    return state


def _posterior_from_state(state: dict[str, np.ndarray], ct: str, wt: str) -> Posterior:
    return Posterior(ct, wt, state["weight_concentration"], state["mean_precision"], state["means"],
                     state.get("degrees_of_freedom"), state["covariances"])


def source_fingerprint(source: Any) -> str:
    """The store's fingerprint, or a sha256 of the rows (chunk by chunk) for arrays."""
    if hasattr(source, "fingerprint"):
        return str(source.fingerprint)
    h = hashlib.sha256(f"{source.n_rows}x{source.n_features}:{np.dtype(source.dtype)}".encode())
    for i in range(len(source.chunk_slices())):
        h.update(np.ascontiguousarray(source.load(i)).tobytes())
    return h.hexdigest()


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return repr(v)


def _show(value: Any) -> str:
    """A value for an error message: NumPy scalars as plain Python numbers."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _float_array(name: str, value: Any) -> np.ndarray:
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be numeric, got {_show(value)}") from None


# ---- kernels used by the estimator (module level so engines can ship them) --------------------
def _moments_kernel(chunk: Chunk) -> SuffStats:
    """Data mean and scatter (one component with r = 1)."""
    return chunk_statistics(chunk, _on_device(chunk, np.ones((chunk.n_rows, 1))))


def _check_kernel(chunk: Chunk, offset: int, where: str) -> None:
    """Reject non-finite rows of sources that were not validated on the driver (stores, dask)."""
    check_finite(to_numpy(chunk.x), where, first_row=offset,
                 hint="clean the data (vbcluster ingest rejects or drops such rows)")


def _on_device(chunk: Chunk, host: np.ndarray) -> Any:
    """Host responsibilities in the chunk's array namespace and dtype."""
    return array_namespace(chunk.x).asarray(host.astype(chunk.x.dtype))


def _resp_stats_kernel(chunk: Chunk, resp: np.ndarray) -> SuffStats:
    return chunk_statistics(chunk, _on_device(chunk, resp))


def _random_stats_kernel(chunk: Chunk, seed: np.random.SeedSequence, k: int) -> SuffStats:
    """Uniform random responsibilities, from a per-chunk seed (the same on every engine)."""
    r = np.random.default_rng(seed).uniform(size=(chunk.n_rows, k))
    return chunk_statistics(chunk, _on_device(chunk, r / r.sum(1, keepdims=True)))


def _nearest_stats_kernel(chunk: Chunk, centres: np.ndarray, k: int) -> SuffStats:
    """Hard responsibilities: each row to its nearest centre (k-means style initialisation)."""
    labels = np.argmin(_sq_dists(to_numpy(chunk.x), centres - chunk.shift), axis=1)
    r = np.zeros((chunk.n_rows, k))
    r[np.arange(chunk.n_rows), labels] = 1.0
    return chunk_statistics(chunk, _on_device(chunk, r))


def _sq_dists(X: np.ndarray, centres: np.ndarray) -> np.ndarray:
    x = X.astype(np.float64)
    return (x * x).sum(1)[:, None] - 2.0 * x @ centres.T + (centres * centres).sum(1)[None]


def _student_t_logpdf(X: np.ndarray, loc: np.ndarray, chol_prec: np.ndarray, dof: float,
                      full: bool) -> np.ndarray:
    """Multivariate t log density with precision ``U U^T`` (full) or diag ``U**2``."""
    d = X.shape[1]
    if full:
        y = (X - loc) @ chol_prec
        log_det = 2.0 * np.log(np.diag(chol_prec)).sum()
    else:
        y = (X - loc) * chol_prec
        log_det = 2.0 * np.log(chol_prec).sum()
    maha = np.sum(y * y, axis=1)
    return (gammaln(0.5 * (dof + d)) - gammaln(0.5 * dof) - 0.5 * d * np.log(dof * np.pi)
            + 0.5 * log_det - 0.5 * (dof + d) * np.log1p(maha / dof))


def _component_predictive(X: np.ndarray, ct: str, m: np.ndarray, beta: float, nu: float | None,
                          cov: Any) -> np.ndarray:
    """Posterior predictive log density of one component (Bishop eq. 10.81 and its Gamma analogues)."""
    d = X.shape[1]
    scale = (1.0 + beta) / beta
    if ct == "fixed":
        var = cov * scale
        return -0.5 * d * np.log(2 * np.pi * var) - 0.5 * np.sum((X - m) ** 2, axis=1) / var
    assert nu is not None
    if ct == "full":
        dof = nu + 1.0 - d
        # precision L = dof * beta / (1 + beta) * W, W = (nu cov)^-1
        sigma = np.asarray(cov) * nu * scale / dof
        chol = np.linalg.cholesky(sigma)
        u = solve_triangular(chol, np.eye(d), lower=True).T
        return _student_t_logpdf(X, m, u, dof, True)
    if ct == "diag":  # independent 1-D t's with nu dof, scale^2 = cov (1+beta)/beta
        s2 = np.asarray(cov) * scale
        z = (X - m) ** 2 / s2
        return np.sum(gammaln(0.5 * (nu + 1)) - gammaln(0.5 * nu) - 0.5 * np.log(nu * np.pi * s2)
                      - 0.5 * (nu + 1) * np.log1p(z / nu), axis=1)
    # spherical: one shared Gamma precision -> multivariate t with nu*D dof
    var_sph = float(cov) * scale
    return _student_t_logpdf(X, m, np.full(d, 1.0 / np.sqrt(var_sph)), nu * d, False)


def posterior_predictive_logpdf(X: np.ndarray, post: Posterior, prior: Prior) -> np.ndarray:
    """``ln p(x | data)`` under the variational posterior: ``sum_k E[pi_k] St_k(x)``.

    For the truncated DP the weights sum to less than one; the remaining mass belongs to the
    components beyond the truncation, whose posterior is the prior, so it takes the prior predictive.
    """
    ct = post.covariance_type
    w = post.expected_weights()
    nu = post.degrees_of_freedom
    cols = [np.log(w[k]) + _component_predictive(X, ct, post.means[k], post.mean_precision[k],
                                                  None if nu is None else nu[k], post.covariances[k])
            for k in range(post.n_components)]
    rest = 1.0 - w.sum()
    if post.weight_type == "dirichlet_process" and rest > 0:
        if ct == "fixed":
            cov0: Any = prior.fixed_variance
            nu0 = None
        else:
            nu0 = prior.degrees_of_freedom
            cov0 = np.asarray(prior.covariance) / nu0
        cols.append(np.log(rest) + _component_predictive(X, ct, prior.mean, prior.mean_precision,
                                                          nu0, cov0))
    return logsumexp(np.stack(cols, axis=1), axis=1)
