"""The scheduler and the workers of a Dask cluster must run the driver's vbcluster code.

Tasks name their functions by module and name (``pipeline.engine.engines._apply_pinned``): the scheduler
unpickles every submitted graph, and a worker every task, by importing those modules where *they*
find them. A scheduler or worker that imports other vbcluster code (another checkout, an older
install) cannot load a function the driver's code added; Dask logs the error on the scheduler and
drops the graph, and the driver only sees a later task "cancelled for reason: lost dependencies".
:func:`check_cluster_code` compares a digest of the code on both sides first and raises one line
saying which processes differ.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

from vbcore.errors import ConfigError

PACKAGES = ("pipeline", "vbcore")


@functools.cache
def code_digest() -> str:
    """sha256 of this process's vbcluster sources: every ``.py`` file of ``pipeline`` and ``vbcore``
    (path relative to its package, and bytes), in sorted order. Where the code lives does not count."""
    import importlib

    h = hashlib.sha256()
    for name in PACKAGES:
        root = Path(importlib.import_module(name).__file__ or "").parent
        for path in sorted(root.rglob("*.py")):
            h.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def _where() -> str:
    import pipeline

    return str(Path(pipeline.__file__ or "").parent.parent)


def _digest_and_where() -> tuple[str, str]:
    """(:func:`code_digest`, the directory its ``pipeline`` package was imported from)."""
    return code_digest(), _where()


def check_cluster_code(client: Any) -> None:
    """Raise :class:`ConfigError` unless the scheduler and every worker of ``client`` run the same
    vbcluster code as this process (see the module docstring)."""
    mine = code_digest()
    try:
        found = {"scheduler": client.run_on_scheduler(_digest_and_where)}
        found.update({f"worker {w}": v for w, v in client.run(_digest_and_where).items()})
    except (AttributeError, ImportError, RuntimeError) as exc:  # they cannot even load this module
        raise ConfigError(
            f"the Dask scheduler or workers cannot load this driver's vbcluster code ({type(exc).__name__}: "
            f"{exc}); run them from the same vbcluster version and environment as the driver "
            f"(the driver's is in {_where()})"
        ) from None
    other = {name: where for name, (digest, where) in sorted(found.items()) if digest != mine}
    if other:
        listed = ", ".join(f"{name} (code in {where})" for name, where in other.items())
        raise ConfigError(
            f"the Dask cluster runs other vbcluster code than the driver (code in {_where()}): {listed}; "
            "run the scheduler and workers from the same vbcluster version and environment"
        )
