"""``cluster_flow``: fit with checkpoints -> assign -> report, on the cluster of a cluster config.

The tasks are thin wrappers of ``pipeline``. Only the tasks that do I/O alone (checking the store,
writing assignments, writing the report) have Prefect retries. The fit has none of its own: the *flow*
has ``retries``, and a retried flow run calls the fit again on the same run directory, where the fit
service (:func:`pipeline.service.fit_run`) resumes from the newest valid checkpoint, so the retried run
ends bit for bit where an uninterrupted one would (``tests/test_flows.py``). A flow run whose process
was killed resumes the same way when it is run again on the same run directory (``vbcluster resume``
does it by hand).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from flows.runtime import EngineSpec, dask_cluster
from pipeline.fit.spec import FitSpec

ITERATION_LOG = "iterations.jsonl"


@task(name="check-store", retries=2, retry_delay_seconds=1, cache_policy=NONE)
def check_store(store: str) -> dict[str, Any]:
    """Open the store (fails with a clear message when it is missing or invalid)."""
    from pipeline.engine.sources import StoreSource

    src = StoreSource(store)
    return {"n_rows": src.n_rows, "n_features": src.n_features, "fingerprint": src.fingerprint}


@task(name="fit", cache_policy=NONE)
def fit(run_dir: str, spec: FitSpec, engine: EngineSpec, warm_from: str | None = None,
        quiet: bool = False, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fit into ``run_dir`` with checkpoints (resumes from them when the directory has some)."""
    from pipeline.fit.progress import FitProgress
    from pipeline.service import fit_run

    logger = get_run_logger()
    logger.info("fit %s -> %s (learner %s, K=%s%s)", spec.store, run_dir, spec.learner,
                spec.components, f", warm start from {warm_from}" if warm_from else "")
    eng = engine.open()
    try:
        with FitProgress(spec.max_iter, f"{spec.learner} {Path(run_dir).name}",
                         log_path=Path(run_dir) / ITERATION_LOG, quiet=quiet) as progress:
            result = fit_run(run_dir, spec, engine=eng, warm_from=warm_from, callback=progress,
                             extra=extra)
    finally:
        eng.close()
    if result.get("resumed_from"):
        logger.info("resumed from %s", result["resumed_from"])
    logger.info("%s: %d iterations, converged %s, %d clusters found, ELBO %.6g", run_dir, result["n_iter"],
                result["converged"], result["n_effective"], result["elbo"])
    return result


@task(name="assign", retries=2, retry_delay_seconds=1, cache_policy=NONE)
def assign(run_dir: str, engine: EngineSpec) -> str:
    """Write each row's cluster and probability next to the store (atomically)."""
    from pipeline.runs.directory import assign_store

    eng = engine.open()
    try:
        return str(assign_store(run_dir, engine=eng))
    finally:
        eng.close()


@task(name="report", retries=2, retry_delay_seconds=1, cache_policy=NONE)
def report(run_dirs: list[str], out: str | None = None, engine: EngineSpec | None = None) -> str:
    """The HTML report (with its PNGs) of one or more run directories; its pass over the rows (labels,
    each cluster's most typical rows) on ``engine``'s cluster, streaming the chunks."""
    from pipeline.runs.report import write_report

    eng = None if engine is None else replace(engine, persist="never").open()
    try:
        return str(write_report(run_dirs, out, engine=eng))
    finally:
        if eng is not None:
            eng.close()


@flow(name="vbcluster-cluster", retries=1, retry_delay_seconds=1)
def cluster_flow(
    store: str,
    run_dir: str,
    learner: str | None = None,
    components: int | None = None,
    covariance: str | None = None,
    weights: str | None = None,
    max_iter: int | None = None,
    tol: float | None = None,
    seed: int | None = None,
    init: str | None = None,
    learner_options: dict[str, Any] | None = None,
    cluster: str | None = None,
    checkpoint_every: int | None = None,
    warm_start_from: str | None = None,
    assign_labels: bool = True,
    write_report: bool = True,
    quiet: bool = False,
    extra: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fit a store into a run directory, write the assignments and the report.

    Parameters
    ----------
    store : str
        The feature store.
    run_dir : str
        The run directory (result.json, posterior.npz, checkpoints/, iterations.jsonl, report/).
    learner, components, covariance, weights, max_iter, tol, seed, init, learner_options, cluster,
    checkpoint_every
        Fit settings (:class:`pipeline.fit.spec.FitSpec`; None: its default, as ``vbcluster fit``).
    settings : dict, optional
        Any other fit setting of :class:`pipeline.fit.spec.FitSpec` by name.
    warm_start_from : str, optional
        A finished run directory whose posterior starts the fit.
    assign_labels, write_report : bool
        Write ``STORE/assignments/<run name>`` / ``RUN_DIR/report/report.html``.

    Returns
    -------
    dict
        The run's result.json, plus ``run_dir``, ``assignments`` and ``report`` paths.
    """
    from pipeline.service import check_fit, make_spec

    spec = make_spec(store, learner=learner, components=components, covariance=covariance,
                     weights=weights, max_iter=max_iter, tol=tol, seed=seed, init=init,
                     cluster=cluster, checkpoint_every=checkpoint_every,
                     learner_options=learner_options or None, **(settings or {}))
    check_fit(run_dir, spec, warm_start_from)  # every setting checked before any task runs
    check_store(store)
    with dask_cluster(spec.cluster, quiet=quiet) as engine:
        result = fit(run_dir, spec, engine, warm_start_from, quiet, extra)
        if assign_labels:
            result["assignments"] = assign(run_dir, engine)
        if write_report:
            result["report"] = report([run_dir], engine=engine)
    result["run_dir"] = str(run_dir)
    return result
