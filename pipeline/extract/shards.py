"""The shard files of an extraction's work folder (``OUT.extract-KEY/shard-NNNNNN.npz``,
:mod:`pipeline.extract.extraction`): written atomically, each carrying an id (a hash of its number and of the
ids of the images it holds), and read back verified.

A shard that does not open (truncated, damaged: zip CRC), lacks an array, or carries another id
(shard files swapped or copied between work folders) is never used: before the extraction runs,
:func:`usable` removes it with a warning naming the shard and its folder, and it is extracted again;
a shard damaged after that check stops the write with one line naming both (:func:`read_shard`).
Shards written before they carried ids are extracted again the same way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from vbcore.errors import InputError

__all__ = ["shard_file", "shard_id", "save_shard", "read_shard", "usable"]

log = logging.getLogger("vbcluster.extract")
#: the arrays of a shard (:func:`pipeline.extract.extraction.run_shard`'s result, plus its id)
ARRAYS = ("X", "ok", "skipped", "errors", "params", "digests", "shard_id")


def shard_file(work: Path, i: int) -> Path:
    return work / f"shard-{i:06d}.npz"


def shard_id(i: int, image_ids: list[str]) -> str:
    """The id of shard ``i`` holding the images ``image_ids`` (in order)."""
    return hashlib.sha256(json.dumps([int(i), [str(v) for v in image_ids]]).encode()).hexdigest()[:32]


def save_shard(work: Path, i: int, res: dict[str, Any], sid: str) -> None:
    """Write one shard's result with its id atomically (temporary file, fsync, rename)."""
    tmp = work / f".shard-{i:06d}.{secrets.token_hex(4)}.npz"
    with open(tmp, "wb") as f:
        np.savez(f, **res, shard_id=np.array(sid))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, shard_file(work, i))


def _problem(path: Path, sid: str) -> tuple[str | None, dict[str, np.ndarray]]:
    """Why the shard at ``path`` cannot be used (None when it can), and its arrays."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in ARRAYS if k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        return f"unreadable ({type(exc).__name__}: {str(exc).strip()[:120] or 'no details'})", {}
    missing = [k for k in ARRAYS if k not in arrays]
    if missing:
        return f"no {', '.join(missing)} (written by an older vbcluster, or damaged)", arrays
    if str(arrays["shard_id"]) != sid:
        return "it holds another shard's images (shard files swapped or copied)", arrays
    return None, arrays


def usable(work: Path, i: int, sid: str) -> bool:
    """Whether shard ``i`` of ``work`` is finished and verifies; one that exists but does not verify is
    removed (it is extracted again) with a warning naming it and its folder."""
    path = shard_file(work, i)
    if not path.is_file():
        return False
    why, _ = _problem(path, sid)
    if why is None:
        return True
    log.warning("extracting shard %s of %s again: %s", path.name, work, why)
    path.unlink(missing_ok=True)
    return False


def read_shard(work: Path, i: int, sid: str) -> dict[str, np.ndarray]:
    """The arrays of shard ``i``, verified; one line naming the shard and its folder otherwise."""
    path = shard_file(work, i)
    why, arrays = _problem(path, sid)
    if why is not None:
        raise InputError(f"extraction shard {path.name} in {work}: {why}; run the ingest again (the shard "
                         "is extracted again)")
    return arrays
