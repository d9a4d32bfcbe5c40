"""Run directories: what ``vbcluster fit`` writes and ``vbcluster assign`` reads.

A run directory holds ``result.json`` (learner, settings, store path and fingerprint, n_iter,
converged, ELBO and its history and terms, effective number of components, metrics against the
store's labels when it has them) and ``posterior.npz`` (the fitted attributes under the
estimator's names, plus the prior). Both are written under a temporary name and renamed into
place, so a killed fit never leaves a half-written result where a good one was.
"""

from __future__ import annotations

import json
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.engine.engines import LocalEngine, make_engine
from pipeline.engine.sources import StoreSource
from pipeline.files.atomic import named_oserror, temp_dir, write_file
from pipeline.files.atomic import replace_dir as publish_dir  # pipeline/runs/report.py imports it from here
from pipeline.fit.checkpoint import sha256_file
from pipeline.fit.fitted import FittedMixture
from pipeline.fit.spec import jsonable
from pipeline.runs.lowrank_model import (
    LOWRANK_FILE,
    NOT_GAUSSIAN,
    LowRankModel,
    is_lowrank_run,
    load_lowrank,
)
from pipeline.store.features import FeatureStore
from vbcore.data.metrics import acc, ari, nmi
from vbcore.errors import ConfigError, InputError, StoreError
from vbcore.kernels.estep import (
    Chunk,
    array_namespace,
    estep_params,
    prepare_chunk,
    responsibilities,
    to_host,
)
from vbcore.kernels.projection import Projection
from vbcore.model.posterior import posterior_arrays, posterior_from_arrays
from vbcore.model.priors import Prior

RESULT = "result.json"
POSTERIOR = "posterior.npz"
ASSIGNMENTS = "assignments"
#: what "clusters found" means in every output (fit summary, result.json's ``n_effective``, the report,
#: the demos, the progress bar): docs/guide.md section 5
CLUSTERS_FOUND = ("clusters found: components holding at least one expected row (N_k = sum_n q(z_n = k) "
                  ">= 1) at the end of the fit, result.json's n_effective")
WRITTEN_BY = "vbcluster assign"  # the attribute of every assignment group: the only kind assign replaces


#: system folders a run directory may neither be nor lie in (``/`` itself may not be one either)
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/sbin", "/sys", "/usr")
#: folders a run directory may lie in but not be
SHARED_DIRS = ("/home", "/media", "/mnt", "/opt", "/root", "/run", "/srv", "/tmp", "/var")


def check_run_dir(run_dir: str | Path, store: str | Path) -> None:
    """Refuse a run directory whose run files would land where they do not belong: the store itself or
    a folder inside it (its Zarr group), ``/``, a system folder or a folder shared by everything
    (``/tmp``), also when reached through a symbolic link; checked on the resolved paths before
    anything is written."""
    where = Path(run_dir).resolve()
    shown = f"--run-dir {run_dir}" + (f" (that is {where})" if str(where) != str(run_dir) else "")
    home = Path(store).resolve()
    if where == home or home in where.parents:
        raise ConfigError(f"{shown} is inside the feature store {store}: run files would land in its Zarr "
                          "group; choose a folder outside the store")
    if where == Path(where.anchor):
        what = "the root folder"
    elif any(where == Path(d) or Path(d) in where.parents for d in SYSTEM_DIRS):
        what = "a system folder"
    elif str(where) in SHARED_DIRS:
        what = "a folder shared by everything on the host"
    else:
        return
    raise ConfigError(f"{shown} is {what}: run files need a folder of their own; choose one, e.g. runs/NAME")


def _assign_kernel(chunk: Chunk, params: Any) -> tuple[np.ndarray, np.ndarray]:
    """MAP cluster and its responsibility per row, reduced where the chunk lives: on a GPU two
    (n,) vectors cross the bus, not the n x K responsibilities."""
    r = responsibilities(chunk, params)
    xp = array_namespace(r)
    return (to_host(xp.argmax(r, axis=1)).astype(np.int32),
            to_host(xp.max(r, axis=1)).astype(np.float32))


def assign_rows(model: Any, source: Any, engine: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """MAP cluster and its responsibility for every row of ``source``, chunk by chunk (projected
    first when the model has a projection); ``model``: a fitted ``VBMixture``, a
    :class:`~pipeline.fit.fitted.FittedMixture` or a low-rank run's
    :class:`~pipeline.runs.lowrank_model.LowRankModel`."""
    if isinstance(model, LowRankModel):
        return model.assign_rows(source, engine)
    eng = engine or LocalEngine(persist="never")
    shift = model.prior_.mean
    handles = eng.prepare(source, prepare_chunk, shift, model.posterior_.covariance_type, None,
                          model.projection_)
    try:
        parts = eng.map(_assign_kernel, handles, estep_params(model.posterior_, shift))
    finally:
        eng.release(handles)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def save_run(run_dir: str | Path, model: Any, store: str, *, extra: dict[str, Any] | None = None,
             engine: Any = None) -> dict[str, Any]:
    """Write result.json and posterior.npz for a fitted model (atomically); returns the result.

    ``model`` is a fitted ``VBMixture`` or a :class:`~pipeline.fit.fitted.FittedMixture` (the fit
    service's): the same fitted attributes, and ``get_params()`` for the settings.

    The store's row count and fingerprint are those the fit read (``model.fitted_store_``, taken when
    the fit opened the store), not the store's now: an append that committed during the fit is not
    counted, so ``assign`` and a scheduled refresh see that the store grew since."""
    run_dir = Path(run_dir)
    fitted = getattr(model, "fitted_store_", None)
    src = fitted if isinstance(fitted, StoreSource) and fitted.path == str(store) else StoreSource(store)
    result: dict[str, Any] = {
        "learner": model.learner,
        "settings": {k: jsonable(v) for k, v in model.get_params().items() if k != "engine"},
        "learner_options": {k: jsonable(v) for k, v in getattr(model, "learner_options_", {}).items()},
        "store": str(Path(store).resolve()) if "://" not in store else store,
        "store_fingerprint": src.fingerprint,
        "n_rows": src.n_rows,
        "n_features": src.n_features,
        "n_iter": int(model.n_iter_),
        "converged": bool(model.converged_),
        "elbo": float(model.lower_bound_),
        "elbo_history": [float(v) for v in model.lower_bounds_],
        "elbo_terms": model.elbo_terms_,
        "n_components": int(model.n_components),
        "n_effective": int(model.n_effective_),
        "n_components_kept": int(getattr(model, "n_components_", model.n_components)),  # after pruning
        "counts": [float(c) for c in model.counts_],
        "truncation": {k: jsonable(v) for k, v in getattr(model, "truncation_", {}).items()},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    labels = src.labels()
    if labels is not None:
        pred, _ = assign_rows(model, src, engine)
        w = src.all_weights()  # weighted rows count w times (0: not at all), as in the fit
        held = pred if w is None else pred[w > 0]
        result["metrics"] = {"nmi": nmi(labels, pred, w), "acc": acc(labels, pred, w),
                             "ari": ari(labels, pred, w), "clusters_used": int(len(np.unique(held)))}
    result.update(extra or {})
    run_dir.mkdir(parents=True, exist_ok=True)
    # posterior first, then result.json (which names the posterior's sha256): a reader that finds a
    # result.json always finds the posterior it describes; a failure leaves the old pair in place
    # (a crash between the two renames leaves the new posterior with the old result, which the
    # sha256 in result.json exposes)
    write_file(run_dir / POSTERIOR, lambda f: _write_posterior(f, model))
    result["posterior_sha256"] = sha256_file(run_dir / POSTERIOR)
    write_file(run_dir / RESULT, lambda f: f.write(json.dumps(result, indent=2).encode()))
    return result


def _write_posterior(f: Any, model: Any) -> None:
    post, prior = model.posterior_, model.prior_
    arrays: dict[str, Any] = {
        **posterior_arrays(post, suffix="_"),
        "weights_": model.weights_,
        "precisions_": model.precisions_,
        "precisions_cholesky_": model.precisions_cholesky_,
        "lower_bounds_": model.lower_bounds_,
        "counts_": model.counts_,
        "prior_mean": prior.mean,
        "meta": np.array(json.dumps({
            "covariance_type": post.covariance_type, "weight_type": post.weight_type,
            "n_components": prior.n_components, "weight_concentration": prior.weight_concentration,
            "mean_precision": prior.mean_precision, "degrees_of_freedom": prior.degrees_of_freedom,
            "fixed_variance": prior.fixed_variance, "n_iter": int(model.n_iter_),
            "empirical": list(prior.empirical),
            "converged": bool(model.converged_), "elbo_terms": model.elbo_terms_,
            "settings": {k: jsonable(v) for k, v in model.get_params().items() if k != "engine"},
            "learner_options": {k: jsonable(v) for k, v in getattr(model, "learner_options_", {}).items()},
        })),
    }
    if prior.covariance is not None:
        arrays["prior_covariance"] = prior.covariance
    if model.projection_ is not None:
        arrays.update(model.projection_.to_arrays())
    np.savez(f, **arrays)


def load_fitted(run_dir: str | Path) -> FittedMixture:
    """The fitted model of a run directory (its posterior verified against result.json);
    :func:`pipeline.estimator.load_model` makes a ``VBMixture`` of it. A low-rank run is refused
    (:func:`load_run_model` reads it)."""
    run_dir = Path(run_dir)
    path = verify_posterior(run_dir)
    if path.name == LOWRANK_FILE:
        raise InputError(f"{run_dir}: {NOT_GAUSSIAN}")
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            post = posterior_from_arrays(z, meta["covariance_type"], meta["weight_type"], suffix="_")
            prior = Prior(meta["covariance_type"], meta["weight_type"], meta["n_components"],
                          meta["weight_concentration"], meta["mean_precision"], z["prior_mean"],
                          meta["degrees_of_freedom"],
                          z["prior_covariance"] if "prior_covariance" in z else None,
                          meta["fixed_variance"])
            history = z["lower_bounds_"]
            projection = Projection.from_arrays(z)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: unreadable posterior ({type(exc).__name__}: {_first_line(exc)}); "
                         "refit the run") from None
    from vbcore.model.elbo import ElboTerms

    terms = meta["elbo_terms"]
    return FittedMixture(post, prior, ElboTerms(terms["log_likelihood"], terms["kl_assignments"],
                                                terms["kl_weights"], terms["kl_components"]),
                         list(history), meta["converged"], meta["n_iter"], projection=projection,
                         settings=meta["settings"])


def load_run_model(run_dir: str | Path) -> FittedMixture | LowRankModel:
    """The model of any finished run (verified against result.json): a :class:`FittedMixture`, or a
    :class:`~pipeline.runs.lowrank_model.LowRankModel` for a ``--covariance lowrank`` run."""
    if verify_posterior(run_dir).name == LOWRANK_FILE:
        return load_lowrank(run_dir, read_result(run_dir))
    return load_fitted(run_dir)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else "no details"


def verify_posterior(run_dir: str | Path) -> Path:
    """The run's posterior.npz (a low-rank run's lowrank.npz), after checking it against the
    ``posterior_sha256`` that result.json records (a posterior replaced by another run's, or damaged,
    is refused naming the file)."""
    run_dir = Path(run_dir)
    path = run_dir / (LOWRANK_FILE if is_lowrank_run(run_dir) else POSTERIOR)
    if not path.is_file():
        raise InputError(f"{run_dir}: no {POSTERIOR} (not a finished vbcluster run directory)")
    if not (run_dir / RESULT).is_file():
        return path  # a posterior without its result (written first by save_run): nothing to check
    expected = read_result(run_dir).get("posterior_sha256")
    if expected is not None:
        try:
            actual = sha256_file(path)
        except OSError as exc:
            raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        if actual != expected:
            raise InputError(f"{path} does not match the posterior_sha256 recorded in {run_dir / RESULT} "
                             "(replaced by another run's or damaged); refit, or restore the run's posterior")
    return path


def read_result(run_dir: str | Path) -> dict[str, Any]:
    """result.json of a finished run; a missing, truncated or damaged file is one clear error."""
    path = Path(run_dir) / RESULT
    if not path.is_file():
        raise InputError(f"{run_dir}: no {RESULT} (not a finished vbcluster run directory)")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise InputError(f"{path}: unreadable ({type(exc).__name__}: {_first_line(exc)}); the file is "
                         "truncated or damaged: refit the run") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}; refit the run")
    return data


def assign_store(run_dir: str | Path, *, store: str | None = None, name: str | None = None,
                 engine: Any = None, format: str = "zarr", out: str | Path | None = None) -> Path:
    """Write the run's MAP labels and their probability for every row of the store, atomically.

    ``format='zarr'`` (default): a Zarr group ``STORE/assignments/NAME`` next to the features, with
    arrays ``labels`` (int32) and ``probability`` (float32). ``format='parquet'`` or ``'csv'``: a
    table file (default ``RUN_DIR/assignments.parquet`` / ``.csv``, or ``out``) with the columns
    ``row``, ``id`` (when the store has row ids), ``label``, ``probability``, one row per store row
    (:mod:`pipeline.runs.assign_formats`). Everything is written under a temporary name and renamed into
    place. Refuses a store whose content changed since the fit (fingerprint). Returns the path written.
    """
    from pipeline.runs import assign_formats

    fmt = assign_formats.check_format(format)
    if fmt == "zarr" and out is not None:
        raise ConfigError("out is for the parquet and csv formats; the zarr format writes "
                          "STORE/assignments/NAME (choose NAME with name)")
    if fmt != "zarr" and name is not None:
        raise ConfigError(f"name is the Zarr group of the zarr format; for {fmt} choose the file with out")
    result = read_result(run_dir)
    model = load_run_model(run_dir)
    store = store or result["store"]
    if "://" in store and fmt == "zarr":
        raise StoreError(f"{store}: assignments are written next to local stores only")
    if fmt == "zarr":  # checked before any work: a name that leaves the store, a group not ours
        target = assignment_target(store, name if name is not None else Path(run_dir).resolve().name,
                                   default=name is None)
    src = StoreSource(store)
    if src.fingerprint != result["store_fingerprint"]:
        raise StoreError(
            f"{store} changed since the run in {run_dir} was fitted (fingerprint differs); refit, or "
            "pass the store the run was fitted on"
        )
    eng = make_engine(engine) if engine is not None else None
    labels, prob = assign_rows(model, src, eng)
    attrs = {"run_dir": str(Path(run_dir).resolve()), "store_fingerprint": src.fingerprint,
             "n_effective": int(model.n_effective_), "posterior_sha256": result.get("posterior_sha256")}
    if fmt != "zarr":
        path = Path(out) if out is not None else assign_formats.default_path(run_dir, fmt)
        if not path.parent.is_dir():
            raise InputError(f"{path.parent}: no such directory (for the {fmt} assignments {path.name})")
        tbl = assign_formats.table(labels, prob, FeatureStore.open(store).read_ids())
        write_file(path, assign_formats.writer(tbl, fmt, {k: str(v) for k, v in attrs.items()}))
        return path
    import zarr

    group = Path(store) / ASSIGNMENTS
    made_group = not group.exists()
    tmp: Path | None = None
    try:
        if not (group / "zarr.json").exists():
            zarr.open_group(str(group), mode="a")
        tmp = temp_dir(target)
        g = zarr.open_group(str(tmp), mode="w")
        chunks = (FeatureStore.open(store).chunk_rows,)
        g.create_array("labels", data=labels, chunks=chunks)
        g.create_array("probability", data=prob, chunks=chunks)
        g.attrs.update({**attrs, "written_by": WRITTEN_BY})
        publish_dir(tmp, target)
    except BaseException as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if made_group:  # the assignments group this call began: gone again if it holds nothing else
            _remove_if_bare(group)
        if isinstance(exc, OSError):  # disk full, permission denied: the assignments named
            raise named_oserror(exc, target) from exc
        raise
    return target


def _remove_if_bare(group: Path) -> None:
    """Remove an assignments group that holds nothing but its own ``zarr.json``."""
    try:
        if {p.name for p in group.iterdir()} <= {"zarr.json"}:
            (group / "zarr.json").unlink(missing_ok=True)
            group.rmdir()
    except OSError:
        pass


def assignment_target(store: str, name: str, *, default: bool = False) -> Path:
    """``STORE/assignments/NAME``, refused unless ``name`` is one plain path component (no ``/``,
    ``\\``, ``..``, no leading ``.``: names never leave the store) and whatever is there is an
    assignment group vbcluster wrote (its ``written_by`` attribute, or the attributes of one written
    before that attribute existed)."""
    hint = "give --name (name=) a plain name" if default else "choose another --name (name=)"
    if (not isinstance(name, str) or name in ("", ".", "..") or name.startswith(".")
            or any(c in name for c in "/\\\0")):
        raise InputError(f"assignment name {name!r} is not a plain name inside {store}/{ASSIGNMENTS} (no "
                         f"'/', '\\', '..' or leading '.'); {hint}")
    folder = Path(store) / ASSIGNMENTS
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError(f"{folder} is not a directory of the store; refusing to write assignments "
                         "through it")
    target = folder / name
    if target.exists() or target.is_symlink():
        attrs = _group_attrs(target)
        old = {"run_dir", "store_fingerprint", "n_effective"} <= set(attrs)  # before written_by existed
        ours = attrs.get("written_by") == WRITTEN_BY or old
        if target.is_symlink() or not ours:
            raise InputError(f"{target} exists and is not an assignment group vbcluster wrote; refusing to "
                             f"replace it: {hint}")
    return target


def _group_attrs(path: Path) -> dict[str, Any]:
    """The attributes in a Zarr v3 group's zarr.json ({} when it is not one)."""
    try:
        meta = json.loads((path / "zarr.json").read_text())
    except (OSError, ValueError):
        return {}
    attrs = meta.get("attributes") if isinstance(meta, dict) and meta.get("node_type") == "group" else None
    return attrs if isinstance(attrs, dict) else {}
