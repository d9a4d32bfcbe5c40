"""vbcore: the math of vbcluster (priors, posteriors, chunk kernels, M-step, exact ELBO).

Imports numpy and scipy only. Chunk kernels take their array namespace from their inputs, so they run
on NumPy or CuPy arrays. Equation numbers in docstrings refer to the papers in docs/references.md.
"""

from vbcore.elbo import ElboTerms, elbo_terms
from vbcore.errors import ConfigError, InputError, NumericalError, VBClusterError
from vbcore.kernels import (
    Chunk,
    EStepParams,
    chunk_statistics,
    estep_params,
    prepare_chunk,
    vbem_kernel,
)
from vbcore.mstep import m_step
from vbcore.posterior import Posterior
from vbcore.priors import COVARIANCE_TYPES, WEIGHT_TYPES, Prior, default_prior
from vbcore.stats import SuffStats

__all__ = [
    "COVARIANCE_TYPES",
    "WEIGHT_TYPES",
    "Chunk",
    "ConfigError",
    "ElboTerms",
    "EStepParams",
    "InputError",
    "NumericalError",
    "Posterior",
    "Prior",
    "SuffStats",
    "VBClusterError",
    "chunk_statistics",
    "default_prior",
    "elbo_terms",
    "estep_params",
    "m_step",
    "prepare_chunk",
    "vbem_kernel",
]
