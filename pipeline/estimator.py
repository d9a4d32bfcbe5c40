"""``VBMixture``: a scikit-learn compatible estimator over vbcore's VB EM.

Parameters mean what they mean in scikit-learn's ``BayesianGaussianMixture``; the additions are
``learner``, ``fixed_variance`` and ``chunk_rows``. The fitted attributes carry scikit-learn's names,
plus ``lower_bounds_`` (the exact ELBO after every iteration) and ``elbo_terms_``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from scipy import sparse
from scipy.linalg import solve_triangular
from scipy.special import gammaln, logsumexp
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from pipeline.engine import LocalEngine, split_rows
from vbcore.elbo import ElboTerms, elbo_terms
from vbcore.errors import ConfigError, InputError, InputTypeError
from vbcore.kernels import (
    Chunk,
    KernelResult,
    chunk_statistics,
    estep_params,
    prepare_chunk,
    responsibilities,
    vbem_kernel,
)
from vbcore.mstep import m_step
from vbcore.posterior import Posterior
from vbcore.priors import COVARIANCE_TYPES, WEIGHT_TYPES, Prior, default_prior
from vbcore.stats import SuffStats

LEARNERS = ("vbem",)
INIT_PARAMS = ("kmeans", "k-means++", "random", "random_from_data")


def check_array_2d(X: Any, name: str = "X") -> np.ndarray:
    """Validate data: dense, 2-D, numeric, at least one row and column, all finite.

    float32 stays float32; other numeric dtypes (and object arrays of numbers) become float64.
    Messages keep scikit-learn's wording where it has one, so its tooling recognises them.
    """
    if sparse.issparse(X):
        raise InputError(
            f"{name} is a scipy sparse matrix; sparse input is not supported: pass X.toarray() "
            "(feature stores hold dense features)"
        )
    try:
        arr = np.asarray(X)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise InputError(f"{name} cannot be converted to an array: {exc}") from None
    if arr.dtype.kind == "c":
        raise InputError(f"Complex data not supported: {name} has dtype {arr.dtype}")
    if arr.dtype.kind == "O":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise InputTypeError(
                f"{name} must be numeric; its dtype object holds a non-number: {exc}"
            ) from None
    if arr.dtype.kind not in "biuf":
        raise InputError(f"{name} must be numeric, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise InputError(
            f"{name} must be 2-D (n_samples, n_features), got {arr.ndim}-D of shape {arr.shape}. "
            "Reshape your data: X.reshape(-1, 1) for a single feature, X.reshape(1, -1) for one row"
        )
    if arr.shape[0] < 1:
        raise InputError(
            f"{name} has n_samples=0: found array with 0 sample(s) (shape={arr.shape}) while a "
            "minimum of 1 is required."
        )
    if arr.shape[1] < 1:
        raise InputError(
            f"{name} has n_features=0: found array with 0 feature(s) (shape={arr.shape}) while a "
            "minimum of 1 is required."
        )
    arr = np.ascontiguousarray(arr, dtype=np.float32 if arr.dtype == np.float32 else np.float64)
    finite = np.isfinite(arr)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise InputError(
            f"{name} contains non-finite values (NaN or inf); the first is at row {row}, "
            f"column {col}: {arr[row, col].item()}"
        )
    return arr


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
    learner : {'vbem'}, default='vbem'
    chunk_rows : int, default=65536
        Rows per chunk for the map-reduce passes.
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
        chunk_rows: int = 65536,
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
        self.chunk_rows = chunk_rows
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
        if self.learner not in LEARNERS:
            raise ConfigError(f"learner must be one of {LEARNERS}, got {self.learner!r}")
        if self.init_params not in INIT_PARAMS:
            raise ConfigError(f"init_params must be one of {INIT_PARAMS}, got {self.init_params!r}")
        self._integer("max_iter", self.max_iter, 0)
        self._number("tol", self.tol)
        self._number("reg_covar", self.reg_covar)
        self._integer("chunk_rows", self.chunk_rows, 1)

    # ---- fitting ------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None, resp_init: Any = None) -> VBMixture:
        """Fit by VB EM.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored
        resp_init : array of shape (n_samples, n_components), optional
            Initial responsibilities: the fit starts with one M-step from them, then runs up to
            ``max_iter`` E/M iterations (so runs can be compared with another implementation).
        """
        self._fit(X, resp_init)
        return self

    def fit_predict(self, X: Any, y: Any = None, resp_init: Any = None) -> np.ndarray:
        self._fit(X, resp_init)
        return self.predict(X)

    def _fit(self, X: Any, resp_init: Any) -> None:
        self._check_settings()
        X = check_array_2d(X)
        n, d = X.shape
        if resp_init is not None and self.warm_start and hasattr(self, "posterior_"):
            raise ConfigError("pass either resp_init or warm_start=True with a fitted model, not both")
        self._engine = LocalEngine()
        raw_chunks = split_rows(X, int(self.chunk_rows))
        ct = self.covariance_type
        fixed_variance = self.fixed_variance
        if ct == "fixed" and fixed_variance is None:
            fixed_variance = self._default_fixed_variance(X)
        prior = self._prior_from_raw(raw_chunks, d, fixed_variance)
        shift = prior.mean.copy()
        chunks = [prepare_chunk(c, shift, ct) for c in raw_chunks]

        warm = self.warm_start and hasattr(self, "posterior_")
        if warm:
            if self.posterior_.n_features != d or self.posterior_.covariance_type != ct:
                raise ConfigError(
                    "warm_start: the new data or settings do not match the fitted model "
                    f"(n_features {self.posterior_.n_features} -> {d}, covariance_type "
                    f"{self.posterior_.covariance_type!r} -> {ct!r})"
                )
            post = self.posterior_
            changed = [
                f"{name} {old!r} -> {new!r}"
                for name, old, new in (
                    ("n_components", post.n_components, int(self.n_components)),
                    ("weight_concentration_prior_type", post.weight_type,
                     self.weight_concentration_prior_type),
                )
                if old != new
            ]
            if changed:
                raise ConfigError(
                    "warm_start: the settings changed since the last fit ("
                    + "; ".join(changed) + "); set warm_start=False to start over"
                )
        else:
            resp = self._initial_resp(X, resp_init, prior)
            stats = self._engine.map_reduce(
                _stats_kernel,
                [(c, resp[s]) for c, s in zip(chunks, _slices(n, self.chunk_rows), strict=True)],
            )
            post = m_step(stats, prior, self.reg_covar)

        history: list[float] = []
        terms: ElboTerms | None = None
        converged = False
        n_iter = 0
        t0 = time.perf_counter()
        for n_iter in range(1, int(self.max_iter) + 1):
            params = estep_params(post, shift)
            result: KernelResult = self._engine.map_reduce(vbem_kernel, chunks, params)
            post = m_step(result.stats, prior, self.reg_covar)
            terms = elbo_terms(result.stats, post, prior)
            history.append(terms.total)
            if self.verbose:
                print(
                    f"iter {n_iter:4d}  ELBO {terms.total:.6e}  per sample {terms.total / n:.6f}  "
                    f"({time.perf_counter() - t0:.2f}s)"
                )
            if len(history) > 1 and abs(history[-1] - history[-2]) / n < self.tol:
                converged = True
                break
        if terms is None:  # max_iter == 0: the bound of the initial posterior needs one E-step
            params = estep_params(post, shift)
            result = self._engine.map_reduce(vbem_kernel, chunks, params)
            terms = elbo_terms(result.stats, post, prior)
        self.prior_ = prior
        self._set_fitted(post, terms, history, converged, n_iter, n, d)

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

    def _prior_from_raw(self, raw_chunks: list[np.ndarray], d: int,
                        fixed_variance: float | None) -> Prior:
        ct = self.covariance_type
        kind = "full" if (ct == "full" and self.covariance_prior is None) else "diag"
        # shift the moment pass by the first row to avoid cancellation on offset data
        first = np.asarray(raw_chunks[0][0], dtype=np.float64)
        chunks = [prepare_chunk(c, first, kind) for c in raw_chunks]
        stats = self._engine.map_reduce(_moments_kernel, chunks)
        n = max(stats.n_rows - 1, 1)
        mean = stats.raw_mean()[0]
        cov = stats.scatter[0] / n
        mean_prior = None if self.mean_prior is None else _float_array("mean_prior", self.mean_prior)
        if mean_prior is not None and mean_prior.shape != (d,):
            raise ConfigError(
                f"mean_prior must have shape (n_features,) = ({d},), got {mean_prior.shape}"
            )
        return default_prior(
            covariance_type=ct,
            weight_type=self.weight_concentration_prior_type,
            n_components=int(self.n_components),
            data_mean=mean,
            data_covariance=cov,
            weight_concentration=self.weight_concentration_prior,
            mean_precision=self.mean_precision_prior,
            mean=mean_prior,
            degrees_of_freedom=self.degrees_of_freedom_prior,
            covariance=None if self.covariance_prior is None
            else _float_array("covariance_prior", self.covariance_prior),
            fixed_variance=fixed_variance,
        )

    def _initial_resp(self, X: np.ndarray, resp_init: Any, prior: Prior) -> np.ndarray:
        n, k = X.shape[0], int(self.n_components)
        if resp_init is not None:
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
        rng = check_random_state(self.random_state)
        if self.init_params in ("kmeans", "k-means++", "random_from_data"):
            if self.init_params == "kmeans":
                from sklearn.cluster import KMeans

                labels = KMeans(n_clusters=min(k, n), n_init=1, random_state=rng).fit(X).labels_
            else:
                if self.init_params == "k-means++":
                    from sklearn.cluster import kmeans_plusplus

                    _, idx = kmeans_plusplus(X, min(k, n), random_state=rng)
                else:
                    idx = rng.choice(n, size=min(k, n), replace=False)
                centres = X[idx].astype(np.float64)
                labels = np.argmin(_sq_dists(X, centres), axis=1)
            r = np.zeros((n, k))
            r[np.arange(n), labels] = 1.0
            return r
        r = rng.uniform(size=(n, k))
        return r / r.sum(1, keepdims=True)

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
        return np.concatenate(out)

    def predict(self, X: Any) -> np.ndarray:
        return self.predict_proba(X).argmax(axis=1)

    def score_samples(self, X: Any) -> np.ndarray:
        """Log density of the posterior predictive (a mixture of Student-t), per sample."""
        X = self._check_X(X).astype(np.float64)
        return posterior_predictive_logpdf(X, self.posterior_, self.prior_)

    def score(self, X: Any, y: Any = None) -> float:
        return float(np.mean(self.score_samples(X)))


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
    xp_ones = np.ones((chunk.n_rows, 1), dtype=chunk.x.dtype)
    return chunk_statistics(chunk, xp_ones)


def _stats_kernel(item: tuple[Chunk, np.ndarray]) -> SuffStats:
    chunk, resp = item
    return chunk_statistics(chunk, resp.astype(chunk.x.dtype))


def _slices(n: int, chunk_rows: int) -> list[slice]:
    from pipeline.engine import row_slices

    return list(row_slices(n, int(chunk_rows)))


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
