"""The warm start of a run directory (``vbcluster fit --warm-from R1 --run-dir WK``), kept with the run.

A warm start is what a fit continues instead of an initialisation: the posterior of a finished run
(with its prior and projection, :class:`Warm`) and the kept state of that run's newest valid
checkpoint (memoized statistics a learner may adopt: :func:`kept_state`).

:func:`save_warm` copies both into ``WK/warm_start/`` -- ``posterior.npz`` (a byte copy of R1's,
verified against the ``posterior_sha256`` of R1's result.json) and ``kept.npz`` -- and returns the
record that ``WK/run.json`` keeps under ``warm_start``: the source run and each copy's sha256. The
fit itself starts from :func:`load_warm` of that record, and so does ``vbcluster resume WK``: a
refresh killed before its first checkpoint resumes from the same warm start, bit for bit, whatever
became of R1 since (docs/operations.md, "Warm start").
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.files.atomic import write_file
from pipeline.fit.checkpoint import sha256_file
from pipeline.runs.directory import POSTERIOR, load_fitted, read_result, verify_posterior
from vbcore.errors import InputError
from vbcore.kernels.projection import Projection
from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior

#: the folder of a run directory that holds its warm start's copies
WARM_DIR = "warm_start"
#: the kept learner state of the source run's newest valid checkpoint
KEPT = "kept.npz"


@dataclass(frozen=True)
class Warm:
    """What a warm start continues: the posterior (with its prior and projection), and optionally
    the previous fit's bound (convergence is judged across the two fits when the data are the same)
    and its kept state (memoized statistics a learner may adopt: ``FitOutcome.kept``)."""

    posterior: Posterior
    prior: Prior
    projection: Projection | None = None
    bound: float | None = None
    state: dict[str, np.ndarray] | None = None


def source_model(run_dir: str | Path) -> Warm:
    """The posterior, prior and projection of the finished run ``run_dir`` (its posterior verified
    against its result.json; a missing or damaged run is an InputError naming the file)."""
    previous = load_fitted(run_dir)
    return Warm(previous.posterior_, previous.prior_, previous.projection_)


def kept_state(run_dir: str | Path) -> dict[str, Any] | None:
    """What a warm start from ``run_dir`` may adopt: the learner state of its newest valid
    checkpoint (its memoized statistics, :mod:`pipeline.fit.learners.vbem.memo`), or None without one."""
    from pipeline.fit.checkpoint import Checkpointer
    from pipeline.fit.driver import LEARNER_KEY

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a skipped damaged checkpoint: an older one serves as well
        loaded = Checkpointer(Path(run_dir) / "checkpoints").load_latest()
    if loaded is None:
        return None
    return {k[len(LEARNER_KEY):]: v for k, v in loaded.state.items() if k.startswith(LEARNER_KEY)} or None


def save_warm(run_dir: str | Path, source: str | Path) -> dict[str, Any]:
    """Copy the warm start from the finished run ``source`` into ``run_dir/warm_start/`` (each file
    atomically); returns the record for run.json: ``from`` (the source, absolute), ``posterior_sha256``
    and ``kept_sha256`` (None when the source kept no state)."""
    source = Path(source).resolve()
    folder = Path(run_dir) / WARM_DIR
    folder.mkdir(parents=True, exist_ok=True)
    original = verify_posterior(source)
    write_file(folder / POSTERIOR, lambda f: f.write(original.read_bytes()))
    record: dict[str, Any] = {"from": str(source), "posterior_sha256": sha256_file(folder / POSTERIOR),
                              "kept_sha256": None}
    expected = read_result(source).get("posterior_sha256")
    if expected is not None and record["posterior_sha256"] != expected:
        raise InputError(f"{original} changed while it was copied for the warm start (another fit into "
                         f"{source}?); try again once that run is finished")
    kept = kept_state(source)
    if kept:
        write_file(folder / KEPT, lambda f: np.savez(f, **kept))
        record["kept_sha256"] = sha256_file(folder / KEPT)
    else:
        (folder / KEPT).unlink(missing_ok=True)
    return record


def load_warm(run_dir: str | Path, record: dict[str, Any]) -> Warm:
    """The warm start that ``record`` (run.json's ``warm_start``) describes, from the copies in
    ``run_dir/warm_start/``, each checked against its sha256 first."""
    folder = Path(run_dir) / WARM_DIR
    for name, key in ((POSTERIOR, "posterior_sha256"), (KEPT, "kept_sha256")):
        if record.get(key) is None:
            continue
        path = folder / name
        try:
            digest = sha256_file(path)
        except OSError as exc:
            digest = f"unreadable ({exc.strerror or exc})"
        if digest != record[key]:
            raise InputError(f"{path}: the copy of the warm start from {record.get('from')} is missing or "
                             f"does not match the {key} in {Path(run_dir) / 'run.json'} (damaged); "
                             "`vbcluster fit ... --warm-from ... --restart` starts the run over")
    model = source_model(folder)
    state = None
    if record.get("kept_sha256") is not None:
        with np.load(folder / KEPT, allow_pickle=False) as z:
            state = {k: z[k] for k in z.files}
    return Warm(model.posterior, model.prior, model.projection, state=state)


def discard_warm(run_dir: str | Path) -> None:
    """Remove the warm start's copies of ``run_dir`` (a cold fit, or one started over)."""
    shutil.rmtree(Path(run_dir) / WARM_DIR, ignore_errors=True)
