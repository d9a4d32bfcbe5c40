"""Batch-job clusters (dask-jobqueue): the submit command checked up front, lost jobs submitted again,
and a wait for the first worker that SIGTERM ends (issues 53 item 4, 56).

* :func:`check_submit_command`: a ``SLURMCluster`` (``PBSCluster``, ``SGECluster`` ...) on a host
  without its submit command (``sbatch``, ``qsub`` ...) printed a raw traceback and then waited
  for workers forever; it is refused in one line before anything starts.
* :func:`keep_jobs`: a job that ends before the cluster does (``scancel``, pre-emption, its
  walltime, a worker ``--lifetime``) leaves the scheduler; dask-jobqueue forgets it
  ``distributed.deploy.lost-worker-timeout`` later (15 s by default) but submits nothing in its
  place until the cluster is scaled again. Every :data:`KEEP_INTERVAL_S` the cluster's planned jobs
  (``scale``, or what ``adapt`` asked for) are made real again, so a lost job is replaced.
* :func:`wait_for_workers`: until the first worker joins (jobs can queue for long), with SIGTERM and
  SIGINT ending the wait (the caller closes the cluster, which cancels its jobs).
"""

from __future__ import annotations

import shlex
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.engine.cluster_checks import error

#: how often a batch-job cluster's lost jobs are looked for (seconds)
KEEP_INTERVAL_S = 2.0


def submit_command(cls: type) -> str | None:
    """The program a dask-jobqueue cluster class submits its jobs with (``sbatch``), or None for
    other classes."""
    job_cls = getattr(cls, "job_cls", None)
    command = getattr(job_cls, "submit_command", None)
    if not isinstance(command, str) or not command.strip():
        return None
    return shlex.split(command)[0]


def check_submit_command(source: str, cls: type, name: str) -> None:
    """Refuse a batch-job cluster whose submit command is not on ``PATH``, in one line."""
    command = submit_command(cls)
    if command is not None and shutil.which(command) is None:
        raise error(source, "cluster_class", f"{name} submits its workers as batch jobs with {command!r}, "
                    f"which is not on PATH: run vbcluster where {command} works (a login node of the "
                    "cluster), or use another cluster config")


def keep_jobs(cluster: Any) -> None:
    """Submit again, every :data:`KEEP_INTERVAL_S`, the planned jobs of ``cluster`` that ended
    (dask-jobqueue clusters only; see the module's docstring)."""
    if submit_command(type(cluster)) is None or not hasattr(cluster, "_correct_state"):
        return
    from distributed.core import Status
    from tornado.ioloop import PeriodicCallback

    def keep() -> None:
        if cluster.status == Status.running and set(cluster.worker_spec) - set(cluster.workers):
            cluster._correct_state()

    def install() -> None:
        pc = PeriodicCallback(keep, KEEP_INTERVAL_S * 1000)
        cluster.periodic_callbacks["vbcluster-keep-jobs"] = pc
        pc.start()

    cluster.loop.add_callback(install)


@contextmanager
def _signals_end_the_wait() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) meanwhile (SIGINT raises KeyboardInterrupt as always)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    saved = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved)


def wait_for_workers(client: Any, say: Any = None) -> None:
    """Block until ``client``'s scheduler has a worker; ``say(message)`` is told once when it has
    none yet. SIGTERM and SIGINT end the wait (SystemExit 143, KeyboardInterrupt)."""
    if client.scheduler_info().get("workers"):
        return
    with _signals_end_the_wait():  # before the message: a signal that follows it ends the wait
        if say is not None:
            say("waiting for the cluster's first worker (batch jobs may queue: squeue / qstat shows them)")
        while True:
            try:
                client.wait_for_workers(1, timeout=1.0)
                return
            except TimeoutError:
                continue
