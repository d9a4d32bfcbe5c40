"""Fits of the low-rank-plus-diagonal family (``--covariance lowrank``, :mod:`vbcore.model.mfa`).

VB EM for the mixture of factor analysers as passes over the prepared chunks through the fit's engine
(in-process or Dask): each pass is one :func:`vbcore.model.mfa.estep` per chunk (the chunk times the
stacked ``Psi^-1 E[L_k]``, one float32 GEMM; the statistics in float64), reduced over the engine's fixed
tree, then the M-step and the exact bound on the driver. The start: k-means with K clusters on the
seeded subsample of whole chunks that model selection screens on
(:func:`pipeline.fit.select.screen_rows`), each cluster's mean and leading principal directions.

``reg_covar`` is the variance of a dequantization noise (:func:`vbcore.model.mfa.dequantized`): the
M-step adds it to ``Psi`` (as the Gaussian families' M-step adds it to their covariances) and the bound,
its history and the one in result.json, is that of the rows dequantized at it (exact, and never
decreasing under VB EM; the plain bound is higher by ``N/2 sum_d reg_covar / Psi_d``). Model selection
fits the family with ``reg_covar = eps^2 / 12`` (:mod:`pipeline.fit.select`).

Merge rounds judged by the exact bound, checkpoints and resume (the driver's checkpoint format and
identity checks); ``assign`` and ``report`` read its run directory (:mod:`pipeline.runs.lowrank_model`).
What it does not do yet (docs/algorithms.md): growth, ``--pca``, warm starts (so no ``publish`` for a
refresh); ``VBMixture`` does not offer it. result.json holds
the bound, the clusters and the metrics of the fit's own assignments.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pipeline.fit.spec import FitSpec
from vbcore.errors import FitInterrupted
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
    resumed_from: str | None = None
    #: the rows' shift (the store's first row): the posterior's means are relative to it
    shift: np.ndarray | None = None

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


def _pass(engine: Any, handles: list[Any], post: mfa.MfaPosterior, variance: float) -> mfa.MfaStats:
    """The E-step statistics of every chunk, of the rows dequantized at ``variance``
    (:func:`vbcore.model.mfa.dequantized`: the fit's ``reg_covar``)."""
    stats = engine.map_reduce(stats_kernel, handles, post, mfa.stacked_operand(post))
    return mfa.dequantized(stats, variance)


def _iteration(engine: Any, handles: list[Any], post: mfa.MfaPosterior, prior: mfa.MfaPrior,
               variance: float) -> tuple[mfa.MfaPosterior, mfa.MfaStats, ElboTerms]:
    """One VB EM iteration: the E-step pass, the M-step, the exact bound of the pair (of the rows
    dequantized at ``variance``)."""
    stats = _pass(engine, handles, post, variance)
    new = mfa.m_step(stats, post, prior)
    return new, stats, mfa.elbo(stats, new, prior)


def _merge_round(engine: Any, handles: list[Any], post: mfa.MfaPosterior, stats: mfa.MfaStats,
                 terms: ElboTerms, prior: mfa.MfaPrior, tries: int,
                 variance: float) -> tuple[mfa.MfaPosterior, mfa.MfaStats, list[ElboTerms]]:
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
        new, new_stats, new_terms = _iteration(engine, handles, proposal, prior, variance)
        if new_terms.total > terms.total:
            post, stats, terms = new, new_stats, new_terms
            kept.append(terms)
            rejected = {(a - (a > gone), b - (b > gone)) for a, b in rejected if not {a, b} & {k, gone}}
        else:
            rejected.add((k, gone))
    return post, stats, kept


def _post_arrays(post: mfa.MfaPosterior) -> dict[str, np.ndarray]:
    return {"weight_concentration": post.weight_concentration, "loadings": post.loadings,
            "precision": post.precision, "noise": post.noise, "ard": post.ard,
            "mean_precision": np.float64(post.mean_precision)}


def _post_from(state: dict[str, np.ndarray], weight_type: str) -> mfa.MfaPosterior:
    return mfa.MfaPosterior(np.asarray(state["weight_concentration"]), weight_type,
                            np.asarray(state["loadings"]), np.asarray(state["precision"]),
                            np.asarray(state["noise"]), np.asarray(state["ard"]),
                            float(state["mean_precision"]))


@dataclass
class _Loop:
    """The loop's state between iterations (what a checkpoint holds)."""

    post: mfa.MfaPosterior
    history: list[float]
    merging: bool
    converged: bool = False
    terms: ElboTerms | None = None
    saved_at: int = 0


def _save(ckpt: Any, loop: _Loop, identity: dict[str, Any]) -> Any:
    assert loop.terms is not None
    return ckpt.save(len(loop.history), _post_arrays(loop.post),
                     dict(identity, converged=loop.converged, elbo_history=loop.history,
                          merging=loop.merging, elbo_terms=asdict(loop.terms)))


def _resume_or_start(spec: FitSpec, source: Any, shift: np.ndarray, prior: mfa.MfaPrior, seed: int | None,
                     ckpt: Any, identity: dict[str, Any], moves: bool) -> tuple[_Loop, str | None]:
    """The newest valid checkpoint of this run (:func:`pipeline.fit.driver.load_checkpoint`: other data
    or settings are refused), else the k-means start."""
    from pipeline.fit.driver import load_checkpoint

    loaded = load_checkpoint(ckpt, identity) if ckpt is not None else None
    if loaded is None:
        return _Loop(_start(spec, source, shift, prior, seed), [], moves), None
    m = loaded.manifest
    loop = _Loop(_post_from(loaded.state, str(spec.weights)), [float(v) for v in m["elbo_history"]],
                 bool(m["merging"]), bool(m["converged"]), ElboTerms(**m["elbo_terms"]))
    loop.saved_at = len(loop.history)
    return loop, str(loaded.path)


def _record(loop: _Loop, steps: list[ElboTerms], stats: mfa.MfaStats, n: float, t_it: float,
            callback: Callable[[dict[str, Any]], None] | None, log: Callable[[str], None] | None) -> None:
    for step in steps:  # (a merge round keeps at most the iterations left)
        loop.terms = step
        loop.history.append(step.total)
        if log is not None:
            log(f"  Iteration {len(loop.history)}\t ELBO {step.total:.6e} (per row {step.total / n:.6f}), "
                f"components {loop.post.n_components}")
        if callback is not None:
            callback({"iteration": len(loop.history), "elbo": step.total,
                      "n_effective": int(np.sum(stats.nk >= 1.0)), "n_components": loop.post.n_components,
                      "seconds": time.perf_counter() - t_it, "learner": "vbem", "bound": "exact"})


def run_lowrank(spec: FitSpec, source: Any, engine: Any, *, random_state: Any = None,
                checkpoint_dir: str | None = None, callback: Callable[[dict[str, Any]], None] | None = None,
                log: Callable[[str], None] | None = None, stop: Any = None) -> LowRankOutcome:
    """VB EM of the low-rank family on ``source`` with the resolved ``spec`` (``spec.components``
    components of rank ``spec.rank``) until the bound changes by less than ``spec.tol`` per row and a
    merge round keeps nothing, or ``spec.max_iter`` iterations (a kept merge counts as one). Merge
    rounds (off with ``-o moves=none``) start whenever the bound changes by less than
    ``MERGE_TOL_FACTOR * tol`` per row. With ``checkpoint_dir``: a checkpoint every
    ``spec.checkpoint_every`` iterations and at the end (and on SIGINT/SIGTERM, as the Gaussian
    families' driver: ``stop``, the run's :class:`pipeline.fit.driver.StopRequest`), and a resume from
    the newest valid one, bit for bit."""
    from pipeline.fit.checkpoint import Checkpointer
    from pipeline.fit.driver import StopRequest, run_identity

    stop = stop if stop is not None else StopRequest()

    t0 = time.perf_counter()
    seed = spec.seed if random_state is None else random_state
    seed = None if seed is None else int(seed)
    moves = str(dict(spec.learner_options).get("moves", "auto")) != "none"
    variance = float(spec.reg_covar)
    ckpt = None if checkpoint_dir is None else Checkpointer(checkpoint_dir, int(spec.keep))
    identity = run_identity(spec, source) if ckpt is not None else {}
    shift = np.asarray(source.load(0)[0], dtype=np.float64)
    handles = engine.prepare(source, prepare_chunk, shift, "diag", False, None, expansion=1.0)
    try:
        moments = engine.map_reduce(moments_kernel, handles)
        n = float(moments.total_weight)
        prior = build_prior(spec, moments.mean[0], moments.scatter[0] / max(n, 1e-300))
        loop, resumed = _resume_or_start(spec, source, shift, prior, seed, ckpt, identity, moves)
        while len(loop.history) < int(spec.max_iter) and not loop.converged:
            t_it = time.perf_counter()
            last = loop.history[-1] if loop.history else None
            loop.post, stats, terms = _iteration(engine, handles, loop.post, prior, variance)
            steps = [terms]
            change = abs(terms.total - last) if last is not None else np.inf
            if loop.merging and change < MERGE_TOL_FACTOR * float(spec.tol) * n:
                tries = min(MERGE_TRIES, int(spec.max_iter) - len(loop.history) - 1)
                loop.post, stats, kept = _merge_round(engine, handles, loop.post, stats, terms, prior,
                                                      tries, variance)
                steps += kept
                loop.merging = bool(kept)
                change = np.inf if kept else change
            _record(loop, steps, stats, n, t_it, callback, log)
            loop.converged = change < float(spec.tol) * n and not loop.merging
            done = loop.converged or len(loop.history) >= int(spec.max_iter)
            if ckpt is not None and (done or stop.signum is not None
                                     or len(loop.history) - loop.saved_at >= int(spec.checkpoint_every)):
                saved, loop.saved_at = _save(ckpt, loop, identity), len(loop.history)
                if stop.signum is not None:
                    raise FitInterrupted(stop.signum, len(loop.history), str(saved))
        if loop.terms is None:  # max_iter == 0: the start's bound needs one E-step
            loop.terms = mfa.elbo(_pass(engine, handles, loop.post, variance), loop.post, prior)
        labels = np.concatenate(engine.map(labels_kernel, handles, loop.post, mfa.stacked_operand(loop.post)))
    finally:
        engine.release(handles)
    return LowRankOutcome(loop.post, prior, loop.terms, loop.history, loop.converged, len(loop.history),
                          time.perf_counter() - t0, labels, int(source.n_rows), resumed_from=resumed,
                          shift=shift,
                          options={"rank": int(spec.rank), "moves": moves, "reg_covar": variance})
