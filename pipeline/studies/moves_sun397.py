"""Study ``moves`` on the SUN397-shaped store: 108,754 x 4096, 397 classes, truncation 1000.

``python -m pipeline.studies.moves_sun397 --store PATH --out DIR`` (the store of ``vbcluster ingest
synthetic --rows 108754 --dim 4096 --classes 397 --seed 0``; tens of minutes on two cores). Fits, with
and without moves, a fixed number of iterations (``tol = 0``: the same iterations, so the CPU seconds
compare directly):

* VB EM, ``covariance_type='diag'``, the truncated E-step (``candidates``, ``neighbours``; an exact
  iteration costs O(N K D)), ``moves=merge,delete``;
* SGA+F, ``'fixed'`` (``sigma^2`` from nearest neighbours, ``a0 = N``, minibatch 2,000), ``moves=merge``;
* MM (with ``--learners ...,mm``), the same model on every row each iteration, ``moves=merge``.

VB EM starts from ``init`` (default ``'random_from_data'``: each row to the nearest of K random rows;
scikit-learn's k-means++ on the 24,576-row sample with K = 1000 took over 15 minutes on the loaded
machine); SGA+F from its own k-means++ on 10,000 rows (Lim & Jiang 2024 Algorithm 1).

Per fit: K found (components holding at least one row), NMI, ACC, the final exact ELBO per row (for
SGA+F and MM after one pass over all rows), CPU and wall seconds; for the hard learners the merges
the full data's exact ELBO still accepts at the final point (:func:`pipeline.studies.moves.
full_data_merges`); and how the partition relates to the classes:
the row-weighted share of a class in its largest cluster ("class kept whole") and of a cluster's
largest class ("cluster purity"), which say whether the bound splits classes or joins them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from pipeline.studies import Report, pyplot, save_figure, study_dir
from pipeline.studies.moves import fit_one

COLUMNS = ["learner", "moves", "iterations", "K found", "K kept", "NMI", "ACC", "ELBO/row",
           "class kept whole", "cluster purity", "full-data merges", "CPU s", "wall s", "CPU s/iter"]


def partition_shares(y: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    """(row-weighted share of each class in its largest cluster, of each cluster's largest class)."""
    _, yi = np.unique(y, return_inverse=True)
    _, pi = np.unique(pred, return_inverse=True)
    table = np.zeros((yi.max() + 1, pi.max() + 1), dtype=np.int64)
    np.add.at(table, (yi, pi), 1)
    return float(table.max(1).sum() / y.size), float(table.max(0).sum() / y.size)


def partition_bounds(store: str, dof_priors: tuple[float | None, ...] = (None, 64.0, 1.0),
                     truncation: int = 1000) -> dict[str, float]:
    """The exact ELBO per row of the diagonal DP mixture (VB EM's model, its M-step) at two hard
    partitions, one component and the store's classes (in descending size, the DP's order), under
    the default prior with ``nu0`` = each of ``dof_priors`` (None: the default ``D``). Statistics by a
    sparse one-hot product per chunk, float64: two passes over the store, O(N D)."""
    from scipy.sparse import csr_matrix

    from pipeline.engine.sources import StoreSource
    from vbcore.model.priors import default_prior
    from vbcore.model.stats import SuffStats
    from vbcore.moves.exact import total_elbo

    src = StoreSource(store)
    y = np.asarray(src.labels(), dtype=np.int64)
    slices = src.chunk_slices()
    s1, s2 = np.zeros(src.n_features), np.zeros(src.n_features)
    for i in range(len(slices)):
        x = np.asarray(src.load(i), dtype=np.float64)
        s1, s2 = s1 + x.sum(0), s2 + (x * x).sum(0)
    n = y.size
    mean = s1 / n
    var = s2 / n - mean**2
    k = int(y.max()) + 1
    sums, squares = np.zeros((2, k, mean.size)), np.zeros((2, k, mean.size))
    for i, sl in enumerate(slices):
        x = np.asarray(src.load(i), dtype=np.float64) - mean
        for j, lab in enumerate((np.zeros(x.shape[0], dtype=np.int64), y[sl])):
            w = csr_matrix((np.ones(lab.size), (lab, np.arange(lab.size))), shape=(k, lab.size))
            sums[j] += w @ x
            squares[j] += w @ (x * x)
    out = {}
    for j, name in enumerate(("one component", f"{k} classes")):
        nk = np.bincount(np.zeros(n, np.int64) if j == 0 else y, minlength=k).astype(np.float64)
        keep = np.argsort(-nk, kind="stable")[: 1 if j == 0 else k]
        nk = nk[keep]
        m = sums[j][keep] / nk[:, None]
        stats = SuffStats(nk=nk, mean=m, scatter=np.maximum(squares[j][keep] - nk[:, None] * m * m, 0.0),
                          sum_rlogr=0.0, n_rows=n, shift=mean)
        for nu0 in dof_priors:
            prior = default_prior(covariance_type="diag", weight_type="dirichlet_process",
                                  n_components=truncation, data_mean=mean, data_covariance=var,
                                  degrees_of_freedom=nu0)
            out[f"nu0={'D' if nu0 is None else f'{nu0:g}'}: {name}"] = total_elbo(stats, prior, 0.0) / n
    return out


def run_sun397(out: Path, store: str, *, seed: int = 0, truncation: int = 1000, vbem_iterations: int = 16,
               sga_iterations: int = 60, mm_iterations: int = 16, candidates: int = 8, neighbours: int = 16,
               learners: tuple[str, ...] = ("vbem", "sga-f"), init: str = "random_from_data",
               vbem_dof_prior: float | None = None) -> Path:
    """Run the study into ``out/moves_sun397`` and return that folder (see the module docstring)."""
    from pipeline.engine.sources import StoreSource

    folder = study_dir(out, "moves_sun397")
    src = StoreSource(store)
    y = src.labels()
    assert y is not None, "the store has labels"
    sample = np.asarray(src.load(0))
    plan = {"vbem": ("merge,delete", vbem_iterations, {"candidates": candidates, "neighbours": neighbours}),
            "sga-f": ("merge", sga_iterations, {}), "mm": ("merge", mm_iterations, {})}
    rows, curves = [], {}
    for learner in learners:
        kinds, iters, opts = plan[learner]
        for moves in ("none", kinds):
            model = ({} if learner != "vbem" or vbem_dof_prior is None
                     else {"degrees_of_freedom_prior": vbem_dof_prior})
            res = fit_one(store, y, sample, learner, truncation, moves, seed, False, iters, opts, init,
                          merge_check=True, **model)
            curves[f"{learner} moves={moves}"] = res.pop("elbo")
            whole, purity = partition_shares(y, res.pop("predictions"))
            rows.append({"learner": learner, "moves": moves, "class kept whole": whole,
                         "cluster purity": purity, "full-data merges": "-", **res})
            print(f"moves_sun397 {learner} moves={moves}: K found {res['K found']}, NMI {res['NMI']:.3f}, "
                  f"ELBO/row {res['ELBO/row']:.3f}, {res['CPU s']:.0f} CPU s", flush=True)
            (folder / "partial.json").write_text(json.dumps(rows, default=float))
    (folder / "curves.json").write_text(json.dumps(curves))
    rep = Report(folder, "Moves study: the SUN397-shaped store (397 classes, truncation 1000)")
    rep.text(f"Store {Path(store).name} ({len(y)} rows), seed {seed}, truncation {truncation}. VB EM: "
             f"'diag', init {init}, candidates={candidates}, neighbours={neighbours}, "
             f"{vbem_iterations} iterations; "
             f"SGA+F: 'fixed', minibatch 2000, {sga_iterations} iterations; MM: 'fixed', {mm_iterations} "
             "iterations; tol = 0 (the same iterations "
             "with and without moves). Timings on a shared, loaded 2-core machine: compare within a pair "
             "of rows.")
    rep.table("results", COLUMNS, [[r[c] for c in COLUMNS] for r in rows], title="All fits")
    plt = pyplot()
    fig, axes = plt.subplots(1, len(learners), figsize=(5 * len(learners), 3.5), squeeze=False)
    for ax, learner in zip(axes[0], learners, strict=True):
        for label, elbo in curves.items():
            if label.startswith(learner + " "):
                ax.plot(np.arange(1, len(elbo) + 1), elbo, label=label)
        ax.set_xlabel("iteration")
        ax.set_ylabel("ELBO per row")
        ax.legend(fontsize=8)
    save_figure(fig, folder / "elbo.png")
    rep.image("elbo.png", "ELBO per row by iteration, with and without moves")
    rep.write()
    return folder


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vbem-iterations", type=int, default=16)
    ap.add_argument("--sga-iterations", type=int, default=60)
    ap.add_argument("--mm-iterations", type=int, default=16)
    ap.add_argument("--candidates", type=int, default=8)
    ap.add_argument("--learners", default="vbem,sga-f", help="comma-separated: vbem, sga-f, mm")
    ap.add_argument("--vbem-dof-prior", type=float, default=None, help="VB EM's nu0 (default: D)")
    ap.add_argument("--bounds", action="store_true", help="only the ELBO of one component and of the classes")
    a = ap.parse_args(argv)
    if a.bounds:
        print(json.dumps(partition_bounds(a.store), indent=1))
        return
    folder = run_sun397(Path(a.out), a.store, seed=a.seed, vbem_iterations=a.vbem_iterations,
                        sga_iterations=a.sga_iterations, mm_iterations=a.mm_iterations,
                        candidates=a.candidates,
                        learners=tuple(a.learners.split(",")), vbem_dof_prior=a.vbem_dof_prior)
    print(f"wrote {folder}/README.md")


if __name__ == "__main__":
    main()
