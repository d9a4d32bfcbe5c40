"""Learners: one interface (:mod:`pipeline.fit.learners.base`), registered by name.

``@register("name")`` adds a :class:`~pipeline.fit.learners.base.Learner` subclass to :data:`LEARNERS`;
``VBMixture(learner="name")`` and ``vbcluster fit --learner name`` find it there. Importing this
package imports every module in it (and in its subpackages), so the registry is complete whichever
module was imported first. A learner outside the package (a plugin) registers when its module is
imported: by the user's own code (``VBMixture``), or, for every face at once (the CLI, the flows, a Dask
cluster's driver), through an installed package's entry point in the group ``vbcluster.learners`` or the
environment variable ``VBCLUSTER_LEARNERS`` (comma-separated module names), both imported with the
package (docs/architecture.md, "How to add a learner"; ``examples/toy_learner.py``).
Every face that names learners (``vbcluster learners``, the help, the ``VBMixture`` docstring, the
report, ``partial_fit``, the tests) reads :data:`LEARNERS`, selecting by the class attributes that
:class:`~pipeline.fit.learners.base.Learner` declares (:func:`learner_names`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.fit.learners.base import FitContext, Learner
from vbcore.errors import ConfigError

LEARNERS: dict[str, type[Learner]] = {}


def register(name: str) -> Callable[[type[Learner]], type[Learner]]:
    def deco(cls: type[Learner]) -> type[Learner]:
        if name in LEARNERS:
            raise ValueError(f"learner {name!r} is registered twice")
        cls.name = name
        LEARNERS[name] = cls
        return cls

    return deco


def learner_class(name: str) -> type[Learner]:
    try:
        return LEARNERS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"learner must be one of {tuple(LEARNERS)}, got {name!r}") from None


def learner_names(**where: Any) -> tuple[str, ...]:
    """The registered learners whose class attributes equal ``where``, in registration order:
    ``learner_names(family="point")``, ``learner_names(grows=True)``, ``learner_names()`` (all)."""
    return tuple(name for name, cls in LEARNERS.items()
                 if all(getattr(cls, key) == value for key, value in where.items()))


def names_text(names: tuple[str, ...]) -> str:
    """``'a, b and c'`` (for help texts and docstrings)."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def make_learner(name: str, ctx: FitContext, options: Mapping[str, Any] | None = None) -> Learner:
    return learner_class(name)(ctx, options)


def _import_every_module() -> None:
    """The learner modules register themselves on import: import every module of the package once,
    in name order (a new module needs no line here)."""
    for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
        importlib.import_module(info.name)


#: entry-point group of installed packages' learner modules, and the environment variable naming more
ENTRY_POINTS, PLUGINS_ENV = "vbcluster.learners", "VBCLUSTER_LEARNERS"


def _import_plugins() -> None:
    """Import the learner modules outside the package: every entry point of the group
    ``vbcluster.learners`` (name order), then the modules ``VBCLUSTER_LEARNERS`` names, in its order.
    One that cannot be imported is a ConfigError naming it and where it was named."""
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        _import_plugin(ep.value.split(":")[0], f"entry point {ep.name!r} of group {ENTRY_POINTS!r}")
    for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        _import_plugin(module, f"{PLUGINS_ENV}={os.environ[PLUGINS_ENV]!r}")


def _import_plugin(module: str, where: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"cannot import learner module {module!r} ({where}): {exc}") from None


_import_every_module()
_import_plugins()

__all__ = ["LEARNERS", "FitContext", "Learner", "learner_class", "learner_names", "make_learner",
           "names_text", "register"]
