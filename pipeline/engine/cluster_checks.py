"""What a cluster config may run, checked before anything starts (issue 29): the cluster class (the
known ones, or one registered as an entry point), the worker class, the keyword arguments the class
takes, and no unfilled ``YOUR_...`` placeholder of the shipped templates.

A config runs ``cluster_class(**cluster_kwargs)``, so a config that could name any importable callable
(``subprocess.Popen`` with ``args``) would run anything, on ``vbcluster fit --cluster`` and on
``vbcluster resume`` of a run directory whose ``run.json`` names it. The class is therefore checked by
name against :data:`KNOWN_CLUSTERS` and the entry points of :data:`ENTRY_POINT_GROUP` when the file
is loaded, before any import. The options of an allowed class that load or run code (worker
``preload`` modules, the job script's own commands) are refused by :mod:`pipeline.engine.cluster_code`
unless the user opts in (``VBCLUSTER_ALLOW_CODE=1``).
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Mapping
from typing import Any

from vbcore.errors import ConfigError

#: The cluster classes a config may name (a config runs ``cluster_class(**cluster_kwargs)``, so any
#: other importable callable would run with arguments from the file): Dask's LocalCluster and those of
#: the cluster packages vbcluster supports. Others are allowed once registered as entry points of the
#: group :data:`ENTRY_POINT_GROUP` by an installed package.
KNOWN_CLUSTERS = (
    "distributed.LocalCluster",
    "dask_jobqueue.SLURMCluster", "dask_jobqueue.PBSCluster", "dask_jobqueue.SGECluster",
    "dask_jobqueue.LSFCluster", "dask_jobqueue.OARCluster", "dask_jobqueue.MoabCluster",
    "dask_jobqueue.HTCondorCluster",
    "dask_kubernetes.operator.KubeCluster", "dask_kubernetes.HelmCluster",
    "dask_cuda.LocalCUDACluster",
)
#: ``[project.entry-points."vbcluster.clusters"] my-cluster = "mypkg.clusters:MyCluster"`` lets a config
#: name ``cluster_class: mypkg.clusters.MyCluster``
ENTRY_POINT_GROUP = "vbcluster.clusters"
#: ``cluster_kwargs.worker_class`` (LocalCluster and LocalCUDACluster import a string): these only
KNOWN_WORKERS = ("distributed.Nanny", "distributed.Worker", "dask_cuda.CUDAWorker")
PLACEHOLDER = re.compile(r"\bYOUR_[A-Z0-9_]+\b")  # the values a site fills in (cluster_config/*.yaml)


def error(source: str, key: str | None, message: str) -> ConfigError:
    where = f"{source}: key {key!r}: " if key else f"{source}: "
    return ConfigError(where + message)


def suggest(word: str, choices: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def registered_clusters() -> set[str]:
    """Cluster classes registered by installed packages under :data:`ENTRY_POINT_GROUP`, as
    ``module.ClassName`` (read from the package metadata; nothing is imported)."""
    from importlib.metadata import entry_points

    return {ep.value.replace(":", ".") for ep in entry_points(group=ENTRY_POINT_GROUP)}


def check_known(source: str, cluster_class: str) -> None:
    """Only the known cluster classes and registered ones: checked by name, before any import."""
    if cluster_class in KNOWN_CLUSTERS or cluster_class in registered_clusters():
        return
    raise error(source, "cluster_class", f"{cluster_class!r} is not a cluster class vbcluster starts"
                f"{suggest(cluster_class, list(KNOWN_CLUSTERS))}: use one of {', '.join(KNOWN_CLUSTERS)}, "
                "'address' for a running scheduler, or register your class as an entry point of the group "
                f"'{ENTRY_POINT_GROUP}' (cluster_config/README.md)")


def placeholders(value: Any, key: str) -> list[tuple[str, str]]:
    """(key, placeholder) of every unfilled ``YOUR_...`` value under ``value``, in order."""
    if isinstance(value, Mapping):
        return [f for k, v in value.items() for f in placeholders(v, f"{key}.{k}" if key else str(k))]
    if isinstance(value, (list, tuple)):
        return [f for i, v in enumerate(value) for f in placeholders(v, f"{key}[{i}]")]
    found = PLACEHOLDER.search(value) if isinstance(value, str) else None
    return [(key, found.group(0))] if found else []


def _accepted(cls: type) -> set[str] | None:
    """Keyword arguments ``cls(...)`` takes; None when it forwards unknown ones where we cannot follow.

    ``distributed.LocalCluster`` forwards its extra keywords to each worker (Nanny, then Worker, then
    the server base class): those are followed, so a misspelt key fails here, before a worker process
    dies with a long traceback.
    """
    classes: list[Any] = [cls]
    try:
        from distributed import LocalCluster, Nanny, Worker
        from distributed.core import Server

        if issubclass(cls, LocalCluster):
            classes += [Nanny, Worker, Server]
    except ImportError:  # pragma: no cover - distributed is a dependency
        pass
    names: set[str] = set()
    for c in classes:
        try:
            params = inspect.signature(c.__init__).parameters
        except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
            return None
        kinds = {p.kind for p in params.values()}
        if inspect.Parameter.VAR_KEYWORD in kinds and c is classes[-1]:
            return None  # the last class forwards keywords we cannot see
        names |= {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names - {"self"}


def check_cluster_kwargs(source: str, cls: type, name: str, kwargs: Mapping[str, Any]) -> None:
    """Refuse a key of ``cluster_kwargs`` that the cluster class (and its workers) do not take."""
    accepted = _accepted(cls)
    if accepted is None or "worker_class" in kwargs:  # another worker class takes other keywords
        return
    for key in kwargs:
        if key not in accepted:
            raise error(source, f"cluster_kwargs.{key}", f"not an argument of {name} or its workers"
                         f"{suggest(key, sorted(accepted))}")
