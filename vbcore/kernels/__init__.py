"""Chunk kernels: the VB E-step and its statistics as GEMMs (:mod:`.estep`, :mod:`.blockgemm`,
:mod:`.spread`), the truncated E-step and MAP search on candidate clusters (:mod:`.truncated`,
:mod:`.truncated_map`, :mod:`.neighbours`), the DP point learners' hard assignments and statistics
(:mod:`.sga_stats`), the projection stage (:mod:`.projection`: the moments kernel, the driver's
eigendecomposition, the projection applied per chunk) and the fit setup's kernels (:mod:`.init`)."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "Chunk": "estep", "prepare_chunk": "estep", "estep_params": "estep", "vbem_kernel": "estep",
    "chunk_statistics": "estep", "array_namespace": "estep", "to_numpy": "estep", "DPPoint": "sga_stats",
    "hard_kernel": "sga_stats", "Projection": "projection", "fit_projection": "projection",
})
