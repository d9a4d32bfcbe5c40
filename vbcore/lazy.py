"""Names a package offers, imported from their modules on first use.

A package's ``__init__`` lists what it offers and where each name lives; importing the package
imports none of those modules (the command line's help loads neither SciPy nor Zarr)::

    __getattr__, __dir__ = exports(__name__, {"FeatureStore": "features", ...})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def exports(package: str, home: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, offering each name of ``home`` from
    the submodule it maps to (relative to ``package``)."""
    module = importlib.import_module(package)

    def getattr_(name: str) -> Any:
        if name in home:
            return getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(set(vars(module)) | set(home))

    return getattr_, dir_
