"""A real Dask scheduler and workers as separate processes, for tests that go through scheduler.yaml.

    with dask_scheduler_and_workers(n_workers=2) as address:
        client = Client(address)
        client.wait_for_workers(2, timeout=60)

The scheduler listens on 127.0.0.1 on a free port, without a dashboard (its HTTP server, which
still answers /health, takes another free port); each worker is its own
``dask worker`` process (one worker, one thread) in its own process group, and all of them are
terminated, then killed, on exit. Workers may still be registering when the address is yielded.

By default (as with the ``dask worker`` CLI) each worker runs under a nanny, which restarts a worker
process that dies; ``nanny=False`` passes ``--no-nanny``, so the ``dask worker`` process is the
worker itself and one that dies stays dead. Such a worker gets the environment a nanny would set
(``distributed.nanny.pre-spawn-environ``: one OpenMP/MKL/OpenBLAS thread), so both kinds compute
the same bits.

Every process gets the code under test first on ``PYTHONPATH`` (``code_root``: by default the
checkout this process imported ``pipeline`` from), not the checkout that the virtual environment's
editable install points at: a scheduler running other code cannot unpickle the driver's graphs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process group, then SIGKILL those still alive after a few seconds."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10.0
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pass
        # Kill the whole group even when the leader exited: a nanny's worker process may linger.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _code_env(code_root: str | None) -> dict[str, str]:
    """This environment with ``code_root`` (default: where this process imported ``pipeline`` from)
    first on ``PYTHONPATH``, so the processes run the code under test, not whatever checkout the
    virtual environment's editable install points at (the scheduler unpickles every graph, a worker
    every task, by importing the project's modules)."""
    if code_root is None:
        import pipeline

        code_root = str(Path(pipeline.__file__ or "").resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (code_root, env.get("PYTHONPATH")) if p)
    return env


def _no_nanny_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` plus what a nanny sets before it spawns its worker process."""
    import dask
    import distributed  # noqa: F401 - loads distributed's config defaults

    env = dict(env)
    env.update({k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()})
    return env


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dask scheduler exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"dask scheduler not listening after {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


@contextmanager
def dask_scheduler_and_workers(n_workers: int = 2, nanny: bool = True,
                               code_root: str | None = None) -> Iterator[str]:
    """Start ``dask scheduler`` and ``n_workers`` ``dask worker`` processes; yield the scheduler address.

    They import the project from ``code_root`` (default: the code this process runs)."""
    code_env = _code_env(code_root)
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask_cli = [sys.executable, "-m", "dask"]
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="vbcluster-dask-") as tmp:
        logs = Path(tmp)

        def spawn(name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
            with open(logs / f"{name}.log", "wb") as out:
                proc = subprocess.Popen(
                    [*dask_cli, *args],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own process group, so killpg reaches the nanny's child
                    cwd=tmp,
                )
            procs.append(proc)
            return proc

        try:
            scheduler = spawn(
                "scheduler",
                ["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
                 "--dashboard-address", "127.0.0.1:0"],
                code_env,
            )  # fmt: skip
            _wait_for_port(port, scheduler, logs / "scheduler.log")
            for i in range(n_workers):
                spawn(
                    f"worker-{i}",
                    [
                        "worker", address, "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
                        "--host", "127.0.0.1", "--local-directory", tmp,
                        *([] if nanny else ["--no-nanny"]),
                    ],
                    env=code_env if nanny else _no_nanny_env(code_env),
                )  # fmt: skip
            yield address
        finally:
            _stop(procs[1:])  # workers first, so they do not reconnect to a dying scheduler
            _stop(procs[:1])
