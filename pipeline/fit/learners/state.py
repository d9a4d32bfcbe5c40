"""A fit's state between iterations, as frozen objects that checkpoint as a whole.

:class:`FitState` is what the driver hands a learner and gets back (:meth:`pipeline.fit.learners.base.
Learner.advance`): the posterior, the prior (with its re-estimated hyperparameters), the iteration and
the learner's own state, a dataclass derived from :class:`LearnerState` (arrays, numbers, flags,
``None``, posteriors, sufficient statistics, and nested dataclasses of these: named fields, never
hand-packed arrays). :meth:`FitState.to_arrays` flattens it into the named arrays of a checkpoint and
:meth:`FitState.from_arrays` rebuilds it from the field types (``numpyro``'s ``SVIState`` is the
model), so no learner lists its checkpoint attributes by hand.

A learner works on a thawed copy of its state (:meth:`LearnerState.thaw`: a deep copy); what it returns
is frozen (:meth:`LearnerState.freeze`: fields that cannot be assigned, arrays as read-only views, no
data copied), so a state the driver holds is not changed through it (the learners replace their
arrays and statistics each iteration rather than write into them: the same-state tests check it).

Checkpoint array names: the posterior's (``means``, ...), ``prior.n_components`` and ``prior.<name>``
of the re-estimated hyperparameters (:func:`vbcore.model.empirical.prior_state`), ``state.<field>``
(``state.<field>.<field>`` for nested ones) of the learner's state; the learner's cache of per-chunk
data is written beside them as ``learner.<name>`` (:meth:`pipeline.fit.learners.base.Learner.
cache_arrays`).
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import numpy as np

from vbcore.model.posterior import Posterior, posterior_arrays, posterior_from_arrays
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats

#: the checkpoint layout of this module (the manifest's ``state_format``); checkpoints without it were
#: written before the learners' state became named fields (issue 54) and are refused
STATE_FORMAT = 2
#: key prefixes of the learner's state and of the prior
STATE_KEY, PRIOR_KEY = "state.", "prior."
_PRESENT = "__present__"  # the marker of a nested state (all of whose fields may be None)
_STATS = ("nk", "mean", "scatter", "sum_rlogr", "n_rows", "shift")


@dataclasses.dataclass
class LearnerState:
    """Base of the learners' state dataclasses (see the module docstring)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r} of a frozen "
                                                  f"{type(self).__name__}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r} of a frozen "
                                                  f"{type(self).__name__}")
        object.__delattr__(self, name)

    @property
    def frozen(self) -> bool:
        return bool(self.__dict__.get("_frozen"))

    def freeze(self) -> Any:
        """A frozen copy (itself when already frozen): nested states copied, arrays as read-only views
        (no data copied: a learner replaces its arrays, it does not write into them), other values
        (statistics, posteriors) shared."""
        if self.frozen:
            return self
        out = copy.copy(self)
        _freeze(out)
        return out

    def thaw(self) -> Any:
        """A mutable deep copy (what a learner works on)."""
        out = copy.deepcopy(self)
        _thaw(out)
        return out

    def to_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """Every field as named arrays (``None`` fields are left out)."""
        out: dict[str, np.ndarray] = {}
        for f in dataclasses.fields(self):
            value, key = getattr(self, f.name), prefix + f.name
            if value is None:
                continue
            if isinstance(value, LearnerState):
                out[f"{key}.{_PRESENT}"] = np.asarray(True)
                out.update(value.to_arrays(key + "."))
            elif isinstance(value, Posterior):
                out.update(posterior_arrays(value, prefix=key + "."))
            elif isinstance(value, SuffStats):
                out.update({f"{key}.{n}": np.asarray(getattr(value, n)) for n in _STATS})
                if value.weight is not None:  # weighted rows' total weight
                    out[f"{key}.weight"] = np.asarray(value.weight)
            elif dataclasses.is_dataclass(value):
                for g in dataclasses.fields(value):
                    out[f"{key}.{g.name}"] = np.asarray(getattr(value, g.name))
            else:
                out[key] = np.asarray(value)
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], covariance_type: str, weight_type: str,
                    prefix: str = "") -> Any:
        """The state written by :meth:`to_arrays` (posteriors take the fit's covariance and weight
        types)."""
        hints = typing.get_type_hints(cls)
        values = {f.name: _field_from(_base_type(hints[f.name]), arrays, prefix + f.name, covariance_type,
                                      weight_type) for f in dataclasses.fields(cls)}
        return cls(**values)


def _field_from(kind: Any, arrays: Mapping[str, np.ndarray], key: str, covariance_type: str,
                weight_type: str) -> Any:
    """One field of :meth:`LearnerState.from_arrays` (None where the checkpoint has none)."""
    if isinstance(kind, type) and issubclass(kind, LearnerState):
        if f"{key}.{_PRESENT}" not in arrays:
            return None
        return kind.from_arrays(arrays, covariance_type, weight_type, prefix=key + ".")
    if kind is Posterior:
        has = key + ".means" in arrays
        return posterior_from_arrays(arrays, covariance_type, weight_type, prefix=key + ".") if has else None
    if kind is SuffStats:
        return None if key + ".nk" not in arrays else SuffStats(
            nk=arrays[key + ".nk"], mean=arrays[key + ".mean"], scatter=arrays[key + ".scatter"],
            sum_rlogr=float(arrays[key + ".sum_rlogr"]), n_rows=int(arrays[key + ".n_rows"]),
            shift=arrays[key + ".shift"],
            weight=float(arrays[key + ".weight"]) if key + ".weight" in arrays else None)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        names = [g.name for g in dataclasses.fields(kind)]
        if f"{key}.{names[0]}" not in arrays:
            return None
        return kind(**{n: _scalar(arrays[f"{key}.{n}"]) for n in names})
    if key not in arrays:
        return None
    if kind in (float, int, bool):
        return kind(arrays[key])
    return np.asarray(arrays[key])


def _freeze(state: LearnerState) -> None:
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if isinstance(value, LearnerState):
            value = copy.copy(value)
            _freeze(value)
        elif isinstance(value, np.ndarray):
            value = value.view()
            value.flags.writeable = False
        object.__setattr__(state, f.name, value)
    object.__setattr__(state, "_frozen", True)


def _thaw(state: LearnerState) -> None:
    state.__dict__.pop("_frozen", None)
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if isinstance(value, LearnerState):
            _thaw(value)
        elif isinstance(value, np.ndarray) and not value.flags.writeable:
            setattr(state, f.name, value.copy())


@dataclasses.dataclass(frozen=True)
class FitState:
    """What the driver hands a learner and gets back: the posterior, the prior (its ``n_components``
    the truncation; its re-estimated hyperparameters, :attr:`Prior.empirical`), the iteration the
    state is after (0: before the first) and the learner's own state (frozen)."""

    post: Posterior
    prior: Prior
    iteration: int
    learner: LearnerState

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The checkpoint arrays of this state (see the module docstring)."""
        from vbcore.model.empirical import prior_state

        out = posterior_arrays(self.post)
        out[PRIOR_KEY + "n_components"] = np.asarray(int(self.prior.n_components), dtype=np.int64)
        out.update(prior_state(self.prior))
        out.update(self.learner.to_arrays(STATE_KEY))
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prior: Prior, iteration: int,
                    state_type: type[LearnerState]) -> FitState:
        """The state of :meth:`to_arrays` over the fit's ``prior`` (its fixed hyperparameters)."""
        from vbcore.model.empirical import prior_from_state

        post = posterior_from_arrays(arrays, prior.covariance_type, prior.weight_type)
        prior = dataclasses.replace(prior_from_state(prior, arrays),
                                    n_components=int(arrays[PRIOR_KEY + "n_components"]))
        learner = state_type.from_arrays(arrays, prior.covariance_type, prior.weight_type, prefix=STATE_KEY)
        return cls(post, prior, int(iteration), learner.freeze())


def _base_type(hint: Any) -> Any:
    """``X`` of ``X | None`` (and ``X`` itself)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return hint


def _scalar(value: np.ndarray) -> Any:
    """0-d arrays back to Python numbers (nested dataclasses of scalars, e.g. ``GradSums``)."""
    arr = np.asarray(value)
    return arr.item() if arr.ndim == 0 else arr
