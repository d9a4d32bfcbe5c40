"""The feature store: a chunked Zarr v3 group (:mod:`.features`), its append journal and lock
(:mod:`.journal`), and chunk integrity (:mod:`.integrity`: checksums, fingerprint, ``vbcluster check``)."""

from __future__ import annotations

from vbcore.lazy import exports

#: rows per chunk of the stores `vbcluster ingest` writes and of in-memory arrays: one chunking for
#: both, and chunks small enough that the in-process engine's threads share an array's passes (one
#: 65,536-row chunk of a 70,000-row array left one thread with 94% of every pass)
CHUNK_ROWS = 8192

__getattr__, __dir__ = exports(__name__, {
    "FeatureStore": "features", "AppendLock": "journal", "read_chunk": "integrity", "check": "integrity",
})
