"""Rows before and around the model: the one row validator (:mod:`.validation`), the magnitude limit
(:mod:`.limits`), row normalisation (:mod:`.normalize`), the projection stage (:mod:`.projection`) and
clustering metrics (:mod:`.metrics`)."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "check_finite": "validation", "normalize_rows": "normalize", "Projection": "projection",
    "fit_projection": "projection", "nmi": "metrics", "acc": "metrics", "ari": "metrics",
})
