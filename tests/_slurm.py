"""A throwaway SLURM on this machine, for the tests of the HPC path (issue 56).

    with local_slurm(root) as slurm:          # or the session fixture ``slurm`` of tests/conftest.py
        subprocess.run(["sbatch", "--wrap", "hostname"], env=slurm.env)

Debian's ``slurm-wlm`` and ``munge`` packages, run as root: a ``munged`` with its own key and socket,
a ``slurm.conf`` naming this host as controller and as one node of 2 CPUs (partition ``debug``),
``slurmctld`` and ``slurmd`` in the foreground as children of this process, every path (state, spool,
pid and log files, the munge socket) under ``root``, and the controller and node ports picked free,
so two sessions on one machine do not meet. ``slurm.env`` holds ``SLURM_CONF``: the client commands
(``sbatch``, ``squeue``, ``scancel``) given that environment talk to this cluster only.
:meth:`LocalSlurm.use` sets it in ``os.environ`` for code that calls them itself (dask-jobqueue).

On exit every job is cancelled and the daemons are stopped by their process ids (SIGTERM, then
SIGKILL after 10 s). :func:`unavailable_reason` says why the harness cannot run here (not root, a
program missing), for a skip that gives the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin")
START_TIMEOUT_S = 60.0
#: the node's size: the tests ask 1 core and 2 GiB a job, so two jobs run at once
NODE_CPUS, NODE_MEMORY_MB = 2, 20000


def _which(name: str) -> str | None:
    found = (f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK))
    return shutil.which(name) or next(found, None)


def unavailable_reason() -> str | None:
    """Why a local SLURM cannot start here, or None when it can (root, and every program found)."""
    if os.name != "posix" or os.geteuid() != 0:
        return "a local SLURM runs its daemons as root (SlurmUser=root); this process is not root"
    missing = [p for p in PROGRAMS if _which(p) is None]
    if missing:
        return (f"{', '.join(missing)} not installed (Debian: apt-get install -y slurm-wlm munge; "
                ".ci/run installs them)")
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _config(root: Path, host: str, sock: Path) -> str:
    ports = _free_port(), _free_port()
    return "\n".join([
        "ClusterName=vbctest", f"SlurmctldHost={host}", f"SlurmctldPort={ports[0]}", f"SlurmdPort={ports[1]}",
        "AuthType=auth/munge", f"AuthInfo=socket={sock}", "CredType=cred/munge",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
        "SlurmUser=root", "SlurmdUser=root", "MpiDefault=none", "ReturnToService=2",
        "SchedulerType=sched/backfill", "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none", "JobCompType=jobcomp/none",
        "KillWait=5", "MinJobAge=300", "InactiveLimit=0", "SlurmctldTimeout=30", "SlurmdTimeout=30",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.log",
        f"NodeName={host} CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP", "",
    ])


@dataclass
class LocalSlurm:
    """A running local SLURM: its directory, the environment of its clients, its daemons."""

    root: Path
    host: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        """slurmctld's log (job allocations: ``sched: Allocate JobId=...``; written late, read it after
        the fact)."""
        return self.root / "slurmctld.log"

    def run(self, *args: str, check: bool = True) -> str:
        """A client command (``squeue``, ``scancel`` ...) against this cluster; its stdout."""
        res = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def jobs(self, states: str = "PENDING,RUNNING") -> list[str]:
        """This cluster's job ids in ``states`` (squeue)."""
        out = self.run("squeue", "-h", "-o", "%i", "-t", states)
        return [line.strip() for line in out.splitlines() if line.strip()]

    def started(self) -> set[str]:
        """Ids of this cluster's jobs that were given a node, running or ended (slurmctld keeps ended
        jobs MinJobAge = 300 s; its log file is written late, so it is not read for this)."""
        out = self.run("squeue", "-h", "-t", "all", "-o", "%i|%N")
        rows = (line.partition("|") for line in out.splitlines())
        return {i.strip() for i, _, nodes in rows if nodes.strip()}

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until no job is pending or running (the previous test's jobs ended)."""
        deadline = time.monotonic() + timeout
        while self.jobs():
            if time.monotonic() > deadline:
                raise TimeoutError(f"SLURM jobs still queued after {timeout:.0f} s: {self.jobs()}")
            time.sleep(0.5)

    @contextmanager
    def use(self) -> Iterator[LocalSlurm]:
        """``SLURM_CONF`` (and this cluster's PATH) set in ``os.environ`` meanwhile."""
        saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "PATH")}
        os.environ.update(SLURM_CONF=self.env["SLURM_CONF"], PATH=self.env["PATH"])
        try:
            yield self
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start_munge(root: Path) -> tuple[subprocess.Popen, Path]:
    key, sock = root / "munge.key", root / "munge.sock"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    cmd = [_which("munged") or "munged", "--foreground", "--force", f"--key-file={key}",
           f"--socket={sock}", f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
           f"--seed-file={root}/munged.seed"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(root / "munged.err", "wb"))
    _wait(lambda: sock.exists(), "munged's socket", [proc], root / "munged.log")
    return proc, sock


def _wait(ready, what: str, procs: list[subprocess.Popen], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            why = (f"{dead[0].args[0]} exited {dead[0].returncode}" if dead
                   else f"{START_TIMEOUT_S:.0f} s passed")
            raise RuntimeError(f"local SLURM: waiting for {what}: {why}; {log}:\n{tail}")
        time.sleep(0.3)


def _node_idle(env: dict[str, str], host: str) -> bool:
    res = subprocess.run(["sinfo", "-h", "-N", "-n", host, "-o", "%t"], env=env, capture_output=True,
                         text=True, timeout=30)
    return res.returncode == 0 and res.stdout.strip() in ("idle", "mix", "alloc")


@contextmanager
def local_slurm(root: Path) -> Iterator[LocalSlurm]:
    """Start munged, slurmctld and slurmd under ``root`` (see the module's docstring); stop them on exit."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"local SLURM: {reason}")
    root = Path(root).resolve()
    for sub in ("state", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["munged"], sock = _start_munge(root)
        conf = root / "slurm.conf"
        conf.write_text(_config(root, host, sock))
        path = os.pathsep.join(dict.fromkeys([*os.environ.get("PATH", "").split(os.pathsep), *SBIN]))
        env = {**os.environ, "SLURM_CONF": str(conf), "PATH": path}
        for name, args in (("slurmctld", ["-D", "-c", "-i", "-f", str(conf)]),
                           ("slurmd", ["-D", "-f", str(conf), "-N", host])):
            procs[name] = subprocess.Popen([_which(name) or name, *args], env=env, stdout=subprocess.DEVNULL,
                                           stderr=open(root / f"{name}.err", "wb"), cwd=root)
            time.sleep(0.5)
        _wait(lambda: _node_idle(env, host), f"node {host} idle (sinfo)", list(procs.values()),
              root / "slurmctld.log")
        slurm = LocalSlurm(root=root, host=host, env=env, procs=procs)
        yield slurm
        subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True, timeout=30)
        try:
            slurm.wait_idle(timeout=30)
        except (TimeoutError, RuntimeError):
            pass
    finally:
        for name in ("slurmd", "slurmctld", "munged"):
            if name in procs:
                _stop(procs[name])
