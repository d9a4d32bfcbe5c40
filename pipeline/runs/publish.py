"""Published versions of a clustering: versioned run directories and an atomic ``latest`` pointer.

A scheduled refresh (``vbcluster deploy``) publishes into one output directory::

    OUT/
      versions/
        v0001-3f2a9c1e/     a run directory (run.json, checkpoints/, result.json, posterior.npz, report/)
        v0002-8b01d4aa/     the suffix is the key of the run that made it (a Prefect flow-run id)
      latest -> versions/v0002-8b01d4aa     a symbolic link, replaced atomically (rename of a new link)

A version directory is claimed with ``mkdir`` (exclusive), so two refreshes never share one; the
same key gets the same directory back, so a retried run resumes from its own checkpoints. ``latest``
moves only after the version's ``result.json`` and ``posterior.npz`` exist, so a reader that follows
it always finds a whole result.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.engine.sources import StoreSource
from pipeline.files.atomic import replace_symlink
from pipeline.runs.directory import POSTERIOR, RESULT, read_result, verify_posterior
from pipeline.runs.lowrank_model import is_lowrank_run
from vbcore.errors import CheckpointError, InputError

VERSIONS = "versions"
LATEST = "latest"
_NAME = re.compile(r"^v(\d{4,})-(.+)$")


def version_dirs(out: str | os.PathLike[str]) -> list[Path]:
    """The version directories under ``OUT/versions``, oldest first."""
    root = Path(out) / VERSIONS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def claim_version(out: str | os.PathLike[str], key: str) -> Path:
    """The version directory of ``key``: the existing one, or ``vNNNN-key`` with the next free number."""
    key = re.sub(r"[^A-Za-z0-9_.-]", "-", key)[:40] or "run"
    root = Path(out) / VERSIONS
    root.mkdir(parents=True, exist_ok=True)
    for p in version_dirs(out):
        m = _NAME.match(p.name)
        if m and m.group(2) == key:
            return p
    while True:
        dirs = version_dirs(out)
        last = int(_NAME.match(dirs[-1].name).group(1)) if dirs else 0  # type: ignore[union-attr]
        path = root / f"v{last + 1:04d}-{key}"
        try:
            path.mkdir()
        except FileExistsError:  # another refresh took this number first
            continue
        return path


#: run.json keys that fix a fit's trajectory (a checkpoint resumes only under the same ones)
TRAJECTORY = ("learner", "components", "covariance", "weights", "seed", "init", "chunk_rows",
              "learner_options")


def unfinished_version(out: str | os.PathLike[str], fingerprint: str,
                       spec: dict[str, Any] | None = None) -> Path | None:
    """A version directory newer than ``latest`` whose refresh died mid-fit and can be resumed.

    That is the newest version without ``result.json`` whose run lock is free or stale (its
    process is gone), whose settings (``run.json``) match ``spec`` where they fix the trajectory,
    and whose newest valid checkpoint was written for the store's current content
    (``fingerprint``). None when there is none.
    """
    import json

    from pipeline.files.locks import RunLock
    from pipeline.fit.checkpoint import Checkpointer

    current = latest(out)
    for path in reversed(version_dirs(out)):
        if current is not None and path.resolve() == current:
            return None  # only versions newer than the published one
        if (path / RESULT).is_file() or not (path / "run.json").is_file():
            continue
        if spec is not None:
            old = json.loads((path / "run.json").read_text())
            if any((old.get(k) or None) != (spec.get(k) or None) for k in TRAJECTORY):
                continue
        if RunLock(path).is_held():
            continue  # a refresh is running in it
        try:
            loaded = Checkpointer(path / "checkpoints").load_latest()
        except CheckpointError:
            continue
        if loaded is not None and loaded.manifest.get("store_fingerprint") == fingerprint:
            return path
    return None


def latest(out: str | os.PathLike[str]) -> Path | None:
    """The published version ``OUT/latest`` points at, or None before the first publication.

    ``latest`` is only ever a symbolic link into ``OUT/versions`` that vbcluster made; anything else
    there (a plain directory or file, a link to nothing, a link out of ``OUT/versions``) is refused
    in one line naming it, so that a scheduled refresh never cold-fits, skips or publishes on the
    strength of a pointer vbcluster did not write.
    """
    out = Path(out)
    link = out / LATEST
    if not link.is_symlink():
        if link.exists():
            raise InputError(f"{link} is a {'directory' if link.is_dir() else 'file'}, not the symbolic link "
                             f"vbcluster publishes; move it away, then `ln -s {VERSIONS}/vNNNN-... {link}` "
                             "to the version to build on (or leave it absent for a cold start)")
        return None
    target = link.resolve()
    versions = (out / VERSIONS).resolve()
    if target.parent != versions or not _NAME.match(target.name):
        raise InputError(f"{link} points at {os.readlink(link)}, which is not a version directory of "
                         f"{out / VERSIONS}; point it at one (`ln -sfn {VERSIONS}/vNNNN-... {link}`) or "
                         "remove it for a cold start")
    if not target.is_dir():
        raise InputError(f"{link} points at {os.readlink(link)}, which does not exist (removed by hand?); "
                         f"point it at a version (`ln -sfn {VERSIONS}/vNNNN-... {link}`) or remove it for "
                         "a cold start")
    return target


def publish(out: str | os.PathLike[str], run_dir: str | os.PathLike[str]) -> Path:
    """Point ``OUT/latest`` at ``run_dir`` (a finished run under ``OUT/versions``), atomically."""
    out, run_dir = Path(out), Path(run_dir)
    if is_lowrank_run(run_dir):
        raise InputError(f"{run_dir}: a --covariance lowrank run cannot be published: a refresh warm-starts "
                         "from the published run, and the low-rank family has no warm start yet")
    for name in (RESULT, POSTERIOR):
        if not (run_dir / name).is_file():
            raise InputError(f"{run_dir}: no {name}; only a finished run can be published")
    verify_posterior(run_dir)  # a posterior that is not the one result.json describes is never published
    if run_dir.resolve().parent != (out / VERSIONS).resolve():
        raise InputError(f"{run_dir} is not a version directory of {out} (expected {out / VERSIONS}/...)")
    link = out / LATEST
    if link.exists() and not link.is_symlink():  # not ours: never replaced (latest() says so too)
        latest(out)
    # relative: the output directory may move; rename(2) over the old link: readers see the old or
    # the new, never none
    replace_symlink(link, Path(VERSIONS) / run_dir.name)
    return link


@dataclass(frozen=True)
class RefreshPlan:
    """What a scheduled refresh does: ``cold`` (fit from scratch), ``warm`` (start from the last
    published posterior) or ``skip`` (the store has not changed since the last publication)."""

    action: str
    previous: str | None
    reason: str
    n_rows: int
    previous_n_rows: int | None = None
    fingerprint: str = ""


def plan_refresh(out: str | os.PathLike[str], store: str) -> RefreshPlan:
    """Compare the store with the last published version (fingerprint and row count)."""
    src = StoreSource(store)  # a missing or invalid store fails here, before anything is written
    prev = latest(out)
    if prev is None:
        return RefreshPlan("cold", None, "no published version yet", src.n_rows, None, src.fingerprint)
    result = read_result(prev)
    verify_posterior(prev)  # a published posterior replaced since is refused, not skipped over
    old_n = int(result["n_rows"])
    if result.get("store_fingerprint") == src.fingerprint:
        return RefreshPlan("skip", str(prev), f"the store is unchanged since {prev.name}", src.n_rows, old_n,
                           src.fingerprint)
    if src.n_rows > old_n and int(result["n_features"]) == src.n_features:
        return RefreshPlan("warm", str(prev), f"the store grew from {old_n} to {src.n_rows} rows",
                           src.n_rows, old_n, src.fingerprint)
    return RefreshPlan("cold", str(prev), f"the store changed other than by appending rows "
                       f"({old_n} -> {src.n_rows} rows, {result['n_features']} -> {src.n_features} "
                       "features)", src.n_rows, old_n, src.fingerprint)
