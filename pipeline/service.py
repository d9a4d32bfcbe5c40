"""One fit into a run directory, for ``vbcluster fit``/``resume`` and the flows.

``fit_run(run_dir, spec)`` validates everything first -- the spec (:mod:`pipeline.fit.spec`), the store,
the warm start, what the run directory already holds -- and writes nothing until all of it passes.
Then it writes ``run.json`` (so ``vbcluster resume RUN_DIR`` works on the directory), takes the run
lock, fits with checkpoints in ``RUN_DIR/checkpoints`` (resuming from the newest valid one when the
directory already holds this run), and writes ``result.json`` and ``posterior.npz``. A directory
that holds another run is refused unless ``restart=True`` (``vbcluster fit --restart``), which
starts over. ``warm_from`` starts from the posterior of a finished run directory instead of the
initialisation (the prior is still the data-dependent default of the current store; see
docs/operations.md, "Warm start").
"""

from __future__ import annotations

import json
import math
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from sklearn.exceptions import ConvergenceWarning

from pipeline.engine.engines import make_engine
from pipeline.engine.sources import StoreSource
from pipeline.estimator import VBMixture
from pipeline.files.atomic import write_file as write_atomic
from pipeline.files.locks import RunLock
from pipeline.fit.setup import check_prior_settings
from pipeline.fit.spec import FitSpec
from pipeline.runs.directory import load_model, read_result, save_run
from vbcore.errors import ConfigError, InputError, TruncationWarning
from vbcore.kernels.projection import check_pca

RUN_SPEC = "run.json"
#: what a run directory may hold; ``restart`` removes these before a new fit
RUN_FILES = ("checkpoints", "result.json", "posterior.npz", "iterations.jsonl", "report")


def make_spec(store: str | None, warm_from: str | Path | None = None, **settings: Any) -> FitSpec:
    """A resolved, validated spec: the defaults of :class:`FitSpec` updated by ``settings``
    (``None`` values mean "the default"). With ``warm_from`` (a run directory), the model's settings
    left ``None`` (those a resumed run must keep: :meth:`FitSpec.identity`) are that run's instead of
    the defaults, and its learner options are kept where the learner is the same (options given here
    override them): a warm start continues the same model. ``max_iter``, ``tol`` and the execution
    settings (cluster, checkpoints) are this fit's own, as for any fit."""
    if warm_from is not None:
        settings = inherited_settings(read_spec(warm_from), settings)
    values = {k: v for k, v in settings.items() if v is not None}
    return absolute_paths(FitSpec.from_dict({"store": store, **values}).resolved("pipeline"))


def inherited_settings(previous: FitSpec, settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with every ``None`` model setting taken from ``previous`` (learner options
    merged, see :func:`make_spec`)."""
    model = {f.name for f in fields(FitSpec) if f.metadata["identity"]}
    base = previous.to_dict()
    out = {k: base.get(k) if v is None and k in model else v for k, v in settings.items()}
    given = dict(settings.get("learner_options") or {})
    same_learner = settings.get("learner") in (None, previous.learner)
    out["learner_options"] = {**(dict(previous.learner_options) if same_learner else {}), **given}
    return out


def absolute_paths(spec: FitSpec) -> FitSpec:
    """``spec`` with its local store and cluster config as absolute paths, so that the run.json it
    becomes resumes from any working directory (URLs, 'local' and scheduler addresses unchanged)."""
    from dataclasses import replace

    def local(path: str | None) -> bool:
        return path is not None and "://" not in path and not Path(path).is_absolute()

    changes: dict[str, Any] = {}
    if local(spec.store):
        changes["store"] = str(Path(str(spec.store)).resolve())
    if local(spec.cluster) and str(spec.cluster).endswith((".yaml", ".yml")):
        changes["cluster"] = str(Path(str(spec.cluster)).resolve())
    return replace(spec, **changes) if changes else spec


def read_spec(run_dir: str | Path) -> FitSpec:
    """The resolved spec of a run directory's ``run.json`` (one-line errors naming the file)."""
    path = Path(run_dir) / RUN_SPEC
    if not path.is_file():
        raise InputError(f"{run_dir}: no {RUN_SPEC} (not a run directory of `vbcluster fit`)")
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable ({exc}); the run's settings are lost: fit again "
                         "into a new directory") from None
    if not isinstance(values, dict):
        raise InputError(f"{path}: not a JSON object of settings")
    spec = FitSpec.from_dict(values, where=str(path)).resolved("pipeline")
    store = spec.store
    if store is not None and "://" not in store and not Path(store).is_absolute() \
            and not Path(store).exists():
        raise InputError(f"{path} names the store {store!r} relative to the directory the fit was started "
                         f"in (written by a vbcluster before issue 29), and {Path(store).resolve()} does "
                         "not exist: resume from that directory, or write the store's absolute path into "
                         f"{RUN_SPEC}")
    return spec


def model_from_spec(spec: FitSpec, engine: Any, checkpoint_dir: str | None, verbose: int = 0) -> VBMixture:
    """The estimator a resolved spec describes."""
    return VBMixture(**spec.estimator_params(), engine=engine, verbose=verbose, checkpoint_dir=checkpoint_dir)


def warm_start_problem(previous: str | Path, spec: FitSpec) -> str | None:
    """Why the posterior in ``previous`` cannot start a fit with ``spec`` (None when it can)."""
    prev = read_result(previous)["settings"]
    want = {"n_components": spec.components, "covariance_type": spec.covariance,
            "weight_concentration_prior_type": spec.weights, "pca": spec.pca, "whiten": spec.whiten}
    prev = {"pca": None, "whiten": False, **prev}  # runs from before the projection had none
    diff = [f"{k} {prev.get(k)!r} -> {v!r}" for k, v in want.items() if prev.get(k) != v]
    return None if not diff else "the settings differ from the previous run's (" + "; ".join(diff) + ")"


def run_dir_state(run_dir: str | Path, spec: FitSpec, restart: bool = False) -> str:
    """What a fit with ``spec`` does in ``run_dir``: 'new', 'continue' (same run) or 'restart'.

    Raises ConfigError, changing nothing, when the directory holds another run and ``restart`` is
    not set."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} exists and is not a directory")
    if not (run_dir / RUN_SPEC).is_file():
        if run_dir.is_dir() and any((run_dir / name).exists() for name in RUN_FILES) and not restart:
            raise ConfigError(f"{run_dir} holds run files but no {RUN_SPEC}; pass --restart to start over "
                              "there, or choose another --run-dir")
        return "new" if not restart else "restart"
    if restart:
        return "restart"
    old = read_spec(run_dir)
    diff = old.differences(spec)
    if diff:
        raise ConfigError(f"{run_dir} holds another run ({'; '.join(diff)}); `vbcluster resume {run_dir}` "
                          "continues it, --restart starts over there, or choose another --run-dir")
    return "continue"


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


def check_fit(run_dir: str | Path, spec: FitSpec, warm_from: str | Path | None = None,
              restart: bool = False) -> str:
    """Every check of :func:`fit_run` that needs no lock and writes nothing; returns
    :func:`run_dir_state`."""
    if spec.store is None:
        raise ConfigError("a run needs a store (the feature store to fit)")
    source = StoreSource(spec.store)  # a missing or bad store fails before anything is written
    if spec.pca is not None:
        check_pca(int(spec.pca), source.n_features, source.n_rows)
    check_prior_settings(spec, source.n_features if spec.pca is None else int(spec.pca))
    if warm_from is not None:
        problem = warm_start_problem(warm_from, spec)
        if problem:
            raise ConfigError(f"cannot warm-start from {warm_from}: {problem}")
    return run_dir_state(run_dir, spec, restart)


def fit_run(run_dir: str | Path, spec: FitSpec, *, engine: Any = "local",
            warm_from: str | Path | None = None, callback: Callable[[dict[str, Any]], None] | None = None,
            extra: dict[str, Any] | None = None, restart: bool = False) -> dict[str, Any]:
    """Fit ``spec.store`` into ``run_dir`` with checkpoints; returns the written result.json.

    Parameters
    ----------
    run_dir : path
        The run directory (created). A directory that already holds checkpoints of the same run
        resumes from the newest valid one (bit for bit the uninterrupted result).
    spec : FitSpec
        Resolved settings (:func:`make_spec`, :func:`read_spec`).
    engine : 'local', a scheduler address, a distributed.Client or a cluster config path
    warm_from : path, optional
        A finished run directory whose posterior starts this fit (``warm_start``).
    callback : callable, optional
        ``callback(info)`` after every iteration (``VBMixture.fit``'s callback).
    extra : dict, optional
        More entries for result.json.
    restart : bool
        Start over in a directory that holds another run (its run files are removed first).
    """
    run_dir = Path(run_dir)
    t0 = time.perf_counter()
    state = check_fit(run_dir, spec, warm_from, restart)
    assert spec.store is not None
    with RunLock(run_dir) as lock, _engine(engine) as eng:
        if state == "restart":
            for name in RUN_FILES:
                path = run_dir / name
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        if state != "continue":
            write_atomic(run_dir / RUN_SPEC, lambda f: f.write(json.dumps(spec.to_dict(), indent=1).encode()))
        model = model_from_spec(spec, eng, str(run_dir / "checkpoints"))
        info: dict[str, Any] = dict(extra or {})
        if lock.taken_over:
            info["took_over_lock_of"] = lock.taken_over
        if warm_from is not None:
            previous = load_model(warm_from)
            # the posterior and prior only: the previous bound belongs to other data, so convergence
            # is judged within this fit
            model.posterior_, model.prior_ = previous.posterior_, previous.prior_
            model.projection_ = previous.projection_  # the previous rows' space: kept, not recomputed
            model.warm_start = True
            model.warm_state_ = kept_state(warm_from)  # memoized statistics of the unchanged chunks
            info["warm_start_from"] = str(Path(warm_from).resolve())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # result.json records `converged`
            warnings.simplefilter("ignore", TruncationWarning)  # and `truncation` (the summary says it)
            model.fit(spec.store, callback=callback)
        if model.resumed_from_:
            info["resumed_from"] = model.resumed_from_
        if warm_from is not None:
            info["adopted_chunks"] = int(model.adopted_chunks_)
        # wall time over every attempt: a resumed fit adds this attempt to the checkpoint's total
        info["seconds"] = model.wall_seconds_ if model.resumed_from_ else time.perf_counter() - t0
        info["bound"] = {"history": model.bound_kind_, "final": "exact"}
        if model.bound_kind_ != "exact":  # the estimates' standard errors, nats (null: not known)
            se = [None if math.isnan(v) else float(v) for v in model.lower_bounds_se_]
            info["bound"]["history_se"] = se
        return save_run(run_dir, model, spec.store, extra=info, engine=eng)



def kept_state(run_dir: str | Path) -> dict[str, Any] | None:
    """What a warm start from ``run_dir`` may adopt: the learner state of its newest valid
    checkpoint (its memoized statistics, :mod:`pipeline.fit.learners.memo`), or None without one."""
    from pipeline.fit.checkpoint import Checkpointer
    from pipeline.fit.driver import LEARNER_KEY

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a skipped damaged checkpoint: an older one serves as well
        loaded = Checkpointer(Path(run_dir) / "checkpoints").load_latest()
    if loaded is None:
        return None
    return {k[len(LEARNER_KEY):]: v for k, v in loaded.state.items() if k.startswith(LEARNER_KEY)} or None
