"""Temporaries of a store being built, with their writer recorded, and the cleaning of those whose
writer is gone.

A new feature store is built at a private sibling ``.OUT.tmp-<random>`` and renamed to ``OUT`` once
complete (:mod:`pipeline.ingest.writer`, :mod:`pipeline.extract.image_store`). A process killed meanwhile
(SIGKILL, node loss) leaves that directory, and the append journal of the temporary store beside
it, for ever. So before the temporary directory exists, :func:`make_temp` writes a **writer record**
``.OUT.tmp-<random>.writer`` beside it (atomically, :func:`pipeline.files.atomic.write_bytes`): host name,
pid, the process's start time (``/proc/PID/stat``, so that a reused pid is not taken for the writer)
and the boot id. :func:`release` removes the record once the temporary is gone (moved into place or
removed after a failure).

:func:`clean` (called by every ingest and by every :meth:`FeatureStore.open` with write access)
removes the temporaries of ``OUT`` whose writer is gone: the record names this host and the process
no longer runs there (no such pid, another process under that pid, or the machine was rebooted).
A temporary whose writer is alive, or whose record names another host (its process cannot be
checked from here), is left alone and mentioned in the log; so is a temporary without a record
(made by an older vbcluster). When no writer of ``OUT`` is left at all, the ``.OUT.old-*``
directories of a killed overwrite (the replaced store, renamed aside and not yet deleted) go too.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import secrets
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.files.atomic import fsync_dir, write_bytes

__all__ = ["WRITER", "make_temp", "release", "clean", "Cleaned", "writer_alive", "process_record"]

log = logging.getLogger(__name__)

WRITER = ".writer"  # suffix of the writer record beside a temporary


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_token(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, ``/proc/PID/stat`` field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()[19]


def process_record() -> dict[str, object]:
    """This process as :func:`writer_alive` checks it later: host, pid, the process's start time and
    the boot id (so a reused pid or a reboot is told apart from the recorded process). The store's
    temporaries and the run lock (:class:`pipeline.files.locks.RunLock`) record it."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _start_token(pid), "boot": _boot_id(),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}


def record_path(tmp: Path) -> Path:
    """The writer record of the temporary ``tmp``."""
    return tmp.parent / (tmp.name + WRITER)


def make_temp(target: str | os.PathLike[str]) -> Path:
    """A new, empty directory ``.NAME.tmp-<random>`` beside ``target`` to build it in, its writer
    (this process) recorded first (the parent is created if needed)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(process_record(), sort_keys=True)
    while True:
        tmp = target.parent / f".{target.name}.tmp-{secrets.token_hex(6)}"
        rec = record_path(tmp)
        if tmp.exists() or rec.exists():  # pragma: no cover - 48 random bits
            continue
        write_bytes(rec, payload)  # the record exists before the directory does
        try:
            os.mkdir(tmp)  # the umask's mode, as pipeline.files.atomic.temp_dir
        except FileExistsError:  # pragma: no cover - taken since we looked
            rec.unlink(missing_ok=True)
            continue
        fsync_dir(target.parent)
        return tmp


def release(tmp: str | os.PathLike[str]) -> None:
    """Forget the temporary ``tmp`` (already moved into place or removed): remove its record."""
    record_path(Path(tmp)).unlink(missing_ok=True)


def writer_alive(record: dict[str, object]) -> bool | None:
    """True when the writer of a record still runs, False when it is gone, None when that cannot be
    told from here (another host)."""
    if record.get("host") != socket.gethostname():
        return None
    boot = _boot_id()
    if record.get("boot") and boot and record["boot"] != boot:
        return False  # the machine was rebooted since
    try:
        pid = int(record["pid"])  # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError):
        return False  # a record without a pid names no process (a damaged record)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    start = record.get("start")
    return start is None or _start_token(pid) in (None, start)  # another process under a reused pid


@dataclass
class Cleaned:
    """What :func:`clean` did: the paths removed, and those left alone with the reason."""

    removed: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)


def _read_record(path: Path) -> dict[str, object]:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _describe(rec: dict[str, object]) -> str:
    return f"pid {rec.get('pid')} on host {rec.get('host')} (since {rec.get('created')})"


def _remove_temp(tmp: Path, done: Cleaned) -> None:
    """Remove a temporary, everything named after it (its store's append journals), then its record
    last, so that a cleaner killed half-way leaves a record for the next one."""
    own = [n for n in os.listdir(tmp.parent) if n.startswith(tmp.name + ".") and n != tmp.name + WRITER]
    targets = [tmp] + [tmp.parent / n for n in own]  # (no glob: a store's name may hold [ or *)
    for p in targets:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists() or p.is_symlink():
            p.unlink(missing_ok=True)
        done.removed.append(str(p))
    release(tmp)


def clean(target: str | os.PathLike[str]) -> Cleaned:
    """Remove the temporaries of ``target`` left by writers that are gone (see the module docstring);
    log the ones left alone. Returns what was removed and what was kept."""
    target = Path(target)
    done = Cleaned()
    parent = target.parent
    if "://" in str(target) or not parent.is_dir():
        return done
    prefix, old_prefix = f".{target.name}.tmp-", f".{target.name}.old-"
    try:
        listing = os.listdir(parent)
    except OSError:
        return done
    names = [n for n in listing if n.startswith(prefix)]
    old = [parent / n for n in listing if n.startswith(old_prefix)]
    temps = {n.removesuffix(WRITER) for n in names
             if "." not in n[len(prefix):].removesuffix(WRITER)}  # not the temps' own journals
    writers_left = False
    for name in sorted(temps):
        tmp = parent / name
        rec_file = record_path(tmp)
        if not rec_file.exists():
            if tmp.exists():
                done.kept.append((str(tmp), "no writer record (an older vbcluster made it); remove it "
                                  "yourself if no ingest into it runs"))
                writers_left = True
            continue
        rec = _read_record(rec_file)
        alive = writer_alive(rec)
        if alive is False:
            _remove_temp(tmp, done)
            continue
        writers_left = True
        why = "its writer is still running" if alive else "its writer runs on another host"
        done.kept.append((str(tmp), f"{why}: {_describe(rec)}"))
    if not writers_left and target.exists():
        for p in old:  # a killed overwrite's replaced store (listed before target was seen in place)
            shutil.rmtree(p, ignore_errors=True)
            done.removed.append(str(p))
    for path, why in done.kept:
        log.warning("left %s alone: %s", path, why)
    if done.removed:
        log.info("removed leftovers of killed ingests: %s", ", ".join(done.removed))
    return done
