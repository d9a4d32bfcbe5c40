"""The learners' math beyond VB EM: gradients of the bound (:mod:`.gradients`), pattern search
(:mod:`.pattern`), the DP point learners SGA / SGA+M / SGA+F / MM (:mod:`.sga`, :mod:`.sga_stats`,
:mod:`.sigma2`) and SVI (:mod:`.svi`)."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "DPPoint": "sga_stats", "hard_kernel": "sga_stats", "mm_update": "sga", "PatternLine": "pattern",
})
