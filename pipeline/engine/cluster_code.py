"""Code that a cluster config would run, refused unless the user opts in (issue 53, item 3).

A cluster config is read by ``vbcluster fit --cluster``, ``deploy`` and ``resume`` (which reads the
file a run directory's ``run.json`` names), so a config someone else wrote, or a ``run.json`` edited to
name such a file, must not run code of its own on the user's account. Keys that load or run code
are therefore refused when the file is loaded, in one line naming the key:

* ``preload``, ``preload_argv``, ``preload_nanny``, ``preload_nanny_argv``, ``plugins``,
  ``extensions`` and the class keys (``job_cls``, ``scheduler_cls``) at the top of ``cluster_kwargs``
  or under ``scheduler_kwargs`` / ``scheduler_options`` / ``worker_kwargs`` / ``worker_options``;
* the job script's own commands: ``python`` (the interpreter the job runs), ``worker_command``,
  ``shebang``, and ``job_script_prologue`` / ``env_extra`` lines other than the site set-up a batch
  job needs (``module ...``, ``ml ...``, ``conda activate NAME``, ``source activate NAME``,
  ``export NAME=VALUE``) -- no shell operators, no variable that makes a program load code;
* ``worker_extra_args`` / ``extra`` options other than those of :data:`WORKER_ARGS` (``--lifetime``
  and its kin are allowed; ``--preload`` is not);
* ``env`` variables that make a program load code (``LD_PRELOAD``, ``PYTHONPATH``, ``PATH``,
  ``DASK_*`` ...).

The opt-in is the environment variable ``VBCLUSTER_ALLOW_CODE=1`` of the process that reads the
config: set by the person who runs vbcluster, never by a file, so neither a config nor a ``run.json``
can opt itself in.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from pipeline.engine.cluster_checks import error

ALLOW_ENV = "VBCLUSTER_ALLOW_CODE"
#: keys that import or run a module, a file or a class of the config's choosing
CODE_KEYS = ("preload", "preload_argv", "preload_nanny", "preload_nanny_argv", "plugins", "extensions",
             "job_cls", "scheduler_cls")
#: mappings under cluster_kwargs handed on to the scheduler or the workers
NESTED = ("scheduler_kwargs", "scheduler_options", "worker_kwargs", "worker_options")
#: dask-jobqueue keys that are commands of the job script
COMMAND_KEYS = ("python", "worker_command", "shebang")
PROLOGUE_KEYS = ("job_script_prologue", "env_extra")
ARGS_KEYS = ("worker_extra_args", "extra")
#: ``dask worker`` options a config may pass (resources, lifetime, networking): none loads code
WORKER_ARGS = frozenset({
    "--lifetime", "--lifetime-stagger", "--lifetime-restart", "--no-lifetime-restart", "--nthreads",
    "--memory-limit", "--resources", "--death-timeout", "--local-directory", "--name", "--nworkers",
    "--nanny", "--no-nanny", "--dashboard", "--no-dashboard", "--dashboard-address", "--interface",
    "--protocol", "--listen-address", "--contact-address", "--host", "--worker-port", "--nanny-port",
    "--reconnect", "--no-reconnect"})
#: job-script set-up lines a site needs: environment modules, a conda environment, a plain variable
SAFE_PROLOGUE = re.compile(r"(module|ml) [\w ./:+@=-]+|(conda|source) activate [\w./-]+|"
                           r"export [A-Za-z_]\w*=[\w./:@+,=${}-]*")
#: environment variables that make a program (python, the dynamic linker, Dask) load other code
CODE_ENV = re.compile(r"LD_\w+|DYLD_\w+|PATH|PYTHON(PATH|HOME|STARTUP|USERBASE|BREAKPOINT|INSPECT)|"
                      r"DASK_\w+|BASH_ENV|ENV")


def allowed() -> bool:
    """Whether the user opted in to configs that run code (``VBCLUSTER_ALLOW_CODE=1``)."""
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def _refuse(source: str, key: str, what: str) -> Exception:
    return error(source, key, f"{what}: a cluster config runs no code of its own unless you opt in "
                 f"with {ALLOW_ENV}=1 (cluster_config/README.md, 'Code in a config')")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]


def _check_prologue(source: str, key: str, value: Any) -> None:
    for line in _strings(value):
        name = line.strip().removeprefix("export ").split("=", 1)[0]
        if not SAFE_PROLOGUE.fullmatch(line.strip()) or (line.strip().startswith("export ")
                                                         and CODE_ENV.fullmatch(name)):
            raise _refuse(source, key, f"the job script line {line!r} is not site set-up (module load, "
                          "conda activate, export NAME=VALUE)")


def _check_args(source: str, key: str, value: Any) -> None:
    for arg in _strings(value):
        flag = arg.split("=", 1)[0]
        if flag.startswith("-") and flag not in WORKER_ARGS:
            raise _refuse(source, key, f"the worker option {flag!r} is not one of the resource, lifetime "
                          "and network options a config may pass")


def check_code(source: str, kwargs: Mapping[str, Any]) -> None:
    """Refuse the keys of ``cluster_kwargs`` that load or run code (see the module's docstring),
    unless :func:`allowed`."""
    if allowed():
        return
    places = [("cluster_kwargs", kwargs)] + [(f"cluster_kwargs.{k}", kwargs[k]) for k in NESTED
                                            if isinstance(kwargs.get(k), Mapping)]
    for where, mapping in places:
        for key in CODE_KEYS:
            if mapping.get(key) not in (None, [], {}, ""):
                raise _refuse(source, f"{where}.{key}", "loads code into the scheduler or the workers")
        env = mapping.get("env")
        for name in env if isinstance(env, Mapping) else ():
            if CODE_ENV.fullmatch(str(name)):
                raise _refuse(source, f"{where}.env.{name}", "makes the workers' programs load other code")
    for key in COMMAND_KEYS:
        if kwargs.get(key) is not None:
            raise _refuse(source, f"cluster_kwargs.{key}", "sets a command of the job script (the "
                          "default runs this Python on the workers)")
    for key in PROLOGUE_KEYS:
        if kwargs.get(key):
            _check_prologue(source, f"cluster_kwargs.{key}", kwargs[key])
    for key in ARGS_KEYS:
        if kwargs.get(key):
            _check_args(source, f"cluster_kwargs.{key}", kwargs[key])
