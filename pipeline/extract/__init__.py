"""Images into feature stores: sources (:mod:`.image_sources`, :mod:`.idx_images`), extractors
(:mod:`.extractors`: ONNX Runtime, torch, classical), sharded resumable extraction (:mod:`.extraction`,
:mod:`.shards`) and its writes into a store (:mod:`.image_store`)."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "ingest_images": "extraction", "refresh_images": "extraction", "make_extractor": "extractors",
    "FeatureExtractor": "extractors", "read_images": "image_sources", "list_images": "image_sources",
})
