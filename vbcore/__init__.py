"""vbcore: the math of vbcluster (priors, posteriors, chunk kernels, M-step, exact ELBO).

Imports numpy and scipy only. Chunk kernels take their array namespace from their inputs, so they run
on NumPy or CuPy arrays. Equation numbers in docstrings refer to the papers in docs/references.md.

The names below are imported on first use (module ``__getattr__``): ``vbcore.errors`` alone, which
the command line needs for its help, does not load SciPy.
"""

from __future__ import annotations

import importlib
from typing import Any

#: where each public name lives
_HOME = {
    "ElboTerms": "elbo", "elbo_terms": "elbo",
    "ConfigError": "errors", "InputError": "errors", "NumericalError": "errors", "VBClusterError": "errors",
    "Chunk": "kernels", "EStepParams": "kernels", "chunk_statistics": "kernels", "estep_params": "kernels",
    "prepare_chunk": "kernels", "vbem_kernel": "kernels",
    "m_step": "mstep", "normalize_rows": "normalize", "Posterior": "posterior",
    "COVARIANCE_TYPES": "priors", "WEIGHT_TYPES": "priors", "Prior": "priors", "default_prior": "priors",
    "SuffStats": "stats",
}
# no __all__: the documentation lists each name in its module (pdoc cannot follow __getattr__)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"vbcore.{_HOME[name]}"), name)
    raise AttributeError(f"module 'vbcore' has no attribute {name!r}")
