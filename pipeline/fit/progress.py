"""Progress of fits: a rich progress bar (ELBO, clusters found, seconds per iteration) and a
structured log (one JSON object per iteration in ``RUN_DIR/iterations.jsonl``).

``FitProgress`` is the ``callback`` of a fit (``VBMixture.fit``, :func:`pipeline.service.fit`): it
receives ``info`` with the keys ``iteration``, ``elbo``, ``n_effective``, ``seconds``, ``learner`` and
``bound`` ('exact' or 'minibatch estimate') after every iteration, and ``elbo_se`` (the estimate's
standard error, nats) when the bound is a minibatch estimate.

Before the first iteration the fit reports its stages through :meth:`FitProgress.stage` (the
projection's passes over the chunks, reading the rows, initialising: about 20 s at K = 200), each
printed when it starts and when it ends with its seconds, and shown in the bar instead of the
iterations: a stage of several passes (``projection pass 2/3 ...``) shows a bar of its passes, the
others none; the bar of iterations appears when they start. During the iterations the bar shows an
**ETA**: ``<= H:MM:SS left``, the iterations left to ``max_iter`` times the mean seconds of the last
:data:`ETA_WINDOW` iterations; an upper bound, since a fit stops earlier when it converges.
``quiet`` shows none of it.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

ETA_WINDOW = 10  # iterations the ETA's seconds per iteration are averaged over
#: the bar's task fields ``shows`` (what the bar shows: the fit's STAGES, before its iterations, or its
#: ITERATIONS) and ``passes`` (a stage's passes; 0: the stage does not count them)
STAGES, ITERATIONS = "stages", "iterations"


class _Only(ProgressColumn):
    """``column`` while the bar shows its iterations; nothing (or, for the bar itself, the passes of a
    stage that counts them) while it shows a stage."""

    def __init__(self, column: ProgressColumn, in_stage: bool = False) -> None:
        super().__init__()
        self.column, self.in_stage = column, in_stage

    def render(self, task: Task) -> Any:
        shown = task.fields.get("shows") == ITERATIONS or (self.in_stage and task.fields.get("passes"))
        return self.column.render(task) if shown else Text("")


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
                _Only(BarColumn(), in_stage=True), _Only(MofNCompleteColumn()),
                *(_Only(TextColumn(text)) for text in ("ELBO {task.fields[elbo]}",
                                                       "clusters found {task.fields[alive]}",
                                                       "{task.fields[rate]} s/iter")),
                TimeElapsedColumn(), TextColumn("{task.fields[status]}", markup=False),
                console=self._console, transient=False,
            )
            self._progress.start()
            # no bar of iterations before they start (a stage shows its own passes, or nothing)
            self._task = self._progress.add_task(self.label, total=None, elbo="-", alive="-", rate="-",
                                                 status="starting", shows=STAGES, passes=0)
        return self

    def _show_iterations(self) -> None:
        assert self._progress is not None
        task = self._progress.tasks[0]
        if task.fields.get("shows") != ITERATIONS:
            self._progress.update(self._task, total=self.max_iter, completed=0, shows=ITERATIONS)

    def stage(self, text: str, step: tuple[int, int] | None = None) -> None:
        """The fit's stage before its iterations (``'iterating'`` when they start): the last stage's
        seconds are printed, the new one is printed and shown in the bar. ``step`` ``(i, n)``: the
        stage is pass ``i`` of ``n`` (the projection's), and the bar shows the ``i - 1`` passes done."""
        from pipeline.fit.driver import ITERATING

        now = time.perf_counter()
        if self._progress is not None:
            if self._stage is not None:
                last, started = self._stage
                self._progress.console.print(f"{last}: {now - started:.1f} s", soft_wrap=True, markup=False)
            if text != ITERATING:
                self._progress.console.print(f"{text} ...", soft_wrap=True, markup=False)
                total, done = (0, 0) if step is None else (int(step[1]), int(step[0]) - 1)
                self._progress.update(self._task, total=total or None, completed=done, status=f"{text} ...",
                                      passes=total)
            else:
                self._show_iterations()
                self._progress.update(self._task, status="")
        self._stage = None if text == ITERATING else (text, now)

    def __call__(self, info: dict[str, Any]) -> None:
        record = {k: _plain(v) for k, v in info.items()}
        self.history.append(record)
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as f:
                f.write(json.dumps(dict(time=time.time(), label=self.label, **record)) + "\n")
        if self._progress is not None:
            self._show_iterations()  # (a callback reporting no stages: at the first iteration)
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
        done = int(f.completed) if f.fields.get("shows") == ITERATIONS else 0  # (stopped in a stage)
        return (f"{self.label}: {done}/{self.max_iter} iterations, ELBO {f.fields['elbo']}, "
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
