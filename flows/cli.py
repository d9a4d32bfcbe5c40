"""The ``vbcluster`` command: every command of :mod:`pipeline.cli`, plus the ones that need Prefect
(``deploy``). The orchestration layer adds them here because ``pipeline`` never imports Prefect."""

from __future__ import annotations

import typer

from pipeline.cli import app, console, fail, key_values, spec_help

__all__ = ["app"]


@app.command()
def deploy(
    store: str = typer.Argument(..., help="The feature store to keep clustered."),
    out: str | None = typer.Option(None, "--out", help="Where versions/ and latest go "
                                   "(default: STORE.versions beside the store)."),
    cron: str | None = typer.Option(None, help="A cron schedule, e.g. '0 2 * * *' (02:00 every day)."),
    interval: float | None = typer.Option(None, help="Or: run every this many seconds."),
    name: str = typer.Option("vbcluster-refresh", help="The deployment's name."),
    learner: str | None = typer.Option(None, help=spec_help("learner")),
    learner_option: list[str] = typer.Option([], "--learner-option", "-o", metavar="KEY=VALUE",
                                             help="Learner option KEY=VALUE (repeatable)."),
    components: int | None = typer.Option(None, "--components", "-k", help=spec_help("components")),
    covariance: str | None = typer.Option(None, help=spec_help("covariance")),
    weights: str | None = typer.Option(None, help="dp | dirichlet (default: dp)."),
    max_iter: int | None = typer.Option(None, help=spec_help("max_iter")),
    tol: float | None = typer.Option(None, help=spec_help("tol")),
    seed: int | None = typer.Option(None, help=spec_help("seed")),
    cluster: str | None = typer.Option(None, help=spec_help("cluster")),
    pca: int | None = typer.Option(None, "--pca", metavar="P", help=spec_help("pca")),
    whiten: bool = typer.Option(False, "--whiten", help=spec_help("whiten")),
    pca_solver: str | None = typer.Option(None, "--pca-solver", help=spec_help("pca_solver")),
    priors: str | None = typer.Option(None, help=spec_help("priors")),
    init: str | None = typer.Option(None, help=spec_help("init")),
    max_components: int | None = typer.Option(None, help=spec_help("max_components")),
    no_grow: bool = typer.Option(
        False, "--no-grow", help="Keep the truncation at -k (the learners that grow: `vbcluster learners`)."),
    images: str | None = typer.Option(None, "--images", help="An image folder, tar shard(s) or image list: "
                                      "each refresh first extracts its new images into STORE."),
    extract_option: list[str] = typer.Option([], "--extract-option", "-x", metavar="KEY=VALUE",
                                             help="Extraction option for --images (repeatable), e.g. "
                                             "-x extractor=onnx -x model=vgg16.onnx -x output=TENSOR "
                                             "(for VGG16's fc7: the tensor docs/ingest.md's export "
                                             "names)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the inputs, register nothing."),
) -> None:
    """Refresh the clustering of STORE on a schedule: register a Prefect deployment on the server of
    PREFECT_API_URL and serve it (this process runs the scheduled flow runs until stopped). Each run
    warm-starts from the last published version when the store has grown and publishes a new
    version (OUT/versions/vNNNN-*, OUT/latest)."""
    from flows.schedule import deploy as run_deploy
    from vbcore.errors import VBClusterError

    try:
        info = run_deploy(store, out, cron=cron, interval=interval, name=name, dry_run=dry_run,
                          learner=learner, learner_options=key_values(learner_option) or None,
                          components=components, covariance=covariance, weights=weights,
                          max_iter=max_iter, tol=tol, seed=seed, cluster=cluster, images=images,
                          pca=pca, whiten=whiten, pca_solver=pca_solver, priors=priors, init=init,
                          max_components=max_components, grow=False if no_grow else None,
                          extract_options=key_values(extract_option) or None)
    except VBClusterError as exc:
        fail(exc)
        return
    if dry_run:
        when = info.get("cron") or f"every {info['interval'].total_seconds():g} s"
        console.print(f"ok: would refresh {info['parameters']['store']} into {info['parameters']['out']} "
                      f"({when})", soft_wrap=True)


if __name__ == "__main__":  # pragma: no cover
    app()
