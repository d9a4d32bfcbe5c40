"""Priors of the Bayesian Gaussian mixture and their validation.

Parameter names follow scikit-learn's ``BayesianGaussianMixture`` (Bishop 2006 ch. 10.2, Kuusela et al. 2009):

* weights: ``dirichlet_distribution`` -- ``pi ~ Dir(alpha0, ..., alpha0)``; ``dirichlet_process`` --
  truncated stick-breaking ``v_k ~ Beta(1, alpha0)``, ``pi_k = v_k prod_{l<k} (1 - v_l)``;
* means: ``mu_k | Lambda_k ~ N(m0, (beta0 Lambda_k)^-1)``;
* precisions, by ``covariance_type``:
  ``full``      ``Lambda_k ~ Wishart(W0, nu0)`` with ``W0^-1 = covariance_prior`` (D x D);
  ``tied``      as 'full', with one variational factor ``q(Lambda)`` shared by all components
                (scikit-learn's 'tied'; docs/algorithms.md derives its updates and ELBO);
  ``diag``      ``lambda_kd ~ Gamma(shape nu0/2, rate s0_d/2)``, ``s0 = covariance_prior`` (D,);
  ``spherical`` ``Lambda_k = lambda_k I``, ``lambda_k ~ Gamma(shape nu0 D/2, rate D s0/2)``, ``s0`` scalar;
  ``fixed``     ``Lambda_k = I / fixed_variance`` known (Watanabe & Watanabe 2005; Lim & Jiang 2024).

With these parametrisations the M-step of every family reduces to scikit-learn's update formulas,
while the E-step and the ELBO are the exact ones of the stated model (see docs/decisions.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vbcore.errors import ConfigError

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical", "fixed")
#: the families with a D x D Wishart precision
WISHART_TYPES = ("full", "tied")
WEIGHT_TYPES = ("dirichlet_distribution", "dirichlet_process")
#: the ways of filling unset hyper-parameters (:func:`default_prior`)
PRIOR_DEFAULTS = ("empirical", "sklearn", "bound")
#: ``nu0`` of the diagonal families under the 'empirical' defaults: ``EMPIRICAL_DOF_PER_DIM * D`` rows,
#: at most ``EMPIRICAL_DOF``, at the data's variance, whatever the number of rows (issue 51: before, 1%
#: of the rows); under the 'bound' defaults the start of ``nu0``, then re-estimated from the bound
#: (:func:`vbcore.model.empirical.best_strength`); docs/decisions.md "A prior whose weight does not
#: grow with the rows"; :func:`empirical_dof`
EMPIRICAL_DOF = 512.0
EMPIRICAL_DOF_PER_DIM = 4.0
#: the DP concentration under the 'empirical' defaults: one model for every truncation
EMPIRICAL_ALPHA = 1.0


def _positive(name: str, value: float) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = float("nan")
    if isinstance(value, bool) or not np.isfinite(out) or out <= 0:
        shown = value.item() if isinstance(value, np.generic) else value
        raise ConfigError(f"{name} must be a finite number > 0, got {shown!r}")
    return out


@dataclass(frozen=True)
class Prior:
    """Hyper-parameters of the mixture, validated.

    Attributes
    ----------
    covariance_type : {'full', 'tied', 'diag', 'spherical', 'fixed'}
    weight_type : {'dirichlet_distribution', 'dirichlet_process'}
    n_components : int
        ``K``, the number of components (the truncation level for the DP).
    weight_concentration : float
        ``alpha0``.
    mean_precision : float
        ``beta0``.
    mean : array of shape (n_features,)
        ``m0``.
    degrees_of_freedom : float
        ``nu0`` (unused for 'fixed').
    covariance : array of shape (D, D), (D,), () or None
        ``W0^-1`` (full, tied), ``s0`` per dimension (diag), ``s0`` (spherical); None for 'fixed'.
    fixed_variance : float or None
        ``sigma^2`` of the 'fixed' family.
    empirical : tuple of str
        The hyperparameters re-estimated from the bound between iterations (empirical Bayes,
        :mod:`vbcore.model.empirical`): a subset of
        ``('mean_precision', 'covariance', 'degrees_of_freedom')``;
        empty: all fixed. The 'empirical' defaults free ``mean_precision`` only: with the covariance prior
        free as well the bound has no maximum where a component has no spread in some dimension.
    """

    covariance_type: str
    weight_type: str
    n_components: int
    weight_concentration: float
    mean_precision: float
    mean: np.ndarray
    degrees_of_freedom: float
    covariance: np.ndarray | None
    fixed_variance: float | None = None
    empirical: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate_prior(self)

    @property
    def n_features(self) -> int:
        return int(self.mean.shape[0])


def validate_prior(p: Prior) -> None:
    """Raise :class:`ConfigError` naming the first invalid hyper-parameter."""
    if p.covariance_type not in COVARIANCE_TYPES:
        raise ConfigError(
            f"covariance_type must be one of {COVARIANCE_TYPES}, got {p.covariance_type!r}"
        )
    if p.weight_type not in WEIGHT_TYPES:
        raise ConfigError(
            f"weight_concentration_prior_type must be one of {WEIGHT_TYPES}, got {p.weight_type!r}"
        )
    if int(p.n_components) != p.n_components or p.n_components < 1:
        raise ConfigError(f"n_components must be an integer >= 1, got {p.n_components!r}")
    _positive("weight_concentration_prior", p.weight_concentration)
    bad = sorted(set(p.empirical) - {"mean_precision", "covariance", "degrees_of_freedom", "strength"})
    if bad:
        raise ConfigError("empirical hyperparameters must be among mean_precision, covariance, "
                          f"degrees_of_freedom, strength; got {bad}")
    _positive("mean_precision_prior", p.mean_precision)
    mean = np.asarray(p.mean)
    if mean.ndim != 1 or not np.all(np.isfinite(mean)):
        raise ConfigError(
            f"mean_prior must be a finite vector of shape (n_features,), got shape {mean.shape}"
        )
    d = mean.shape[0]
    if p.covariance_type == "fixed":
        if p.fixed_variance is None:
            raise ConfigError("covariance_type='fixed' needs fixed_variance (a number > 0)")
        _positive("fixed_variance", p.fixed_variance)
        return
    try:
        nu0 = float(p.degrees_of_freedom)
    except (TypeError, ValueError):
        raise ConfigError(
            f"degrees_of_freedom_prior must be a number, got {p.degrees_of_freedom!r}"
        ) from None
    if p.covariance_type in WISHART_TYPES:
        if not np.isfinite(nu0) or nu0 <= d - 1:
            raise ConfigError(  # scikit-learn's words first, so code matching them still matches
                f"The parameter 'degrees_of_freedom_prior' should be greater than {d - 1}, but got "
                f"{nu0:.3f}. (degrees_of_freedom_prior must be > n_features - 1 = {d - 1} for "
                f"{p.covariance_type!r})"
            )
    else:
        _positive("degrees_of_freedom_prior", nu0)
    cov = p.covariance
    if cov is None:
        raise ConfigError(f"covariance_prior is required for covariance_type={p.covariance_type!r}")
    cov = np.asarray(cov, dtype=float)
    expected = {"full": (d, d), "tied": (d, d), "diag": (d,), "spherical": ()}[p.covariance_type]
    if cov.shape != expected:
        raise ConfigError(
            f"covariance_prior must have shape {expected} for covariance_type="
            f"{p.covariance_type!r}, got {cov.shape}"
        )
    if not np.all(np.isfinite(cov)):
        raise ConfigError("covariance_prior contains non-finite values")
    if p.covariance_type in WISHART_TYPES:
        # rounding relative to the matrix's scale, not to each entry: the near-zero off-diagonal
        # entries of decorrelated (e.g. PCA-projected) features carry the rounding of the large ones
        if np.abs(cov - cov.T).max() > 1e-10 * np.abs(cov).max():
            raise ConfigError("covariance_prior must be symmetric")
        try:
            np.linalg.cholesky(cov)
        except np.linalg.LinAlgError:
            raise ConfigError(
                "covariance_prior must be positive definite (its Cholesky factorisation failed)"
            ) from None
    elif np.any(cov <= 0):
        bad = int(np.flatnonzero(np.atleast_1d(cov) <= 0)[0])
        raise ConfigError(f"covariance_prior must be > 0 everywhere; entry {bad} is not")


def empirical_dof(n_features: int | None = None) -> float:
    """The starting ``nu0`` of 'diag' and 'spherical' under the 'empirical' defaults in ``n_features``
    dimensions: ``EMPIRICAL_DOF_PER_DIM * n_features`` (at least 2), at most ``EMPIRICAL_DOF`` (that
    when ``n_features`` is unknown). It does not depend on the number of rows; the bound moves it."""
    if n_features is None:
        return float(EMPIRICAL_DOF)
    return float(min(EMPIRICAL_DOF, max(2.0, EMPIRICAL_DOF_PER_DIM * float(n_features))))


def _empirical_defaults(defaults: str, covariance_type: str, weight_type: str, d: int,
                        weight_concentration: float | None, mean_precision: float | None,
                        degrees_of_freedom: float | None, n_rows: float | None) -> tuple[tuple[str, ...],
                                                                                       float | None,
                                                                                       float | None, float]:
    """For :func:`default_prior`: the free hyperparameters, alpha0, nu0 and the covariance prior's scale
    under ``defaults`` (unset values stay None where scikit-learn's default follows)."""
    if defaults not in PRIOR_DEFAULTS:
        raise ConfigError(f"prior defaults must be one of {PRIOR_DEFAULTS}, got {defaults!r}")
    if defaults == "sklearn":
        return (), weight_concentration, degrees_of_freedom, 1.0
    # only beta0 is re-estimated: jointly with the covariance prior (and nu0) the bound has no maximum
    # where a component has no spread in some direction (vbcore/model/empirical.py; docs/decisions.md)
    free: tuple[str, ...] = ("mean_precision",) if mean_precision is None else ()
    if degrees_of_freedom is None:
        if covariance_type in WISHART_TYPES:
            degrees_of_freedom = float(d)
        else:
            degrees_of_freedom = empirical_dof(d)
            if covariance_type != "fixed" and defaults == "bound":  # nu0 the bound's (issue 51)
                free = (*free, "strength")
    if weight_concentration is None and weight_type == "dirichlet_process":
        weight_concentration = EMPIRICAL_ALPHA
    scale = float(degrees_of_freedom) if covariance_type != "fixed" else 1.0
    return free, weight_concentration, degrees_of_freedom, scale


def default_prior(
    *,
    covariance_type: str,
    weight_type: str,
    n_components: int,
    data_mean: np.ndarray,
    data_covariance: np.ndarray,
    weight_concentration: float | None = None,
    mean_precision: float | None = None,
    mean: np.ndarray | None = None,
    degrees_of_freedom: float | None = None,
    covariance: np.ndarray | float | None = None,
    fixed_variance: float | None = None,
    defaults: str = "sklearn",
    n_rows: float | None = None,
) -> Prior:
    """Fill unset hyper-parameters with data-dependent defaults.

    ``defaults='sklearn'``: scikit-learn's, ``alpha0 = 1/K``, ``beta0 = 1``, ``m0`` = data mean,
    ``nu0 = D``; ``covariance_prior`` = data covariance (full, tied), per-dimension variance (diag) or
    their mean (spherical). Where the data has a constant dimension the default would be singular, so
    variances are floored at ``1e-6`` times the mean variance (documented in docs/decisions.md).
    ``fixed_variance`` defaults to the mean per-dimension variance of the data.

    ``defaults='empirical'`` (the pipeline's): ``alpha0 = 1`` for the DP (the same model for every
    truncation; ``1/K`` stays for finite Dirichlet weights), ``nu0 =`` :func:`empirical_dof` (``4 D``,
    at most 512, whatever ``n_rows``) for the diagonal families (``D`` for the Wishart ones, which
    need ``nu0 > D - 1``), the covariance prior ``nu0`` times scikit-learn's (a prior variance equal
    to the data's), held, and ``beta0``, where unset, re-estimated from the bound between iterations
    (:attr:`Prior.empirical`, :mod:`vbcore.model.empirical`, which says why the covariance prior's
    scale is not). ``defaults='bound'``: the same, and the diagonal families' ``nu0`` (the prior
    variance held) re-estimated from the bound too. ``n_rows`` is accepted and not used: the prior's
    weight does not depend on the number of rows (issue 51).

    Parameters
    ----------
    data_mean : array of shape (n_features,)
    data_covariance : array of shape (n_features, n_features) or (n_features,)
        Full covariance, or only the per-dimension variances (enough for all but 'full' and 'tied').
    """
    data_mean = np.asarray(data_mean, dtype=float)
    data_cov = np.asarray(data_covariance, dtype=float)
    var = np.diag(data_cov) if data_cov.ndim == 2 else data_cov
    mean_var = float(np.mean(var)) if var.size else 1.0
    floor = 1e-6 * mean_var if mean_var > 0 else 1e-6
    d = data_mean.shape[0]
    free, weight_concentration, degrees_of_freedom, scale = _empirical_defaults(
        defaults, covariance_type, weight_type, d, weight_concentration, mean_precision, degrees_of_freedom,
        n_rows)
    if covariance is None and covariance_type != "fixed":
        if covariance_type in WISHART_TYPES:
            if data_cov.ndim != 2:
                raise ConfigError(f"a {covariance_type!r} covariance prior needs the full data covariance")
            covariance = scale * (0.5 * (data_cov + data_cov.T) + np.diag(np.maximum(floor - var, 0.0)))
            try:
                np.linalg.cholesky(covariance)
            except np.linalg.LinAlgError:
                raise ConfigError(
                    f"the covariance of the data (the default covariance_prior for {covariance_type!r}) is "
                    f"singular: too few rows for {d} features, or collinear features; pass "
                    "covariance_prior, or use covariance_type='diag'"
                ) from None
        elif covariance_type == "diag":
            covariance = scale * np.maximum(var, floor)
        else:
            covariance = scale * max(mean_var, floor)
    if covariance_type == "fixed" and fixed_variance is None:
        fixed_variance = max(mean_var, floor)
    return Prior(
        covariance_type=covariance_type,
        weight_type=weight_type,
        n_components=n_components,
        weight_concentration=1.0 / n_components if weight_concentration is None else weight_concentration,
        mean_precision=1.0 if mean_precision is None else mean_precision,
        mean=data_mean.copy() if mean is None else np.asarray(mean, dtype=float),
        degrees_of_freedom=float(d) if degrees_of_freedom is None else degrees_of_freedom,
        covariance=None if covariance is None else np.asarray(covariance, dtype=float),
        fixed_variance=None if fixed_variance is None else float(fixed_variance),
        empirical=free,
    )
