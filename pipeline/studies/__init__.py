"""Studies that rerun the papers' experiments (docs/references.md): ``vbcluster study NAME --out DIR``.

Each study is a module ``pipeline.studies.<name>`` with

    run(out: Path, *, quick: bool = False, seed: int = 0) -> Path

that writes Markdown + CSV tables and PNG plots under ``out/<name>/`` and returns that folder.
``quick=True`` is a small version (seconds) used by the tests; the full version is the study.
The helpers here write the tables and plots the same way for every study.
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vbcore.errors import ConfigError

#: the studies that ``run_study`` knows (one module each)
STUDIES: tuple[str, ...] = ("seed000", "seed001", "seed003", "moves", "real")


def known_studies() -> list[str]:
    """The studies whose module is importable in this installation."""
    return [n for n in STUDIES if importlib.util.find_spec(f"pipeline.studies.{n}") is not None]


def run_study(name: str, out: str | os.PathLike[str], quick: bool = False, seed: int = 0) -> Path:
    """Run study ``name`` into ``out/<name>/`` and return that folder.

    Raises
    ------
    ConfigError
        When ``name`` is not a known study (the message lists the known ones).
    """
    known = known_studies()
    if name not in known:
        raise ConfigError(f"unknown study {name!r}; known studies: {', '.join(known)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")
    module = importlib.import_module(f"pipeline.studies.{name}")
    with one_blas_thread():
        return Path(module.run(Path(out), quick=bool(quick), seed=int(seed)))


# ---- output helpers ---------------------------------------------------------------------------
def study_dir(out: Path, name: str) -> Path:
    """``out/name``, created."""
    path = Path(out) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:  # NaN
            return "nan"
        return f"{v:.6g}"
    return str(v)


def write_table(path: Path, columns: Sequence[str], rows: Iterable[Sequence[Any]],
                title: str | None = None) -> str:
    """Write ``rows`` as ``path.csv`` (full precision) and return the Markdown table text.

    Parameters
    ----------
    path : Path
        File name without suffix; ``.csv`` is added.
    columns : sequence of str
    rows : iterable of sequences, each of len(columns)
    title : str, optional
        A line printed above the Markdown table.
    """
    rows = [list(r) for r in rows]
    for r in rows:
        if len(r) != len(columns):
            raise ValueError(f"row {r!r} has {len(r)} values for {len(columns)} columns")
    csv_path = Path(path).with_suffix(".csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow([repr(v) if isinstance(v, float) else v for v in r])
    lines = [] if title is None else [f"**{title}** ({csv_path.name})", ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    lines.extend("| " + " | ".join(_fmt(v) for v in r) + " |" for r in rows)
    return "\n".join(lines) + "\n"


def read_table(path: Path) -> tuple[list[str], list[list[str]]]:
    """Read a CSV written by :func:`write_table`: (columns, rows as strings)."""
    with open(Path(path).with_suffix(".csv"), newline="") as f:
        data = list(csv.reader(f))
    return data[0], data[1:]


class Report:
    """A Markdown report assembled section by section and written to ``README.md``."""

    def __init__(self, folder: Path, title: str) -> None:
        self.folder = folder
        self.parts: list[str] = [f"# {title}\n"]
        self.t0 = time.perf_counter()

    def text(self, s: str) -> None:
        self.parts.append(s.rstrip() + "\n")

    def table(self, name: str, columns: Sequence[str], rows: Iterable[Sequence[Any]],
              title: str | None = None) -> None:
        self.parts.append(write_table(self.folder / name, columns, rows, title))

    def image(self, name: str, caption: str) -> None:
        self.parts.append(f"![{caption}]({name})\n\n*{caption}*\n")

    def write(self, seconds: float | None = None) -> Path:
        """``README.md``, ending with the study's wall time: since this report began, or ``seconds``
        (a study whose runs it cannot see, such as a resumed one)."""
        seconds = time.perf_counter() - self.t0 if seconds is None else seconds
        self.parts.append(f"\n_Study wall time: {seconds:.1f} s._\n")
        path = self.folder / "README.md"
        path.write_text("\n".join(self.parts))
        return path


def pyplot() -> Any:
    """matplotlib's pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> Path:
    """Save a figure as PNG and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run with one BLAS thread: most studies' problems are tiny (N <= 6,600, D <= 5), where BLAS
    threads only add overhead and make timings on a shared machine noisier; the seed003 study's are not, and
    its learners are compared at this one equal thread count."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def available_learners() -> tuple[str, ...]:
    """Names of the learners ``VBMixture(learner=...)`` accepts in this installation."""
    from pipeline.fit.learners import LEARNERS

    return tuple(LEARNERS)
