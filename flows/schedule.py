"""Scheduled refreshes: ``refresh_flow`` and ``deploy`` (``vbcluster deploy``).

Each run of ``refresh_flow`` compares the store with the last published version (``OUT/latest``):

- unchanged (same fingerprint): nothing to do, nothing published;
- grown (more rows, same features): **warm start**, i.e. the fit starts from the last published
  posterior and the last published run's memoized statistics of the unchanged chunks (VB EM keeps
  them, learner option ``memo``: :func:`refresh_options`), visiting the new chunks first; the prior
  stays the data-dependent default of the (grown) store, not the old posterior
  (docs/operations.md, "Warm start", says why);
- otherwise (first run, rows replaced, other settings): a cold start.

The fit runs as the ``cluster_flow`` subflow (checkpoints, assignments, report) in a version
directory ``OUT/versions/vNNNN-<end of the flow run id>``; a retried flow run gets the same
directory back and resumes from its checkpoints, and so does the next scheduled run when a refresh
died (its process killed, its node lost) before publishing. ``OUT/latest`` moves to the new version
only once it is complete.

``deploy`` registers the flow as a deployment on the Prefect server of ``PREFECT_API_URL`` with a
cron or interval schedule and serves it: this process polls the server and executes the
scheduled runs (``flow.serve``), until it is stopped.
"""

from __future__ import annotations

import datetime
import uuid
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from flows.cluster import cluster_flow
from vbcore.errors import ConfigError

DEPLOYMENT = "vbcluster-refresh"
#: the share of chunks a refresh's memoized VB EM iteration visits (learner option ``memo``)
REFRESH_MEMO = 0.1


@task(name="plan-refresh", retries=2, retry_delay_seconds=1, cache_policy=NONE)
def plan(out: str, store: str) -> dict[str, Any]:
    """What this refresh does: cold, warm or skip (see :func:`pipeline.runs.publish.plan_refresh`)."""
    from dataclasses import asdict

    from pipeline.runs.publish import plan_refresh

    return asdict(plan_refresh(out, store))


@task(name="publish", retries=2, retry_delay_seconds=1, cache_policy=NONE)
def publish_version(out: str, run_dir: str) -> str:
    """Point ``OUT/latest`` at the finished version (atomically)."""
    from pipeline.runs.publish import publish

    publish(out, run_dir)
    return run_dir


def _run_key() -> str:
    from prefect.runtime import flow_run

    rid = flow_run.id  # a UUID7: its first digits are a timestamp, its last ones random
    return uuid.UUID(str(rid)).hex[-12:] if rid else uuid.uuid4().hex[-12:]


@task(name="extract-new-images", retries=2, retry_delay_seconds=1, cache_policy=NONE)
def extract_new_images(images: str, store: str, cluster: str | None,
                       options: dict[str, Any] | None) -> dict[str, Any]:
    """Create the store from the image source, or append the images it does not hold yet
    (:func:`pipeline.extract.extraction.refresh_images`; a killed extraction resumes from its shards)."""
    from pipeline.extract.extraction import refresh_images

    opts = dict(options or {})
    if cluster is not None:
        opts.setdefault("cluster", cluster)
    report = refresh_images(images, store, **opts)
    return {"rows_written": int(getattr(report, "rows_written", 0))}


@flow(name=DEPLOYMENT, retries=1, retry_delay_seconds=2)
def refresh_flow(
    store: str,
    out: str,
    learner: str | None = None,
    components: int | None = None,
    covariance: str | None = None,
    weights: str | None = None,
    max_iter: int | None = None,
    tol: float | None = None,
    seed: int | None = None,
    learner_options: dict[str, Any] | None = None,
    cluster: str | None = None,
    pca: int | None = None, whiten: bool = False, pca_solver: str | None = None,
    priors: str | None = None, init: str | None = None,  # (FitSpec's, as the other settings)
    max_components: int | None = None, grow: bool | None = None,
    quiet: bool = True,
    images: str | None = None,
    extract_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Refit the store when it changed and publish a new version (see the module docstring).

    With ``images`` (an image folder, tar shards or an image list), the new images are first
    extracted and appended to the store (the store is created on the first run), so the refit
    warm-starts on them; ``extract_options`` are those of ``vbcluster ingest`` for images
    (``extractor``, ``model``, ``output``, ``batch_images``, ...).

    Returns
    -------
    dict
        ``action`` (cold / warm / skip), ``reason``, and for a fit ``version`` (its directory),
        ``n_iter``, ``elbo``, ``n_effective`` and ``warm_start_from``.
    """
    from pipeline.runs.publish import claim_version, unfinished_version
    from pipeline.service import make_spec, warm_start_problem

    logger = get_run_logger()
    if images is not None:
        got = extract_new_images(images, store, cluster, extract_options)
        logger.info("extracted %d new image(s) from %s into %s", got["rows_written"], images, store)
    p = plan(out, store)
    logger.info("refresh of %s into %s: %s (%s)", store, out, p["action"], p["reason"])
    if p["action"] == "skip":
        return {"action": "skip", "reason": p["reason"], "latest": p["previous"]}
    warm = p["previous"] if p["action"] == "warm" else None

    def refresh_spec(cold: bool) -> Any:  # a warm one continues the previous version's (kept) model
        return make_spec(store, None if cold else warm, reg_covar=None, rank=None,
                         learner=learner, components=components, covariance=covariance,
                         weights=weights, max_iter=max_iter, tol=tol, seed=seed, cluster=cluster,
                         learner_options=refresh_options(learner, learner_options, cold), pca=pca,
                         whiten=whiten or None, pca_solver=pca_solver, priors=priors, init=init,
                         max_components=max_components, grow=grow)

    spec = refresh_spec(warm is None)
    if warm is not None and (problem := warm_start_problem(warm, spec)):
        logger.info("cold start instead of a warm start from %s: %s", warm, problem)
        warm, spec = None, refresh_spec(True)
        p["action"], p["reason"] = "cold", problem
    # a refresh that died mid-fit: resume it
    run_dir = unfinished_version(out, p["fingerprint"], spec.to_dict())
    if run_dir is not None:
        logger.info("resuming the unfinished refresh in %s", run_dir)
    else:
        run_dir = claim_version(out, _run_key())
    result = cluster_flow(store, str(run_dir), learner=spec.learner, components=spec.components,
                          covariance=spec.covariance, weights=spec.weights, max_iter=spec.max_iter,
                          tol=spec.tol, seed=spec.seed, init=spec.init,
                          learner_options=spec.learner_options or None,
                          cluster=spec.cluster, warm_start_from=warm, quiet=quiet, extra={"refresh": p},
                          settings={"pca": spec.pca, "whiten": spec.whiten or None,
                                    "pca_solver": spec.pca_solver, "priors": spec.priors,
                                    "max_components": spec.max_components, "grow": spec.grow,
                                    "select": spec.select, "select_lowrank": spec.select_lowrank,  # resolved
                                    "reg_covar": spec.reg_covar, "rank": spec.rank})
    publish_version(out, str(run_dir))
    logger.info("published %s (%s start, %d rows, %d iterations, %d clusters found)", run_dir.name,
                p["action"], result["n_rows"], result["n_iter"], result["n_effective"])
    return {"action": p["action"], "reason": p["reason"], "version": str(run_dir),
            "n_iter": result["n_iter"], "elbo": result["elbo"], "n_effective": result["n_effective"],
            "warm_start_from": result.get("warm_start_from")}


def refresh_options(learner: str | None, options: dict[str, Any] | None,
                    cold: bool = False) -> dict[str, Any] | None:
    """The learner options of a refresh: VB EM keeps memoized statistics (``memo`` unless given), so
    that after an append the next refresh adopts those of the unchanged chunks and visits the new ones
    first (:mod:`pipeline.fit.learners.vbem.memo`): :data:`REFRESH_MEMO` for a warm start, 1 for a
    ``cold`` one
    (every chunk every iteration: plain VB EM's trajectory bit for bit, with the statistics kept; at
    0.1 a cold fit's ``max_iter`` would be a tenth of the passes, too few for births from below the
    truth). The memoized fit keeps the spec's growth and merge/delete moves."""
    opts = dict(options or {})
    if (learner or "vbem") == "vbem" and "memo" not in opts and int(opts.get("candidates", -1)) <= 0:
        opts["memo"] = 1.0 if cold else REFRESH_MEMO
    return opts or None


def check_schedule(cron: str | None, interval: float | None) -> dict[str, Any]:
    """The schedule keyword of ``flow.serve``; a cron string that does not parse is a ConfigError."""
    if (cron is None) == (interval is None):
        raise ConfigError("give exactly one schedule: --cron \"MIN HOUR DOM MON DOW\" or --interval SECONDS")
    if cron is not None:
        from prefect.client.schemas.schedules import CronSchedule
        from pydantic import ValidationError

        try:
            CronSchedule(cron=cron)
        except ValidationError as exc:
            raise ConfigError(f"--cron {cron!r} does not parse as a cron schedule (5 fields: minute hour "
                              f"day-of-month month day-of-week, e.g. '0 2 * * *'): "
                              f"{exc.errors()[0]['msg']}") from None
        return {"cron": cron}
    assert interval is not None
    if not interval > 0:
        raise ConfigError(f"--interval must be a positive number of seconds, got {interval}")
    return {"interval": datetime.timedelta(seconds=float(interval))}


def check_api() -> None:
    """A deployment needs a Prefect server to hold its schedule: without ``PREFECT_API_URL`` (an
    environment variable or the Prefect profile's setting) ``serve`` would poll an ephemeral API that
    no scheduler feeds and run nothing, for ever."""
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise ConfigError("PREFECT_API_URL is not set: deploy registers its schedule on a Prefect server; "
                          "start one (prefect server start) and export PREFECT_API_URL=http://HOST:4200/api, "
                          "or log in to Prefect Cloud (prefect cloud login); --dry-run checks the rest "
                          "without one")


def deployment_parameters(store: str, out: str | None, **settings: Any) -> dict[str, Any]:
    """Check the store (it must exist, unless ``images`` will create it) and the settings; the
    refresh flow's parameters."""
    from pipeline.engine.sources import StoreSource
    from pipeline.service import make_spec

    images = settings.get("images")
    if images is not None:
        from pipeline.extract.extraction import is_image_source

        if not is_image_source(str(images)):
            raise ConfigError(f"--images {images}: not an image folder, tar shard(s) or image list")
        settings["images"] = str(Path(images).resolve())
    # a missing or invalid store: a clear StoreError, nothing changed (images create it on first run)
    src = StoreSource(store) if images is None or Path(store).exists() else None
    store_path = str(Path(store).resolve()) if "://" not in store else store
    out_path = Path(out) if out is not None else Path(store_path).with_name(Path(store_path).name
                                                                           + ".versions")
    cluster = settings.get("cluster")
    if cluster is not None and "://" not in cluster and cluster != "local":
        from pipeline.engine.cluster import load_cluster_config

        load_cluster_config(cluster).check_filled()  # missing, invalid, or YOUR_... left: a ConfigError
        settings["cluster"] = str(Path(cluster).resolve())  # scheduled runs may start elsewhere
    fit = {k: v for k, v in settings.items() if k not in ("quiet", "images", "extract_options")}
    make_spec(store, **fit)  # the refresh's spec
    if out_path.exists() and not out_path.is_dir():
        raise ConfigError(f"--out {out_path} exists and is not a directory")
    del src
    return dict(store=store_path, out=str(out_path.resolve()), **settings)


def deploy(store: str, out: str | None = None, *, cron: str | None = None, interval: float | None = None,
           name: str = DEPLOYMENT, dry_run: bool = False, **settings: Any) -> dict[str, Any]:
    """Register ``refresh_flow`` on the Prefect server as deployment ``name`` with the schedule, and
    serve it (blocks, executing the scheduled runs); ``dry_run`` only checks the inputs.

    Every input is checked before anything is registered or written. Returns the deployment's
    parameters and schedule.
    """
    schedule = check_schedule(cron, interval)
    params = deployment_parameters(store, out, **settings)
    if not dry_run:
        check_api()
        serve(name, params, schedule)
    return {"parameters": params, **schedule}


def serve(name: str, params: dict[str, Any], schedule: dict[str, Any]) -> None:
    """``refresh_flow.serve(name=name, parameters=params, limit=1, **schedule)``, where SIGTERM stops
    the process as Ctrl-C does (the runner stops and pauses the schedule): Prefect's own SIGTERM
    handler calls the runner's asynchronous stop without awaiting it, which printed "coroutine
    'Runner.astop' was never awaited" and exited without stopping the runner."""
    import asyncio
    import signal

    from prefect.runner import Runner

    class StopOnTerm(Runner):
        def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
            signal.raise_signal(signal.SIGINT)  # asyncio's Ctrl-C: the main task is cancelled

    runner = StopOnTerm(name=name, limit=1)
    runner.add_flow(refresh_flow, name=name, parameters=params, **schedule)
    when = schedule.get("cron") or f"every {schedule['interval'].total_seconds():g} s"
    print(f"serving the deployment {name!r} of refresh_flow ({when}); Ctrl-C or SIGTERM stops it", flush=True)
    try:
        asyncio.run(runner.start())
    except KeyboardInterrupt:
        print(f"stopped serving {name!r} (its schedule is paused)", flush=True)
