"""Atomic files and directories: the one write-then-rename mechanism of vbcluster.

Every file or directory that a reader may find while it is being made is built under a temporary
name in the same directory (so the rename cannot cross a file system), flushed to disk with
``fsync``, and renamed into place with ``rename(2)``; the parent directory is fsynced after the
rename so the new name survives a power cut. A reader sees the old version or the new one, never a
half-written one. Checkpoints, run directories, reports, feature stores (new stores, the append
journal), the ``latest`` pointer of published versions and ``run.json`` all go through here.

Permissions follow the umask as ``open``/``mkdir`` would: files ``0o666 & ~umask``, directories
``0o777 & ~umask`` (``tempfile.mkstemp``/``mkdtemp`` alone would make them 0600/0700, unreadable
for colleagues on shared storage).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["file_mode", "dir_mode", "current_umask", "fsync_dir", "write_file", "write_bytes",
           "temp_dir", "rename", "replace_dir", "replace_symlink"]


def current_umask() -> int:
    """The process umask, read without changing it where the platform allows (Linux ``/proc``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: the classic read-and-restore (not thread-safe)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets under the current umask (``0o666 & ~umask``)."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """The mode a new directory gets under the current umask (``0o777 & ~umask``)."""
    return 0o777 & ~current_umask()


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (names created, renamed or removed in it) to disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory file descriptors
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any]) -> None:
    """Write the file ``path`` atomically: ``write(f)`` fills a temporary file beside it (binary
    mode), which is fsynced, given the umask's mode and renamed over ``path``.

    On any exception the temporary file is removed and ``path`` is left as it was; an OSError (disk
    full, permission denied) names ``path`` (:func:`named_oserror`).
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    except OSError as exc:
        raise named_oserror(exc, path) from exc
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise named_oserror(exc, path) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def named_oserror(exc: OSError, path: str | os.PathLike[str]) -> OSError:
    """The same error (disk full, permission denied ...) with the file it was writing named."""
    if exc.filename is not None and str(exc.filename) == str(path):
        return exc
    return OSError(exc.errno, f"{exc.strerror or exc} (writing {path})", str(path))


def write_bytes(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically (see :func:`write_file`)."""
    payload = data.encode() if isinstance(data, str) else data
    write_file(path, lambda f: f.write(payload))


def temp_dir(target: str | os.PathLike[str]) -> Path:
    """A new, empty, uniquely named directory beside ``target`` (``.NAME.tmp-*``) to build it in,
    with the umask's directory mode; the parent is created if needed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    os.chmod(tmp, dir_mode())
    return tmp


def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """``rename(2)`` ``src`` to ``dst`` (replacing a file or an empty directory there) and make the
    new name durable (fsync of ``dst``'s directory)."""
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


def replace_dir(tmp: str | os.PathLike[str], target: str | os.PathLike[str], *,
                discard: Callable[[Path], None] | None = None) -> None:
    """Move the finished directory ``tmp`` to ``target`` atomically.

    ``tmp``'s entries are fsynced and it gets the umask's directory mode. An old ``target`` is first
    renamed aside (``.NAME.old-*``) and removed only after the new one is in place, by ``discard``
    (default: ``shutil.rmtree``), so a crash leaves the old or the new directory under ``target``.
    """
    tmp, target = Path(tmp), Path(target)
    os.chmod(tmp, dir_mode())
    fsync_dir(tmp)
    old = None
    if target.exists() or target.is_symlink():
        old = _free_name(target, "old")
        os.replace(target, old)
    try:
        rename(tmp, target)
    except BaseException:
        if old is not None:  # put the old one back: target never stays missing
            os.replace(old, target)
        raise
    if old is not None:
        (discard or (lambda p: shutil.rmtree(p, ignore_errors=True)))(old)


def replace_symlink(link: str | os.PathLike[str], points_to: str | os.PathLike[str]) -> None:
    """Point the symbolic link ``link`` at ``points_to`` atomically: a new link is made under a
    temporary name and renamed over the old one, so readers see the old target or the new one."""
    link = Path(link)
    while True:
        tmp = _free_name(link, "tmp")
        try:
            os.symlink(points_to, tmp)
        except FileExistsError:  # taken since _free_name looked: draw again
            continue
        break
    try:
        rename(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _free_name(path: Path, kind: str) -> Path:
    """An unused hidden sibling name ``.NAME.KIND-<random>`` of ``path``."""
    while True:
        cand = path.parent / f".{path.name}.{kind}-{os.urandom(4).hex()}"
        if not (cand.exists() or cand.is_symlink()):
            return cand
