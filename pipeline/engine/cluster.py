"""Cluster configurations: the YAML files in ``cluster_config/`` turned into a Dask cluster and client.

A configuration names a cluster class and its keyword arguments (``cluster_class`` +
``cluster_kwargs``, as prefect-dask does), or the ``address`` of a scheduler that is already running,
plus optional ``scale`` / ``adapt``, the array backend the kernels run on and whether chunks are
persisted on the workers. ``cluster_config/README.md`` documents the schema.

Loading checks the file's shape only; the cluster class is imported when a cluster is made, so a
GPU or Kubernetes config can be read (and shipped) where dask-cuda or dask-kubernetes is missing.
Every problem is a :class:`~vbcore.errors.ConfigError` that names the file and the key.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, cast

import yaml

from pipeline.engine.backends import ARRAY_BACKENDS
from pipeline.engine.cluster_checks import (
    KNOWN_WORKERS,
    check_cluster_kwargs,
    check_known,
    error,
    placeholders,
    suggest,
)
from pipeline.engine.cluster_code import check_code
from pipeline.engine.cluster_jobs import check_submit_command, keep_jobs

if TYPE_CHECKING:
    from distributed import Client

ArrayBackend = Literal["numpy", "cupy"]
Persist = Literal["auto", "always", "never"]

TOP_LEVEL_KEYS = ("cluster_class", "address", "cluster_kwargs", "scale", "adapt", "array_backend", "persist")
SCALE_KEYS = ("workers", "jobs", "memory", "cores")
ADAPT_KEYS = (
    "minimum",
    "maximum",
    "minimum_jobs",
    "maximum_jobs",
    "minimum_cores",
    "maximum_cores",
    "minimum_memory",
    "maximum_memory",
    "interval",
    "wait_count",
    "target_duration",
)
COUNT_KEYS = frozenset(
    {
        "workers",
        "jobs",
        "cores",
        "minimum",
        "maximum",
        "minimum_jobs",
        "maximum_jobs",
        "minimum_cores",
        "maximum_cores",
        "wait_count",
    }
)
PERSIST_MODES = ("auto", "always", "never")
# The optional extra that installs each cluster package.
EXTRAS = {"dask_jobqueue": "hpc", "dask_kubernetes": "k8s", "dask_cuda": "gpu"}

# default_config()'s settings (a Dask cluster without a file; vbcluster without --cluster starts none);
# cluster_config/local.yaml holds the same (a test keeps them equal), but is not installed with the package.
DEFAULT_CONFIG: Mapping[str, Any] = MappingProxyType(
    {
        "cluster_class": "distributed.LocalCluster",
        "cluster_kwargs": {
            "n_workers": 2,
            "threads_per_worker": 1,
            "processes": True,
            "memory_limit": "auto",
            "host": "127.0.0.1",
            "dashboard_address": "127.0.0.1:0",
        },
        "array_backend": "numpy",
        "persist": "auto",
    }
)


def _mapping(source: str, key: str, value: Any, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A YAML mapping with string keys (from ``allowed`` when given); ``None`` reads as empty."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise error(source, key, f"expected a mapping, got {type(value).__name__} {value!r}")
    for k in value:
        if not isinstance(k, str):
            raise error(source, key, f"keys must be strings, got {k!r}")
        if allowed is not None and k not in allowed:
            raise error(
                source,
                f"{key}.{k}",
                f"unknown key{suggest(k, allowed)}; allowed under {key!r}: {', '.join(allowed)}",
            )
    return copy.deepcopy(dict(value))


def _check_sizes(source: str, key: str, sizes: Mapping[str, Any]) -> None:
    """Counts are integers >= 0, and each minimum is at most its maximum."""
    for k, v in sizes.items():
        if k in COUNT_KEYS and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise error(source, f"{key}.{k}", f"expected an integer >= 0, got {v!r}")
    for k, v in sizes.items():
        top = sizes.get(k.replace("minimum", "maximum"))
        if k.startswith("minimum") and k in COUNT_KEYS and isinstance(top, int) and v > top:
            raise error(source, key, f"{k} ({v}) is larger than {k.replace('minimum', 'maximum')} ({top})")
    if key == "scale" and "workers" in sizes and "jobs" in sizes:
        raise error(source, key, "give workers or jobs, not both")


def _import_attr(source: str, module_name: str, attr: str) -> Any:
    """``module_name.attr``, or a ConfigError on key 'cluster_class' that says what to install."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = EXTRAS.get(module_name.split(".", 1)[0])
        hint = f" (install the {extra!r} extra: pip install 'vbcluster[{extra}]')" if extra else ""
        raise error(source, "cluster_class", f"cannot import module {module_name!r}{hint}: {exc}") from exc
    if not hasattr(module, attr):
        names = [n for n in dir(module) if not n.startswith("_")]
        raise error(
            source,
            "cluster_class",
            f"module {module_name!r} has no attribute {attr!r}" + suggest(attr, names),
        )
    return getattr(module, attr)


def _check_target(source: str, cluster_class: Any, address: Any) -> tuple[Any, Any]:
    """Exactly one of ``cluster_class`` (a cluster to start) and ``address`` (a running scheduler),
    each well formed."""
    if cluster_class is None and address is None:
        raise error(
            source,
            "cluster_class",
            "missing: give 'cluster_class' (a cluster to start, for "
            "example distributed.LocalCluster) or 'address' (a running scheduler, for example "
            "tcp://127.0.0.1:8786)",
        )
    if cluster_class is not None and address is not None:
        raise error(
            source,
            "address",
            "'cluster_class' and 'address' are mutually exclusive: keep "
            "'cluster_class' to start a cluster, or 'address' to connect to a running scheduler",
        )
    if cluster_class is not None:
        parts = cluster_class.split(".") if isinstance(cluster_class, str) else []
        if len(parts) < 2 or not all(p.isidentifier() for p in parts):
            raise error(
                source,
                "cluster_class",
                f"expected 'package.module.ClassName' (for example "
                f"distributed.LocalCluster), got {cluster_class!r}",
            )
    if cluster_class is not None:
        check_known(source, cluster_class)
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise error(
            source,
            "address",
            f"expected a scheduler address such as tcp://127.0.0.1:8786, got {address!r}",
        )
    return cluster_class, address


@dataclass(frozen=True)
class ClusterConfig:
    """A validated cluster configuration.

    Exactly one of ``cluster_class`` (a cluster vbcluster starts) and ``address`` (a running
    scheduler) is set; ``scale`` and ``adapt`` are not both set. ``source`` is the file it came
    from, used in every error message.
    """

    cluster_class: str | None = None
    address: str | None = None
    cluster_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    scale: Mapping[str, Any] | None = None
    adapt: Mapping[str, Any] | None = None
    array_backend: ArrayBackend = "numpy"
    persist: Persist = "auto"
    source: str = "<dict>"

    @classmethod
    def from_dict(cls, d: Any, source: str = "<dict>") -> ClusterConfig:
        """Validate a parsed YAML document (a mapping of the top-level keys) into a ClusterConfig."""
        if not isinstance(d, Mapping):
            kind = "empty" if d is None else f"a {type(d).__name__}"
            raise error(
                source,
                None,
                f"the top level is {kind}; expected a mapping with the keys {', '.join(TOP_LEVEL_KEYS)}",
            )
        for key in d:
            if key not in TOP_LEVEL_KEYS:
                raise error(
                    source,
                    str(key),
                    f"unknown key{suggest(str(key), TOP_LEVEL_KEYS)}; "
                    f"allowed keys: {', '.join(TOP_LEVEL_KEYS)}",
                )

        cluster_class, address = _check_target(source, d.get("cluster_class"), d.get("address"))
        kwargs = _mapping(source, "cluster_kwargs", d.get("cluster_kwargs"))
        scale = _mapping(source, "scale", d.get("scale"), SCALE_KEYS) or None
        adapt = _mapping(source, "adapt", d.get("adapt"), ADAPT_KEYS) or None
        if scale is not None and adapt is not None:
            raise error(
                source,
                "adapt",
                "'scale' and 'adapt' are mutually exclusive: keep 'scale' for a "
                "fixed size, or 'adapt' to grow and shrink with the work",
            )
        for key, sizes in (("scale", scale), ("adapt", adapt)):
            if sizes is not None:
                _check_sizes(source, key, sizes)
        check_code(source, kwargs)
        if address is not None:
            for key, value in (("cluster_kwargs", kwargs), ("scale", scale), ("adapt", adapt)):
                if value:
                    raise error(
                        source,
                        key,
                        "applies only to a cluster vbcluster starts ('cluster_class'); "
                        "an 'address' config connects to a running scheduler, so remove it",
                    )

        array_backend = d.get("array_backend", "numpy")
        if array_backend not in ARRAY_BACKENDS:
            raise error(
                source, "array_backend", f"expected one of {', '.join(ARRAY_BACKENDS)}, got {array_backend!r}"
            )
        persist = d.get("persist", "auto")
        if persist not in PERSIST_MODES:
            raise error(source, "persist", f"expected one of {', '.join(PERSIST_MODES)}, got {persist!r}")

        return cls(
            cluster_class=cluster_class,
            address=address.strip() if address is not None else None,
            cluster_kwargs=MappingProxyType(kwargs),
            scale=MappingProxyType(scale) if scale is not None else None,
            adapt=MappingProxyType(adapt) if adapt is not None else None,
            array_backend=cast(ArrayBackend, array_backend),
            persist=cast(Persist, persist),
            source=source,
        )

    def to_dict(self) -> dict[str, Any]:
        """The YAML document (plain dicts), such that ``from_dict(c.to_dict()) == c`` up to ``source``."""
        out: dict[str, Any] = {}
        if self.address is not None:
            out["address"] = self.address
        else:
            out["cluster_class"] = self.cluster_class
            out["cluster_kwargs"] = copy.deepcopy(dict(self.cluster_kwargs))
        if self.scale is not None:
            out["scale"] = dict(self.scale)
        if self.adapt is not None:
            out["adapt"] = dict(self.adapt)
        out["array_backend"] = self.array_backend
        out["persist"] = self.persist
        return out

    def check_filled(self) -> None:
        """Refuse a config whose values still hold a ``YOUR_...`` placeholder of the shipped files,
        naming the key (loading allows them, so a template can be read and copied)."""
        found = placeholders(self.to_dict(), "")
        if found:
            key, value = found[0]
            raise error(self.source, key, f"unfilled placeholder {value!r}: replace it with your site's "
                        "value")

    def resolve_cluster_class(self) -> type:
        """Import ``cluster_class``; ConfigError (naming the extra to install) when that fails."""
        if self.cluster_class is None:
            raise error(
                self.source,
                "cluster_class",
                f"not set: this config connects to {self.address} instead of starting a cluster",
            )
        module_name, _, attr = self.cluster_class.rpartition(".")
        obj = _import_attr(self.source, module_name, attr)
        if not inspect.isclass(obj):
            raise error(
                self.source, "cluster_class", f"{self.cluster_class} is a {type(obj).__name__}, not a class"
            )
        return cast(type, obj)

    def make_cluster(self) -> Any | None:
        """Start the cluster (``cluster_class(**cluster_kwargs)``, then scale or adapt) and return it.

        Returns None for an ``address`` config: there is nothing to start. The caller closes the
        cluster (``cluster.close()``) when done.
        """
        if self.address is not None:
            return None
        return self._start_cluster()

    def _start_cluster(self) -> Any:
        import dask

        self.check_filled()
        worker = self.cluster_kwargs.get("worker_class")
        if worker is not None and worker not in KNOWN_WORKERS:
            raise error(self.source, "cluster_kwargs.worker_class", f"{worker!r} is not a Dask worker class; "
                         f"use one of {', '.join(KNOWN_WORKERS)}")
        cls = self.resolve_cluster_class()
        check_cluster_kwargs(self.source, cls, self.cluster_class or "", self.cluster_kwargs)
        check_submit_command(self.source, cls, self.cluster_class or "")
        drop = worker_environ()
        # a nanny started earlier in this process left Dask's value in os.environ, which the new
        # workers would inherit (distributed.nanny sets os.environ before spawning): hidden meanwhile
        hidden = os.environ.pop("MALLOC_TRIM_THRESHOLD_", None) if drop else None
        try:
            with dask.config.set(drop):  # the workers started here and by scale()
                return self._start(cls)
        finally:
            if hidden is not None:
                os.environ["MALLOC_TRIM_THRESHOLD_"] = hidden

    def _start(self, cls: type) -> Any:
        try:
            cluster = cls(**copy.deepcopy(dict(self.cluster_kwargs)))
        except (TypeError, ValueError) as exc:
            raise error(self.source, "cluster_kwargs", f"{self.cluster_class} rejected them: {exc}") from exc
        try:
            if self.scale is not None:
                sizes = dict(self.scale)
                if "workers" in sizes:
                    sizes["n"] = sizes.pop("workers")
                cluster.scale(**sizes)
            elif self.adapt is not None:
                cluster.adapt(**dict(self.adapt))
        except (TypeError, ValueError) as exc:
            cluster.close()
            key = "scale" if self.scale is not None else "adapt"
            raise error(self.source, key, f"{self.cluster_class} rejected it: {exc}") from exc
        except BaseException:
            cluster.close()
            raise
        keep_jobs(cluster)  # batch jobs that end early (scancel, pre-emption, walltime) come back
        return cluster

    def connect(self) -> Client:
        """A ``distributed.Client`` on the running scheduler, or on a cluster started from this config.

        Close it with :func:`close_client`, which also closes a cluster this config started.
        """
        from distributed import Client

        if self.address is not None:
            return Client(self.address)
        cluster = self._start_cluster()
        try:
            return Client(cluster)
        except BaseException:
            cluster.close()
            raise

    def kubernetes_spec(self) -> dict[str, Any]:
        """The DaskCluster resource a dask-kubernetes config would create, without contacting Kubernetes.

        Built by ``dask_kubernetes.operator.make_cluster_spec`` from the ``cluster_kwargs`` it
        accepts (name, image, n_workers, resources, env, ...); ``scale: {workers: N}`` sets the
        worker replicas.
        """
        if not (self.cluster_class or "").startswith("dask_kubernetes."):
            raise error(
                self.source,
                "cluster_class",
                "a Kubernetes spec needs "
                f"dask_kubernetes.operator.KubeCluster, got {self.cluster_class or self.address!r}",
            )
        make_cluster_spec = _import_attr(self.source, "dask_kubernetes.operator", "make_cluster_spec")
        accepted = inspect.signature(make_cluster_spec).parameters
        kwargs = {k: copy.deepcopy(v) for k, v in self.cluster_kwargs.items() if k in accepted}
        if not isinstance(kwargs.get("name"), str):
            raise error(self.source, "cluster_kwargs.name", "required: the DaskCluster's name")
        if isinstance(kwargs.get("env"), Mapping):  # KubeCluster takes a dict; the spec needs a list
            kwargs["env"] = [{"name": k, "value": str(v)} for k, v in kwargs["env"].items()]
        spec = cast(dict[str, Any], make_cluster_spec(**kwargs))
        if self.scale is not None and "workers" in self.scale:
            spec["spec"]["worker"]["replicas"] = self.scale["workers"]
        return spec


#: Dask's nanny default for ``MALLOC_TRIM_THRESHOLD_``: glibc returns freed memory at once, so every
#: kernel call page-faults its temporaries in again (task compute 3.85-4.34 s against 2.89-2.98 s a
#: pass without it, docs/benchmarks.md)
DASK_TRIM_DEFAULT = "65536"


def worker_environ() -> dict[str, Any]:
    """Dask config for the nannies vbcluster starts: Dask's default ``MALLOC_TRIM_THRESHOLD_`` left
    out; another value the user configured or exported (or ``cluster_kwargs.env``, which nannies apply
    after it) is kept."""
    import dask

    key = "distributed.nanny.pre-spawn-environ"
    env = dask.config.get(key, default={}) or {}
    own = os.environ.get("MALLOC_TRIM_THRESHOLD_", DASK_TRIM_DEFAULT)  # Dask's value, or the user's export
    if str(env.get("MALLOC_TRIM_THRESHOLD_")) == DASK_TRIM_DEFAULT and own == DASK_TRIM_DEFAULT:
        return {key + ".MALLOC_TRIM_THRESHOLD_": None}  # None unsets it (distributed.nanny)
    return {}


def load_cluster_config(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate a cluster config YAML file (see ``cluster_config/README.md``)."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(
            source,
            None,
            "no such cluster config file (the files shipped with vbcluster are "
            "in cluster_config/: local, scheduler, slurm, slurm-local, pbs, kubernetes, gpu)",
        ) from None
    except OSError as exc:
        raise error(source, None, f"cannot read the cluster config: {exc}") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(source, None, f"invalid YAML{where}: {problem}") from exc
    return ClusterConfig.from_dict(document, source=source)


def default_config() -> ClusterConfig:
    """``cluster_config/local.yaml``'s settings, built in (2 local worker processes, 1 thread each): a
    Dask cluster without a file. Not what vbcluster uses without ``--cluster`` (the local engine)."""
    return ClusterConfig.from_dict(DEFAULT_CONFIG, source="<default: cluster_config/local.yaml>")


def dashboard_link(client: Client) -> str | None:
    """The scheduler dashboard's URL, or None when the scheduler reports no HTTP service."""
    try:
        link = client.dashboard_link
    except (KeyError, AttributeError):
        return None
    return str(link) if link else None


def close_client(client: Client) -> None:
    """Close ``client`` and the cluster it was started on, if any; a running scheduler is left alone."""
    cluster = client.cluster
    client.close()
    if cluster is not None:
        cluster.close()
