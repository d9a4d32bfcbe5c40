"""``study_flow``: run studies (``pipeline.studies.<name>.run(out, quick=, seed=)``) as Prefect tasks.

Studies are computation, so their tasks have no retries. Given a cluster (a ``cluster_config/``
file or a scheduler address), the study tasks themselves spread over its workers through
prefect-dask's ``DaskTaskRunner``; without one they run in threads of this process.
"""

from __future__ import annotations

import importlib.util

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from pipeline.studies import known_studies
from pipeline.studies import run_study as _run_study
from vbcore.errors import ConfigError


def available_studies() -> list[str]:
    """The studies of ``pipeline.studies``."""
    return known_studies()


def check_study(name: str) -> None:
    """Refuse a name that is not an importable study module with a ``run`` function."""
    if not name.isidentifier():
        raise ConfigError(f"study name {name!r} is not a module name")
    try:
        spec = importlib.util.find_spec(f"pipeline.studies.{name}")
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        known = available_studies()
        raise ConfigError(f"unknown study {name!r}: no module pipeline.studies.{name} "
                          f"(available: {', '.join(known) if known else 'none installed'})")


@task(name="study", cache_policy=NONE)
def run_study(name: str, out: str, quick: bool = False, seed: int = 0) -> str:
    """:func:`pipeline.studies.run_study` (one BLAS thread, as every study); returns its output dir."""
    path = _run_study(name, out, quick=quick, seed=seed)
    get_run_logger().info("study %s wrote %s", name, path)
    return str(path)


@flow(name="vbcluster-study")
def study_flow(names: list[str] | str, out: str, quick: bool = False, seed: int = 0) -> list[str]:
    """Run the named studies (in parallel on the flow's task runner); returns their output dirs."""
    items = [names] if isinstance(names, str) else list(names)
    for name in items:
        check_study(name)
    futures = [run_study.submit(name, out, quick, seed) for name in items]
    return [f.result() for f in futures]


def run_studies(names: list[str] | str, out: str, *, quick: bool = False, seed: int = 0,
                cluster: str | None = None) -> list[str]:
    """``study_flow``, with its tasks on the Dask cluster ``cluster`` names when one is given."""
    items = [names] if isinstance(names, str) else list(names)
    for name in items:
        check_study(name)  # before any cluster starts
    if cluster is None:
        return study_flow(items, out, quick, seed)
    from prefect_dask import DaskTaskRunner

    from flows.runtime import dask_cluster

    with dask_cluster(cluster) as engine:
        runner = DaskTaskRunner(address=engine.address) if engine.address else None
        f = study_flow if runner is None else study_flow.with_options(task_runner=runner)
        return f(items, out, quick, seed)
