"""The learners' math beyond VB EM: gradients of the bound (:mod:`.gradients`), pattern search
(:mod:`.pattern`), the DP point learners SGA / SGA+M / SGA+F / MM (:mod:`.sga`, :mod:`.sigma2`; their
chunk kernels are :mod:`vbcore.kernels.sga_stats`) and SVI (:mod:`.svi`)."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "mm_update": "sga", "default_threshold": "sga", "PatternLine": "pattern",
})
