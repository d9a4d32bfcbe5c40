"""The fit specification: every fit setting, its type, its default and its constraints, in one place.

:class:`FitSpec` is the only place that names a fit setting. ``VBMixture``, ``vbcluster fit`` /
``resume``, :func:`pipeline.service.fit_run`, ``cluster_flow``, ``refresh_flow`` and ``vbcluster
deploy`` all build one; none keeps defaults of its own. Each field carries its metadata: help text,
the ``VBMixture`` parameter it maps to (with scikit-learn's default where the estimator keeps
scikit-learn's), allowed values, lower bound, and whether it belongs to a run's identity (settings a
resumed run must keep; ``"when set"``: only away from its default, so checkpoints written before the
setting existed still resume).

Resolving a spec (:meth:`FitSpec.resolved`) applies what the learner declares (its default
covariance type; :class:`pipeline.fit.learners.base.Learner`) and validates everything -- types, ranges,
the learner's options, the covariance and weight types it supports -- before any data pass and
before any file is written. The JSON round trip is ``run.json``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

import numpy as np

from pipeline.store import CHUNK_ROWS
from vbcore.data.normalize import NORMALIZATIONS
from vbcore.errors import ConfigError
from vbcore.model.priors import COVARIANCE_TYPES, PRIOR_DEFAULTS, WEIGHT_TYPES

#: accepted spellings of the weight priors (run.json, the CLI) -> scikit-learn's names
WEIGHT_ALIASES = {"dp": "dirichlet_process", "dirichlet": "dirichlet_distribution"}
INIT_METHODS = ("kmeans", "k-means++", "random", "random_from_data", "k-means++-projected")
PERSIST_MODES = ("auto", "always", "never")
#: how the projection (pca) is computed: pipeline.fit.projection.projection_pass
PCA_SOLVERS = ("exact", "randomized")
#: what model selection may choose (pipeline.fit.select): 'auto' resolves to the parts left unset
SELECT_PARTS = ("none", "auto", "covariance", "priors", "covariance+priors")
#: the faces a spec is resolved for: their defaults differ only where the estimator keeps scikit-learn's
FACES = ("pipeline", "estimator")
#: settings whose command-line default depends on the store (pipeline.service.make_spec): their help
#: states it
STORE_DEFAULTS = ("select",)
_SAME = object()


def _s(default: Any, help: str, kind: str, *, estimator: str | None = None, sklearn: Any = _SAME,
       choices: tuple[str, ...] | None = None, minimum: float | None = None, above: bool = False,
       nullable: bool = False, identity: bool | str = True, flag: str | None = None) -> Any:
    """A spec field with its metadata (see the module docstring)."""
    meta = dict(help=help, kind=kind, estimator=estimator, sklearn=sklearn, choices=choices,
                minimum=minimum, above=above, nullable=nullable or default is None, identity=identity,
                flag=flag)
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class FitSpec:
    """One fit: the data and every setting (see the module docstring; ``vbcluster fit --help``)."""

    store: str | None = _s(None, "The feature store (None for in-memory data).", "str", identity=False)
    learner: str = _s("vbem", "The learner (`vbcluster learners` lists them).", "learner",
                      estimator="learner")
    components: int = _s(50, "K: number of components (the starting truncation of the Dirichlet process, "
                         "which the learners that grow (`vbcluster learners`) grow while the fit uses "
                         "nearly all of it; --no-grow, grow=False in VBMixture, keeps it).",
                         "int", estimator="n_components", sklearn=1, minimum=1, flag="--components/-k")
    grow: bool = _s(True, "Grow the truncation (the learners that grow, `vbcluster learners`; DP weights) "
                    "while the fit ends with nearly every component in use, up to max_components.", "bool",
                    estimator="grow", sklearn=False,
                    flag="--no-grow")
    max_components: int | None = _s(None, "Upper limit of the truncation when it grows; default: "
                                    "max(4 K, 1024), at most the number of rows.", "int",
                                    estimator="max_components", minimum=1)
    covariance: str | None = _s(None, "full | diag | spherical | fixed | tied | lowrank; default: the "
                                "learner's (fixed for the point family; diag, or scikit-learn's full in "
                                "VBMixture). lowrank: a mixture of factor analysers of rank --rank (vbem, "
                                "`vbcluster fit`).",
                                "str", estimator="covariance_type", choices=(*COVARIANCE_TYPES, "lowrank"))
    rank: int = _s(4, "With --covariance lowrank: the factors per component (loadings D x rank beside "
                   "the shared diagonal noise).", "int", minimum=0, identity="when set", flag="--rank")
    weights: str = _s("dirichlet_process", "dp (truncated Dirichlet process) | dirichlet (finite).",
                      "str", estimator="weight_concentration_prior_type", choices=WEIGHT_TYPES)
    max_iter: int = _s(200, "Maximum iterations.", "int", estimator="max_iter", sklearn=100, minimum=0,
                       identity=False)
    tol: float = _s(1e-4, "Convergence threshold on the ELBO change per row.", "float", estimator="tol",
                    sklearn=1e-3, minimum=0, identity=False)
    seed: int | None = _s(0, "Random seed (drives every random draw of the fit).", "int",
                          estimator="random_state", sklearn=None, minimum=0, nullable=True)
    init: str = _s("k-means++-projected", "k-means++-projected (seeds among sample rows, nearest seed "
                   "in a 256-dimensional projection; no Lloyd iterations) | kmeans | k-means++ | random | "
                   "random_from_data.", "str", estimator="init_params", sklearn="kmeans",
                   choices=INIT_METHODS)
    n_init: int = _s(1, "Restarts; the one with the best ELBO is kept.", "int", estimator="n_init",
                     minimum=1)
    reg_covar: float = _s(1e-6, "Added to the diagonal of each component's sample covariance.", "float",
                          estimator="reg_covar", minimum=0)
    pca: int | None = _s(None, "Project the rows onto their P leading principal components first (one "
                         "pass over the data; saved with the run, applied by predict and assign). Where "
                         "classes have many more rows than P^2/2 pair it with --covariance full (diag "
                         "keeps far more clusters there; docs/guide.md).", "int",
                         estimator="pca", minimum=1, flag="--pca", identity="when set")
    whiten: bool = _s(False, "With --pca: scale every principal component to unit variance.", "bool",
                      estimator="whiten", identity="when set")
    pca_solver: str = _s("exact", "With --pca: exact (the D x D covariance in one pass, N D^2 flops) | "
                         "randomized (three passes of subspace iteration on P + 32 vectors, 12 N D (P + 32) "
                         "flops, the store read once where it fits in memory; about 99% of the exact "
                         "components' variance; docs/guide.md).", "str", estimator="pca_solver",
                         choices=PCA_SOLVERS, identity="when set")
    normalize: str = _s("none", "Rows normalised before --pca projects them: l2 (unit length) | power-l2 "
                        "(sign(x)|x|^0.5, then unit length) | none; saved with the projection, so assign "
                        "and refreshes apply it. The wide non-negative default (off; pipeline.fit.wide, "
                        "docs/guide.md) sets power-l2.", "str",
                        choices=NORMALIZATIONS, identity="when set", flag="--normalize")
    learner_options: dict[str, Any] = _s({}, "Learner options KEY=VALUE (`vbcluster learners`).",
                                         "options", estimator="learner_options", sklearn=None)
    weight_concentration_prior: float | None = _s(
        None, "Weight concentration (DP alpha / Dirichlet); default 1 for the DP with priors=empirical, "
        "else 1/K (a0 = N for the point family).",
        "float", estimator="weight_concentration_prior", minimum=0, above=True)
    mean_precision_prior: float | None = _s(None, "Precision of the means' prior; default 1 (sklearn), "
                                            "re-estimated from the bound (empirical).", "float",
                                            estimator="mean_precision_prior", minimum=0, above=True)
    mean_prior: Any = _s(None, "Mean of the means' prior, shape (D,); default: the data mean.", "array",
                         estimator="mean_prior")
    degrees_of_freedom_prior: float | None = _s(None, "Degrees of freedom nu0 of the precisions' prior; "
                                                "default for diag and spherical with priors=empirical: "
                                                "4 D, at most 512 (bound: re-estimated), else D "
                                                "(checked against D with the prior).", "prior",
                                                estimator="degrees_of_freedom_prior")
    covariance_prior: Any = _s(None, "Covariance prior; default: the data covariance (sklearn), nu0 "
                               "times it (empirical; held: a prior variance equal to the data's).", "array",
                               estimator="covariance_prior")
    priors: str | None = _s(None, "How unset priors are filled (default empirical; see select): "
                            "empirical (alpha0 = 1 for the DP, a prior variance equal to the data's "
                            "weighing nu0 = 4 D rows, at most 512, whatever the number of rows, beta0 "
                            "re-estimated from the bound between iterations) | bound (the same, and nu0 "
                            "of diag and spherical re-estimated from the bound, at least 1) | sklearn "
                            "(scikit-learn's: alpha0 = 1/K, nu0 = D, fixed).",
                     "str", estimator="prior_defaults", sklearn="sklearn", choices=PRIOR_DEFAULTS)
    select: str = _s("none", "Model selection by the exact bound (issue 51): auto screens the covariance "
                     "families (diag, spherical; full and tied up to 256 dimensions; lowrank of rank 2 and 8 "
                     "below D; without --pca also full on 64 whitened principal components, scored on "
                     "the original rows; above 256 dimensions all but lowrank within one whitened space: "
                     "--select-pca) and the "
                     "priors (empirical, bound, sklearn) that --covariance / --priors leave unset on a "
                     "seeded subsample, at a resolution of 0.03 times the rows' spread, fits the best "
                     "in full and records every candidate's bound; none | "
                     "auto | covariance | priors | covariance+priors. Default: auto (without the "
                     "low-rank candidates, --select-lowrank) on stores of at most 256 dimensions where "
                     "no --covariance, --priors or --pca and no learner but vbem is given, else none "
                     "(VBMixture: none).", "str", choices=SELECT_PARTS,
                     identity="when set")
    select_fits: int = _s(1, "With select: how many of the best screened candidates are fitted to all "
                          "rows (the highest full bound is kept).", "int", minimum=1, identity="when set")
    select_pca: int = _s(64, "With select on a store of more than 256 dimensions whose covariance is "
                         "selected and no --pca is given: every candidate (diag, full, tied, spherical) is "
                         "fitted and compared within one space, the rows' P leading principal components "
                         "whitened, by the bound of the projected rows (the fitted model keeps that "
                         "projection); 0: on the rows themselves (diag and spherical, and full on pca 64 "
                         "whitened scored on the original rows).", "int", minimum=0, identity="when set")
    select_lowrank: bool = _s(True, "With select: screen the low-rank family (ranks 2 and 8) among the "
                              "candidates (true | false). A fit that leaves --select unset on a store of at "
                              "most 256 dimensions selects without it (on the battery it never won and "
                              "doubled the screen; a lowrank run has no warm start: docs/decisions.md); "
                              "--select auto keeps it.", "bool",
                              identity="when set", flag="--select-lowrank")
    fixed_variance: float | None = _s(None, "sigma^2 of covariance 'fixed'; default: estimated.", "float",
                                      estimator="fixed_variance", minimum=0, above=True)
    chunk_rows: int = _s(CHUNK_ROWS, "Rows per chunk for in-memory arrays (stores keep their chunking).",
                         "int", estimator="chunk_rows", minimum=1)
    cluster: str | None = _s(None, "A cluster config (cluster_config/*.yaml) or scheduler address; "
                             "default: in-process.", "str", identity=False)
    persist: str = _s("auto", "Keep prepared chunks in (worker) memory: auto | always | never.", "str",
                      estimator="persist", choices=PERSIST_MODES, identity=False)
    checkpoint_every: int = _s(10, "Iterations between checkpoints.", "int", estimator="checkpoint_every",
                               minimum=1, identity=False)
    checkpoint_seconds: float | None = _s(None, "Also checkpoint after this many seconds.", "float",
                                          estimator="checkpoint_seconds", minimum=0, identity=False)
    keep: int = _s(3, "Checkpoints kept.", "int", estimator="checkpoint_keep", minimum=1, identity=False)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str = "fit settings") -> FitSpec:
        """A spec from ``run.json``-style values (unknown keys are an error naming them)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            hints = [difflib.get_close_matches(u, sorted(known), n=1) for u in unknown]
            hint = "; ".join(f"{u!r}: did you mean {h[0]!r}?" for u, h in zip(unknown, hints, strict=True)
                             if h)
            raise ConfigError(f"{where}: unknown setting(s) {', '.join(map(repr, unknown))}"
                              + (f" ({hint})" if hint else "") + f"; known: {', '.join(sorted(known))}")
        vals = {k: v for k, v in values.items() if v is not None or _meta(k)["nullable"]}
        if vals.get("learner_options") is None:
            vals.pop("learner_options", None)
        return cls(**vals)

    @classmethod
    def from_estimator(cls, params: Mapping[str, Any], store: str | None = None) -> FitSpec:
        """A spec from ``VBMixture.get_params()`` (RandomState seeds become None)."""
        values: dict[str, Any] = {"store": store}
        for f in fields(cls):
            name = f.metadata["estimator"]
            if name is not None and name in params:
                values[f.name] = params[name]
        seed = values.get("seed")
        if not (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)):
            values["seed"] = None if seed is None or hasattr(seed, "randint") else seed
        values["learner_options"] = dict(values.get("learner_options") or {})
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (``run.json``)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}

    def estimator_params(self) -> dict[str, Any]:
        """``VBMixture`` keyword arguments for this spec."""
        out = {f.metadata["estimator"]: getattr(self, f.name) for f in fields(self)
               if f.metadata["estimator"] is not None}
        out["learner_options"] = dict(self.learner_options) or None
        return out

    def identity(self) -> dict[str, Any]:
        """The settings a resumed run must keep (its checkpoints were written under them)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self) if f.metadata["identity"]
                and not (f.metadata["identity"] == "when set" and getattr(self, f.name) == f.default)}

    def differences(self, other: FitSpec) -> list[str]:
        """``name old -> new`` for every identity setting that differs."""
        a, b = self.identity(), other.identity()
        names = [f.name for f in fields(self) if f.name in a or f.name in b]
        return [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in names if a.get(k) != b.get(k)]

    # ---- resolution and validation ------------------------------------------------------------
    def resolved(self, face: str = "pipeline") -> FitSpec:
        """This spec with the learner's declared defaults applied, validated completely.

        Raises ConfigError (one line naming the setting) for anything invalid; reads no data."""
        from pipeline.fit.learners import learner_class

        if face not in FACES:
            raise ValueError(f"face must be one of {FACES}")
        spec = self._checked_values(face)
        cls = learner_class(spec.learner)
        changes: dict[str, Any] = {}
        if spec.covariance is None:
            face_default = "full" if face == "estimator" else "diag"
            changes["covariance"] = cls.default_covariance or face_default
            if changes["covariance"] not in cls.covariance_types:
                changes["covariance"] = cls.covariance_types[0]
        unset = spec.covariance is None or spec.priors is None
        if spec.select == "auto" or (spec.select != "none" and unset):
            # what is given by hand is not selected (a resolved spec keeps its parts: both given)
            asked = ("covariance", "priors") if spec.select == "auto" else spec.select.split("+")
            free = [name for name in asked if getattr(spec, name) is None]
            changes["select"] = "+".join(free) if free else "none"
        if spec.priors is None:
            changes["priors"] = "sklearn" if face == "estimator" else "empirical"
        changes["weights"] = WEIGHT_ALIASES.get(spec.weights, spec.weights)
        changes["learner_options"] = cls.parse_options(spec.learner_options)
        if spec.whiten and spec.pca is None:
            raise ConfigError(f"{_where('whiten', face)} needs {_where('pca', face)}: whitening scales "
                              "the principal components")
        selected = changes.get("select", spec.select)
        if spec.normalize != "none" and spec.pca is None and "covariance" not in selected:
            raise ConfigError(f"{_where('normalize', face)} needs {_where('pca', face)} (the fit normalises "
                              "the rows before projecting them), or normalise the store at ingest")
        if spec.pca_solver != "exact" and spec.pca is None:
            raise ConfigError(f"{_where('pca_solver', face)} needs {_where('pca', face)}: it computes the "
                              "principal components")
        spec = replace(spec, **changes)
        if spec.covariance == "lowrank":
            _check_lowrank(spec, face)
        else:
            cls.check_spec(spec)
        return spec

    def _checked_values(self, face: str) -> FitSpec:
        """Every field against its metadata; aliases resolved; learner name known."""
        from pipeline.fit.learners import LEARNERS

        changes: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            new = check_value(f.name, value, face)
            if new is not value:
                changes[f.name] = new
        spec = replace(self, **changes) if changes else self
        if spec.learner not in LEARNERS:
            close = difflib.get_close_matches(str(spec.learner), list(LEARNERS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown learner {spec.learner!r}{hint} (known: {', '.join(LEARNERS)})")
        return spec


def _check_lowrank(spec: FitSpec, face: str) -> None:
    """What the low-rank family (:mod:`pipeline.fit.lowrank`) fits today: VB EM, `vbcluster fit`, no
    projection and no warm start (ConfigError naming the setting)."""
    if face == "estimator":
        raise ConfigError("covariance_type='lowrank' is fitted by `vbcluster fit --covariance lowrank` only "
                          "(VBMixture does not offer it yet)")
    if spec.learner != "vbem":
        raise ConfigError(f"learner {spec.learner!r} fits covariance 'full', 'diag', ...: the lowrank family "
                          "is fitted by vbem (--learner vbem)")
    if spec.pca is not None:
        raise ConfigError("--covariance lowrank models the rows themselves: drop --pca (its loadings are "
                          "the projection)")
    if spec.n_init != 1:
        raise ConfigError("--covariance lowrank fits one start: drop --n-init")


def _meta(name: str) -> Mapping[str, Any]:
    return {f.name: f.metadata for f in fields(FitSpec)}[name]


def setting_help(name: str, face: str = "pipeline") -> str:
    """The help text of a setting with its default (for CLI options and docs)."""
    meta = _meta(name)
    default = {f.name: f for f in fields(FitSpec)}[name]
    value = default.default if default.default is not MISSING else {}
    if face == "estimator" and meta["sklearn"] is not _SAME:
        value = meta["sklearn"]
    if name in STORE_DEFAULTS:  # the help says it
        return str(meta["help"])
    return meta["help"] if value in (None, {}) else f"{meta['help']} (default: {value})"


def defaults(face: str = "pipeline") -> dict[str, Any]:
    """Every setting's default for ``face`` (the estimator keeps scikit-learn's where it has one)."""
    out: dict[str, Any] = {}
    for f in fields(FitSpec):
        value = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc,operator]
        if face == "estimator" and f.metadata["sklearn"] is not _SAME:
            value = f.metadata["sklearn"]
        out[f.name] = value
    if out["priors"] is None:  # unset: the pipeline's 'empirical' (FitSpec.resolved), or selected
        out["priors"] = "empirical"
    return out


def estimator_params(face: str = "pipeline") -> dict[str, Any]:
    """``VBMixture`` parameters giving ``face``'s defaults where they differ from the estimator's:
    ``VBMixture(K, covariance_type=..., **estimator_params())`` is the model ``vbcluster fit -k K``
    fits (its priors, growth, start, iterations, tolerance and seed). ``n_components``,
    ``covariance_type`` (resolved per learner) and ``learner_options`` (the same on both faces) are
    left to the caller."""
    if face not in FACES:
        raise ValueError(f"face must be one of {FACES}")
    mine, est = defaults(face), defaults("estimator")
    skip = ("components", "covariance", "learner_options")
    return {str(_meta(n)["estimator"]): v for n, v in mine.items()
            if n not in skip and _meta(n)["estimator"] and v != est[n]}


def _where(name: str, face: str = "pipeline") -> str:
    """How the user named a setting: the estimator's parameter, or the setting and its flag."""
    meta = _meta(name)
    if face == "estimator" and meta["estimator"]:
        return str(meta["estimator"])
    return f"{name} ({meta['flag'] or '--' + name.replace('_', '-')})"


def check_value(name: str, value: Any, face: str = "pipeline") -> Any:
    """``value`` for setting ``name``, checked; strings from a command line are converted, except
    for the estimator (``face='estimator'``), whose parameters are typed as in scikit-learn."""
    meta = _meta(name)
    where = _where(name, face)
    kind = meta["kind"]
    if value is None:
        if meta["nullable"]:
            return None
        raise ConfigError(f"{where} must be set")
    if kind in ("str", "learner"):
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {show(value)}")
        if name == "weights":
            value = WEIGHT_ALIASES.get(value, value)
        if meta["choices"] is not None and value not in meta["choices"]:
            close = difflib.get_close_matches(value, list(meta["choices"]), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where} must be one of {', '.join(meta['choices'])}, got {value!r}"
                              f"{hint}")
        return value
    if kind == "options":
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a mapping of KEY=VALUE, got {show(value)}")
        return dict(value)
    if kind in ("array", "prior"):  # shapes and ranges depend on the data: checked with the prior
        try:
            np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be numeric, got {show(value)}") from None
        return value
    if face == "estimator" and isinstance(value, str) and kind != "bool":
        raise ConfigError(f"{where} must be {'an integer' if kind == 'int' else 'a number'}, got {value!r}")
    number = coerce(kind, value, where)
    low = meta["minimum"]
    if low is not None and (number < low or (meta["above"] and number <= low)):
        rel = ">" if meta["above"] else ">="
        raise ConfigError(f"{where} must be {'an integer' if kind == 'int' else 'a number'} "
                          f"{rel} {low:g}, got {show(value)}")
    return number


def coerce(kind: str, value: Any, where: str) -> Any:
    """The one option coercer: ``value`` as a bool, int, float or str (command-line strings too).

    Booleans accept true/false, yes/no, on/off, 1/0 (any case)."""
    if kind == "bool":
        words = {"true": True, "yes": True, "on": True, "1": True,
                 "false": False, "no": False, "off": False, "0": False}
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in words:
            return words[value.strip().lower()]
        if isinstance(value, (int, np.integer)) and value in (0, 1):
            return bool(value)
        raise ConfigError(f"{where} must be true or false, got {show(value)}")
    if kind == "str":
        return str(value)
    if isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{where} must be a number, got {show(value)}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be a number, got {show(value)}") from None
    if not math.isfinite(number):
        raise ConfigError(f"{where} must be a finite number, got {show(value)}")
    if kind == "int":
        if number != int(number):
            raise ConfigError(f"{where} must be an integer, got {show(value)}")
        return int(number)
    return number


def kind_of(default: Any) -> str:
    """The coercion kind of a learner option from its default (bool, int, float, str)."""
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float) or default is None:
        return "float"
    return "str"


def show(value: Any) -> str:
    """A value for an error message: NumPy scalars as plain Python numbers."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
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


jsonable = _jsonable
