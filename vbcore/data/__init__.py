"""Rows before the model: the one row validator (:mod:`.validation`), the magnitude limit and the
kernels' block size it rests on (:mod:`.limits`), row normalisation (:mod:`.normalize`) and
clustering metrics against labels (:mod:`.metrics`)."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "check_finite": "validation", "check_magnitude": "limits", "normalize_rows": "normalize",
    "nmi": "metrics", "acc": "metrics", "ari": "metrics",
})
