"""One fit into a run directory, as ``vbcluster fit`` does it, for callers other than the CLI (flows).

``fit_run(run_dir, spec)`` writes ``run.json`` (so ``vbcluster resume RUN_DIR`` works on the
directory), takes the run lock, fits with checkpoints in ``RUN_DIR/checkpoints`` (resuming from the
newest valid one when the directory already holds this run), and writes ``result.json`` and
``posterior.npz``. ``warm_from`` starts from the posterior of a finished run directory instead of
the initialisation (the prior is still the data-dependent default of the current store; see
docs/operations.md, "Warm start").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.atomic import write_file as write_atomic
from pipeline.checkpoint import RunLock
from pipeline.engine import make_engine
from pipeline.estimator import VBMixture
from pipeline.runs import load_model, read_result, save_run
from pipeline.sources import StoreSource
from vbcore.errors import ConfigError

RUN_SPEC = "run.json"
WEIGHTS = {"dp": "dirichlet_process", "dirichlet": "dirichlet_distribution"}

#: the settings of ``vbcluster fit`` (the keys of run.json) and their defaults
DEFAULT_SPEC: dict[str, Any] = {
    "learner": "vbem", "components": 50, "covariance": "diag", "weights": "dp", "max_iter": 200,
    "tol": 1e-4, "seed": 0, "init": "kmeans", "cluster": None, "chunk_rows": 65536,
    "checkpoint_every": 10, "checkpoint_seconds": None, "keep": 3,
}


def make_spec(store: str, **settings: Any) -> dict[str, Any]:
    """A complete run spec: the defaults of ``vbcluster fit`` updated by ``settings``."""
    unknown = sorted(set(settings) - set(DEFAULT_SPEC) - {"learner_options"})
    if unknown:
        raise ConfigError(f"unknown fit settings {unknown}; known: {sorted(DEFAULT_SPEC)}")
    spec = dict(DEFAULT_SPEC, store=store)
    spec.update(settings)
    if not spec.get("learner_options"):
        spec.pop("learner_options", None)
    return spec


def model_from_spec(spec: dict[str, Any], engine: Any, checkpoint_dir: str | None,
                    verbose: int = 0) -> VBMixture:
    """The estimator a run spec describes (``learner_options`` only where the estimator has them)."""
    kw: dict[str, Any] = dict(
        covariance_type=spec["covariance"],
        weight_concentration_prior_type=WEIGHTS.get(spec["weights"], spec["weights"]),
        max_iter=spec["max_iter"], tol=spec["tol"], random_state=spec["seed"],
        init_params=spec["init"], learner=spec["learner"], chunk_rows=spec["chunk_rows"],
        engine=engine, verbose=verbose, checkpoint_dir=checkpoint_dir,
        checkpoint_every=spec["checkpoint_every"], checkpoint_seconds=spec["checkpoint_seconds"],
        checkpoint_keep=spec["keep"],
    )
    if spec.get("learner_options"):
        kw["learner_options"] = dict(spec["learner_options"])
    return VBMixture(spec["components"], **kw)


def warm_start_problem(previous: str | Path, spec: dict[str, Any]) -> str | None:
    """Why the posterior in ``previous`` cannot start a fit with ``spec`` (None when it can)."""
    prev = read_result(previous)["settings"]
    want = {"n_components": spec["components"], "covariance_type": spec["covariance"],
            "weight_concentration_prior_type": WEIGHTS.get(spec["weights"], spec["weights"])}
    diff = [f"{k} {prev.get(k)!r} -> {v!r}" for k, v in want.items() if prev.get(k) != v]
    return None if not diff else "the settings differ from the previous run's (" + "; ".join(diff) + ")"


@contextmanager
def _engine(engine: Any) -> Iterator[Any]:
    """An engine for ``engine``; one made here is closed on exit (a client it opened, not a cluster
    it connected to)."""
    eng = make_engine(engine)
    try:
        yield eng
    finally:
        if eng is not engine:
            eng.close()


def fit_run(run_dir: str | Path, spec: dict[str, Any], *, engine: Any = "local",
            warm_from: str | Path | None = None, callback: Callable[[dict[str, Any]], None] | None = None,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fit ``spec["store"]`` into ``run_dir`` with checkpoints; returns the written result.json.

    Parameters
    ----------
    run_dir : path
        The run directory (created). A directory that already holds checkpoints of the same run
        resumes from the newest valid one (bit for bit the uninterrupted result).
    spec : dict
        The settings of ``vbcluster fit`` (see :func:`make_spec`).
    engine : 'local', a scheduler address, a distributed.Client or a cluster config path
    warm_from : path, optional
        A finished run directory whose posterior starts this fit (``warm_start``).
    callback : callable, optional
        ``callback(info)`` after every iteration (``VBMixture.fit``'s callback).
    extra : dict, optional
        More entries for result.json.
    """
    run_dir = Path(run_dir)
    t0 = time.perf_counter()
    StoreSource(spec["store"])  # a missing or bad store fails before anything is written
    from pipeline.learners import learner_class  # and so do a bad learner or its options

    learner_class(spec["learner"]).parse_options(spec.get("learner_options") or {})
    with RunLock(run_dir) as lock, _engine(engine) as eng:
        write_atomic(run_dir / RUN_SPEC, lambda f: f.write(json.dumps(spec, indent=1).encode()))
        model = model_from_spec(spec, eng, str(run_dir / "checkpoints"))
        info: dict[str, Any] = dict(extra or {})
        if lock.taken_over:
            info["took_over_lock_of"] = lock.taken_over
        if warm_from is not None:
            problem = warm_start_problem(warm_from, spec)
            if problem:
                raise ConfigError(f"cannot warm-start from {warm_from}: {problem}")
            model.posterior_ = load_model(warm_from).posterior_
            model.warm_start = True
            info["warm_start_from"] = str(Path(warm_from).resolve())
        model.fit(spec["store"], callback=callback)
        if getattr(model, "resumed_from_", None):
            info["resumed_from"] = model.resumed_from_
        info["seconds"] = time.perf_counter() - t0
        return save_run(run_dir, model, spec["store"], extra=info, engine=eng)
