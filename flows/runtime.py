"""The Dask cluster of a flow run, from ``cluster_config/`` (or an address, or none).

``dask_cluster(cluster)`` is a context manager around the whole flow body: it starts the cluster a
config describes (``cluster_config/*.yaml``), prints the dashboard link, and yields an
:class:`EngineSpec` that the tasks turn into an engine (a client to the same scheduler), so fit and
assign share one cluster. ``None`` runs every pass in the task's own process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.console import Console

console = Console(stderr=True, markup=False)  # addresses and class names as they are


@dataclass(frozen=True)
class EngineSpec:
    """Where the passes run: ``address`` of a Dask scheduler, or None for the in-process engine."""

    address: str | None = None
    persist: str = "auto"
    array_backend: str = "numpy"

    def open(self) -> Any:
        """A pipeline engine (the caller closes it; closing closes the client, not the cluster)."""
        from pipeline.engine.engines import DaskEngine, LocalEngine

        if self.address is None:
            return LocalEngine(persist="always" if self.persist == "auto" else self.persist)
        from distributed import Client

        return DaskEngine(Client(self.address), persist=self.persist, owns_client=True,
                          array_backend=self.array_backend)


@contextmanager
def dask_cluster(cluster: str | None, quiet: bool = False) -> Iterator[EngineSpec]:
    """Start (or connect to) the cluster ``cluster`` names for the duration of a flow run.

    Parameters
    ----------
    cluster : None, 'local', 'tcp://host:port' or a cluster config path (cluster_config/*.yaml)
    quiet : bool
        Do not print the scheduler address and dashboard link.
    """
    if cluster is None or cluster == "local":
        yield EngineSpec()
        return
    if "://" in cluster:
        yield EngineSpec(cluster)
        return
    from pipeline.engine.cluster import load_cluster_config

    cfg = load_cluster_config(cluster)
    if cfg.address is not None:
        yield EngineSpec(cfg.address, cfg.persist, cfg.array_backend)
        return
    started = cfg.make_cluster()
    try:
        link = getattr(started, "dashboard_link", None)
        if not quiet:
            console.print(f"Dask cluster ({cfg.cluster_class}): {started.scheduler_address}"
                          + (f"  dashboard: {link}" if link else ""), soft_wrap=True)
        yield EngineSpec(started.scheduler_address, cfg.persist, cfg.array_backend)
    finally:
        started.close()
