"""Progress of fits: a rich progress bar (ELBO, clusters found, seconds per iteration) and a
structured log (one JSON object per iteration in ``RUN_DIR/iterations.jsonl``).

``FitProgress`` is the ``callback`` of a fit (``VBMixture.fit``, :func:`pipeline.service.fit`): it
receives ``info`` with the keys ``iteration``, ``elbo``, ``n_effective``, ``seconds``, ``learner`` and
``bound`` ('exact' or 'minibatch estimate') after every iteration, and ``elbo_se`` (the estimate's
standard error, nats) when the bound is a minibatch estimate.

Before the first iteration the fit reports its stages through :meth:`FitProgress.stage` (reading the
rows, initialising: about 20 s at K = 200), each printed when it starts and when it ends with its
seconds, and shown in the bar. During the iterations the bar shows an **ETA**: ``<= H:MM:SS left``,
the iterations left to ``max_iter`` times the mean seconds of the last :data:`ETA_WINDOW`
iterations; an upper bound, since a fit stops earlier when it converges. ``quiet`` shows none of it.
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

ETA_WINDOW = 10  # iterations the ETA's seconds per iteration are averaged over


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
        self._stage: tuple[str, float] | None = None  # the stage under way and when it started

    def __enter__(self) -> FitProgress:
        if not self.quiet:
            self._progress = Progress(
                TextColumn("{task.description}", style="bold", markup=False),  # a run directory's name
                BarColumn(), MofNCompleteColumn(),
                TextColumn("ELBO {task.fields[elbo]}"), TextColumn("clusters found {task.fields[alive]}"),
                TextColumn("{task.fields[rate]} s/iter"), TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
                console=self._console, transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.max_iter, elbo="-", alive="-",
                                                 rate="-", status="starting")
        return self

    def stage(self, text: str) -> None:
        """The fit's stage before its iterations (``'iterating'`` when they start): the last stage's
        seconds are printed, the new one is printed and shown in the bar."""
        from pipeline.fit.driver import ITERATING

        now = time.perf_counter()
        if self._progress is not None:
            if self._stage is not None:
                last, started = self._stage
                self._progress.console.print(f"{last}: {now - started:.1f} s", soft_wrap=True, markup=False)
            if text != ITERATING:
                self._progress.console.print(f"{text} ...", soft_wrap=True, markup=False)
            self._progress.update(self._task, status=f"{text} ..." if text != ITERATING else "")
        self._stage = None if text == ITERATING else (text, now)

    def __call__(self, info: dict[str, Any]) -> None:
        record = {k: _plain(v) for k, v in info.items()}
        self.history.append(record)
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as f:
                f.write(json.dumps(dict(time=time.time(), label=self.label, **record)) + "\n")
        if self._progress is not None:
            secs = [float(r.get("seconds", math.nan)) for r in self.history if "event" not in r]
            timed = [v for v in secs if math.isfinite(v)]  # (a fit resumed at its end times none)
            rate = f"{sum(timed) / len(timed):.3f}" if timed else "-"
            done = int(info.get("iteration", info.get("after_iteration", len(self.history))))
            self._progress.update(self._task, completed=done,
                                  elbo=f"{float(info.get('elbo', math.nan)):.6g}" + (
                                      f" +- {float(info['elbo_se']):.2g}" if "elbo_se" in info else ""),
                                  alive=str(info.get("n_effective", "-")), rate=rate,
                                  status=eta(self.max_iter - done, secs[-ETA_WINDOW:]))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            if exc_type is None and self._task is not None:
                self._progress.update(self._task, status="finished")  # no ETA left standing
            self._progress.stop()
            if not self._progress.console.is_terminal and self._task is not None:
                # a log (a pipe, Prefect's): the bar's last frame is cut to the console's width
                # ('ELBO …'); one plain line that wraps keeps every figure
                self._progress.console.print(self.summary(exc_type is None), soft_wrap=True, markup=False)

    def summary(self, finished: bool = True) -> str:
        """The bar's figures as one line: ``'LABEL: I/MAX iterations, ELBO E, clusters found C,
        R s/iter, finished'`` (``stopped`` where the fit raised)."""
        assert self._progress is not None
        f = self._progress.tasks[0]
        return (f"{self.label}: {int(f.completed)}/{self.max_iter} iterations, ELBO {f.fields['elbo']}, "
                f"clusters found {f.fields['alive']}, {f.fields['rate']} s/iter, "
                f"{'finished' if finished else 'stopped'}")


def eta(left: int, recent: list[float]) -> str:
    """``'<= H:MM:SS left'``: ``left`` iterations at the mean of the ``recent`` seconds per iteration
    (``'done'`` with none left, ``''`` before any iteration)."""
    if left <= 0:
        return "done"
    finite = [v for v in recent if math.isfinite(v)]
    if not finite:
        return ""
    total = round(left * sum(finite) / len(finite))
    return f"<= {total // 3600}:{total // 60 % 60:02d}:{total % 60:02d} left"


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    return v
