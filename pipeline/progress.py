"""Progress of fits: a rich progress bar (ELBO, clusters found, seconds per iteration) and a
structured log (one JSON object per iteration in ``RUN_DIR/iterations.jsonl``).

``FitProgress`` is the ``callback`` of ``VBMixture.fit``: it receives ``info`` with the keys
``iteration``, ``elbo``, ``n_effective``, ``seconds``, ``learner`` and ``bound`` ('exact' or
'minibatch estimate') after every iteration, and ``elbo_se`` (the estimate's standard error, nats)
when the bound is a minibatch estimate.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class FitProgress:
    """A progress bar over ``max_iter`` iterations (none when ``quiet``), and a JSON-lines log.

    Parameters
    ----------
    max_iter : int
        The bar's length (a fit that converges earlier stops short of it).
    label : str
        Shown before the bar (for example the store or run name).
    log_path : path, optional
        Append one JSON object per iteration here (``time``, ``label`` and the callback's keys).
    quiet : bool
        No bar (the log is still written).
    console : rich Console, optional
    """

    def __init__(self, max_iter: int, label: str = "fit", *, log_path: str | Path | None = None,
                 quiet: bool = False, console: Console | None = None) -> None:
        self.max_iter = max(int(max_iter), 1)
        self.label = label
        self.log_path = Path(log_path) if log_path is not None else None
        self.quiet = quiet
        self.history: list[dict[str, Any]] = []
        self._progress: Progress | None = None
        self._task: Any = None
        self._console = console

    def __enter__(self) -> FitProgress:
        if not self.quiet:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("ELBO {task.fields[elbo]}"), TextColumn("clusters found {task.fields[alive]}"),
                TextColumn("{task.fields[rate]} s/iter"), TimeElapsedColumn(),
                console=self._console, transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.max_iter, elbo="-", alive="-",
                                                 rate="-")
        return self

    def __call__(self, info: dict[str, Any]) -> None:
        record = {k: _plain(v) for k, v in info.items()}
        self.history.append(record)
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as f:
                f.write(json.dumps(dict(time=time.time(), label=self.label, **record)) + "\n")
        if self._progress is not None:
            secs = [float(r.get("seconds", math.nan)) for r in self.history]
            rate = sum(secs) / len(secs) if secs else math.nan
            self._progress.update(self._task, completed=int(info.get("iteration", len(self.history))),
                                  elbo=f"{float(info.get('elbo', math.nan)):.6g}" + (
                                      f" +- {float(info['elbo_se']):.2g}" if "elbo_se" in info else ""),
                                  alive=str(info.get("n_effective", "-")), rate=f"{rate:.3f}")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    return v
