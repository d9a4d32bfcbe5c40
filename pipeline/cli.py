"""The ``vbcluster`` command line (typer + rich).

Today: ``vbcluster demo`` (the embedded default job) and ``vbcluster version``. Ingest, fit, resume,
report and deploy arrive with the feature-store, checkpoint and flow issues.
"""

from __future__ import annotations

import time

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Variational Bayesian clustering of large feature stores.")
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


if __name__ == "__main__":  # pragma: no cover
    app()
