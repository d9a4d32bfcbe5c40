"""Checkpoints and run locks: a killed run resumes and ends exactly where an uninterrupted one would.

Layout of a checkpoint directory (``CHECKPOINT_DIR/ckpt-00000012/``)::

    state.npz       the learner's global state (for VB EM: every posterior array), float64
    manifest.json   iteration, learner, config hash and settings, store fingerprint, RNG record,
                    ELBO history, sha256 of every file, and its own sha256 (``manifest_sha256``,
                    over its other keys); written last

A checkpoint is written into ``.ckpt-00000012.tmp-*/``, fsynced, and renamed into place; the last
``keep`` checkpoints are kept. Loading takes the newest checkpoint whose files match their sha256 and
reports every newer one it had to skip (truncated, corrupted, half-written). Learners with
per-sample state will add Zarr arrays beside ``state.npz`` (see docs/operations.md).

A run lock (``.lock``: pid, host, the process's start time and boot id, token; published whole by
``link``) keeps two processes out of one run directory; a lock whose process is gone (same host: no
such pid, or the pid now belongs to another process, or the machine rebooted) is stale and taken over.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import leftovers
from pipeline.atomic import named_oserror, replace_dir, temp_dir
from vbcore.errors import CheckpointError, RunLockedError

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


def _publish_lock(tmp: Path, path: Path, body: dict[str, Any]) -> None:
    """Make ``path`` appear with ``tmp``'s content at once (``link``); FileExistsError when it exists.

    File systems without hard links (some FUSE and SMB mounts) get O_EXCL and a write: the lock is
    then briefly empty, which competitors respect for ``RunLock.UNREADABLE_GRACE_S`` seconds.
    """
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(body))
        f.flush()
        os.fsync(f.fileno())


class RunLock:
    """An exclusive lock on a run directory or a ``checkpoint_dir`` (``.lock``: pid, host, start time,
    a random token). The one lock of the CLI (run directory) and the estimator (``checkpoint_dir``).

    The lock file appears with its whole content at once: the content is written to a private temp
    file, which is then hard-linked to ``.lock`` (``link`` fails when the name exists, so exactly one
    process wins). A competitor therefore never sees an empty or half-written lock; it treats a lock
    as stale only when its complete content names a process on this host that is gone (a lock that
    does not parse, which only an older vbcluster or a damaged disk leaves, after
    ``UNREADABLE_GRACE_S`` seconds). Removing a stale lock happens under a short guard file
    (``.lock.breaking``, O_EXCL) and only if ``.lock`` still holds the content judged stale, so two
    processes that both saw the same stale lock cannot remove each other's fresh one.
    """

    #: an unparsable lock younger than this is taken as being written by an older vbcluster
    UNREADABLE_GRACE_S = 10.0
    #: a guard file older than this was left by a process killed while breaking a stale lock
    GUARD_STALE_S = 30.0

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / ".lock"
        self.taken_over: dict[str, Any] | None = None
        self._token: str | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        token = os.urandom(8).hex()
        me = {**leftovers.process_record(), "started": time.time(), "token": token}
        tmp = self.path.with_name(f".lock.tmp-{os.getpid()}-{token}")
        try:
            with open(tmp, "w") as f:
                f.write(json.dumps(me))
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # disk full, permission denied: nothing left behind, the lock named
            tmp.unlink(missing_ok=True)
            raise named_oserror(exc, self.path) from exc
        try:
            for _ in range(20):
                try:
                    _publish_lock(tmp, self.path, me)
                except FileExistsError:
                    holder = self._holder()
                    if holder is None and not self.path.exists():
                        continue  # released (or broken) between our link and our read
                    if not self._stale(holder):
                        raise self._locked(holder) from None
                    if self._break(holder):
                        self.taken_over = holder if holder is not None else {"pid": None, "host": None}
                    else:
                        time.sleep(0.01)
                    continue
                self._token = token
                return self
        finally:
            tmp.unlink(missing_ok=True)
        raise RunLockedError(f"could not take the lock {self.path}: it keeps changing hands; retry")

    def is_held(self) -> bool:
        """True when ``.lock`` exists and is not stale (a live process, or one on another host, holds it)."""
        holder = self._holder()
        if holder is None and not self.path.exists():
            return False
        return not self._stale(holder)

    def _locked(self, holder: dict[str, Any] | None) -> RunLockedError:
        if holder is None:
            return RunLockedError(f"{self.path.parent} is locked by {self.path}, which is being written or "
                                  "unreadable; if no vbcluster process uses this directory, remove it")
        return RunLockedError(
            f"{self.path.parent} is in use by pid {holder.get('pid')} on host "
            f"{holder.get('host')} (since {time.ctime(holder.get('started', 0))}); "
            "wait for it, or point this run at another directory"
        )

    def _stale(self, holder: dict[str, Any] | None) -> bool:
        if holder is None:  # unparsable: an older vbcluster's half-written lock, or damage
            try:
                return time.time() - self.path.stat().st_mtime > self.UNREADABLE_GRACE_S
            except FileNotFoundError:
                return False
        return not self._alive(holder)

    def _break(self, seen: dict[str, Any] | None) -> bool:
        """Remove ``.lock`` if it still holds ``seen`` (judged stale); True when this call removed it."""
        guard = self.path.with_name(".lock.breaking")
        try:
            fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - guard.stat().st_mtime > self.GUARD_STALE_S:
                    guard.unlink(missing_ok=True)  # its process was killed while breaking
            except FileNotFoundError:
                pass
            return False
        try:
            if self._holder() != seen or (seen is None and not self._stale(None)):
                return False
            self.path.unlink(missing_ok=True)
            return True
        finally:
            os.close(fd)
            guard.unlink(missing_ok=True)

    def _holder(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    @staticmethod
    def _alive(holder: dict[str, Any]) -> bool:
        """Whether the lock's process still runs: its pid exists on this host *and* is the same
        process (start time and boot id, :func:`pipeline.leftovers.writer_alive`), so a pid reused by
        another process does not keep the lock; a holder on another host cannot be checked: alive."""
        return leftovers.writer_alive(holder) is not False

    def release(self) -> None:
        """Remove the lock if this object holds it (its token is in the file)."""
        try:
            holder = self._holder()
            if self._token is not None and holder is not None and holder.get("token") == self._token:
                self.path.unlink(missing_ok=True)
        except OSError:
            pass
        self._token = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
