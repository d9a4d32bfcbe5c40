"""A learner's state beyond the posterior, as one object that checkpoints as a whole.

A learner keeps its driver-side state in a dataclass derived from :class:`LearnerState` (arrays,
numbers, flags, ``None``, posteriors, sufficient statistics, and nested dataclasses of these).
:meth:`LearnerState.to_arrays` flattens it into the named arrays of a checkpoint and
:meth:`LearnerState.from_arrays` rebuilds it from the field types, so a learner never lists its
checkpoint attributes by hand (``numpyro``'s ``SVIState`` is the model).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import numpy as np

from vbcore.model.posterior import Posterior, posterior_arrays, posterior_from_arrays
from vbcore.model.stats import SuffStats


@dataclasses.dataclass
class LearnerState:
    """Base of the learners' state dataclasses (see the module docstring)."""

    def to_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """Every field as named arrays (``None`` fields are left out)."""
        out: dict[str, np.ndarray] = {}
        for f in dataclasses.fields(self):
            value, key = getattr(self, f.name), prefix + f.name
            if value is None:
                continue
            if isinstance(value, Posterior):
                out.update(posterior_arrays(value, prefix=key + "."))
            elif isinstance(value, SuffStats):
                out.update({f"{key}.{n}": np.asarray(getattr(value, n))
                            for n in ("nk", "mean", "scatter", "sum_rlogr", "n_rows", "shift")})
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
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            key = prefix + f.name
            kind = _base_type(hints[f.name])
            if kind is Posterior:
                has = key + ".means" in arrays
                values[f.name] = posterior_from_arrays(arrays, covariance_type, weight_type,
                                                       prefix=key + ".") if has else None
            elif kind is SuffStats:
                values[f.name] = None if key + ".nk" not in arrays else SuffStats(
                    nk=arrays[key + ".nk"], mean=arrays[key + ".mean"], scatter=arrays[key + ".scatter"],
                    sum_rlogr=float(arrays[key + ".sum_rlogr"]), n_rows=int(arrays[key + ".n_rows"]),
                    shift=arrays[key + ".shift"],
                    weight=float(arrays[key + ".weight"]) if key + ".weight" in arrays else None)
            elif isinstance(kind, type) and dataclasses.is_dataclass(kind):
                sub = {g.name: arrays[f"{key}.{g.name}"] for g in dataclasses.fields(kind)}
                values[f.name] = kind(**{k: _scalar(v) for k, v in sub.items()})
            elif key not in arrays:
                values[f.name] = None
            elif kind in (float, int, bool):
                values[f.name] = kind(arrays[key])
            else:
                values[f.name] = np.asarray(arrays[key])
        return cls(**values)


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
