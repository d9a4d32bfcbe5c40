"""The fit service: one fit of a spec on a source, with a run directory or without.

Every face calls it directly: the estimator (:class:`pipeline.estimator.VBMixture`), the command
line (``vbcluster fit``/``resume``), the flows and the schedules.

* :func:`fit` -- a resolved spec, a row source and an engine: the ``n_init`` restarts (one when warm
  starting) of :func:`pipeline.fit.driver.run_fit`, the best bound kept; the checkpoint directory's
  lock; a warm start (:class:`Warm`, checked by :func:`check_warm`). Returns the best restart's
  :class:`~pipeline.fit.driver.FitOutcome`.
* :func:`fit_run` -- one fit into a run directory. It validates everything first -- the spec
  (:mod:`pipeline.fit.spec`), the store, the warm start, what the run directory already holds -- and
  writes nothing until all of it passes. Then it takes the run lock, copies a warm start into
  ``RUN_DIR/warm_start/`` (:mod:`pipeline.runs.warm_start`), writes ``run.json`` with its record
  (so ``vbcluster resume RUN_DIR`` continues the same fit, warm start included), calls :func:`fit`
  with checkpoints in ``RUN_DIR/checkpoints`` (resuming from the newest valid one when the
  directory already holds this run), and writes ``result.json`` and ``posterior.npz``
  (:func:`pipeline.runs.directory.save_run`). A directory that holds another run is refused unless
  ``restart=True`` (``vbcluster fit --restart``), which starts over. ``warm_from`` starts from the
  posterior of a finished run directory instead of the initialisation (the prior is still the
  data-dependent default of the current store; see docs/operations.md, "Warm start").
* :func:`make_spec`, :func:`read_spec`, :func:`warm_record` -- the spec of a command-line fit, and
  of a run directory and its warm start; :func:`finished_result` -- a finished run's result.json.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.engine.engines import make_engine
from pipeline.engine.sources import StoreSource
from pipeline.files.atomic import write_file as write_atomic
from pipeline.files.locks import RunLock
from pipeline.fit.driver import FitOutcome, run_fit
from pipeline.fit.fitted import fitted_model
from pipeline.fit.setup import check_components, check_prior_settings, open_source
from pipeline.fit.spec import FitSpec
from pipeline.fit.wide import wide_settings
from pipeline.runs.directory import check_run_dir, read_result, save_run, verify_posterior
from pipeline.runs.warm_start import WARM_DIR, Warm, discard_warm, load_warm, save_warm, source_model
from vbcore.errors import ConfigError, InputError, VBClusterError
from vbcore.kernels.projection import check_pca

RUN_SPEC = "run.json"
#: what a run directory may hold; ``restart`` removes these before a new fit
RUN_FILES = ("checkpoints", "result.json", "posterior.npz", "lowrank.npz", "iterations.jsonl", "report",
             WARM_DIR)


def check_warm(warm: Warm, spec: FitSpec, n_features: int, run: str | Path | None = None) -> None:
    """A warm start against the new data's features and the spec (ConfigError naming each difference;
    ``run``: the run directory a command line or flow warm-starts from, else the estimator's own)."""
    post, proj = warm.posterior, warm.projection
    changed = [
        f"{name} {old!r} -> {new!r}"
        for name, old, new in (
            ("n_features", post.n_features if proj is None else proj.n_features_in, n_features),
            ("pca", None if proj is None else proj.n_components, spec.pca),
            ("whiten", proj is not None and proj.whiten, bool(spec.whiten)),
            ("covariance_type", post.covariance_type, spec.covariance),
            ("n_components", warm.prior.n_components,  # growth moves the truncation: any will do
             warm.prior.n_components if spec.grow else int(spec.components)),
            ("weight_concentration_prior_type", post.weight_type, spec.weights),
        )
        if old != new
    ]
    if changed:
        if run is None:
            raise ConfigError("warm_start: the new data or settings do not match the fitted model ("
                              + "; ".join(changed) + "); set warm_start=False to start over")
        raise ConfigError(f"cannot warm-start from {run}: the store or settings do not match its model ("
                          + "; ".join(changed) + "); drop --warm-from (warm_from) to start over")


def restart_seeds(random_state: Any, n_init: int) -> list[Any]:
    """The seed of each restart: the fit's own for the first (so ``n_init=1`` is one plain fit),
    then seeds derived from it (``SeedSequence(seed, spawn_key=(restart,))``); a RandomState or
    None draws them from one generator, as scikit-learn does."""
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        base = int(random_state)
        return [base] + [int(np.random.SeedSequence(base, spawn_key=(i,)).generate_state(1)[0])
                         for i in range(1, n_init)]
    if n_init == 1:
        return [random_state]
    from sklearn.utils import check_random_state

    rng = check_random_state(random_state)
    return [int(rng.randint(np.iinfo(np.int32).max)) for _ in range(n_init)]


def fit(spec: FitSpec, source: Any, engine: Any = "local", *, random_state: Any = None,
        checkpoint_dir: str | None = None, warm: Warm | None = None, resp_init: Any = None,
        callback: Callable[[dict[str, Any]], None] | None = None, verbose: int = 0,
        log_every: int = 10, stop: Any = None) -> FitOutcome:
    """Fit a resolved ``spec`` to ``source``: ``spec.n_init`` restarts (one with ``warm``), the one
    with the highest ELBO returned.

    ``engine``: 'local', an engine, a distributed.Client, a scheduler address or a cluster config (one
    made here is closed at the end). ``checkpoint_dir`` is locked for the fit (restarts checkpoint in
    ``restart-I`` below it). ``verbose``: 1 prints each restart and its end, 2 also every
    ``log_every`` iterations. ``stop``: the run's stop request
    (:class:`pipeline.fit.driver.StopRequest`, from :func:`pipeline.fit.driver.stop_on_signals`)."""
    if source.n_rows < 2:  # (a partial_fit batch may be one row: partial.py does not come here)
        raise InputError(f"{source.describe()}: found {source.n_rows} sample(s) (rows) while a minimum of 2 "
                         "is required to fit a mixture")
    lock = RunLock(checkpoint_dir).acquire() if checkpoint_dir is not None else None
    try:
        eng = make_engine(engine, spec.persist)
        try:
            if spec.select != "none" and warm is None and resp_init is None:
                return _select_and_fit(spec, source, eng, random_state, checkpoint_dir, callback, verbose,
                                       log_every, stop)
            return _restarts(spec, source, eng, random_state, checkpoint_dir, warm, resp_init, callback,
                             verbose, log_every, stop)
        finally:
            if eng is not engine:
                eng.close()
    finally:
        if lock is not None:
            lock.release()


def _select_and_fit(spec: FitSpec, source: Any, eng: Any, random_state: Any, checkpoint_dir: str | None,
                    callback: Any, verbose: int, log_every: int, stop: Any = None) -> FitOutcome:
    """Model selection (:mod:`pipeline.fit.select`): screen, fit the ``select_fits`` best in full (each
    in ``model-I`` below ``checkpoint_dir`` when more than one), keep the highest full bound."""
    from pipeline.fit.driver import report_stage
    from pipeline.fit.select import chosen_spec, finish, full_bounds, screen

    report_stage(callback, "selecting the model (screening candidates on a subsample)")
    selection = screen(spec, source, eng, random_state)
    n = min(int(spec.select_fits), len(selection.candidates))
    outs: dict[int, FitOutcome] = {}
    for i in range(n):
        ckpt = f"{checkpoint_dir}/model-{i}" if checkpoint_dir is not None and n > 1 else checkpoint_dir
        outs[i] = _restarts(chosen_spec(spec, selection.candidates[i]), source, eng, random_state, ckpt,
                            None, None, callback, verbose, log_every, stop)
    selection = finish(selection, full_bounds(outs, source, selection, spec.normalize))
    best = next(i for i, c in enumerate(selection.candidates) if c.chosen)
    outs[best].selection = selection.to_dict()
    return outs[best]


def _restarts(spec: FitSpec, source: Any, eng: Any, random_state: Any, checkpoint_dir: str | None,
              warm: Warm | None, resp_init: Any, callback: Any, verbose: int, log_every: int,
              stop: Any = None) -> FitOutcome:
    """``spec.n_init`` restarts (one with ``warm``); the one with the highest ELBO."""
    log = print if verbose >= 2 else None
    if spec.covariance == "lowrank":  # its own VB EM (pipeline.fit.lowrank: one start)
        from pipeline.fit.lowrank import run_lowrank

        return run_lowrank(spec, source, eng, random_state=random_state,  # type: ignore[return-value]
                           checkpoint_dir=checkpoint_dir, callback=callback, log=log, stop=stop)
    n_init = 1 if warm is not None else int(spec.n_init)
    best: FitOutcome | None = None
    projection = warm.projection if warm is not None else None
    for i, seed in enumerate(restart_seeds(random_state, n_init)):
        if verbose:
            print(f"Initialization {i}")
        ckpt = f"{checkpoint_dir}/restart-{i}" if checkpoint_dir is not None and n_init > 1 \
            else checkpoint_dir
        out = run_fit(spec, source, eng, random_state=seed, checkpoint_dir=ckpt,
                      warm=warm.posterior if warm is not None else None,
                      projection=projection,  # the restarts share one projection pass
                      previous_bound=warm.bound if warm is not None else None,
                      resp_init=resp_init, warm_state=warm.state if warm is not None else None,
                      callback=callback, log=log, log_every=log_every, stop=stop)
        if verbose:
            state = "converged" if out.converged else "did not converge"
            print(f"Initialization {state} after {out.n_iter} iterations; ELBO {out.terms.total:.6e}")
        projection = out.projection
        if best is None or out.terms.total > best.terms.total:
            best = out
    assert best is not None
    return best


def make_spec(store: str | None, warm_from: str | Path | None = None, **settings: Any) -> FitSpec:
    """A resolved, validated spec: :class:`FitSpec`'s defaults (a wide store's: :mod:`pipeline.fit.wide`)
    updated by ``settings`` (``None``: the default). With ``warm_from`` (a run directory) the model's
    settings left ``None`` (:meth:`FitSpec.identity`) and its learner's options are that run's: a warm
    start continues the same model; ``max_iter``, ``tol`` and execution settings are this fit's own."""
    if warm_from is not None:
        from pipeline.fit.select import kept_model  # (a selected run: the model it kept)
        settings = inherited_settings(kept_model(read_spec(warm_from), finished_result(warm_from)), settings)
    values = {k: v for k, v in settings.items() if v is not None}
    values.update(wide_settings(store, values) if store is not None and warm_from is None else {})
    if store is not None and warm_from is None and "components" not in values:
        values["components"] = default_components(store)
    if store is not None and warm_from is None and "select" not in values:
        values["select"] = default_select(store, values)  # its screen without the low-rank family:
        values.setdefault("select_lowrank", values["select"] == "none")  # FitSpec.select_lowrank
    return absolute_paths(FitSpec.from_dict({"store": store, **values}).resolved("pipeline"))


def default_components(store: str) -> int:
    """The starting K of a fit that gives none: :class:`FitSpec`'s default, or one component per row
    for a store of fewer rows (a 30-row store fits with K = 30 instead of refusing the default 50). A
    store that cannot be opened keeps the default: :func:`check_fit` reports what is wrong with it."""
    default = int(FitSpec().components)
    try:
        n_rows = StoreSource(store).n_rows
    except (VBClusterError, OSError):
        return default
    return max(1, min(default, n_rows))


def default_select(store: str, given: dict[str, Any]) -> str:
    """``--select`` of a fit giving none (:func:`pipeline.fit.select.default_select`; bad store: none)."""
    from pipeline.fit import select

    try:
        return select.default_select(StoreSource(store).n_features, given)
    except (VBClusterError, OSError):  # check_fit reports what is wrong with it
        return "none"


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


def _run_json(run_dir: str | Path) -> tuple[Path, dict[str, Any]]:
    """``run_dir``'s run.json and its values (one-line errors naming the file)."""
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
    return path, values


def read_spec(run_dir: str | Path) -> FitSpec:
    """The resolved spec of a run directory's ``run.json`` (one-line errors naming the file)."""
    path, values = _run_json(run_dir)
    values.pop("warm_start", None)  # the run's warm start, not a setting: warm_record
    spec = FitSpec.from_dict(values, where=str(path)).resolved("pipeline")
    store = spec.store
    if store is not None and "://" not in store and not Path(store).is_absolute() \
            and not Path(store).exists():
        raise InputError(f"{path} names the store {store!r} relative to the directory the fit was started "
                         f"in (written by a vbcluster before issue 29), and {Path(store).resolve()} does "
                         "not exist: resume from that directory, or write the store's absolute path into "
                         f"{RUN_SPEC}")
    return spec


def warm_record(run_dir: str | Path) -> dict[str, Any] | None:
    """The warm start that ``run_dir``'s run.json records (``warm_start``: the source run and the
    sha256 of its copies in ``RUN_DIR/warm_start/``, :mod:`pipeline.runs.warm_start`), or None for a
    cold run (and for a warm run written by a vbcluster before issue 53, which recorded none)."""
    path, values = _run_json(run_dir)
    record = values.get("warm_start")
    if record is None:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("from"), str) \
            or not isinstance(record.get("posterior_sha256"), str):
        raise InputError(f"{path}: 'warm_start' is not the record vbcluster writes (from, posterior_sha256, "
                         "kept_sha256); `vbcluster fit ... --warm-from ... --restart` starts the run over")
    return record


def finished_result(run_dir: str | Path) -> dict[str, Any] | None:
    """``run_dir``'s result.json when the run is finished (a readable result.json whose posterior
    matches it, and no checkpoint of a later iteration: a continued fit, ``fit --max-iter`` raised,
    killed after it), else None: a run to resume."""
    from pipeline.fit.checkpoint import Checkpointer

    if not (Path(run_dir) / "result.json").is_file():
        return None
    try:
        verify_posterior(run_dir)
        result = read_result(run_dir)
    except InputError:  # damaged: resuming rewrites it from the last checkpoint
        return None
    newest = Checkpointer(Path(run_dir) / "checkpoints").list()
    if newest and int(newest[-1].name.rsplit("-", 1)[-1]) > int(result.get("n_iter", 0)):
        return None
    return result


def warm_start_problem(previous: str | Path, spec: FitSpec) -> str | None:
    """Why the posterior in ``previous`` cannot start a fit with ``spec`` (None when it can)."""
    result = read_result(previous)
    if "lowrank" in (result.get("covariance"), spec.covariance):
        return "the low-rank family (--covariance lowrank) has no warm start yet (pipeline/fit/lowrank.py)"
    prev = result["settings"]
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
        held = [name for name in RUN_FILES if name != WARM_DIR and (run_dir / name).exists()]
        if run_dir.is_dir() and held and not restart:  # (warm-start copies alone: killed before run.json)
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
    """Every check of :func:`fit_run` that needs no lock and writes nothing (the warm start's source
    run included: its posterior read and matched to the store and the spec); returns
    :func:`run_dir_state`."""
    if spec.store is None:
        raise ConfigError("a run needs a store (the feature store to fit)")
    source = StoreSource(spec.store)  # a missing or bad store fails before anything is written
    check_run_dir(run_dir, spec.store)
    if spec.pca is not None:
        check_pca(int(spec.pca), source.n_features, source.n_rows)
    if warm_from is None:
        check_components(int(spec.components), source.n_rows, source.describe())
    if spec.covariance != "lowrank":  # (its prior has no settings to check: pipeline.fit.lowrank)
        check_prior_settings(spec, source.n_features if spec.pca is None else int(spec.pca))
    if warm_from is not None:
        problem = warm_start_problem(warm_from, spec)
        if problem:
            raise ConfigError(f"cannot warm-start from {warm_from}: {problem}")
        check_warm(source_model(warm_from), spec, source.n_features, warm_from)
    state = run_dir_state(run_dir, spec, restart)
    record = warm_record(run_dir) if state == "continue" else None
    if record is not None and warm_from is not None and record["from"] != str(Path(warm_from).resolve()):
        raise ConfigError(f"{run_dir} holds a run warm-started from {record['from']}; `vbcluster resume "
                          f"{run_dir}` continues it, --restart starts over there, or choose another "
                          "--run-dir")
    return state


def fit_run(run_dir: str | Path, spec: FitSpec, *, engine: Any = "local",
            warm_from: str | Path | None = None, callback: Callable[[dict[str, Any]], None] | None = None,
            extra: dict[str, Any] | None = None, restart: bool = False, stop: Any = None) -> dict[str, Any]:
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
    stop : pipeline.fit.driver.StopRequest, optional
        The run's stop request (:func:`pipeline.fit.driver.stop_on_signals`).
    """
    run_dir = Path(run_dir)
    t0 = time.perf_counter()
    state = check_fit(run_dir, spec, warm_from, restart)
    assert spec.store is not None
    source = open_source(spec.store, int(spec.chunk_rows))
    with RunLock(run_dir) as lock, _engine(engine) as eng:
        record = _prepare_run_dir(run_dir, spec, state, warm_from)
        info: dict[str, Any] = dict(extra or {})
        if lock.taken_over:
            info["took_over_lock_of"] = lock.taken_over
        warm = None
        if record is not None:  # the recorded warm start (the same on resume): the copies in the run
            # the posterior and prior only: the previous bound belongs to other data, so convergence
            # is judged within this fit; the projection is the previous rows' space, kept; the kept
            # state: memoized statistics of the unchanged chunks
            warm = load_warm(run_dir, record)
            check_warm(warm, spec, source.n_features, record["from"])
            info["warm_start_from"] = record["from"]
        ckpt = str(run_dir / "checkpoints")
        out = fit(spec, source, eng, random_state=spec.seed, checkpoint_dir=ckpt, warm=warm,
                  callback=callback, stop=stop)
        if not isinstance(out, FitOutcome):  # the low-rank family's own run files
            from pipeline.fit.select import Selection, choice
            from pipeline.runs.lowrank_run import save_lowrank_run

            kept = spec if out.selection is None else \
                replace(spec, **choice(Selection.from_dict(out.selection).winner()))
            return save_lowrank_run(run_dir, kept, out, source, info, time.perf_counter() - t0)
        fitted_spec = spec
        if out.selection is not None:  # the settings of the model kept (a VBMixture of them refits it)
            from pipeline.fit.select import Selection, choice

            fitted_spec = replace(spec, **choice(Selection.from_dict(out.selection).winner()))
            info["selection"] = out.selection
        model = fitted_model(out, run_settings(fitted_spec, ckpt, warm is not None), source)
        if out.resumed_from:
            info["resumed_from"] = out.resumed_from
        if warm is not None:
            info["adopted_chunks"] = int(out.adopted)
        # wall time over every attempt: a resumed fit adds this attempt to the checkpoint's total (and a
        screen = float((out.selection or {}).get("screen_seconds", 0.0))  # selection's screen, once)
        info["seconds"] = out.wall_seconds + screen if out.resumed_from else time.perf_counter() - t0
        info["bound"] = {"history": out.bound_kind, "final": "exact"}
        if out.bound_kind != "exact":  # the estimates' standard errors, nats (null: not known)
            se = [None if math.isnan(v) else float(v) for v in model.lower_bounds_se_]
            info["bound"]["history_se"] = se
        return save_run(run_dir, model, spec.store, extra=info, engine=eng)


def _prepare_run_dir(run_dir: Path, spec: FitSpec, state: str,
                     warm_from: str | Path | None) -> dict[str, Any] | None:
    """Under the run lock: the run files of another run removed (``restart``); for a new run the
    warm start copied in (:func:`pipeline.runs.warm_start.save_warm`), then run.json written with its
    record (the run exists from then on). Returns the run's warm-start record (None: cold)."""
    if state == "restart":
        for name in RUN_FILES:
            path = run_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    record = warm_record(run_dir) if state == "continue" else None
    if state == "continue" and (record is not None or warm_from is None):
        return record
    # a new run, or one written before run.json recorded its warm start (issue 53): record it now
    if warm_from is not None:
        record = save_warm(run_dir, warm_from)
    else:
        discard_warm(run_dir)  # (copies of a fit killed before its run.json)
    values = {**spec.to_dict(), **({"warm_start": record} if record is not None else {})}
    write_atomic(run_dir / RUN_SPEC, lambda f: f.write(json.dumps(values, indent=1).encode()))
    return record


def run_settings(spec: FitSpec, checkpoint_dir: str | None, warm_start: bool) -> dict[str, Any]:
    """The estimator parameters a run directory records (result.json's ``settings``): those of
    ``spec``, with the run's checkpoint directory and whether it was warm-started; a
    :class:`~pipeline.estimator.VBMixture` built from them fits the same model."""
    params = {**spec.estimator_params(), "checkpoint_dir": checkpoint_dir, "warm_start": warm_start}
    return dict(sorted(params.items()))

