"""Checkpoints: a killed run resumes and ends exactly where an uninterrupted one would.

Layout of a checkpoint directory (``CHECKPOINT_DIR/ckpt-00000012/``)::

    state.npz       the learner's global state (for VB EM: every posterior array), float64
    manifest.json   iteration, learner, config hash and settings, store fingerprint, RNG record,
                    ELBO history, sha256 of every file, and its own sha256 (``manifest_sha256``,
                    over its other keys); written last

A checkpoint is written into ``.ckpt-00000012.tmp-*/``, fsynced, and renamed into place; the last
``keep`` checkpoints are kept. Loading takes the newest checkpoint whose files match their sha256 and
reports every newer one it had to skip (truncated, corrupted, half-written). Learners with
per-sample state will add Zarr arrays beside ``state.npz`` (see docs/operations.md).

The run lock that keeps two processes out of one run directory is :mod:`pipeline.files.locks`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.files.atomic import replace_dir, temp_dir
from vbcore.errors import CheckpointError

MANIFEST = "manifest.json"
STATE = "state.npz"
PREFIX = "ckpt-"
#: the manifest's own sha256 (over its other keys, canonical JSON), a key of the manifest
MANIFEST_SHA = "manifest_sha256"
#: fault injection for tests: seconds to pause between writing the state and the manifest
PAUSE_ENV = "VBCLUSTER_CHECKPOINT_PAUSE"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest_digest(body: dict[str, Any]) -> str:
    """sha256 of a manifest's content other than its own checksum, as JSON reads it back (keys made
    strings, then sorted: the digest does not depend on the order they were written in)."""
    rest = json.loads(json.dumps({k: v for k, v in body.items() if k != MANIFEST_SHA}))
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def config_hash(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def iteration_seed(entropy: int, iteration: int) -> np.random.SeedSequence:
    """The RNG of iteration ``iteration``: derived from the run's seed alone, so a resumed run draws
    exactly what the uninterrupted run drew (minibatch learners use it; VB EM draws nothing)."""
    return np.random.SeedSequence(entropy, spawn_key=(iteration,))


@dataclass
class Loaded:
    path: Path
    manifest: dict[str, Any]
    state: dict[str, np.ndarray]
    skipped: list[tuple[Path, str]] = field(default_factory=list)


class Checkpointer:
    """Writes, prunes and loads the checkpoints of one run."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3) -> None:
        if int(keep) < 1:
            raise CheckpointError(f"checkpoint keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = int(keep)

    def list(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if p.is_dir() and p.name.startswith(PREFIX))

    def save(self, iteration: int, state: dict[str, np.ndarray], manifest: dict[str, Any]) -> Path:
        """Write one checkpoint atomically; on any OSError the previous checkpoints are untouched."""
        final = self.directory / f"{PREFIX}{iteration:08d}"
        tmp: Path | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = temp_dir(final)
            with open(tmp / STATE, "wb") as f:
                np.savez(f, **state)  # type: ignore[arg-type]
                f.flush()
                os.fsync(f.fileno())
            pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
            if pause:
                time.sleep(pause)
            body = dict(manifest, iteration=int(iteration), files={STATE: sha256_file(tmp / STATE)},
                        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            body[MANIFEST_SHA] = manifest_digest(body)
            with open(tmp / MANIFEST, "w") as f:
                f.write(json.dumps(body, indent=1))
                f.flush()
                os.fsync(f.fileno())
            # a checkpoint of this iteration from an earlier attempt is replaced (removed after)
            replace_dir(tmp, final)
        except OSError as exc:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            prev = self.list()
            kept = f"the previous checkpoint ({prev[-1].name}) is intact" if prev else "no earlier checkpoint"
            raise CheckpointError(
                f"cannot write checkpoint {final}: {exc.strerror or exc}; {kept}"
            ) from exc
        self._prune()
        return final

    def _prune(self) -> None:
        for p in self.list()[: -self.keep]:
            shutil.rmtree(p, ignore_errors=True)
        for pattern in (f".{PREFIX}*.tmp-*", f".{PREFIX}*.old-*"):  # leftovers of killed writes
            for p in self.directory.glob(pattern):
                shutil.rmtree(p, ignore_errors=True)

    def load_latest(self) -> Loaded | None:
        """The newest checkpoint whose files verify, or None; ``skipped`` lists newer bad ones."""
        skipped: list[tuple[Path, str]] = []
        for path in reversed(self.list()):
            reason = _verify(path)
            if reason:
                skipped.append((path, reason))
                continue
            manifest = json.loads((path / MANIFEST).read_text())
            with np.load(path / STATE, allow_pickle=False) as z:
                state = {k: z[k] for k in z.files}
            return Loaded(path, manifest, state, skipped)
        if skipped:
            raise CheckpointError(
                f"no usable checkpoint in {self.directory}: "
                + "; ".join(f"{p.name}: {r}" for p, r in skipped)
            )
        return None


def _verify(path: Path) -> str | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return "no manifest (the write was interrupted)"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest ({exc})"
    if not isinstance(manifest, dict):
        return "the manifest is not a JSON object"
    # manifests of vbcluster before issue 29 carry no checksum of their own: read as they are
    if MANIFEST_SHA in manifest and manifest[MANIFEST_SHA] != manifest_digest(manifest):
        return (f"{MANIFEST} does not match its {MANIFEST_SHA} (edited or corrupted: its ELBO history, "
                "settings or RNG record would be resumed wrong)")
    files = manifest.get("files", {})
    if STATE not in files:
        return "the manifest lists no state file"
    for name, digest in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if sha256_file(f) != digest:
            return f"{name} does not match its sha256 (truncated or corrupted)"
    return None
