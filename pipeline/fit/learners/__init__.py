"""Learners: one interface (:mod:`pipeline.fit.learners.base`), registered by name.

``@register("name")`` adds a :class:`~pipeline.fit.learners.base.Learner` subclass to :data:`LEARNERS`;
``VBMixture(learner="name")`` and ``vbcluster fit --learner name`` find it there. Importing this
package imports every module in it (and in its subpackages), so the registry is complete whichever
module was imported first; a learner outside the package registers when its module is imported.
Every face that names learners (``vbcluster learners``, the help, the ``VBMixture`` docstring, the
report, ``partial_fit``, the tests) reads :data:`LEARNERS`, selecting by the class attributes that
:class:`~pipeline.fit.learners.base.Learner` declares (:func:`learner_names`).
"""

from __future__ import annotations

import importlib
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


_import_every_module()

__all__ = ["LEARNERS", "FitContext", "Learner", "learner_class", "learner_names", "make_learner",
           "names_text", "register"]
