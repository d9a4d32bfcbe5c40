"""The learner interface: what every learner (VB EM, NCG, SGA, ...) gives the estimator.

The estimator owns everything that is the same for all learners -- data sources, engines,
initialisation, warm starts, convergence bookkeeping, checkpoints and resume -- and drives a learner
through :class:`Learner`. A learner owns one iteration: the engine passes it needs and its global
update. All learners work on one model (the prior in :class:`FitContext`) and report the same exact
ELBO (:func:`vbcore.elbo.elbo_terms`), so bounds compare across learners and a fit may switch
learners from a warm start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from vbcore.elbo import ElboTerms
from vbcore.errors import ConfigError
from vbcore.posterior import Posterior
from vbcore.priors import COVARIANCE_TYPES, Prior


@dataclass
class FitContext:
    """What a learner may use: the prepared data, the engine, the model and the seed.

    Attributes
    ----------
    engine : LocalEngine or DaskEngine
    handles : list
        Prepared chunks (``vbcore.kernels.Chunk`` objects, or Dask futures of them), in row order.
    source : row source
        ``n_rows``, ``n_features``, ``chunk_slices()``, ``load(i)``.
    prior : Prior
    shift : array of shape (n_features,)
        Rows inside chunks are ``x - shift`` (float32 GEMMs stay accurate near the data).
    reg_covar : float
    n_rows, n_features : int
    covariance_type, weight_type : str
    seed : int or None
        Entropy of every random draw of the fit; see :meth:`rng`.
    """

    engine: Any
    handles: list[Any]
    source: Any
    prior: Prior
    shift: np.ndarray
    reg_covar: float
    n_rows: int
    n_features: int
    covariance_type: str
    weight_type: str
    seed: int | None = None
    chunk_starts: list[int] = field(default_factory=list)

    def rng(self, *key: int) -> np.random.Generator:
        """A generator derived from the fit's seed and ``key`` (for example the iteration): the same
        draws in an uninterrupted and a resumed run, on any engine."""
        return np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=tuple(int(k) for k in key)))


class Learner:
    """Base class of the learners.

    Subclasses set ``name`` and ``options`` (the allowed ``learner_options`` with their defaults)
    and implement :meth:`start` and :meth:`step`; learners with state beyond the posterior (search
    directions, momentum, per-chunk logits) also implement :meth:`state`, :meth:`load_state` and
    :meth:`close`.
    """

    name: ClassVar[str] = ""
    #: allowed learner options and their defaults
    options: ClassVar[dict[str, Any]] = {}
    #: whether the chunks keep the ``[x*x, x]`` cache of the diagonal families (its E-steps use it;
    #: hard-assignment learners form ``x*x`` only for the rows they touch and save 2x the data's memory)
    cache_squares: ClassVar[bool] = True
    #: the covariance types the learner's updates are written for; others are refused at validation
    covariance_types: ClassVar[tuple[str, ...]] = COVARIANCE_TYPES

    def __init__(self, ctx: FitContext, options: Mapping[str, Any] | None = None) -> None:
        self.ctx = ctx
        self.opts = self.parse_options(options or {}, covariance_type=ctx.covariance_type)
        #: engine passes issued so far (each map or map_reduce over the chunks counts one)
        self.passes = 0
        self.post: Posterior | None = None

    @classmethod
    def parse_options(cls, options: Mapping[str, Any], covariance_type: str | None = None) -> dict[str, Any]:
        """Defaults overridden by ``options``; unknown keys and wrong types are errors.

        Values keep the type of their default (strings from the command line are converted). With
        ``covariance_type``, also refuse a type the learner does not support
        (:meth:`check_covariance_type`)."""
        if covariance_type is not None:
            cls.check_covariance_type(covariance_type)
        unknown = sorted(set(options) - set(cls.options))
        if unknown:
            known = ", ".join(sorted(cls.options)) or "none"
            raise ConfigError(
                f"learner {cls.name!r} has no option {', '.join(map(repr, unknown))}; its options: {known}"
            )
        out = dict(cls.options)
        for key, value in options.items():
            out[key] = _coerce(cls.name, key, value, cls.options[key])
        return out

    @classmethod
    def check_covariance_type(cls, covariance_type: str) -> None:
        """Raise :class:`ConfigError` when ``covariance_type`` is not in :attr:`covariance_types`."""
        if covariance_type in cls.covariance_types:
            return
        allowed = cls.covariance_types
        need = f"={allowed[0]!r}" if len(allowed) == 1 else f" in {allowed}"
        raise ConfigError(f"learner {cls.name!r} needs covariance_type{need}, got {covariance_type!r}")

    # ---- the interface ------------------------------------------------------------------------
    def start(self, post: Posterior) -> None:
        """Begin from ``post`` (after initialisation, a warm start or a switch of learner)."""
        self.post = post

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        """One iteration; returns the posterior after it and the exact ELBO of the variational
        distribution it describes."""
        raise NotImplementedError

    def converged(self, history: list[float], tol: float) -> bool:
        """Default rule: the ELBO changed by less than ``tol`` per sample in the last iteration."""
        return len(history) > 1 and abs(history[-1] - history[-2]) / self.ctx.n_rows < tol

    def state(self) -> dict[str, np.ndarray]:
        """Learner state beyond the posterior, for checkpoints (arrays only)."""
        return {}

    def load_state(self, post: Posterior, state: Mapping[str, np.ndarray]) -> None:
        """Resume from a checkpoint written from :meth:`state`."""
        self.start(post)

    def close(self) -> None:
        """Release per-chunk state held by the engine."""


def _coerce(learner: str, key: str, value: Any, default: Any) -> Any:
    """Convert ``value`` to the type of ``default`` (bool, int, float or str)."""
    where = f"learner option {key!r} of {learner!r}"
    if isinstance(default, bool):
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if isinstance(default, (int, float)) and not isinstance(default, bool) or default is None:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be a number, got {value!r}") from None
        if isinstance(value, bool) or not np.isfinite(number):
            raise ConfigError(f"{where} must be a finite number, got {value!r}")
        if isinstance(default, int) and not isinstance(default, bool):
            if number != int(number):
                raise ConfigError(f"{where} must be an integer, got {value!r}")
            return int(number)
        return number
    return str(value)
