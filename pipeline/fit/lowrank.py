"""Fits of the low-rank-plus-diagonal family (``--covariance lowrank``, :mod:`vbcore.model.mfa`).

VB EM for the mixture of factor analysers as passes over the prepared chunks through the fit's engine
(in-process or Dask): each pass is one :func:`vbcore.model.mfa.estep` per chunk (the chunk times the
stacked ``Psi^-1 E[L_k]``, one float32 GEMM; the statistics in float64), reduced over the engine's fixed
tree, then the M-step and the exact bound on the driver. The start: k-means with K clusters on the
seeded subsample of whole chunks that model selection screens on
(:func:`pipeline.fit.select.screen_rows`), each cluster's mean and leading principal directions.

What it does not do yet (docs/algorithms.md): checkpoints and resume, growth and merge moves,
``--pca``, warm starts, ``assign`` and ``report`` on its run directory; ``VBMixture`` does not offer
it. result.json holds the bound, the clusters and the metrics of the fit's own assignments.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.fit.spec import FitSpec
from vbcore.kernels.estep import Chunk, prepare_chunk
from vbcore.kernels.init import moments_kernel
from vbcore.model import mfa
from vbcore.model.elbo import ElboTerms
from vbcore.model.priors import EMPIRICAL_ALPHA

#: the covariance family's name in FitSpec
LOWRANK = "lowrank"
#: the spawn key of the k-means start's draws
INIT_KEY = 52
#: merges proposed per round (each one engine pass), and when a round starts: the bound changing by
#: less than this many times ``tol`` per row
MERGE_TRIES = 8
MERGE_TOL_FACTOR = 100.0


@dataclass
class LowRankOutcome:
    """What a low-rank fit ends with (the fields of :class:`pipeline.fit.driver.FitOutcome` that
    model selection and the run directory read)."""

    post: mfa.MfaPosterior
    prior: mfa.MfaPrior
    terms: ElboTerms
    history: list[float]
    converged: bool
    n_iter: int
    wall_seconds: float
    labels: np.ndarray
    n_rows: int
    selection: dict[str, Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def n_effective(self) -> int:
        """Components holding at least one row's worth of responsibility."""
        return int(np.sum(self.counts >= 1.0))

    @property
    def counts(self) -> np.ndarray:
        wc = self.post.weight_concentration
        if self.post.weight_type == "dirichlet_process":
            return wc[0] - 1.0
        return wc - self.prior.weight_concentration


def stats_kernel(chunk: Chunk, post: mfa.MfaPosterior, operand: np.ndarray) -> mfa.MfaStats:
    """One chunk's E-step statistics (its rows are ``x - shift``; weighted rows by ``chunk.w``)."""
    w = None if chunk.w is None else np.asarray(chunk.w, dtype=np.float64)
    return mfa.estep(np.asarray(chunk.x), post, w, operand)[0]


def labels_kernel(chunk: Chunk, post: mfa.MfaPosterior, operand: np.ndarray) -> np.ndarray:
    """The most probable component of each row of a chunk."""
    return np.asarray(mfa.estep(np.asarray(chunk.x), post, None, operand)[1].argmax(1), dtype=np.int32)


def build_prior(spec: FitSpec, mean: np.ndarray, variance: np.ndarray) -> mfa.MfaPrior:
    """The weights' prior as the Gaussian families' (alpha0 given, else 1 for the DP under the pipeline's
    priors, else 1/K), ``m0`` the data mean, ``Psi`` floored at 1e-6 of the mean variance (as
    :func:`vbcore.model.priors.default_prior` floors the covariance prior)."""
    k = int(spec.components)
    alpha0 = spec.weight_concentration_prior
    if alpha0 is None:
        pipeline_dp = spec.weights == "dirichlet_process" and spec.priors != "sklearn"
        alpha0 = EMPIRICAL_ALPHA if pipeline_dp else 1.0 / k
    mean_var = float(np.mean(variance)) if variance.size else 1.0
    floor = 1e-6 * mean_var if mean_var > 0 else 1e-6
    return mfa.MfaPrior(str(spec.weights), float(alpha0), np.asarray(mean, dtype=np.float64), floor)


def _start(spec: FitSpec, source: Any, shift: np.ndarray, prior: mfa.MfaPrior,
           seed: int | None) -> mfa.MfaPosterior:
    """k-means on the seeded subsample of whole chunks, then each cluster's mean and principal directions."""
    from sklearn.cluster import KMeans

    from pipeline.fit.select import screen_rows

    rows = screen_rows(source, seed).astype(np.float64) - shift
    k = min(int(spec.components), len(rows))
    entropy = 0 if seed is None else int(seed)
    rng = np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(INIT_KEY,)))
    labels = KMeans(n_clusters=k, n_init=1, random_state=int(rng.integers(2**31 - 1))).fit(rows).labels_
    post = mfa.initial_posterior(rows, labels, k, int(spec.rank), prior, seed=int(rng.integers(2**31 - 1)))
    if k < int(spec.components):  # fewer sample rows than components: the others start empty
        post = mfa.initial_posterior(rows, labels, int(spec.components), int(spec.rank), prior,
                                     seed=int(rng.integers(2**31 - 1)))
    return post


def _iteration(engine: Any, handles: list[Any], post: mfa.MfaPosterior,
               prior: mfa.MfaPrior) -> tuple[mfa.MfaPosterior, mfa.MfaStats, ElboTerms]:
    """One VB EM iteration: the E-step pass, the M-step, the exact bound of the pair."""
    stats = engine.map_reduce(stats_kernel, handles, post, mfa.stacked_operand(post))
    new = mfa.m_step(stats, post, prior)
    return new, stats, mfa.elbo(stats, new, prior)


def _merge_round(engine: Any, handles: list[Any], post: mfa.MfaPosterior, stats: mfa.MfaStats,
                 terms: ElboTerms, prior: mfa.MfaPrior, tries: int) -> tuple[mfa.MfaPosterior, mfa.MfaStats,
                                                                             list[ElboTerms]]:
    """Up to ``tries`` merges of components that share rows (most shared first), each judged by
    the exact bound after one iteration from the merged posterior and kept only where it is higher than
    ``terms``'s: the kept steps' bounds (the history goes on rising)."""
    rejected: set[tuple[int, int]] = set()
    kept: list[ElboTerms] = []
    for _ in range(tries):
        pairs = [p for p in mfa.merge_candidates(stats, tries + len(rejected)) if p not in rejected]
        if not pairs or post.n_components < 2:
            break
        k, gone = pairs[0]
        proposal = mfa.merge_proposal(stats, post, prior, k, gone)
        new, new_stats, new_terms = _iteration(engine, handles, proposal, prior)
        if new_terms.total > terms.total:
            post, stats, terms = new, new_stats, new_terms
            kept.append(terms)
            rejected = {(a - (a > gone), b - (b > gone)) for a, b in rejected if not {a, b} & {k, gone}}
        else:
            rejected.add((k, gone))
    return post, stats, kept


def run_lowrank(spec: FitSpec, source: Any, engine: Any, *, random_state: Any = None,
                callback: Callable[[dict[str, Any]], None] | None = None,
                log: Callable[[str], None] | None = None) -> LowRankOutcome:
    """VB EM of the low-rank family on ``source`` with the resolved ``spec`` (``spec.components``
    components of rank ``spec.rank``) until the bound changes by less than ``spec.tol`` per row and a
    merge round keeps nothing, or ``spec.max_iter`` iterations (a kept merge counts as one). Merge
    rounds (off with ``-o moves=none``) start whenever the bound changes by less than
    ``MERGE_TOL_FACTOR * tol`` per row."""
    t0 = time.perf_counter()
    seed = spec.seed if random_state is None else random_state
    seed = None if seed is None else int(seed)
    moves = str(dict(spec.learner_options).get("moves", "auto")) != "none"
    shift = np.asarray(source.load(0)[0], dtype=np.float64)
    handles = engine.prepare(source, prepare_chunk, shift, "diag", False, None, expansion=1.0)
    try:
        moments = engine.map_reduce(moments_kernel, handles)
        n = float(moments.total_weight)
        prior = build_prior(spec, moments.mean[0], moments.scatter[0] / max(n, 1e-300))
        post = _start(spec, source, shift, prior, seed)
        history: list[float] = []
        converged, merging, terms = False, moves, None
        while len(history) < int(spec.max_iter) and not converged:
            t_it = time.perf_counter()
            post, stats, terms = _iteration(engine, handles, post, prior)
            steps = [terms]
            change = abs(terms.total - history[-1]) if history else np.inf
            if merging and change < MERGE_TOL_FACTOR * float(spec.tol) * n:
                tries = min(MERGE_TRIES, int(spec.max_iter) - len(history) - 1)
                post, stats, kept = _merge_round(engine, handles, post, stats, terms, prior, tries)
                steps += kept
                merging = bool(kept)
                change = np.inf if kept else change
            for step in steps:  # (a merge round keeps at most the iterations left)
                terms = step
                history.append(step.total)
                if log is not None:
                    log(f"  Iteration {len(history)}\t ELBO {step.total:.6e} (per row {step.total / n:.6f}), "
                        f"components {post.n_components}")
                if callback is not None:
                    callback({"iteration": len(history), "elbo": step.total,
                              "n_effective": int(np.sum(stats.nk >= 1.0)), "n_components": post.n_components,
                              "seconds": time.perf_counter() - t_it, "learner": "vbem", "bound": "exact"})
            converged = change < float(spec.tol) * n and not merging
        if terms is None:  # max_iter == 0: the start's bound needs one E-step
            terms = mfa.elbo(engine.map_reduce(stats_kernel, handles, post, mfa.stacked_operand(post)),
                             post, prior)
        labels = np.concatenate(engine.map(labels_kernel, handles, post, mfa.stacked_operand(post)))
    finally:
        engine.release(handles)
    return LowRankOutcome(post, prior, terms, history, converged, len(history), time.perf_counter() - t0,
                          labels, int(source.n_rows), options={"rank": int(spec.rank), "moves": moves})
