"""The engines: passes over the chunks of a row source, next to the data.

:mod:`.engines` (``LocalEngine``, ``DaskEngine``, the fixed-order tree reduction), :mod:`.sources`
(where rows come from, chunk by chunk), :mod:`.cluster` and :mod:`.cluster_checks` (cluster configs
into a Dask client), :mod:`.codecheck` (workers run the driver's code), :mod:`.blas` (one BLAS thread
per kernel), :mod:`.dask_sizes`."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "LocalEngine": "engines", "DaskEngine": "engines", "make_engine": "engines", "tree_reduce": "engines",
    "StoreSource": "sources", "ArraySource": "sources", "load_cluster_config": "cluster",
    "one_blas_thread": "blas",
})
