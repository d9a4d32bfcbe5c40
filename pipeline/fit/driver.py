"""The fit driver: the loop of iterations, convergence, checkpoints and resume, for one restart.

:func:`run_fit` takes a resolved :class:`~pipeline.fit.spec.FitSpec`, a row source and an engine, runs
the fit setup (:mod:`pipeline.fit.setup`), then the learner's iterations until convergence or
``max_iter``, writing a checkpoint every ``checkpoint_every`` iterations (and the last one) when a
checkpoint directory is given, and resuming from the newest valid checkpoint of the same run. The
returned :class:`FitOutcome` holds everything the estimator exposes.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pipeline.fit.checkpoint import Checkpointer, Loaded, config_hash
from pipeline.fit.learners import FitContext, Learner, make_learner
from pipeline.fit.learners.state import STATE_FORMAT, FitState
from pipeline.fit.projection import check_projection
from pipeline.fit.setup import check_components, initial_posterior, setup
from pipeline.fit.spec import FitSpec
from vbcore.errors import ConfigError, FitInterrupted
from vbcore.kernels.projection import Projection
from vbcore.model.elbo import ElboTerms
from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior

#: checkpoint keys of the learner's cache (:meth:`Learner.cache_arrays`) carry this prefix; the state's
#: keys are :meth:`FitState.to_arrays`'
LEARNER_KEY = "learner."


@dataclass
class FitOutcome:
    """What one fit (one restart) ends with."""

    post: Posterior
    prior: Prior
    terms: ElboTerms
    history: list[float]
    converged: bool
    n_iter: int
    passes: int
    resumed_from: str | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: what ``history`` holds: 'exact' or 'minibatch estimate' (``terms`` is always exact)
    bound_kind: str = "exact"
    #: wall seconds of the whole fit, summed over the attempts that a resume continued
    wall_seconds: float = 0.0
    #: the standard error of each ``history`` entry that is a minibatch estimate (None where exact
    #: or not known)
    history_se: list[float | None] = field(default_factory=list)
    #: the learner's options as the fit used them (defaults filled in, automatic values resolved)
    options: dict[str, Any] = field(default_factory=dict)
    #: the projection the rows went through (``pca``), or None
    projection: Projection | None = None
    #: what a later warm start may adopt (:meth:`Learner.keep_state`: memoized statistics), and the
    #: number of chunks this fit adopted from its warm start
    kept: dict[str, np.ndarray] = field(default_factory=dict)
    adopted: int = 0
    #: the truncation: start, final, limit, used, saturated, limit_hit, max_iter_hit
    #: (:meth:`Learner.truncation_record`)
    truncation: dict[str, Any] = field(default_factory=dict)
    #: the data's moments the prior was built from (:attr:`FitContext.moments`)
    moments: Any = None
    #: model selection's record (:meth:`pipeline.fit.select.Selection.to_dict`), or None
    selection: dict[str, Any] | None = None


class StopRequest:
    """A request to stop after the current iteration, owned by one run: :func:`stop_on_signals`
    makes one and installs it as the SIGINT/SIGTERM handler; :func:`run_fit` (and the service,
    :func:`pipeline.fit.lowrank.run_lowrank`) receive it and read it after every iteration, then
    write a checkpoint and raise :class:`FitInterrupted`. Calling it is what a signal does."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, frame: Any = None) -> None:
        import signal

        if self.signum is not None:  # a second signal: stop now
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None


class stop_on_signals:
    """``with stop_on_signals() as stop:`` SIGINT and SIGTERM set ``stop`` (a :class:`StopRequest` of
    this block's own, handed to the fit): the fit finishes the current iteration, writes a checkpoint
    and raises :class:`FitInterrupted` (a second signal stops at once). Handlers: main thread only."""

    def __init__(self) -> None:
        self.request = StopRequest()

    def __enter__(self) -> StopRequest:
        import signal
        import threading

        self.saved: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self.request)
        return self.request

    def __exit__(self, *exc: object) -> None:
        import signal

        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


class CountingEngine:
    """An engine that counts the passes (map, map_reduce, map_keep) issued through it: the one
    place where a fit's passes are counted."""

    def __init__(self, engine: Any) -> None:
        self.inner = engine
        self.passes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def map(self, *args: Any, **kwargs: Any) -> Any:
        self.passes += 1
        return self.inner.map(*args, **kwargs)

    def map_reduce(self, *args: Any, **kwargs: Any) -> Any:
        self.passes += 1
        return self.inner.map_reduce(*args, **kwargs)

    def map_keep(self, *args: Any, **kwargs: Any) -> Any:
        self.passes += 1
        return self.inner.map_keep(*args, **kwargs)


ITERATING = "iterating"  # the last stage: the iterations, reported through the callback itself


def report_stage(callback: Any, text: str, step: tuple[int, int] | None = None) -> None:
    """Tell a progress display what the fit does before its first iteration (the projection's passes,
    reading, initialising: 20 s at K = 200), through the callback's ``stage(text)`` method when it
    has one (FitProgress; ``stage(text, step)`` for pass ``step = (i, n)`` of a stage of several);
    ``text`` is :data:`ITERATING` when the iterations start. Plain callbacks see iterations only."""
    stage = getattr(callback, "stage", None)
    if stage is not None:
        stage(text) if step is None else stage(text, step)


def n_effective(post: Posterior, prior: Prior) -> int:
    """Components holding at least one sample's worth of responsibility."""
    wc = post.weight_concentration
    counts = (wc[0] - 1.0) if post.weight_type == "dirichlet_process" else wc - prior.weight_concentration
    return int(np.sum(counts >= 1.0))


def source_fingerprint(source: Any) -> str:
    """The store's fingerprint, or a sha256 of the rows (chunk by chunk) for arrays."""
    import hashlib

    if hasattr(source, "fingerprint"):
        return str(source.fingerprint)
    h = hashlib.sha256(f"{source.n_rows}x{source.n_features}:{np.dtype(source.dtype)}".encode())
    for i in range(len(source.chunk_slices())):
        h.update(np.ascontiguousarray(source.load(i)).tobytes())
        w = source.load_weights(i) if hasattr(source, "load_weights") else None
        if w is not None:  # weighted rows: the weights are part of the data
            h.update(b"weights" + np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def run_identity(spec: FitSpec, source: Any) -> dict[str, Any]:
    """What a checkpoint must match: learner, identity settings, data fingerprint, seed."""
    settings = spec.identity()
    return {
        "learner": spec.learner,
        "settings": settings,
        "config_hash": config_hash(settings),
        "store_fingerprint": source_fingerprint(source),
        "rng": {"entropy": spec.seed, "derivation": "numpy SeedSequence(entropy, spawn_key=(iteration,))"},
    }


def load_checkpoint(ckpt: Checkpointer, identity: dict[str, Any]) -> Loaded | None:
    """The newest valid checkpoint of this run, or None; a checkpoint of other data or settings is
    an error (nothing is overwritten)."""
    loaded = ckpt.load_latest()
    if loaded is None:
        return None
    m = loaded.manifest
    if m.get("store_fingerprint") != identity["store_fingerprint"]:
        raise ConfigError(
            f"{loaded.path}: the data changed since this checkpoint was written (fingerprint "
            f"{str(m.get('store_fingerprint'))[:12]}... vs {identity['store_fingerprint'][:12]}...); "
            "start the new fit in another directory (or restart this one)"
        )
    if m.get("config_hash") != identity["config_hash"] or m.get("learner") != identity["learner"]:
        old, new = m.get("settings", {}), identity["settings"]
        diff = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
                if old.get(k) != new.get(k)]
        raise ConfigError(
            f"{loaded.path}: the settings differ from the checkpoint's ({'; '.join(diff) or 'learner'}); "
            "use the same settings to resume, or start the new fit in another directory"
        )
    for path, reason in loaded.skipped:
        warnings.warn(f"skipped checkpoint {path.name}: {reason}; resuming from {loaded.path.name}",
                      stacklevel=3)
    return loaded


@dataclass
class _Loop:
    """The loop's bookkeeping (restored from a checkpoint on resume)."""

    history: list[float] = field(default_factory=list)
    terms: ElboTerms | None = None
    converged: bool = False
    n_iter: int = 0
    wall_before: float = 0.0  # wall seconds of earlier attempts (from the checkpoint)
    started: float = field(default_factory=time.perf_counter)
    history_se: list[float | None] = field(default_factory=list)
    adopted: int = 0  # chunks adopted from the warm start (kept in checkpoints: a resume reports them)

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.started


def run_fit(spec: FitSpec, source: Any, engine: Any, *, random_state: Any,
            checkpoint_dir: str | None = None, warm: Posterior | None = None,
            projection: Projection | None = None,
            previous_bound: float | None = None, resp_init: Any = None,
            warm_state: dict[str, np.ndarray] | None = None,
            callback: Callable[[dict[str, Any]], None] | None = None,
            log: Callable[[str], None] | None = None, log_every: int = 1,
            stop: StopRequest | None = None) -> FitOutcome:
    """One fit of ``source`` with the resolved ``spec`` on ``engine`` (see the module docstring).

    ``warm`` starts from a posterior (warm start), ``projection`` is that posterior's (the rows are
    projected with it instead of a new one); ``previous_bound`` is the final ELBO of the previous
    warm-started call, so convergence is judged across calls as scikit-learn does. A checkpoint's
    projection is taken from the checkpoint; ``warm_state`` is what the learner may adopt of the
    previous fit (:meth:`Learner.adopt`); ``stop`` is the run's stop request (:func:`stop_on_signals`;
    None: the fit is not stopped early)."""
    t_start = time.perf_counter()
    ckpt = None if checkpoint_dir is None else Checkpointer(checkpoint_dir, int(spec.keep))
    identity = run_identity(spec, source) if ckpt is not None else {}
    loaded = load_checkpoint(ckpt, identity) if ckpt is not None else None
    if loaded is not None and spec.pca is not None:
        projection = Projection.from_arrays(loaded.state)
        if projection is None:
            raise ConfigError(f"{loaded.path}: the checkpoint holds no projection; restart the fit")
    if projection is not None:
        check_projection(projection, source.n_features, spec.pca, bool(spec.whiten),
                         "the warm start" if loaded is None else str(loaded.path), spec.normalize)
    if loaded is None and warm is None:  # (a resumed or warm start keeps the components it has)
        check_components(int(spec.components), source.n_rows, source.describe())
    ctx = setup(spec, source, CountingEngine(engine), random_state, projection,
                stage=lambda text, step: report_stage(callback, text, step))
    ctx.engine.passes = 0  # the setup's passes are not the learner's
    try:
        learner = make_learner(spec.learner, ctx, spec.learner_options)
        try:
            report_stage(callback, "loading the checkpoint" if loaded is not None else "warm start"
                         if warm is not None else f"initialising ({spec.init}, K = {spec.components})")
            loop, state = _begin(spec, ctx, learner, loaded, warm, resp_init, random_state)
            post = state.post
            report_stage(callback, ITERATING)
            if warm is not None and warm_state and loaded is None:
                loop.adopted = learner.adopt(warm_state)
            loop.started = t_start
            if loaded is not None and callback is not None and loop.history:  # the bar starts there
                # not an iteration (no "iteration" key: the log holds each iteration once, issue 29)
                callback({"event": "resumed", "after_iteration": loop.n_iter, "elbo": loop.history[-1],
                          "n_effective": n_effective(post, ctx.prior), "n_components": post.n_components,
                          "seconds": 0.0, "passes": learner.passes, "learner": spec.learner,
                          "bound": learner.bound_kind()})
            state = _iterate(spec, ctx, learner, loop, state, ckpt, identity, previous_bound, callback,
                             log, log_every, stop or StopRequest())
            post = state.post
            final = learner.final_terms() if loop.n_iter else None  # exact, where steps estimate
            if final is not None:
                assert learner.post is not None
                loop.terms, post = final, learner.post
            if loop.terms is None:  # max_iter == 0: the bound of the initial posterior
                loop.terms = learner.initial_terms(post)
            out = FitOutcome(
                post=post, prior=ctx.prior, terms=loop.terms, history=loop.history, converged=loop.converged,
                n_iter=loop.n_iter, passes=learner.passes, bound_kind=learner.bound_kind(),
                history_se=loop.history_se, options=dict(learner.opts), kept=learner.keep_state(),
                adopted=loop.adopted, projection=ctx.projection, moments=ctx.moments,
                truncation=learner.truncation_record(n_effective(post, ctx.prior), loop.converged),
                resumed_from=None if loaded is None else str(loaded.path),
                skipped=[] if loaded is None else [(str(p), r) for p, r in loaded.skipped])
        finally:
            learner.close()
    finally:
        ctx.engine.release(ctx.handles)
    out.wall_seconds = loop.wall()
    return out


def _begin(spec: FitSpec, ctx: FitContext, learner: Learner, loaded: Loaded | None, warm: Posterior | None,
           resp_init: Any, random_state: Any) -> tuple[_Loop, FitState]:
    """The loop's bookkeeping and the state to start from: a checkpoint's, a warm start's or an
    initialisation's."""
    loop = _Loop()
    if loaded is not None:
        m = loaded.manifest
        if m.get("state_format") != STATE_FORMAT:
            raise ConfigError(
                f"{loaded.path}: a checkpoint written before the learners' state became named fields "
                f"(state format {STATE_FORMAT}); resume it with the vbcluster version that wrote it, or "
                "start the fit again (--restart, or another checkpoint directory)")
        state = FitState.from_arrays(loaded.state, ctx.prior, int(m["iteration"]), learner.state_type)
        loop = _Loop([float(v) for v in m["elbo_history"]],
                     ElboTerms(**m["elbo_terms"]) if m["elbo_terms"] else None,
                     bool(m["converged"]), int(m["iteration"]), float(m.get("wall_seconds", 0.0)))
        loop.history_se = list(m.get("elbo_history_se", [None] * len(loop.history)))
        loop.adopted = int(m.get("adopted", 0))
        learner.resume(state, {k[len(LEARNER_KEY):]: v for k, v in loaded.state.items()
                               if k.startswith(LEARNER_KEY)})
        ctx.engine.passes = int(m.get("passes", 0))  # the count goes on
        return loop, state
    if warm is not None:
        return loop, learner.begin(warm, warm=True)
    own = learner.initialise() if resp_init is None else None  # a learner's own initialisation
    if own is None:
        n0 = ctx.engine.passes
        own = initial_posterior(spec, ctx, resp_init, random_state)
        ctx.engine.passes = n0  # the setup's initialisation is not a learner pass
    return loop, learner.begin(own)


def _iterate(spec: FitSpec, ctx: FitContext, learner: Learner, loop: _Loop, state: FitState,
             ckpt: Checkpointer | None, identity: dict[str, Any], previous_bound: float | None,
             callback: Callable[[dict[str, Any]], None] | None, log: Callable[[str], None] | None,
             log_every: int, stop: StopRequest) -> FitState:
    """Iterations until convergence or ``max_iter``, with checkpoints: each hands the learner the
    state and takes the new one (:meth:`Learner.advance`)."""
    t0 = last_ckpt = t_iter = time.perf_counter()
    before = [] if previous_bound is None else [float(previous_bound)]
    while not loop.converged and loop.n_iter < int(spec.max_iter):
        loop.n_iter += 1
        step = learner.advance(state, before + loop.history, float(spec.tol))
        state, loop.terms, se, post = step.state, step.terms, step.se, step.state.post
        loop.history.append(loop.terms.total)
        loop.history_se.append(None if se is None else float(se))
        loop.converged = step.converged
        now = time.perf_counter()
        if log is not None and (loop.n_iter % max(int(log_every), 1) == 0 or loop.converged):
            pm = "" if se is None else f" +- {se:.2e} (minibatch estimate)"
            log(f"  Iteration {loop.n_iter}\t time lapse {now - t0:.5f}s\t ELBO {loop.terms.total:.6e}{pm} "
                f"(per row {loop.terms.total / ctx.n_weight:.6f}), components {post.n_components}")
        if callback is not None:
            callback({"iteration": loop.n_iter, "elbo": loop.terms.total,
                      "n_effective": n_effective(post, ctx.prior), "n_components": post.n_components,
                      "seconds": now - t_iter, "passes": learner.passes, "learner": spec.learner,
                      "bound": learner.bound_kind(), **({} if se is None else {"elbo_se": se})})
        t_iter = now
        due = (loop.n_iter % int(spec.checkpoint_every) == 0 or loop.converged
               or loop.n_iter == int(spec.max_iter))
        if spec.checkpoint_seconds is not None:
            due = due or now - last_ckpt >= float(spec.checkpoint_seconds)
        signum = stop.signum
        saved = None
        if ckpt is not None and (due or signum is not None):
            saved = _save(ckpt, loop, state, learner, identity)
            last_ckpt = time.perf_counter()
        if signum is not None:
            raise FitInterrupted(signum, loop.n_iter, None if saved is None else str(saved))
    return state


def _save(ckpt: Checkpointer, loop: _Loop, state: FitState, learner: Learner,
          identity: dict[str, Any]) -> Any:
    """A checkpoint of the state (:meth:`FitState.to_arrays`), the learner's cache, the projection and
    the loop's bookkeeping."""
    assert loop.terms is not None
    arrays = state.to_arrays()
    arrays.update({LEARNER_KEY + k: v for k, v in learner.cache_arrays().items()})
    if learner.ctx.projection is not None:
        arrays.update(learner.ctx.projection.to_arrays())
    return ckpt.save(loop.n_iter, arrays, dict(identity, converged=loop.converged, elbo_history=loop.history,
                                               elbo_history_se=loop.history_se, state_format=STATE_FORMAT,
                                               elbo_terms=asdict(loop.terms), wall_seconds=loop.wall(),
                                               bound_kind=learner.bound_kind(), passes=learner.passes,
                                               adopted=loop.adopted))
