"""The ``vbcluster`` command line (typer + rich): ingest, fit, resume, assign, demo, version.

Report and deploy arrive with the flow issue.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

#: exit codes: bad input (a file, store, config or option to fix) and environment (disk, permissions)
EXIT_INPUT, EXIT_ENVIRONMENT = 2, 1


class _App(typer.Typer):
    """The command group: an error no command handled is one line on stderr (exit 2 for bad input,
    1 for the environment) instead of a traceback; ``--debug`` anywhere on the command line shows the
    traceback instead."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        argv = list(kwargs.pop("args", None) or sys.argv[1:])
        if "--debug" in argv:
            return super().__call__(*args, args=[a for a in argv if a != "--debug"], **kwargs)
        import warnings

        warnings.showwarning = _show_warning  # one line each, no source line
        try:
            return super().__call__(*args, args=argv, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the point: one line, whatever it is
            sys.exit(_one_line(exc))


_SHOWN: set[str] = set()


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """A warning as one line, each distinct one once per command."""
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


def _one_line(exc: BaseException) -> int:
    text = " ".join(str(exc).split()) or "no details"
    if isinstance(exc, OSError) and exc.filename is None and not any(c in text for c in "/\\"):
        text += " (the file was not named by the system; run with --debug)"
    print(f"error: {type(exc).__name__}: {text} (run with --debug for the traceback)", file=sys.stderr)
    return exit_code(exc)


app = _App(add_completion=False, no_args_is_help=True,
           help="Variational Bayesian clustering of large feature stores. Errors are one line (exit 2: "
           "bad input, 1: environment); add --debug to see the traceback.")
console = Console(width=110) if not Console().is_terminal else Console()


@app.command()
def version() -> None:
    """Print the installed vbcluster version."""
    from importlib.metadata import version as _v

    console.print(f"vbcluster {_v('vbcluster')}")


@app.command()
def demo(
    n_components: int = typer.Option(30, help="Truncation level K of the Dirichlet process."),
    seed: int = typer.Option(0, help="Random seed (k-means initialisation)."),
    max_iter: int = typer.Option(300, help="Maximum VB EM iterations."),
) -> None:
    """Fit scikit-learn's bundled digits (1,797 x 64, 10 classes) with DP mixtures by VB EM."""
    from sklearn.datasets import load_digits

    from pipeline.estimator import VBMixture
    from vbcore.metrics import acc, ari, nmi

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
        found = len(np.unique(labels))
        table.add_row(ct, str(model.n_iter_), str(model.converged_), str(found),
                      f"{model.lower_bound_:.1f}", f"{nmi(y, labels):.3f}", f"{acc(y, labels):.3f}",
                      f"{ari(y, labels):.3f}", f"{secs:.2f}")
    console.print(table)
    console.print("clusters found = components that own at least one row (argmax of q(z)).")


def _options(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise typer.BadParameter(f"options take KEY=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
    raise typer.Exit(code=exit_code(exc))


@app.command()
def ingest(
    source: str = typer.Argument(..., help="A .npy/.npz/.h5/.parquet/.csv file, an image folder, "
                                 "'digits', 'image:NAME' or 'synthetic'."),
    out: str = typer.Option(..., "--out", help="The feature store to write (a Zarr directory)."),
    chunk_rows: int = typer.Option(8192, help="Rows per chunk in the store."),
    labels: str | None = typer.Option(None, help="Labels: a file, key, dataset, column or 'folders'."),
    ids: str | None = typer.Option(None, help="Row ids: a file, key, dataset or column."),
    append: bool = typer.Option(False, help="Append to an existing store (atomically)."),
    overwrite: bool = typer.Option(False, help="Replace an existing store once the new one is complete."),
    drop_nonfinite: bool = typer.Option(False, help="Drop rows with NaN/inf (counted) instead of failing."),
    rows: int | None = typer.Option(None, help="synthetic: number of rows."),
    dim: int | None = typer.Option(None, help="synthetic: number of features."),
    classes: int | None = typer.Option(None, help="synthetic: number of classes."),
    seed: int | None = typer.Option(None, help="synthetic: random seed."),
    option: list[str] = typer.Option([], "--option", "-o", help="Source option KEY=VALUE (repeatable)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar; print only the summary."),
) -> None:
    """Stream a source into a chunked, compressed Zarr feature store."""
    from pipeline.ingest import ingest as run_ingest
    from pipeline.integrity import check_input_file
    from vbcore.errors import VBClusterError

    opts: dict[str, Any] = dict(_options(option))
    for k, v in (("rows", rows), ("dim", dim), ("classes", classes), ("seed", seed)):
        if v is not None:
            opts[k] = v
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    try:
        check_input_file(source)  # an empty (0-byte) source file is named, not "Aborted."
        with Progress(SpinnerColumn(), TextColumn("[bold]ingest {task.description}"),
                      TextColumn("{task.completed:,} rows"), TimeElapsedColumn(), console=console,
                      disable=quiet) as bar:
            t = bar.add_task(source, total=None)
            report = run_ingest(source, out, chunk_rows=chunk_rows, labels=labels, ids=ids, append=append,
                                overwrite=overwrite, drop_nonfinite=drop_nonfinite,
                                progress=lambda n: bar.advance(t, n), **opts)
    except (VBClusterError, OSError) as exc:
        _fail(exc)
        return
    console.print(f"{report.path}: wrote {report.rows_written} rows x {report.n_features} features "
                  f"from {report.source} ({report.rows_dropped} dropped) in {report.elapsed_s:.1f}s; "
                  f"the store has {report.n_rows} rows")


def _engine(cluster: str | None):  # type: ignore[no-untyped-def]
    from pipeline.cluster import dashboard_link
    from pipeline.engine import DaskEngine, make_engine

    engine = make_engine(cluster or "local")
    if isinstance(engine, DaskEngine):
        link = dashboard_link(engine.client)
        console.print(f"Dask cluster: {engine.client.scheduler.address}"
                      + (f"  dashboard: {link}" if link else ""))
    return engine


RUN_SPEC = "run.json"


@app.command()
def fit(
    store: str = typer.Argument(..., help="The feature store to cluster."),
    run_dir: str = typer.Option(..., "--run-dir", help="Where result.json, posterior.npz and "
                                "checkpoints/ go."),
    learner: str = typer.Option("vbem", help="The learner: vbem, or another of `vbcluster learners`."),
    learner_option: list[str] = typer.Option([], "--learner-option", "-o",
                                             help="Learner option KEY=VALUE (repeatable)."),
    components: int = typer.Option(50, "--components", "-k", help="K (the DP truncation level)."),
    covariance: str | None = typer.Option(None, help="full | diag | spherical | fixed; default: the "
                                          "learner's (fixed for mm, sga*, svi; diag otherwise)."),
    weights: str = typer.Option("dp", help="dp (truncated Dirichlet process) | dirichlet."),
    max_iter: int = typer.Option(200, help="Maximum iterations."),
    tol: float = typer.Option(1e-4, help="Convergence threshold on the ELBO change per row."),
    seed: int = typer.Option(0, help="Random seed."),
    init: str = typer.Option("kmeans", help="kmeans | k-means++ | random | random_from_data."),
    cluster: str | None = typer.Option(None, help="A cluster config (cluster_config/*.yaml) or "
                                       "scheduler address; default: in-process."),
    chunk_rows: int = typer.Option(65536, help="Rows per chunk for in-memory arrays."),
    checkpoint_every: int = typer.Option(10, help="Iterations between checkpoints."),
    checkpoint_seconds: float | None = typer.Option(None, help="Also checkpoint after this many seconds."),
    keep: int = typer.Option(3, help="Checkpoints kept."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the summary."),
) -> None:
    """Fit a VB mixture to a store; write DIR/result.json and DIR/posterior.npz, with checkpoints in
    DIR/checkpoints (a killed fit continues with `vbcluster resume DIR`)."""
    if covariance is None:  # the learner's own default (issue 6: the seed 003 learners need 'fixed')
        from pipeline.learners import LEARNERS

        covariance = getattr(LEARNERS.get(learner), "default_covariance_type", "diag")
    spec = {"store": store, "learner": learner, "components": components, "covariance": covariance,
            "weights": weights, "max_iter": max_iter, "tol": tol, "seed": seed, "init": init,
            "cluster": cluster, "chunk_rows": chunk_rows, "checkpoint_every": checkpoint_every,
            "checkpoint_seconds": checkpoint_seconds, "keep": keep,
            "learner_options": _options(learner_option)}
    _run(run_dir, spec, quiet, fresh=True)


@app.command()
def learners() -> None:
    """List the learners and their options (pass options to `fit` as -o KEY=VALUE)."""
    from pipeline.learners import LEARNERS

    table = Table(title="vbcluster learners")
    table.add_column("learner")
    table.add_column("options (defaults)")
    table.add_column("about")
    for name, cls in LEARNERS.items():
        opts = ", ".join(f"{k}={v}" for k, v in cls.options.items()) or "-"
        table.add_row(name, opts, (cls.__doc__ or "").strip().splitlines()[0])
    console.print(table)


@app.command()
def resume(
    run_dir: str = typer.Argument(..., help="A run directory of `vbcluster fit`."),
    cluster: str | None = typer.Option(None, help="Run on another cluster config than the fit's."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the summary."),
) -> None:
    """Continue a fit from its newest valid checkpoint (bit for bit where an uninterrupted fit ends)."""
    import json
    from pathlib import Path

    path = Path(run_dir) / RUN_SPEC
    if not path.is_file():
        _fail(FileNotFoundError(f"{run_dir}: no {RUN_SPEC} (not a run directory of `vbcluster fit`)"))
        return
    spec = json.loads(path.read_text())
    if cluster is not None:
        spec["cluster"] = cluster
    _run(run_dir, spec, quiet, fresh=False)


def _run(run_dir: str, spec: dict[str, Any], quiet: bool, fresh: bool) -> None:
    import json
    from pathlib import Path

    from pipeline.checkpoint import CheckpointError, RunLock, RunLockedError
    from pipeline.estimator import VBMixture
    from pipeline.runs import save_run, write_atomic
    from vbcore.errors import VBClusterError

    wt = {"dp": "dirichlet_process", "dirichlet": "dirichlet_distribution"}.get(spec["weights"],
                                                                              spec["weights"])
    t0 = time.perf_counter()
    try:
        from pipeline.sources import StoreSource

        StoreSource(spec["store"])  # a missing or bad store fails before anything is written
        from pipeline.learners import learner_class  # and so do a bad learner or its options

        learner_class(spec["learner"]).parse_options(spec.get("learner_options") or {})
        with RunLock(run_dir) as lock:
            if lock.taken_over:
                console.print(f"took over a stale lock of pid {lock.taken_over.get('pid')} on "
                              f"{lock.taken_over.get('host')}", soft_wrap=True)
            if fresh:
                write_atomic(Path(run_dir) / RUN_SPEC, lambda f: f.write(json.dumps(spec, indent=1).encode()))
            engine = _engine(spec["cluster"])
            try:
                model = VBMixture(
                    spec["components"], covariance_type=spec["covariance"],
                    weight_concentration_prior_type=wt, max_iter=spec["max_iter"], tol=spec["tol"],
                    random_state=spec["seed"], init_params=spec["init"], learner=spec["learner"],
                    learner_options=spec.get("learner_options") or None,
                    chunk_rows=spec["chunk_rows"], engine=engine, verbose=0,
                    checkpoint_dir=str(Path(run_dir) / "checkpoints"),
                    checkpoint_every=spec["checkpoint_every"],
                    checkpoint_seconds=spec["checkpoint_seconds"], checkpoint_keep=spec["keep"],
                )
                from pipeline.progress import FitProgress

                with FitProgress(spec["max_iter"], f"{spec['learner']} {Path(run_dir).name}", quiet=quiet,
                                 log_path=Path(run_dir) / "iterations.jsonl", console=console) as progress:
                    model.fit(spec["store"], callback=progress)
                if getattr(model, "resumed_from_", None):
                    console.print(f"resumed from {model.resumed_from_}", soft_wrap=True)
                for name, reason in getattr(model, "skipped_checkpoints_", []):
                    console.print(f"skipped checkpoint {name}: {reason}", soft_wrap=True)
                result = save_run(run_dir, model, spec["store"],
                                  extra={"seconds": time.perf_counter() - t0}, engine=engine)
            finally:
                engine.close()
    except (VBClusterError, RunLockedError, CheckpointError, OSError) as exc:
        _fail(exc)
        return
    table = Table(title=f"vbcluster fit {spec['store']}")
    for col in ("learner", "iterations", "converged", "K", "effective K", "ELBO", "NMI", "ACC", "seconds"):
        table.add_column(col, justify="right")
    m = result.get("metrics", {})
    table.add_row(spec["learner"], str(result["n_iter"]), str(result["converged"]),
                  str(spec["components"]), str(result["n_effective"]), f"{result['elbo']:.6g}",
                  f"{m['nmi']:.3f}" if m else "-", f"{m['acc']:.3f}" if m else "-",
                  f"{result['seconds']:.1f}")
    console.print(table)
    console.print(f"wrote {run_dir}/result.json and {run_dir}/posterior.npz")


@app.command()
def assign(
    run_dir: str = typer.Argument(..., help="A run directory written by `vbcluster fit`."),
    store: str | None = typer.Option(None, help="The store (default: the one the run was fitted on)."),
    name: str | None = typer.Option(None, help="Name of the assignment group (default: the run's name)."),
) -> None:
    """Write each row's cluster and its probability next to the store (atomically)."""
    from pipeline.runs import assign_store
    from vbcore.errors import VBClusterError

    try:
        target = assign_store(run_dir, store=store, name=name)
    except VBClusterError as exc:
        _fail(exc)
        return
    console.print(f"wrote {target} (arrays labels, probability)")


@app.command()
def study(
    name: str = typer.Argument(..., help="The study: seed000, seed001 or seed003."),
    out: str = typer.Option(..., "--out", help="Results folder; the study writes OUT/NAME/."),
    quick: bool = typer.Option(False, "--quick", help="A small version (seconds), as the tests run it."),
    seed: int = typer.Option(0, help="Random seed of the study."),
) -> None:
    """Reproduce a seed paper's experiments: Markdown + CSV tables and PNG plots in OUT/NAME/."""
    from pipeline.studies import run_study
    from vbcore.errors import VBClusterError

    t0 = time.perf_counter()
    try:
        folder = run_study(name, out, quick=quick, seed=seed)
    except VBClusterError as exc:
        _fail(exc)
        return
    console.print(f"study {name}: wrote {folder}/README.md and its tables and plots "
                  f"in {time.perf_counter() - t0:.1f}s", soft_wrap=True)


@app.command()
def report(
    run_dirs: list[str] = typer.Argument(..., help="One or more run directories (several: compared on "
                                         "one ELBO plot)."),
    out: str | None = typer.Option(None, "--out", help="The report directory (default: "
                                   "FIRST_RUN_DIR/report)."),
    sample: int = typer.Option(3000, help="Rows drawn for the PCA scatter."),
) -> None:
    """Write one self-contained HTML report (PNGs embedded, and written beside it)."""
    from pipeline.report import write_report
    from vbcore.errors import VBClusterError

    try:
        path = write_report(run_dirs, out, sample=sample)
    except VBClusterError as exc:
        _fail(exc)
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

    from pipeline.integrity import StoreIntegrityWarning
    from pipeline.integrity import check as run_check
    from pipeline.integrity import upgrade as run_upgrade
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
        _fail(exc)
        return
    for w in caught:
        console.print(f"[yellow]warning:[/yellow] {w.message}", soft_wrap=True)
    if rep.nonfinite_rows:
        _fail(ValueError(f"{store}: {rep.nonfinite_rows} rows of 'features' hold NaN/inf"))
    how = "checksums verified" if rep.checksummed else "no checksums: only presence and decoding checked"
    console.print(f"{store}: ok, {rep.n_rows} rows, {rep.chunks} chunks, {rep.n_bytes / 1e6:.1f} MB "
                  f"({how}) in {rep.seconds:.2f}s = {rep.seconds_per_gb:.1f} s/GB", soft_wrap=True)


if __name__ == "__main__":  # pragma: no cover
    app()
