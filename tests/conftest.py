"""Test-session setup: a throwaway Prefect home, no telemetry, a headless matplotlib, GPU skips.

The environment is set at import time, before any test module imports prefect or matplotlib;
values already set by the caller (for example by `make test`) win.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from functools import cache

import pytest

if "PREFECT_HOME" not in os.environ:
    _prefect_home = tempfile.mkdtemp(prefix="vbcluster-prefect-")
    os.environ["PREFECT_HOME"] = _prefect_home
    atexit.register(shutil.rmtree, _prefect_home, ignore_errors=True)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("MPLBACKEND", "Agg")


@cache
def _gpu_unavailable_reason() -> str | None:
    """Why CUDA tests cannot run here, or None when CuPy sees at least one device."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - ImportError, or CUDA libraries failing to load
        return f"cupy cannot be imported ({type(exc).__name__}: {exc})"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - no driver, no device, driver too old
        return f"no CUDA device ({type(exc).__name__}: {exc})"
    if count == 0:
        return "no CUDA device (getDeviceCount() == 0)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = _gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test skipped: {reason}")
    for item in gpu_items:
        item.add_marker(skip)


# ---- Prefect: one ephemeral API server for the whole session (flow tests) -------------------------
@pytest.fixture(scope="session")
def prefect_api():
    """A Prefect test harness (its own SQLite database, a local API subprocess) shared by every test
    of the session that runs flows: starting one costs 12-26 s. Yields the API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=None):  # None: the ephemeral start-up timeout
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="module")
def client():
    """A real Dask cluster for a test module: two worker processes, one thread each, on 127.0.0.1."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                           host="127.0.0.1")
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()


# ---- SLURM: one throwaway SLURM on this machine for the whole session (issue 56) ------------------
@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A local SLURM (``tests/_slurm.py``: munged, slurmctld and slurmd as root in a temp directory,
    one node of 2 CPUs, partition ``debug``), started once a session, stopped by PID at its end.
    Skips, giving the reason, where it cannot run (not root, slurm-wlm or munge not installed)."""
    from tests._slurm import local_slurm, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no local SLURM: {reason}")
    with local_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
