"""The ``vbcluster`` command line (typer + rich): ingest, fit, resume, assign, report, study, learners,
check, demo, version (``flows.cli`` adds ``deploy``). ``-h``/``--help`` everywhere, ``--version``."""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipeline.cli_format import (
    RowsBar,
    exit_code,
    fit_table,
    install_help_formatting,
    key_values,
    one_line,
    selection_table,
    show_warning,
    table_console,
)


class _App(typer.Typer):
    """The command group: an error no command handled is one line on stderr (exit 2 for bad input,
    1 for the environment) instead of a traceback; ``--debug`` anywhere on the command line shows the
    traceback instead."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        argv = list(kwargs.pop("args", None) or sys.argv[1:])
        if "--debug" in argv:
            return super().__call__(*args, args=[a for a in argv if a != "--debug"], **kwargs)
        import warnings

        warnings.showwarning = show_warning  # one line each, no source line
        try:
            return super().__call__(*args, args=argv, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the point: one line, whatever it is
            sys.exit(one_line(exc))


app = _App(add_completion=False, no_args_is_help=True,
           context_settings={"help_option_names": ["-h", "--help"]},
           help="Variational Bayesian clustering of large feature stores. Errors are one line (exit 2: "
           "bad input, 1: environment); add --debug to see the traceback.")
# markup off: messages hold paths and values ('feats[v2].zarr', 'vbcluster[gpu]'), printed as they are
console = Console(width=110, markup=False) if not Console().is_terminal else Console(markup=False)


install_help_formatting()


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version as _v

        console.print(f"vbcluster {_v('vbcluster')}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                      help="Print the installed vbcluster version and exit.")) -> None:
    pass


@app.command()
def version() -> None:
    """Print the installed vbcluster version."""
    _print_version(True)


@app.command()
def demo(
    n_components: int = typer.Option(30, help="Truncation level K of the Dirichlet process."),
    seed: int = typer.Option(0, help="Random seed (k-means initialisation)."),
    max_iter: int = typer.Option(300, help="Maximum VB EM iterations."),
) -> None:
    """Fit scikit-learn's bundled digits (1,797 x 64, 10 classes) with DP mixtures by VB EM."""
    from sklearn.datasets import load_digits

    from pipeline.estimator import VBMixture
    from pipeline.runs.directory import CLUSTERS_FOUND
    from vbcore.data.metrics import acc, ari, nmi

    X, y = load_digits(return_X_y=True)
    console.print(f"digits: {X.shape[0]} rows x {X.shape[1]} features, {len(np.unique(y))} classes; "
                  f"truncated Dirichlet process, K = {n_components}")
    table = Table(title="VB EM on digits (exact ELBO, metrics against the labels)")
    for col in ("covariance", "iterations", "converged", "clusters found", "ELBO", "NMI", "ACC",
                "ARI", "seconds"):
        table.add_column(col, justify="right")
    for ct in ("full", "diag", "spherical"):
        t0 = time.perf_counter()
        model = VBMixture(n_components, covariance_type=ct, max_iter=max_iter, random_state=seed)
        labels = model.fit_predict(X)
        secs = time.perf_counter() - t0
        found = model.n_effective_  # the fit summary's, result.json's and the report's count
        table.add_row(ct, str(model.n_iter_), str(model.converged_), str(found),
                      f"{model.lower_bound_:.1f}", f"{nmi(y, labels):.3f}", f"{acc(y, labels):.3f}",
                      f"{ari(y, labels):.3f}", f"{secs:.2f}")
    console.print(table)
    console.print(CLUSTERS_FOUND + ".", soft_wrap=True)


def fail(exc: Exception) -> None:
    console.print(Text.assemble(("error:", "red"), f" {exc}"), soft_wrap=True)
    raise typer.Exit(code=exit_code(exc))


@app.command()
def ingest(
    source: str = typer.Argument(..., help="A .npy/.npz/.h5/.parquet/.csv file, an image folder, "
                                 "'digits', 'image:NAME' or 'synthetic'."),
    out: str = typer.Option(..., "--out", help="The feature store to write (a Zarr directory)."),
    chunk_rows: int = typer.Option(8192, help="Rows per chunk in the store."),
    labels: str | None = typer.Option(None, help="Labels: a file, key, dataset, column or 'folders'."),
    ids: str | None = typer.Option(None, help="Row ids: a file, key, dataset or column."),
    append: bool = typer.Option(False, "--append", help="Append to an existing store (atomically)."),
    weights: str | None = typer.Option(None, "--weights", help="Row weights: a .npy file, one per row, or "
                                       "the source's column, .npz array or HDF5 dataset holding them."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing store once the new "
                                   "one is complete."),
    drop_nonfinite: bool = typer.Option(False, "--drop-nonfinite", help="Drop rows with NaN/inf "
                                        "(counted) instead of failing."),
    allow_duplicate: bool = typer.Option(False, "--allow-duplicate", help="Append a source the store "
                                         "already holds (same source fingerprint); refused otherwise."),
    normalize: str | None = typer.Option(None, "--normalize", metavar="none|l2|power-l2", help="Rows of a "
                                         "new store made unit length (l2), after sign(x)|x|^0.5 (power-l2); "
                                         "recorded, every append applies it. Default: none."),
    rows: int | None = typer.Option(None, help="synthetic: number of rows."),
    dim: int | None = typer.Option(None, help="synthetic: number of features."),
    classes: int | None = typer.Option(None, help="synthetic: number of classes."),
    seed: int | None = typer.Option(None, help="synthetic: random seed."),
    option: list[str] = typer.Option([], "--option", "-o", metavar="KEY=VALUE",
                                     help="Source option KEY=VALUE (repeatable)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar; print only the summary."),
) -> None:
    """Stream a source into a chunked, compressed Zarr feature store."""
    from pipeline.ingest import ingest as run_ingest
    from pipeline.store.integrity import check_input_file
    from vbcore.errors import VBClusterError

    opts: dict[str, Any] = dict(key_values(option))
    for k, v in (("rows", rows), ("dim", dim), ("classes", classes), ("seed", seed)):
        if v is not None:
            opts[k] = v
    from rich.progress import (
        Progress,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    try:
        check_input_file(source)  # an empty (0-byte) source file is named, not "Aborted."
        with Progress(SpinnerColumn(), TextColumn("ingest {task.description}", style="bold", markup=False),
                      TextColumn("{task.completed:,} rows"), TaskProgressColumn(show_speed=True),
                      TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                      disable=quiet) as bar:
            t = bar.add_task(source, total=None)
            report = run_ingest(source, out, chunk_rows=chunk_rows, labels=labels, ids=ids, append=append,
                                overwrite=overwrite, drop_nonfinite=drop_nonfinite,
                                allow_duplicate=allow_duplicate, progress=RowsBar(bar, t),
                                weights=weights, normalize=normalize, **opts)
    except (VBClusterError, OSError) as exc:
        fail(exc)
        return
    console.print(f"{report.path}: wrote {report.rows_written} rows x {report.n_features} features "
                  f"from {report.source} ({report.rows_dropped} dropped) in {report.elapsed_s:.1f}s; "
                  f"the store has {report.n_rows} rows")


def _engine(cluster: str | None, persist: str = "auto"):  # type: ignore[no-untyped-def]
    from pipeline.engine.cluster import dashboard_link
    from pipeline.engine.cluster_jobs import wait_for_workers
    from pipeline.engine.engines import DaskEngine, make_engine

    engine = make_engine(cluster or "local", persist)
    if isinstance(engine, DaskEngine):
        link = dashboard_link(engine.client)
        console.print(f"Dask cluster: {engine.client.scheduler.address}"
                      + (f"  dashboard: {link}" if link else ""))
        try:  # batch jobs may queue; SIGTERM / Ctrl-C end the wait and cancel them
            wait_for_workers(engine.client, say=lambda m: console.print(m, soft_wrap=True))
        except BaseException:
            engine.close()
            raise
    return engine


def spec_help(name: str) -> str:
    from pipeline.fit.spec import setting_help

    return setting_help(name)


@app.command()
def fit(
    store: str = typer.Argument(..., help="The feature store to cluster."),
    run_dir: str = typer.Option(..., "--run-dir", help="Where result.json, posterior.npz, checkpoints/ go."),
    learner: str | None = typer.Option(None, help=spec_help("learner")),
    learner_option: list[str] = typer.Option([], "--learner-option", "-o", metavar="KEY=VALUE",
                                             help="Learner option KEY=VALUE (repeatable; `vbcluster "
                                             "learners` lists them)."),
    components: int | None = typer.Option(None, "--components", "-k", help=spec_help("components")),
    covariance: str | None = typer.Option(None, help=spec_help("covariance")),
    rank: int | None = typer.Option(None, "--rank", help=spec_help("rank")),
    weights: str | None = typer.Option(None, help=spec_help("weights")),
    max_iter: int | None = typer.Option(None, help=spec_help("max_iter")),
    tol: float | None = typer.Option(None, help=spec_help("tol")),
    seed: int | None = typer.Option(None, help=spec_help("seed")),
    init: str | None = typer.Option(None, help=spec_help("init")),
    n_init: int | None = typer.Option(None, help=spec_help("n_init")),
    fixed_variance: float | None = typer.Option(None, help=spec_help("fixed_variance")),
    weight_concentration_prior: float | None = typer.Option(
        None, help=spec_help("weight_concentration_prior")),
    mean_precision_prior: float | None = typer.Option(None, help=spec_help("mean_precision_prior")),
    degrees_of_freedom_prior: float | None = typer.Option(None, help=spec_help("degrees_of_freedom_prior")),
    priors: str | None = typer.Option(None, help=spec_help("priors")),
    select: str | None = typer.Option(None, help=spec_help("select")),
    select_fits: int | None = typer.Option(None, help=spec_help("select_fits")),
    select_pca: int | None = typer.Option(None, "--select-pca", metavar="P", help=spec_help("select_pca")),
    select_lowrank: str | None = typer.Option(None, metavar="BOOL", help=spec_help("select_lowrank")),
    no_grow: bool = typer.Option(
        False, "--no-grow", help="Keep the truncation at -k (the learners that grow: `vbcluster learners`)."),
    max_components: int | None = typer.Option(None, help=spec_help("max_components")),
    reg_covar: float | None = typer.Option(None, help=spec_help("reg_covar")),
    pca: int | None = typer.Option(None, "--pca", metavar="P", help=spec_help("pca")),
    whiten: bool = typer.Option(False, "--whiten", help=spec_help("whiten")),
    pca_solver: str | None = typer.Option(None, "--pca-solver", help=spec_help("pca_solver")),
    normalize: str | None = typer.Option(None, help=spec_help("normalize")),
    cluster: str | None = typer.Option(None, help=spec_help("cluster")),
    persist: str | None = typer.Option(None, "--persist", metavar="MODE", help=spec_help("persist")),
    chunk_rows: int | None = typer.Option(None, help=spec_help("chunk_rows")),
    checkpoint_every: int | None = typer.Option(None, help=spec_help("checkpoint_every")),
    checkpoint_seconds: float | None = typer.Option(None, help=spec_help("checkpoint_seconds")),
    keep: int | None = typer.Option(None, help=spec_help("keep")),
    restart: bool = typer.Option(False, "--restart", help="Start over in a run dir holding another run."),
    warm_from: str | None = typer.Option(None, "--warm-from", help="Start from a run and its model."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the summary."),
) -> None:
    """Fit a VB mixture to a store: DIR/result.json, DIR/posterior.npz, checkpoints in DIR/checkpoints
    (`vbcluster resume DIR` continues a killed fit). Settings are checked before anything is written."""
    from pipeline.service import make_spec
    from vbcore.errors import VBClusterError

    try:
        spec = make_spec(store, warm_from, learner=learner, components=components, covariance=covariance,
                         weights=weights, max_iter=max_iter, tol=tol, seed=seed, init=init, n_init=n_init,
                         fixed_variance=fixed_variance, weight_concentration_prior=weight_concentration_prior,
                         mean_precision_prior=mean_precision_prior, reg_covar=reg_covar, cluster=cluster,
                         persist=persist, degrees_of_freedom_prior=degrees_of_freedom_prior,
                         chunk_rows=chunk_rows, priors=priors, grow=False if no_grow else None,
                         max_components=max_components, keep=keep, checkpoint_every=checkpoint_every,
                         checkpoint_seconds=checkpoint_seconds, learner_options=key_values(learner_option),
                         pca=pca, whiten=whiten or None, pca_solver=pca_solver, select=select, rank=rank,
                         select_fits=select_fits, select_pca=select_pca, select_lowrank=select_lowrank,
                         normalize=normalize)
    except VBClusterError as exc:
        fail(exc)
        return
    _run(run_dir, spec, quiet, restart=restart, warm_from=warm_from)


@app.command()
def learners(name: str | None = typer.Argument(None, help="A learner: each of its options with its type, "
                                               "default, accepted values and help.")) -> None:
    """List the learners, their family and options (pass options to `fit` as -o KEY=VALUE)."""
    from pipeline.cli_format import learners_table
    from vbcore.errors import VBClusterError

    try:
        table_console().print(learners_table(name))
    except VBClusterError as exc:
        fail(exc)


@app.command("defaults")
def show_defaults() -> None:
    """List every fit setting's default on the command line and in VBMixture, side by side."""
    from pipeline.cli_format import defaults_table

    table_console().print(defaults_table())


@app.command()
def resume(
    run_dir: str = typer.Argument(..., help="A run directory of `vbcluster fit`."),
    cluster: str | None = typer.Option(None, help="Run on another cluster config than the fit's."),
    persist: str | None = typer.Option(None, "--persist", metavar="MODE",
                                       help="Override the fit's --persist (the bits do not depend on it)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the summary."),
) -> None:
    """Continue a fit from its newest valid checkpoint (bit for bit where an uninterrupted fit ends)."""
    from dataclasses import replace

    from pipeline.service import finished_result, read_spec
    from vbcore.errors import VBClusterError

    try:
        spec, done = read_spec(run_dir), finished_result(run_dir)
    except VBClusterError as exc:
        fail(exc)
        return
    if done is not None:  # nothing to resume: result.json and posterior.npz stay as they are
        console.print(f"{run_dir}: the run is finished ({done.get('n_iter')} iterations, result.json of "
                      f"{done.get('finished')}); nothing to resume", soft_wrap=True)
        return
    if cluster is not None:
        spec = replace(spec, cluster=cluster)
    if persist is not None:
        spec = replace(spec, persist=persist).resolved("pipeline")
    _run(run_dir, spec, quiet, resume=True)


def _run(run_dir: str, spec: Any, quiet: bool, restart: bool = False, resume: bool = False,
         warm_from: str | None = None) -> None:
    from pathlib import Path

    from pipeline.fit.checkpoint import Checkpointer, CheckpointError
    from pipeline.fit.driver import stop_on_signals
    from pipeline.fit.progress import FitProgress
    from pipeline.service import check_fit, fit_run, warm_record
    from vbcore.errors import FitInterrupted, RunLockedError, VBClusterError, truncation_message

    try:
        state = check_fit(run_dir, spec, warm_from, restart=restart)  # nothing is written before this
        if state == "continue" and not resume:
            console.print(f"{run_dir} holds this run: continuing it (--restart starts over)", soft_wrap=True)
        if resume and not Checkpointer(Path(run_dir) / "checkpoints").list():
            start = "its warm start" if warm_record(run_dir) else "the beginning"
            console.print(f"{run_dir}: no checkpoint yet; the fit starts from {start}", soft_wrap=True)
        engine = _engine(spec.cluster, spec.persist)
        try:
            with stop_on_signals() as stop, FitProgress(spec.max_iter, f"{spec.learner} {Path(run_dir).name}",
                                                quiet=quiet, log_path=Path(run_dir) / "iterations.jsonl",
                                                console=console) as progress:
                result = fit_run(run_dir, spec, engine=engine, callback=progress, restart=restart,
                                 warm_from=warm_from, stop=stop)
        finally:
            engine.close()
    except FitInterrupted as exc:
        console.print(f"{exc}. Continue with:\n  vbcluster resume {run_dir}", soft_wrap=True)
        raise typer.Exit(code=128 + exc.signum) from None
    except (VBClusterError, RunLockedError, CheckpointError, OSError) as exc:
        fail(exc)
        return
    if result.get("resumed_from"):
        console.print(f"resumed from {result['resumed_from']}", soft_wrap=True)
    if result.get("took_over_lock_of"):
        taken = result["took_over_lock_of"]
        console.print(f"took over a stale lock of pid {taken.get('pid')} on {taken.get('host')}",
                      soft_wrap=True)
    console.print(fit_table(spec, result))
    if result.get("selection"):
        console.print(selection_table(result["selection"]))
    bound = result.get("bound", {})
    ses = [v for v in bound.get("history_se", []) if v is not None]
    if bound.get("history", "exact") != "exact" and result.get("elbo_history"):
        last = f"{result['elbo_history'][-1]:.6g}" + (f" +- {ses[-1]:.2g}" if ses else "")
        console.print(f"the per-iteration bounds are minibatch estimates (last {last}, standard error); "
                      "the ELBO above is exact (one full pass)", soft_wrap=True)
    if (result.get("truncation") or {}).get("limit_hit"):
        warning = truncation_message(result["truncation"])
        console.print(Text.assemble(("warning:", "bold yellow"), f" {warning}"), soft_wrap=True)
    model = "lowrank.npz" if result.get("covariance") == "lowrank" else "posterior.npz"
    console.print(f"wrote {run_dir}/result.json and {run_dir}/{model}")


@app.command()
def assign(
    run_dir: str = typer.Argument(..., help="A run directory written by `vbcluster fit`."),
    store: str | None = typer.Option(None, help="The store (default: the one the run was fitted on)."),
    name: str | None = typer.Option(None, help="zarr: name of the assignment group (default: the "
                                    "run's name)."),
    fmt: str | None = typer.Option(None, "--format", "-f", metavar="zarr|parquet|csv",
                                   help="zarr: a group STORE/assignments/NAME next to the features; parquet "
                                        "or csv: a table file with columns row, id (if the store has ids), "
                                        "label, probability. Default: --out's suffix, else zarr."),
    out: str | None = typer.Option(None, "--out", help="parquet/csv: the file to write (default: "
                                   "RUN_DIR/assignments.parquet or .csv)."),
) -> None:
    """Write each row's cluster and its probability (atomically): next to the store, or as a table file."""
    from pipeline.runs.assign_formats import format_of
    from pipeline.runs.directory import assign_store
    from vbcore.errors import ConfigError, VBClusterError

    try:
        kind = format_of(out) if fmt is None else fmt.lower()
        if kind != "zarr" and name is not None:
            raise ConfigError(f"--name names the Zarr group; with --format {kind} choose the file with --out")
        if kind == "zarr" and out is not None:
            raise ConfigError("--out is for --format parquet or csv; --format zarr writes "
                              "STORE/assignments/NAME")
        target = assign_store(run_dir, store=store, name=name, format=kind, out=out)
    except VBClusterError as exc:
        fail(exc)
        return
    what = "arrays labels, probability" if kind == "zarr" else f"one row per store row, {kind}"
    console.print(f"wrote {target} ({what})", soft_wrap=True)


@app.command()
def study(
    name: str = typer.Argument(..., help="seed000 (Kuusela et al. 2009), seed001 (Watanabe & Watanabe 2005), "
                              "seed003 (Lim & Jiang 2024), moves (merges, deletes) or real (Fashion-MNIST)."),
    out: str = typer.Option(..., "--out", help="Results folder; the study writes OUT/NAME/."),
    quick: bool = typer.Option(False, "--quick", help="A small version (seconds), as the tests run it."),
    seed: int = typer.Option(0, help="Random seed of the study."),
) -> None:
    """Rerun a paper's experiments (docs/references.md): Markdown + CSV tables and PNG plots in OUT/NAME/."""
    from pipeline.studies import run_study
    from vbcore.errors import VBClusterError

    t0 = time.perf_counter()
    try:
        folder = run_study(name, out, quick=quick, seed=seed)
    except VBClusterError as exc:
        fail(exc)
        return
    console.print(f"study {name}: wrote {folder}/README.md and its tables and plots "
                  f"in {time.perf_counter() - t0:.1f}s", soft_wrap=True)


@app.command()
def report(
    run_dirs: list[str] = typer.Argument(..., help="One or more run directories (several: one ELBO "
                                         "plot per group whose bounds compare)."),
    out: str | None = typer.Option(None, "--out", help="The report directory (default: "
                                   "FIRST_RUN_DIR/report)."),
    sample: int = typer.Option(3000, help="Rows drawn for the PCA scatter."),
    cluster: str | None = typer.Option(None, help="Where the pass over the rows (labels, each cluster's "
                                       "most typical rows) runs: a cluster config or scheduler address."),
) -> None:
    """Write one self-contained HTML report (PNGs embedded, and written beside it)."""
    from pipeline.runs.report import write_report
    from vbcore.errors import VBClusterError

    try:
        engine = _engine(cluster, "never") if cluster else None  # one pass: chunks streamed
        try:
            path = write_report(run_dirs, out, sample=sample, engine=engine)
        finally:
            if engine is not None:
                engine.close()
    except VBClusterError as exc:
        fail(exc)
        return
    console.print(f"wrote {path} (and its PNGs beside it)")


@app.command()
def check(
    store: str = typer.Argument(..., help="The feature store to verify."),
    upgrade: bool = typer.Option(False, "--upgrade", help="First rewrite a store written without chunk "
                                 "checksums (by an older vbcluster) with them, atomically."),
) -> None:
    """Verify every chunk of a store (present, checksum, decodable, finite features); say how long it
    took per GB of chunk files. Exit 2 when something is wrong."""
    import warnings

    from pipeline.store.integrity import StoreIntegrityWarning
    from pipeline.store.integrity import check as run_check
    from pipeline.store.integrity import upgrade as run_upgrade
    from vbcore.errors import VBClusterError

    try:
        if upgrade:
            done = run_upgrade(store)
            console.print(f"{store}: rewrote every chunk with a CRC-32C checksum (the store's fingerprint "
                          "changed: runs fitted before refer to the old one)" if done
                          else f"{store}: already has chunk checksums; nothing to upgrade", soft_wrap=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", StoreIntegrityWarning)
            rep = run_check(store)
    except (VBClusterError, OSError) as exc:
        fail(exc)
        return
    for w in caught:
        console.print(Text.assemble(("warning:", "yellow"), f" {w.message}"), soft_wrap=True)
    if rep.nonfinite_rows:
        fail(ValueError(f"{store}: {rep.nonfinite_rows} rows of 'features' hold NaN/inf"))
    how = "checksums verified" if rep.checksummed else "no checksums: only presence and decoding checked"
    rate = "" if rep.seconds_per_gb is None else f" = {rep.seconds_per_gb:.1f} s/GB"
    console.print(f"{store}: ok, {rep.n_rows} rows, {rep.chunks} chunks, {rep.n_bytes / 1e6:.1f} MB "
                  f"({how}) in {rep.seconds:.2f}s{rate}", soft_wrap=True)


if __name__ == "__main__":  # pragma: no cover
    app()
