"""What a fit leaves: run directories (:mod:`.directory`: ``result.json``, ``posterior.npz``,
assignments, with :mod:`.assign_formats`; a low-rank run's model: :mod:`.lowrank_run`,
:mod:`.lowrank_model`), published versions (:mod:`.publish`) and the report
(:mod:`.report`, :mod:`.report_curves`, :mod:`.report_clusters`, :mod:`.typical`)."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "save_run": "directory", "load_fitted": "directory", "load_run_model": "directory",
    "read_result": "directory",
    "assign_store": "directory", "plan_refresh": "publish",
    "write_report": "report",
})
