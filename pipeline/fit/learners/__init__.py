"""Learners: one interface (:mod:`pipeline.fit.learners.base`), registered by name.

``@register("name")`` adds a :class:`~pipeline.fit.learners.base.Learner` subclass to :data:`LEARNERS`;
``VBMixture(learner="name")`` and ``vbcluster fit --learner name`` find it there. Importing this
package imports every learner module, so the registry is complete.
"""

from __future__ import annotations

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


def make_learner(name: str, ctx: FitContext, options: Mapping[str, Any] | None = None) -> Learner:
    return learner_class(name)(ctx, options)


# the learner modules register themselves on import (keep this list sorted)
from pipeline.fit.learners import gradient, mm, pattern, sga, svi, vbem  # noqa: E402,F401

__all__ = ["LEARNERS", "FitContext", "Learner", "learner_class", "make_learner", "register"]
