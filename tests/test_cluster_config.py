"""Cluster configurations: every file in cluster_config/ loads, bad files get one clear error naming the
file and the key, and the local, existing-scheduler, SLURM, PBS, Kubernetes and GPU configs build what
they describe (without submitting jobs or contacting Kubernetes)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from distributed import Client

from pipeline.engine.cluster import (
    DEFAULT_CONFIG,
    ClusterConfig,
    close_client,
    dashboard_link,
    default_config,
    load_cluster_config,
)
from tests._dask_procs import dask_scheduler_and_workers
from vbcore.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[1] / "cluster_config"
CONFIG_FILES = sorted(CONFIG_DIR.glob("*.yaml"))


def _write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _in_file(path: Path, key: str) -> str:
    """Regex for the start of an error message about `key` in `path`."""
    return re.escape(f"{path}: key {key!r}")


# --- the shipped files --------------------------------------------------------------------------


def test_config_dir_holds_the_documented_files() -> None:
    names = {p.stem for p in CONFIG_FILES}
    assert {"local", "scheduler", "slurm", "pbs", "kubernetes", "gpu"} <= names


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    config = load_cluster_config(path)
    assert config.source == str(path)
    assert (config.cluster_class is None) != (config.address is None)
    assert ClusterConfig.from_dict(config.to_dict(), source=str(path)) == config
    if config.cluster_class is not None:
        module = config.cluster_class.rpartition(".")[0]
        top = module.split(".")[0]
        if importlib.util.find_spec(top) is not None:  # importable here: the class must exist
            assert isinstance(config.resolve_cluster_class(), type)


def test_local_yaml_is_the_default() -> None:
    config = load_cluster_config(CONFIG_DIR / "local.yaml")
    assert config.to_dict() == dict(DEFAULT_CONFIG)
    assert default_config().to_dict() == config.to_dict()
    kw = config.cluster_kwargs
    assert config.cluster_class == "distributed.LocalCluster"
    assert (kw["n_workers"], kw["threads_per_worker"], kw["processes"]) == (2, 1, True)
    assert config.array_backend == "numpy"


def test_config_is_frozen() -> None:
    config = default_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.persist = "never"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.cluster_kwargs["n_workers"] = 8  # type: ignore[index]


# --- bad input: one ConfigError naming the file and the key --------------------------------------

BAD_DOCUMENTS = [
    pytest.param(
        "cluster_class: distributed.LocalCluster\ncluster_kwarg: {n_workers: 2}\n",
        "cluster_kwarg",
        r"unknown key \(did you mean 'cluster_kwargs'\?\); allowed keys: cluster_class, address",
        id="unknown-key",
    ),
    pytest.param("cluster_kwargs: {n_workers: 2}\n", "cluster_class", "missing", id="no-class-no-address"),
    pytest.param(
        "cluster_class: distributed.LocalCluster\naddress: tcp://127.0.0.1:8786\n",
        "address",
        "mutually exclusive",
        id="class-and-address",
    ),
    pytest.param(
        "cluster_class: distributed.LocalCluster\nscale: {workers: 2}\nadapt: {minimum: 1, maximum: 4}\n",
        "adapt",
        "'scale' and 'adapt' are mutually exclusive",
        id="scale-and-adapt",
    ),
    pytest.param(
        "cluster_class: distributed.LocalCluster\narray_backend: jax\n",
        "array_backend",
        "expected one of numpy, cupy, got 'jax'",
        id="array-backend",
    ),
    pytest.param(
        "cluster_class: distributed.LocalCluster\npersist: sometimes\n",
        "persist",
        "expected one of auto, always, never, got 'sometimes'",
        id="persist",
    ),
    pytest.param(
        "cluster_class: LocalCluster\n", "cluster_class", "package.module.ClassName", id="no-module"
    ),
    pytest.param(
        "cluster_class: dask_jobqueue.SLURMCluster\nscale: {job: 2}\n",
        "scale.job",
        r"unknown key \(did you mean 'jobs'\?\)",
        id="unknown-scale-key",
    ),
    pytest.param(
        "cluster_class: dask_jobqueue.SLURMCluster\nscale: {jobs: -1}\n",
        "scale.jobs",
        "integer >= 0",
        id="negative-scale",
    ),
    pytest.param(
        "cluster_class: dask_jobqueue.PBSCluster\nadapt: {minimum_jobs: 5, maximum_jobs: 2}\n",
        "adapt",
        r"minimum_jobs \(5\) is larger than maximum_jobs \(2\)",
        id="adapt-min-above-max",
    ),
    pytest.param(
        "cluster_class: distributed.LocalCluster\ncluster_kwargs: [1, 2]\n",
        "cluster_kwargs",
        "expected a mapping",
        id="kwargs-not-mapping",
    ),
    pytest.param(
        "address: tcp://127.0.0.1:8786\nscale: {workers: 2}\n",
        "scale",
        "applies only to a cluster vbcluster starts",
        id="address-with-scale",
    ),
]


@pytest.mark.parametrize(("text", "key", "message"), BAD_DOCUMENTS)
def test_bad_config_names_file_and_key(tmp_path: Path, text: str, key: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=_in_file(path, key) + ".*" + message):
        load_cluster_config(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=re.escape(f"{path}: no such cluster config file")):
        load_cluster_config(path)


def test_yaml_syntax_error_gives_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "cluster_class: distributed.LocalCluster\ncluster_kwargs:\n  n_workers: [2\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: invalid YAML at line ") + r"\d+, column \d+"):
        load_cluster_config(path)
    path = _write(tmp_path, "cluster_class: a.B\n  bad: indent\n", name="indent.yaml")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: invalid YAML at line 2, column")):
        load_cluster_config(path)


@pytest.mark.parametrize(
    ("text", "kind"), [("", "empty"), ("- a\n- b\n", "a list"), ("just text\n", "a str")]
)
def test_top_level_not_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(f"{path}: the top level is {kind}; expected a mapping")):
        load_cluster_config(path)


def test_from_dict_names_dict_source() -> None:
    with pytest.raises(ConfigError, match=r"^<dict>: key 'persist'"):
        ClusterConfig.from_dict({"cluster_class": "distributed.LocalCluster", "persist": 1})


@pytest.mark.parametrize(("name", "hint"), [
    ("distributed.LocalClustr", r" \(did you mean 'distributed\.LocalCluster'\?\)"),
    ("no_such_module_vbc.Cluster", ""),
    ("distributed.wait", r" \(did you mean 'distributed\.LocalCluster'\?\)"),
    ("subprocess.Popen", ""),
])
def test_only_known_cluster_classes_load(tmp_path: Path, name: str, hint: str) -> None:
    """Refused by name when the file is loaded (issue 29): nothing is imported (tests/test_config_refusals.py
    has the attack and the registered entry points)."""
    path = _write(tmp_path, f"cluster_class: {name}\n")
    with pytest.raises(ConfigError, match=_in_file(path, "cluster_class") + f": {re.escape(repr(name))} is "
                       f"not a cluster class vbcluster starts{hint}: use one of distributed.LocalCluster, "):
        load_cluster_config(path)


def test_cluster_rejecting_scale_is_closed(tmp_path: Path) -> None:
    # LocalCluster counts workers, not jobs: the error names 'scale' and the cluster is closed.
    path = _write(
        tmp_path,
        "cluster_class: distributed.LocalCluster\n"
        "cluster_kwargs: {n_workers: 0, processes: false, dashboard_address: ':0'}\n"
        "scale: {jobs: 2}\n",
    )
    with pytest.raises(ConfigError, match=_in_file(path, "scale") + ": distributed.LocalCluster rejected it"):
        load_cluster_config(path).make_cluster()


# --- local: a real cluster of 2 worker processes --------------------------------------------------


def test_local_yaml_connects_two_worker_processes() -> None:
    config = load_cluster_config(CONFIG_DIR / "local.yaml")
    client = config.connect()
    try:
        assert isinstance(client, Client)
        workers = client.scheduler_info()["workers"]
        assert len(workers) == 2
        assert all(w["nthreads"] == 1 for w in workers.values())
        assert len({w["id"] for w in workers.values()}) == 2
        assert client.submit(sum, [1, 2]).result() == 3
        # Dask's MALLOC_TRIM_THRESHOLD_ default is left out (it slowed the kernels ~1.3x), BLAS pinned
        names = ("MALLOC_TRIM_THRESHOLD_", "OPENBLAS_NUM_THREADS")
        envs = client.run(lambda: {k: os.environ.get(k) for k in names})
        assert all(e == {"MALLOC_TRIM_THRESHOLD_": None, "OPENBLAS_NUM_THREADS": "1"} for e in envs.values())
        link = dashboard_link(client)
        assert link is not None and link.startswith("http://127.0.0.1:")
    finally:
        cluster = client.cluster
        close_client(client)
    assert client.status == "closed"
    assert cluster.status.name == "closed"


# --- an existing scheduler, as separate processes -------------------------------------------------


def test_scheduler_yaml_connects_to_running_scheduler(tmp_path: Path) -> None:
    shipped = yaml.safe_load((CONFIG_DIR / "scheduler.yaml").read_text())
    with dask_scheduler_and_workers(n_workers=2) as address:
        path = _write(tmp_path, yaml.safe_dump({**shipped, "address": address}), name="scheduler.yaml")
        config = load_cluster_config(path)
        assert config.make_cluster() is None
        client = config.connect()
        try:
            assert client.cluster is None
            client.wait_for_workers(2, timeout=60)
            assert len(client.scheduler_info()["workers"]) == 2
            assert client.submit(sum, [1, 2]).result() == 3
            link = dashboard_link(client)  # --no-dashboard still serves HTTP (/health) on a free port
            assert link is not None and link.startswith("http://127.0.0.1:")
        finally:
            close_client(client)  # leaves the scheduler running; the context manager stops it


# --- SLURM and PBS: the job script, without submitting ----------------------------------------------


@pytest.mark.parametrize(
    ("name", "directive"),
    [("slurm.yaml", "#SBATCH"), ("pbs.yaml", "#PBS")],
)
def test_jobqueue_job_script(name: str, directive: str, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("dask_jobqueue")
    for command in ("sbatch", "qsub"):  # a submit command must be on PATH (it is not called here)
        (tmp_path / command).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / command).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    from dask.utils import parse_bytes
    from dask_jobqueue.pbs import pbs_format_bytes_ceil
    from dask_jobqueue.slurm import slurm_format_bytes_ceil

    config = load_cluster_config(CONFIG_DIR / name)
    assert config.cluster_class == f"dask_jobqueue.{name[:-5].upper()}Cluster"
    assert (config.scale or config.adapt) is not None
    # the site's values in place of the template's YOUR_... placeholders (refused unfilled)
    kw: dict[str, Any] = {k: v.replace("YOUR_", "site_") if isinstance(v, str) else v
                          for k, v in config.cluster_kwargs.items()}
    # No scale/adapt: constructing the cluster starts only its scheduler here; no job is submitted.
    cluster = dataclasses.replace(config, cluster_kwargs=kw, scale=None, adapt=None).make_cluster()
    assert cluster is not None
    try:
        script = cluster.job_script()
        assert cluster.workers == {}
    finally:
        cluster.close()

    lines = script.splitlines()
    memory = parse_bytes(kw["memory"])
    if directive == "#SBATCH":
        expected = [
            f"#SBATCH -p {kw['queue']}",
            f"#SBATCH -A {kw['account']}",
            f"#SBATCH --cpus-per-task={kw['cores']}",
            f"#SBATCH --mem={slurm_format_bytes_ceil(memory)}",
            f"#SBATCH -t {kw['walltime']}",
        ]
    else:
        expected = [
            f"#PBS -q {kw['queue']}",
            f"#PBS -A {kw['account']}",
            f"#PBS -l select=1:ncpus={kw['cores']}:mem={pbs_format_bytes_ceil(memory)}",
            f"#PBS -l walltime={kw['walltime']}",
        ]
    expected += [f"{directive} {extra}" for extra in kw["job_extra_directives"]]
    for line in expected:
        assert line in lines, f"{line!r} not in job script:\n{script}"
    worker_cmd = [line for line in lines if "distributed.cli.dask_worker" in line or "dask worker" in line]
    assert len(worker_cmd) == 1
    assert f"--nthreads {kw['cores'] // kw['processes']}" in worker_cmd[0]


# --- Kubernetes: the DaskCluster spec, without a Kubernetes cluster ---------------------------------


def test_kubernetes_spec() -> None:
    pytest.importorskip("dask_kubernetes")
    config = load_cluster_config(CONFIG_DIR / "kubernetes.yaml")
    assert config.cluster_class == "dask_kubernetes.operator.KubeCluster"
    kw = config.cluster_kwargs
    spec = config.kubernetes_spec()
    assert spec["kind"] == "DaskCluster"
    assert spec["metadata"]["name"] == kw["name"]
    worker = spec["spec"]["worker"]
    assert worker["replicas"] == kw["n_workers"]
    (container,) = worker["spec"]["containers"]
    assert container["image"] == kw["image"]
    assert container["resources"] == kw["resources"]
    assert spec["spec"]["scheduler"]["spec"]["containers"][0]["image"] == kw["image"]

    scaled = dataclasses.replace(config, scale={"workers": 7}).kubernetes_spec()
    assert scaled["spec"]["worker"]["replicas"] == 7


def test_kubernetes_spec_needs_a_kubernetes_config() -> None:
    with pytest.raises(ConfigError, match=r"local\.yaml: key 'cluster_class': a Kubernetes spec needs"):
        load_cluster_config(CONFIG_DIR / "local.yaml").kubernetes_spec()


# --- GPU: loads anywhere; making the cluster needs the [gpu] extra ----------------------------------


def test_gpu_yaml() -> None:
    path = CONFIG_DIR / "gpu.yaml"
    config = load_cluster_config(path)
    assert config.cluster_class == "dask_cuda.LocalCUDACluster"
    assert config.array_backend == "cupy"
    if importlib.util.find_spec("dask_cuda") is not None:
        pytest.skip("dask_cuda is installed: the missing-extra message cannot be checked")
    with pytest.raises(
        ConfigError,
        match=_in_file(path, "cluster_class")
        + re.escape(
            ": cannot import module 'dask_cuda' (install the 'gpu' extra: pip install 'vbcluster[gpu]')"
        ),
    ):
        config.make_cluster()


def test_worker_environ_keeps_a_configured_trim_threshold() -> None:
    import dask

    from pipeline.engine.cluster import worker_environ

    key = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
    assert worker_environ() == {key: None}  # Dask's default: dropped
    with dask.config.set({key: 1 << 30}):
        assert worker_environ() == {}  # the user's own value: kept
