"""The run files of a low-rank fit (``--covariance lowrank``, :mod:`pipeline.fit.lowrank`).

result.json has the keys of every fit's that describe the outcome (learner, settings, store, n_rows,
n_features, n_iter, converged, elbo, elbo_history, elbo_terms, n_components, n_effective, counts,
metrics, seconds, selection) plus ``covariance: 'lowrank'`` and ``rank``; the metrics are those of the
fit's own assignments (each row's most probable component). ``lowrank.npz`` holds q(L), the shared
noise, the hyperparameters, the labels and the shift of the fit's rows (the store's first row);
result.json's ``posterior_sha256`` is lowrank.npz's (``posterior.npz`` is not written).
:mod:`pipeline.runs.lowrank_model` reads it for ``assign`` and ``report``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.engine.sources import StoreSource
from pipeline.files.atomic import write_file
from pipeline.fit.checkpoint import sha256_file
from pipeline.fit.lowrank import LowRankOutcome
from pipeline.fit.spec import FitSpec, jsonable
from pipeline.runs.lowrank_model import LOWRANK_FILE
from vbcore.data.metrics import acc, ari, nmi


def save_lowrank_run(run_dir: str | Path, spec: FitSpec, out: LowRankOutcome, source: Any,
                     extra: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Write lowrank.npz, then result.json (atomically each); returns the result."""
    run_dir = Path(run_dir)
    src = source if isinstance(source, StoreSource) else StoreSource(str(spec.store))
    result: dict[str, Any] = {
        "learner": spec.learner,
        "settings": {k: jsonable(v) for k, v in {**spec.estimator_params(), "rank": spec.rank}.items()
                     if k != "engine"},
        "covariance": "lowrank",
        "rank": int(spec.rank),
        "store": str(Path(str(spec.store)).resolve()) if "://" not in str(spec.store) else spec.store,
        "store_fingerprint": src.fingerprint,
        "n_rows": src.n_rows,
        "n_features": src.n_features,
        "n_iter": int(out.n_iter),
        "converged": bool(out.converged),
        "elbo": float(out.terms.total),
        "elbo_per_row": float(out.terms.total) / float(out.n_rows),
        "elbo_history": [float(v) for v in out.history],
        "elbo_terms": out.terms.as_dict(),
        "n_components": int(out.post.n_components),
        "n_effective": out.n_effective,
        "counts": [float(c) for c in out.counts],
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    labels = src.labels()
    if labels is not None:
        w = src.all_weights()
        held = out.labels if w is None else out.labels[w > 0]
        result["metrics"] = {"nmi": nmi(labels, out.labels, w), "acc": acc(labels, out.labels, w),
                             "ari": ari(labels, out.labels, w), "clusters_used": int(len(np.unique(held)))}
    result.update(extra)
    result["seconds"] = float(seconds)
    result["bound"] = {"history": "exact", "final": "exact"}
    if out.selection is not None:
        result["selection"] = out.selection
    run_dir.mkdir(parents=True, exist_ok=True)
    p = out.post
    write_file(run_dir / LOWRANK_FILE, lambda f: np.savez(
        f, weight_concentration=p.weight_concentration, loadings=p.loadings, precision=p.precision,
        noise=p.noise, ard=p.ard, mean_precision=np.float64(p.mean_precision), labels=out.labels,
        prior_mean=out.prior.mean, **({} if out.shift is None else {"shift": out.shift})))
    result["posterior_sha256"] = sha256_file(run_dir / LOWRANK_FILE)
    write_file(run_dir / "result.json", lambda f: f.write(json.dumps(result, indent=2).encode()))
    return result
