"""Merge and delete moves on the exact ELBO (:mod:`.exact`), their E-step pass (:mod:`.estep_pass`),
and their variants for the tied covariance (:mod:`.tied`), the truncated E-step (:mod:`.truncated`) and
the hard-assignment learners (:mod:`.hard`)."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "total_elbo": "exact", "select_merges": "exact", "propose_pairs": "exact", "MoveParams": "estep_pass",
    "move_kernel": "estep_pass",
})
