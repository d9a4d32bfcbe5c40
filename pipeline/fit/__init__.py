"""Fitting: the fit specification (:mod:`.spec`), the setup (:mod:`.setup`), the driver's loop
(:mod:`.driver`), checkpoints (:mod:`.checkpoint`), the learners (:mod:`.learners`), the projection
stage (:mod:`.projection`), ``partial_fit`` (:mod:`.partial`) and progress (:mod:`.progress`)."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "FitSpec": "spec", "open_source": "setup", "run_fit": "driver",
    "Checkpointer": "checkpoint", "FitProgress": "progress", "projection_pass": "projection",
})
