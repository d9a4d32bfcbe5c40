"""vbcore: the math of vbcluster (priors, posteriors, chunk kernels, M-step, exact ELBO).

Imports numpy and scipy only. Four subpackages: :mod:`vbcore.model` (the model and its exact bound),
:mod:`vbcore.kernels` (chunk kernels, the truncated E-step among them), :mod:`vbcore.learners` (the
learners' math beyond VB EM), :mod:`vbcore.moves` (merges and deletes); :mod:`vbcore.data` (rows:
validation, normalisation, projection, metrics) and :mod:`vbcore.errors` beside them. Chunk kernels
take their array namespace from their inputs, so they run on NumPy or CuPy arrays. Equation numbers in
docstrings refer to the papers in docs/references.md.

The names below are imported on first use (module ``__getattr__``): ``vbcore.errors`` alone, which
the command line needs for its help, does not load SciPy.
"""

from __future__ import annotations

from vbcore.lazy import exports

#: where each public name lives
__getattr__, __dir__ = exports(__name__, {
    "ElboTerms": "model.elbo", "elbo_terms": "model.elbo",
    "ConfigError": "errors", "InputError": "errors", "NumericalError": "errors", "VBClusterError": "errors",
    "Chunk": "kernels.estep", "EStepParams": "kernels.estep", "chunk_statistics": "kernels.estep",
    "estep_params": "kernels.estep", "prepare_chunk": "kernels.estep", "vbem_kernel": "kernels.estep",
    "m_step": "model.mstep", "normalize_rows": "data.normalize", "Posterior": "model.posterior",
    "COVARIANCE_TYPES": "model.priors", "WEIGHT_TYPES": "model.priors", "Prior": "model.priors",
    "default_prior": "model.priors", "SuffStats": "model.stats",
})
# no __all__: the documentation lists each name in its module (pdoc cannot follow __getattr__)
