"""``VBMixture.partial_fit``: VB EM over batches that arrive one at a time, on memoized statistics
(Hughes & Sudderth 2013).

Every batch's last sufficient statistics are kept on the driver (:class:`PartialState`, in arrival
order, each under a content key of its rows and weights): a batch passed again *replaces* its own
statistics (memoized VB's revisit), so laps over the same batches converge to the fit of all of them,
while a new batch adds its own. A call prepares its batch (rows shifted by the first batch's first
row, so all statistics merge), then iterates up to ``max_iter`` times: the VB E-step of *this*
batch under the current posterior, the global statistics as the reduction of every batch's kept
statistics over the fixed pairwise tree (the bits of a full pass over those responsibilities), the
M-step, and the exact bound.
The rows of earlier batches are not read again: their responsibilities stay those of their last
call, so the bound is the exact ELBO of all rows seen with that q(Z) and never decreases within a
call. The first call (of an unfitted model) *is* ``fit`` of its batch (one initialisation, the
spec's growth and moves, the data-dependent prior of :func:`pipeline.fit.setup.build_prior` and its
empirical updates; the same bits as ``fit`` with ``n_init=1``), keeping memoized statistics whose sum
becomes the batch's statistics, so a representative first batch gives the model ``fit`` would give
and later batches refine it. Later calls keep that truncation (no growth, no pruning); the prior's
data-dependent defaults (prior mean, covariance prior, the empirical ``nu0``) follow the moments of
every row seen (each batch's kept beside its statistics: after the last batch they are what ``fit``
builds on all rows), and its free hyperparameters (the empirical defaults' ``beta0``) are
re-estimated after every M-step as ``fit`` does (:func:`vbcore.model.empirical.empirical_update`). A model
fitted by ``fit`` continues from its posterior and prior, with no statistics (nor moments) of the
rows ``fit`` saw, so its data defaults stay ``fit``'s. A call that fails changes no state.

With ``pca`` the projection is that of the first batch (its one projection pass; or a model fitted by
``fit``: that fit's), kept for every later batch: statistics summed across batches must live in
one space, so later batches are projected onto it and do not move it (a representative first batch
gives the projection ``fit`` would compute; ``predict`` applies it as after ``fit``).

Against scikit-learn's conventions (its mixtures have no ``partial_fit``; ``MiniBatchKMeans`` and the
SGD estimators do): one call is one pass of the model over one batch. ``n_iter_`` is the number of
VB EM iterations of the last call; ``converged_`` says whether the last call's bound changed by less
than ``tol`` per unit of the batch's weight (its rows, or their ``sample_weight``) before ``max_iter``;
``lower_bound_`` is the exact bound over every row seen so far; ``lower_bounds_`` holds the last
call's iterations. No ``ConvergenceWarning``: a batch need not converge. Only the learners that
declare ``partial_fit`` (VB EM).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pipeline.engine.engines import make_engine, tree_reduce
from pipeline.fit.driver import CountingEngine, run_fit
from pipeline.fit.learners import learner_class, learner_names
from pipeline.fit.learners.vbem.learner import vbem_pass
from pipeline.fit.learners.vbem.memo import chunk_keys, kept_total
from pipeline.fit.projection import check_projection
from pipeline.fit.setup import build_prior, open_source, setup
from pipeline.fit.spec import FitSpec
from vbcore.errors import ConfigError, InputError
from vbcore.kernels.estep import KernelResult
from vbcore.kernels.projection import Projection
from vbcore.model.elbo import ElboTerms, elbo_terms
from vbcore.model.empirical import empirical_update
from vbcore.model.mstep import m_step
from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats


@dataclass
class PartialState:
    """What ``partial_fit`` keeps between calls: every batch's last statistics, the shift and the prior."""

    shift: np.ndarray
    prior: Prior
    memos: list[KernelResult] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # each batch's content key (learners.vbem.memo)
    #: each batch's data moments (the prior's data-dependent defaults follow their sum); None for a
    #: model fitted by ``fit``, whose rows' moments are not kept (its prior stays), or with ``pca``
    moments: list[SuffStats] | None = None
    #: the projection every batch is seen through (``pca``: the first batch's, or ``fit``'s)
    projection: Projection | None = None


@dataclass
class PartialOutcome:
    post: Posterior
    terms: ElboTerms
    history: list[float]
    converged: bool
    n_iter: int


def partial_fit(spec: FitSpec, X: Any, sample_weight: Any, engine: Any, state: PartialState | None,
                post: Posterior | None, prior: Prior | None, random_state: Any,
                projection: Projection | None = None) -> tuple[PartialOutcome, PartialState]:
    """Fold the batch ``X`` into ``state`` (None: the first batch) and update the posterior (see the
    module docstring). ``post``/``prior``/``projection``: a model to start from when ``state`` is None
    (a model fitted by ``fit``)."""
    if not learner_class(spec.learner).partial_fit:
        use = " or ".join(f"learner={name!r}" for name in learner_names(partial_fit=True))
        raise ConfigError(f"partial_fit runs VB EM on memoized statistics; learner {spec.learner!r} has no "
                          f"partial_fit (use {use})")
    source = open_source(X, int(spec.chunk_rows), sample_weight)
    eng = make_engine(engine, spec.persist)
    try:
        if state is None and post is None:
            return _first_fit(spec, source, eng, random_state)
        shift = None if state is None else state.shift
        projection = projection if state is None else state.projection
        if projection is not None:
            check_projection(projection, source.n_features, spec.pca, bool(spec.whiten), "partial_fit",
                             spec.normalize)
        elif spec.pca is not None:
            raise ConfigError(f"partial_fit: pca={spec.pca!r}, but the model was fitted without a projection")
        ctx = setup(spec, source, CountingEngine(eng), random_state, projection=projection, shift=shift)
        try:
            if state is None:
                state = PartialState(ctx.shift, ctx.prior if prior is None else prior, projection=projection)
            assert post is not None  # (an unfitted model's first call is _first_fit)
            if post.n_features != ctx.n_features:  # (projected rows: the projection's components)
                raise InputError(f"X has {ctx.n_features} features, but the model was fitted with "
                                 f"{post.n_features}")
            key = "/".join(chunk_keys(source))
            at = state.keys.index(key) if key in state.keys else len(state.memos)
            # the defaults of every row seen, this batch's included (the state changes only at the end)
            start = state.prior if state.moments is None else prior_of_rows(spec, state, ctx.moments, at,
                                                                            ctx.n_features)
            out, memo, end_prior = _iterate(spec, replace(ctx, prior=start), state, post, at)
        finally:
            ctx.engine.release(ctx.handles)
    finally:
        if eng is not engine:
            eng.close()
    state.prior = end_prior
    if at == len(state.memos):
        state.memos.append(memo)
        state.keys.append(key)
        if state.moments is not None:
            state.moments.append(ctx.moments)
    state.memos[at] = memo
    if state.moments is not None:
        state.moments[at] = ctx.moments
    return out, state


def prior_of_rows(spec: FitSpec, state: PartialState, batch: SuffStats, at: int, d: int) -> Prior:
    """The prior ``fit`` would build on every row seen (the kept batches' moments with ``batch`` at
    position ``at``, summed over the fixed tree), keeping the truncation and the values of the
    hyperparameters the bound re-estimates (:mod:`vbcore.model.empirical`)."""
    assert state.moments is not None
    parts = [*state.moments[:at], batch, *state.moments[at + 1:]]
    new = build_prior(spec, tree_reduce(parts), d, None)
    free = set(new.empirical) - {"strength"}
    if "degrees_of_freedom" in new.empirical:
        free |= {"covariance"}
    kept = {name: getattr(state.prior, name) for name in sorted(free)}
    if "strength" in new.empirical and new.covariance is not None:  # the bound's weight, the rows' variance
        nu0 = float(state.prior.degrees_of_freedom)
        kept.update(degrees_of_freedom=nu0, covariance=new.covariance * (nu0 / float(new.degrees_of_freedom)))
    return replace(new, n_components=state.prior.n_components, **kept)


def _first_fit(spec: FitSpec, source: Any, engine: Any,
               random_state: Any) -> tuple[PartialOutcome, PartialState]:
    """The first batch of an unfitted model: ``fit`` of the batch (one initialisation; growth and moves
    as the spec says) keeping memoized statistics (``memo``; 1 unless given: plain VB EM's bits),
    whose sum over the batch's chunks becomes the batch's statistics."""
    opts = dict(spec.learner_options)
    opts["memo"] = opts.get("memo") or 1.0
    out = run_fit(replace(spec, learner_options=opts), source, engine, random_state=random_state)
    memo = kept_total(out.kept)
    state = PartialState(np.asarray(memo.stats.shift), out.prior, [memo], ["/".join(chunk_keys(source))],
                         None if out.moments is None or spec.pca is not None else [out.moments],
                         out.projection)
    return PartialOutcome(out.post, out.terms, out.history, out.converged, out.n_iter), state


def _iterate(spec: FitSpec, ctx: Any, state: PartialState, post: Posterior,
             at: int) -> tuple[PartialOutcome, KernelResult, Prior]:
    """E-steps of the batch and M-steps of all statistics (the batch's at position ``at``), from the
    prior ``ctx.prior``, until the bound changes by less than ``tol`` per unit of the batch's weight,
    or ``max_iter``; returns the outcome, the batch's statistics and the prior at the end."""
    history: list[float] = []
    terms: ElboTerms | None = None
    memo: KernelResult | None = None
    converged = False
    prior = ctx.prior
    others = [m for i, m in enumerate(state.memos) if i != at]
    for _ in range(max(int(spec.max_iter), 1)):
        memo = vbem_pass(ctx, post)
        total = tree_reduce([*others[:at], memo, *others[at:]])
        post = m_step(total.stats, prior, ctx.reg_covar)
        prior = empirical_update(prior, post)  # as fit's M-step (never lowers the bound)
        terms = elbo_terms(total.stats, post, prior)
        history.append(terms.total)
        if len(history) > 1 and abs(history[-1] - history[-2]) / ctx.n_weight < float(spec.tol):
            converged = True
            break
    assert terms is not None and memo is not None
    return PartialOutcome(post, terms, history, converged, len(history)), memo, prior
