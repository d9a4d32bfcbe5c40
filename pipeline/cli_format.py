"""How the ``vbcluster`` command line formats what it prints: typer's help (readable types, usage
lines, option names kept whole at 80 columns), the fit summary table, and ``KEY=VALUE`` options."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.table import Table
from typer.core import TyperArgument, TyperOption

from vbcore.errors import FacedWarning

#: exit codes: bad input (a file, store, config or option to fix) and environment (disk, permissions)
EXIT_INPUT, EXIT_ENVIRONMENT = 2, 1

_SHOWN: set[str] = set()


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """A warning as one line, each distinct one once per command."""
    if isinstance(message, FacedWarning):
        message = message.worded("cli")
    text = f"warning: {' '.join(str(message).split())}"
    if text not in _SHOWN:
        _SHOWN.add(text)
        print(text, file=sys.stderr)


def exit_code(exc: BaseException) -> int:
    """2 for bad input (vbcluster's errors, unreadable or missing files), 1 for the environment."""
    from vbcore.errors import VBClusterError

    if isinstance(exc, VBClusterError | FileNotFoundError | IsADirectoryError | NotADirectoryError):
        return EXIT_INPUT
    if isinstance(exc, OSError):
        return EXIT_ENVIRONMENT  # disk full, permission denied, I/O error
    return EXIT_INPUT if isinstance(exc, ValueError | EOFError | KeyError | TypeError) else EXIT_ENVIRONMENT


def one_line(exc: BaseException) -> int:
    """``exc`` as one line on stderr; returns its exit code (:func:`exit_code`)."""
    text = " ".join(str(exc).split()) or "no details"
    if isinstance(exc, OSError) and exc.filename is None and not any(c in text for c in "/\\"):
        text += " (the file was not named by the system; run with --debug)"
    print(f"error: {type(exc).__name__}: {text} (run with --debug for the traceback)", file=sys.stderr)
    return exit_code(exc)


__all__ = ["install_help_formatting", "fit_table", "defaults_table", "key_values", "table_console"]

#: the width of tables printed into a pipe or a file when COLUMNS does not say (not a terminal)
PIPE_COLUMNS = 80


def table_console() -> Any:
    """A console for tables (``learners``, ``defaults``): the terminal's width, or COLUMNS, or
    PIPE_COLUMNS when printing into a pipe or a file (110 columns went into pipes before)."""
    import os

    from rich.console import Console

    columns = os.environ.get("COLUMNS", "")
    if Console().is_terminal or columns.isdigit():
        return Console(markup=False)  # (rich reads COLUMNS itself)
    return Console(markup=False, width=PIPE_COLUMNS)


def _readable_type(self: Any, ctx: Any) -> str | None:
    """Help shows a parameter's metavar, or click's words (INTEGER, NUMBER, TEXT) and nothing for
    flags; typer 0.29 prints Python annotations (``<int>``, ``<bool>``, ``<list[str]>``)."""
    if getattr(self, "is_flag", False) or isinstance(self, TyperArgument):
        return None
    if self.metavar is not None:
        return str(self.metavar)
    bare = str(self.bare_type())
    return {"int": "INTEGER", "float": "NUMBER", "str": "TEXT"}.get(bare, bare.upper())


def _argument_usage(self: Any) -> str:
    """``STORE`` (required) or ``[STORE]`` in the usage line; typer 0.29 writes ``{store}``."""
    name = str(self.display_name_raw).upper()
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")




class _WholeNamesTable(Table):
    """Help's options table (typer builds it through ``typer.rich_utils.Table``): the option name,
    flag and type columns keep their whole width and only the help text wraps, so at 80 columns no
    option name ends in '…' (``--weight-concentration-prior`` did)."""

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        super().add_row(*cells, **kwargs)
        for column, cell in zip(self.columns[:-1], cells, strict=False):
            width = len(cell) if hasattr(cell, "__len__") else len(str(cell))
            column.no_wrap = True
            column.min_width = max(column.min_width or 0, width)
        self.columns[-1].overflow = "fold"  # a word longer than the help column (a tensor name) folds


def install_help_formatting() -> None:
    """Patch typer's help rendering: readable types, ``STORE``/``[STORE]`` in usage lines, and the
    options table of :class:`_WholeNamesTable`."""
    import typer.rich_utils as rich_utils

    TyperOption.display_type_rich = _readable_type  # type: ignore[method-assign]
    TyperArgument.display_type_rich = _readable_type  # type: ignore[method-assign]
    TyperArgument._usage_display_name = _argument_usage  # type: ignore[method-assign]
    rich_utils.Table = _WholeNamesTable  # type: ignore[misc]


def fit_table(spec: Any, result: dict[str, Any]) -> Table:
    """The summary of a fit: one row that fits 80 columns whole (no cell ends in '…'): no vertical
    rules, headers wrap at their spaces, every column at least as wide as its value."""
    from rich import box
    from rich.text import Text

    from pipeline.runs.report_curves import k_cell

    m = result.get("metrics", {})
    cells = {"learner": spec.learner, "iters": str(result["n_iter"]), "converged": str(result["converged"]),
             "K": k_cell({"n_components": spec.components, **result}),
             "clusters found": str(result["n_effective"]),  # pipeline.runs.directory.CLUSTERS_FOUND
             "ELBO (exact)": f"{result['elbo']:.6g}", "NMI": f"{m['nmi']:.3f}" if m else "-",
             "ACC": f"{m['acc']:.3f}" if m else "-", "seconds": f"{result['seconds']:.1f}"}
    table = Table(title=Text(f"vbcluster fit {spec.store}"), title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True)
    for header, value in cells.items():
        width = max(len(value), *(len(w) for w in header.split()))
        table.add_column(header, justify="right", min_width=width, max_width=max(width, len(value) + 2),
                         no_wrap=False)  # a two-word header wraps rather than push the others
    table.add_row(*cells.values())
    return table


def selection_table(selection: dict[str, Any]) -> Table:
    """Model selection's candidates (result.json's ``selection``): each one's exact bound per row on
    the screening subsample and, where fitted to all rows, on all rows; the kept model marked."""
    from rich import box
    from rich.text import Text

    res = selection.get("resolution") or 0.0
    at = f" at resolution {res:g} (times the features' rms deviation)" if res else ""
    norm = selection.get("normalize", "none")
    rows = "rows" if norm == "none" else f"{norm}-normalised rows"
    title = (f"model selection: {selection['parts']} by the exact bound per row of the {rows}{at} "
             f"({selection['screen_rows']} rows screened in {selection['screen_seconds']:.1f} s)")
    caption = ("--select none fixes diag with the empirical priors on the rows as they are; "
               "--covariance / --priors fix a part by hand"
               + ("" if any(c.get("rank") is not None for c in selection["candidates"])
                  else "; --select-lowrank true screens the low-rank family too"))
    table = Table(title=Text(title), title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, padding=(0, 1), collapse_padding=True, caption=Text(caption),
                  caption_justify="left")
    for header in ("covariance", "priors", "screen bound", "clusters", "full bound", "kept"):
        table.add_column(header, justify="left" if header in ("covariance", "priors") else "right")
    from pipeline.fit.select import label

    for c in selection["candidates"]:
        full = "-" if c["full_bound"] is None else f"{c['full_bound']:.4f}"
        table.add_row(label(c), c["priors"], f"{c['screen_bound']:.4f}", str(c["screen_clusters"]),
                      full, "<- kept" if c["chosen"] else "")
    return table


#: why the command line's default differs from VBMixture's (VBMixture keeps scikit-learn's)
WHY = {
    "components": "a store of unknown structure needs room for clusters; the DP prior empties the unused",
    "covariance": "'full' holds K x D x D (D = 4,096: 134 MB per cluster in float64); 'diag' scales",
    "max_iter": "the tighter tol needs more iterations; checkpoints make a long fit resumable",
    "tol": "a tighter stop for the run that is published (both: ELBO change per row)",
    "seed": "a run directory must resume bit for bit, so the command line always records a seed",
    "grow": "-k starts the truncation; the bound, not K, decides the clusters (VBMixture: K fixed)",
    "priors": "scikit-learn's nu0 = D and alpha0 = 1/K let D and K decide; the pipeline's fit them",
    "init": "k-means at K = 1000 took 180 s; projected k-means++ seeds start in seconds",
    "select": "the exact bound picks the family and priors (issue 51); VBMixture fits the model it names",
    "select_lowrank": "it never won on the battery, doubles the screen and has no warm start",
}


def defaults_table() -> Table:
    """Every fit setting's default on the command line and in ``VBMixture``, side by side, and why
    each that differs does (``vbcluster defaults``; docs/operations.md has the same table)."""
    from pipeline.fit.spec import defaults

    cli, est = defaults("pipeline"), defaults("estimator")
    cli["covariance"], est["covariance"] = "diag", "full"  # resolved by the learner when None
    cli["select"] = "auto up to 256 dims, else none"  # by the store's width: service.default_select
    cli["select_lowrank"] = "False where select defaults to auto"
    table = Table(title="fit defaults: command line and VBMixture (scikit-learn's)", title_justify="left")
    for col in ("setting", "command line", "VBMixture", "why they differ"):
        table.add_column(col, overflow="fold")
    for name in cli:
        if name in ("store", "learner_options"):
            continue
        same = cli[name] == est[name]
        table.add_row(name, repr(cli[name]), "same" if same else repr(est[name]),
                      "" if same else WHY.get(name, ""))
    return table


def learners_table(name: str | None = None) -> Table:
    """Every registered learner (``vbcluster learners``): its family and what it does beyond it
    (``grows`` the truncation, reads a ``minibatch`` per iteration), its options and its docstring's
    first line; with ``name``, that learner's options as declared (:func:`learner_options_table`)."""
    from pipeline.fit.learners import LEARNERS

    if name is not None:
        return learner_options_table(name)
    table = Table(title="vbcluster learners")
    for col in ("learner", "family", "options (defaults)", "about"):
        table.add_column(col)
    for name, cls in LEARNERS.items():
        family = "\n".join([cls.family or "-"] + ["grows"] * cls.grows
                            + ["minibatch"] * ("minibatch" in cls.options))
        opts = ", ".join(f"{k}={v}" for k, v in cls.options.items()) or "-"
        table.add_row(name, family, opts, (cls.__doc__ or "").strip().splitlines()[0].replace("``", ""))
    return table


#: the columns of a learner's options (:func:`pipeline.fit.learners.options.describe`)
OPTION_COLUMNS = ("option", "type", "default", "accepts", "help")


def learner_options_table(name: str) -> Table:
    """``vbcluster learners NAME``: each option of the learner as declared -- type, default, what it
    accepts, help (special values, where the learner resolves it) -- and the rules between them."""
    from pipeline.fit.learners import learner_class
    from pipeline.fit.learners.options import describe

    cls = learner_class(name)
    table = Table(title=f"options of learner {name!r} (-o KEY=VALUE)")
    for col in OPTION_COLUMNS:  # the help takes what the others leave
        table.add_column(col, overflow="fold", ratio={"accepts": 2, "help": 4}.get(col))
    for row in describe(cls):
        table.add_row(*(row[c] for c in OPTION_COLUMNS))
    return table


def learner_options_markdown() -> str:
    """docs/learner-options.md: every registered learner's options, from their declarations (a test
    compares the file with this text)."""
    from pipeline.fit.learners import LEARNERS
    from pipeline.fit.learners.options import describe

    out = ["# Learner options", "", "Generated from the options' declarations "
           "(`pipeline.fit.learners.options`) by `pipeline.cli_format.learner_options_markdown`; "
           "`vbcluster learners NAME` prints the same. Pass them as `vbcluster fit -o KEY=VALUE` or "
           "`VBMixture(learner_options={...})`.", ""]
    for name, cls in LEARNERS.items():
        if not cls.__module__.startswith("pipeline.fit.learners."):
            continue  # a plug-in's, or a test's
        out += [f"## {name}", "", "| " + " | ".join(OPTION_COLUMNS) + " |",
                "|" + "---|" * len(OPTION_COLUMNS)]
        out += ["| " + " | ".join(_cell(row[c], c) for c in OPTION_COLUMNS) + " |" for row in describe(cls)]
        out.append("")
    return "\n".join(out)


def _cell(text: str, column: str) -> str:
    text = text.replace("|", "\\|")
    return f"`{text}`" if column in ("option", "default") and text else text


def key_values(pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` options (``-o``, ``-x``) as a dict; anything else is a usage error naming it."""
    out = {}
    for p in pairs:
        if "=" not in p:
            raise typer.BadParameter(f"options take KEY=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


class RowsBar:
    """An ingest's ``progress``: ``bar(n)`` advances the task by ``n`` rows; ``total(n)``, called by
    sources that know their size up front (image folders: the images listed), gives the bar its end,
    so it shows a share and the time left instead of a spinner (issue 53, item 12)."""

    def __init__(self, bar: Any, task: Any) -> None:
        self.bar, self.task = bar, task

    def __call__(self, n: int) -> None:
        self.bar.advance(self.task, n)

    def total(self, n: int) -> None:
        self.bar.update(self.task, total=int(n))
