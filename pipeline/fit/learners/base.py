"""The learner interface: what every learner (VB EM, NCG, SGA, ...) gives the estimator.

The estimator owns everything that is the same for all learners -- data sources, engines,
initialisation, warm starts, convergence bookkeeping, checkpoints and resume -- and drives a learner
through :class:`Learner`. A learner owns one iteration: the engine passes it needs and its global
update. All learners work on one model (the prior in :class:`FitContext`) and report the same exact
ELBO (:func:`vbcore.model.elbo.elbo_terms`), so bounds compare across learners and a fit may switch
learners from a warm start.

**State in, state out** (numpyro's ``SVI.update(state) -> (state, loss)``): the driver holds a frozen
:class:`~pipeline.fit.learners.state.FitState` -- posterior, prior, iteration and the learner's own
:class:`~pipeline.fit.learners.state.LearnerState` -- and calls :meth:`Learner.advance`, which returns
a :class:`Step`: the new frozen state, the bound's terms, the minibatch standard error where the bound
is estimated, and whether the fit converged. :meth:`Learner.begin` builds the first state (after an
initialisation or from a warm start), :meth:`Learner.resume` takes one rebuilt from a checkpoint, and
checkpoints write the state (:meth:`FitState.to_arrays`). The rng is inside: every draw comes from
``ctx.rng(iteration, ...)``.

**State and cache.** *State* is every host value the next iteration depends on: the posterior, the
prior, and the learner's :class:`LearnerState` (VB EM: growth, moves, over-relaxation; the point
learners: sticks, counts, threshold, momentum, moves and growth records; the gradient learners: the
line search's record; pattern search: its step). The *cache* is what lives with the chunks on the
engine and cannot be a frozen host value, with the per-chunk bookkeeping kept beside it: VB EM's
memoized per-chunk statistics (:mod:`pipeline.fit.learners.vbem.memo`, with their visit record and
kept move-round shares), the candidate sets of the truncated E-step and of the point learners' MAP
search (with their neighbour lists, pivots and pending relabelling), the gradient learners' per-chunk
logits, gradient and direction, and VB EM's chunk keys and fresh-chunk flags of a warm start. The
learner object keeps the cache between calls; checkpoints gather it (:meth:`Learner.cache_arrays`,
written as ``learner.<name>``) and a resume places it back (:meth:`Learner.load_cache`). A step
given a state other than the last one it returned restores that state first (:meth:`Learner.restore`;
the same bits from the same state); the cache then is the learner's current one (the driver never
steps from an older state: learners without cache -- plain VB EM, MM, SGA, SVI on exact E-steps --
give the same bits from any state they are handed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from pipeline.fit.learners.state import FitState, LearnerState
from vbcore.errors import ConfigError
from vbcore.model.elbo import ElboTerms
from vbcore.model.posterior import Posterior
from vbcore.model.priors import COVARIANCE_TYPES, WEIGHT_TYPES, Prior


@dataclass
class FitContext:
    """What a learner may use: the prepared data, the engine, the model and the seed.

    Attributes
    ----------
    engine : LocalEngine or DaskEngine
    handles : list
        Prepared chunks (``vbcore.kernels.estep.Chunk`` objects, or Dask futures of them), in row order.
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
    projection : vbcore.kernels.projection.Projection or None
        The fit's projection (``pca``): chunks, ``source.load`` and ``n_features`` are projected.
    total_weight : float or None
        ``sum_n w_n`` of weighted rows (the data's ``N`` in every formula that counts rows: the
        convergence test per row, minibatch scaling, default thresholds); None: ``n_rows``
        (:attr:`n_weight`).
    moments : SuffStats or None
        The data's one-component moments (count, mean, scatter; shifted), from which the prior's
        data-dependent defaults were built (``partial_fit`` sums them over its batches).
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
    projection: Any = None
    total_weight: float | None = None
    moments: Any = None

    @property
    def n_weight(self) -> float:
        """The data's ``N``: the rows' total weight (``n_rows`` when the rows are unweighted)."""
        return float(self.n_rows) if self.total_weight is None else float(self.total_weight)
    #: grow the truncation while it is saturated (learners that can: ``vbem``, ``sga*``), up to the limit
    grow: bool = False
    max_components: int | None = None

    def rng(self, *key: int) -> np.random.Generator:
        """A generator derived from the fit's seed and ``key`` (for example the iteration): the same
        draws in an uninterrupted and a resumed run, on any engine."""
        return np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=tuple(int(k) for k in key)))


@dataclass(frozen=True)
class Step:
    """What :meth:`Learner.advance` returns: the new state, the bound's terms (exact, or a minibatch
    estimate: :meth:`Learner.bound_kind`), its standard error where it is estimated (else None) and
    whether the fit converged with it (:meth:`Learner.converged`)."""

    state: FitState
    terms: ElboTerms
    se: float | None = None
    converged: bool = False


class Learner:
    """Base class of the learners: every hook the fit setup and driver use is declared here with
    its default, so a learner overrides only what it changes.

    Subclasses set ``options`` (the allowed ``learner_options``, declared once with their defaults,
    ranges and help, :mod:`pipeline.fit.learners.options`) and implement :meth:`step`; learners with
    state beyond the posterior (search directions, momentum) declare it as a :class:`LearnerState`
    dataclass (:attr:`state_type`) and implement :meth:`own_state` and :meth:`load`; learners with a
    cache of per-chunk data on the engine (per-chunk logits, candidate sets) implement
    :meth:`cache_arrays`, :meth:`load_cache` and :meth:`close`. Engine passes are counted by the
    engine wrapper of the fit context (``ctx.engine.passes``), not by the learners.
    """

    name: ClassVar[str] = ""
    #: the learner options: name -> default, declared as :class:`pipeline.fit.learners.options.Options`
    #: (type, range or choices, special values, help; a plain dict of defaults is typed by them)
    options: ClassVar[dict[str, Any]] = {}
    #: covariance and weight types the learner can fit (the spec refuses others before any pass)
    covariance_types: ClassVar[tuple[str, ...]] = COVARIANCE_TYPES
    weight_types: ClassVar[tuple[str, ...]] = WEIGHT_TYPES
    #: the covariance type used when none is given (None: the face's default, diag or full)
    default_covariance: ClassVar[str | None] = None
    #: whether the chunks keep the ``[x*x, x]`` cache of the diagonal families (its E-steps use it;
    #: hard-assignment learners form ``x*x`` only for the rows they touch and save 2x the data's memory)
    cache_squares: ClassVar[bool] = True
    #: rows gathered (uniformly, through the engine) for :meth:`estimate_fixed_variance`; None: the
    #: default estimate (k-means on whole chunks picked at random)
    sigma2_sample_rows: ClassVar[int | None] = None
    #: whether the learner re-estimates the prior's free hyperparameters (:attr:`Prior.empirical`);
    #: for the others the fit setup holds them at their initial values
    empirical_bayes: ClassVar[bool] = False
    # -- what the faces say of the learner (the registry, pipeline.fit.learners.learner_names, reads
    # -- these; no face keeps a list of names). A ``minibatch`` option marks a minibatch learner.
    #: the family: ``'vbem'`` (VB EM and its accelerations), ``'point'`` (MAP point learners on DP
    #: weights: MM, SGA, SVI) or ``'gradient'`` (gradient and conjugate-gradient on the bound)
    family: ClassVar[str] = ""
    #: whether it grows the truncation while it is saturated (``grow``; ``vbcluster learners``)
    grows: ClassVar[bool] = False
    #: engine passes of one plain iteration, for the report's x axis of a run that did not log them
    #: (None: not a fixed number)
    passes_per_iteration: ClassVar[int | None] = None
    #: whether ``VBMixture.partial_fit`` accepts it: that runs VB EM's pass on memoized batch
    #: statistics (:mod:`pipeline.fit.partial`), so only VB EM sets it
    partial_fit: ClassVar[bool] = False
    #: the learner's own state (:meth:`own_state`), rebuilt from a checkpoint by its field types
    state_type: ClassVar[type[LearnerState]] = LearnerState

    def __init__(self, ctx: FitContext, options: Mapping[str, Any] | None = None) -> None:
        self.ctx = ctx
        self.opts = self.parse_options(options or {})
        self.post: Posterior | None = None
        self._current: FitState | None = None  # the state the learner's objects hold now

    @property
    def passes(self) -> int:
        """Engine passes issued so far (each map or map_reduce over chunks counts one)."""
        return int(getattr(self.ctx.engine, "passes", 0))

    @classmethod
    def parse_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults overridden by ``options``, converted and checked against the declarations of
        :attr:`options` (:func:`pipeline.fit.learners.options.check_options`, the one check): unknown
        keys, wrong types, values out of range and broken rules are errors. Strings from the command
        line are converted to each option's type."""
        from pipeline.fit.learners.options import check_options

        return check_options(cls, options)

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        """Refuse a resolved :class:`pipeline.fit.spec.FitSpec` this learner cannot fit."""
        if spec.covariance not in cls.covariance_types:
            fits = " or ".join(map(repr, cls.covariance_types))
            raise ConfigError(f"learner {cls.name!r} fits covariance {fits}, not {spec.covariance!r} "
                              "(--covariance / covariance_type)")
        if spec.weights not in cls.weight_types:
            needs = " or ".join(map(repr, cls.weight_types))
            raise ConfigError(f"learner {cls.name!r} needs weights {needs}, not {spec.weights!r} "
                              "(--weights / weight_concentration_prior_type)")
        from pipeline.fit.learners.options import check_options

        check_options(cls, spec.learner_options, covariance=spec.covariance)  # the rules on the covariance

    @classmethod
    def default_weight_concentration(cls, n_rows: float) -> float | None:
        """The learner's default weight concentration for N rows (None: the prior's, 1/K)."""
        return None

    @classmethod
    def estimate_fixed_variance(cls, sample: np.ndarray, n_components: int, seed: Any) -> float | None:
        """``sigma^2`` of covariance 'fixed' from ``sample`` (None: the default k-means estimate)."""
        return None

    def initialise(self) -> Posterior | None:
        """The learner's own initial posterior (None: the fit setup's initialisation)."""
        return None

    # ---- the interface: state in, state out ----------------------------------------------------
    def begin(self, post: Posterior, *, warm: bool = False) -> FitState:
        """The first state: from ``post`` (an initialisation, or a finished fit's with ``warm``:
        :meth:`start_warm`)."""
        (self.start_warm if warm else self.start)(post)
        return self.snapshot(0)

    def resume(self, state: FitState, cache: Mapping[str, np.ndarray]) -> None:
        """Continue from a checkpoint's ``state`` (:meth:`FitState.from_arrays`) and cache
        (:meth:`cache_arrays`' arrays)."""
        self.restore(state)
        self.load_cache(state.post, cache)

    def advance(self, state: FitState, history: Sequence[float] = (), tol: float | None = None) -> Step:
        """One iteration from ``state``: the new state, the bound's terms and, with ``tol``, whether
        the fit converged (:meth:`converged` on ``history`` and the new bound). The learner's
        objects follow: a state other than the last one returned is restored first."""
        if state is not self._current:
            self.restore(state)
        _, terms = self.step(state.iteration + 1)
        se = self.bound_se()
        done = False if tol is None else self.converged([*history, terms.total], float(tol))
        return Step(self.snapshot(state.iteration + 1), terms, se, done)

    def snapshot(self, iteration: int) -> FitState:
        """The learner's state now, frozen (the state :meth:`advance` returns)."""
        assert self.post is not None, "start() first"
        self._current = FitState(self.post, self.ctx.prior, int(iteration), self.own_state().freeze())
        return self._current

    def restore(self, state: FitState) -> None:
        """Make the learner's objects hold ``state`` (the cache stays as it is)."""
        self.ctx.prior = state.prior
        self.load(state.post, state.learner.thaw())
        self._current = state

    def own_state(self) -> LearnerState:
        """The learner's state beyond the posterior and prior (host values; :attr:`state_type`)."""
        return LearnerState()

    def load(self, post: Posterior, state: Any) -> None:
        """Hold ``post`` and the learner's ``state`` (an :attr:`state_type`, thawed); default: start
        from ``post``."""
        self.start(post)

    def cache_arrays(self) -> dict[str, np.ndarray]:
        """The cache (engine-held per-chunk data, see the module docstring) gathered for a checkpoint."""
        return {}

    def load_cache(self, post: Posterior, arrays: Mapping[str, np.ndarray]) -> None:
        """Place a checkpoint's cache (:meth:`cache_arrays`) back with the chunks."""

    # ---- what one iteration is (the learners implement these) ---------------------------------
    def start(self, post: Posterior) -> None:
        """Begin from ``post`` (after initialisation, a warm start or a switch of learner)."""
        self.post = post

    def start_warm(self, post: Posterior) -> None:
        """Begin from the posterior of a finished fit (a warm start); :meth:`start` unless a learner
        carries more over."""
        self.start(post)

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        """One iteration on the learner's objects (:meth:`advance` wraps it); returns the posterior after
        it and the exact ELBO of the variational distribution it describes."""
        raise NotImplementedError

    def bound_kind(self) -> str:
        """What :meth:`step` reports: ``'exact'`` (the ELBO of the distribution, over all rows) or
        ``'minibatch estimate'`` (an unbiased estimate from the iteration's minibatch)."""
        return "exact"

    def bound_se(self) -> float | None:
        """The standard error (nats, whole data set) of the last :meth:`step`'s bound when it is a
        minibatch estimate (:func:`vbcore.model.elbo.minibatch_standard_error`); None when it is exact or
        when the step cannot say (a step that also merged clusters)."""
        return None

    def final_terms(self) -> ElboTerms | None:
        """The exact ELBO of the final distribution when :meth:`step` reports estimates (one full
        pass; it may update ``self.post``); None when the last step's bound is already exact."""
        return None

    def converged(self, history: list[float], tol: float) -> bool:
        """Default rule: the exact ELBO changed by less than ``tol`` per sample in the last iteration.
        A learner whose bounds are minibatch estimates never converges on them (one noisy step can
        change the estimate by less than ``tol``): it runs its ``max_iter`` budget."""
        if self.bound_kind() != "exact":
            return False
        return len(history) > 1 and abs(history[-1] - history[-2]) / self.ctx.n_weight < tol

    def truncation_info(self, used: int) -> dict[str, Any]:
        """What result.json says of the truncation for a fit ending with ``used`` components holding a
        row's worth (``truncation``): learners that do not grow it report whether it bound the answer."""
        from pipeline.fit.learners.growth import saturated

        k = int(self.ctx.prior.n_components)
        sat = saturated(used, k) and self.ctx.weight_type == "dirichlet_process"
        return {"start": k, "final": k, "limit": k, "grew": 0, "used": int(used), "saturated": sat,
                "growth": False, "refused": False, "limit_hit": sat}

    def truncation_record(self, used: int, converged: bool) -> dict[str, Any]:
        """The ``truncation`` entry of a fit that ended (``used`` components holding a row's worth):
        :meth:`truncation_info` and whether the iteration limit decided the count
        (:func:`pipeline.fit.learners.growth.stopped_growing`)."""
        from pipeline.fit.learners.growth import stopped_growing

        projected_diag = self.ctx.projection is not None and self.ctx.covariance_type == "diag"
        return stopped_growing(self.truncation_info(used), converged, projected_diag)

    def initial_terms(self, post: Posterior) -> ElboTerms:
        """The exact ELBO of ``post`` before any iteration (a fit of ``max_iter=0``): one exact
        E-step pass (VB EM's; every learner reports the bound of the same model)."""
        from vbcore.kernels.estep import estep_params, vbem_pass_kernel
        from vbcore.model.elbo import elbo_terms

        ctx = self.ctx
        res = ctx.engine.map_reduce(vbem_pass_kernel, ctx.handles, estep_params(post, ctx.shift))
        return elbo_terms(res.stats, post, self.ctx.prior)

    def adopt(self, state: Mapping[str, np.ndarray]) -> int:
        """Warm start: take what applies of a previous fit's kept state (its :meth:`keep_state`, e.g.
        the memoized statistics of unchanged chunks, :mod:`pipeline.fit.learners.vbem.memo`) after
        :meth:`start`. Returns the number of chunks whose state was adopted (0: none, the default)."""
        return 0

    def keep_state(self) -> dict[str, np.ndarray]:
        """The state a later warm start may :meth:`adopt` (fetched at the end of a fit; {}: none)."""
        return {}

    def close(self) -> None:
        """Release per-chunk state held by the engine."""


def restart_lineage(ctx: FitContext, states: list[Any], parts: list[Any]) -> list[Any]:
    """The per-chunk states to keep after gathering them (``parts``) for a checkpoint: on a Dask
    cluster, the gathered copies put back as new tasks; elsewhere ``states`` as they are.

    A placed state is the end of a chain of tasks, one per pass since it was placed, which Dask keeps
    (each with that pass's global parameters) to rebuild the states of a dead worker. Placing the
    checkpoint's copy instead rebuilds them from the last checkpoint, and bounds what the scheduler
    holds to the passes since then (the same values: the bits do not change). Device (CuPy) states
    stay as they are: placing host copies would cost a pass to move them. The old chain is released,
    not cancelled, when its last future goes.
    """
    engine = ctx.engine
    if getattr(engine, "name", "local") != "dask" or getattr(engine, "array_backend", "numpy") != "numpy":
        return states
    return list(engine.place_states(parts, ctx.handles))
