"""Run locks: one process at a time in a run directory, a ``checkpoint_dir`` or a store's append.

A run lock (``.lock``: pid, host, the process's start time and boot id, token; published whole by
``link``) keeps two processes out of one directory; a lock whose process is gone (same host: no
such pid, or the pid now belongs to another process, or the machine rebooted) is stale and taken over.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any

from pipeline.files import leftovers
from pipeline.files.atomic import named_oserror
from vbcore.errors import RunLockedError


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
        process (start time and boot id, :func:`pipeline.files.leftovers.writer_alive`), so a pid reused by
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
