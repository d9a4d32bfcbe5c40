"""Study ``seed003``: the shape of Tables 2-3 and Figs. 1, 3-4 on synthetic stores.

For data sets sized like the paper's (Table 1: Caltech10, Scene15, MIT67, SUN397; train + test rows,
4096-dimensional, the paper's truncation levels and minibatch sizes of section 5.2), it fits the DP
mixture with ``mm``, ``sga``, ``sga-m``, ``sga-f``, ``svi`` and ``vbem`` for 30 iterations and reports
NMI and ACC (Table 3, Fig. 2), the estimated number of clusters (Table 2), CPU time as a factor of
MM (Fig. 1) and the ELBO per iteration (Figs. 3-4).

We have no VGG16 fc7 features: the stores come from the synthetic SUN397-fc7 stand-in of
``vbcluster ingest synthetic`` (``pipeline.ingest``: a rank-64 class signal through a random linear
map, Gaussian noise, a ReLU with 50-80% zeros per dimension, imbalanced classes); docs/studies.md
describes it. All learners fit the same model: ``covariance_type='fixed'`` with one ``sigma^2``
estimated once per data set (``pipeline.fit.learners.point.base.estimate_fixed_variance``), ``a0 = N``
(Algorithm 1), ``mean_precision_prior = 1``; every learner starts from k-means++ seeds.

``run(out, quick=True)`` runs two small 64-dimensional data sets (seconds); the full study takes
hours on 2 cores (SUN397: one VB EM iteration is about 20 s).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

#: name -> (classes, train + test rows of Lim & Jiang 2024 Table 1, truncation (Table 2), batch (sec. 5.2))
DATASETS: dict[str, tuple[int, int, int, int]] = {
    "caltech10": (10, 300 + 2744, 50, 100),
    "scene15": (15, 750 + 3735, 50, 300),
    "mit67": (67, 3350 + 12_270, 100, 1005),
    "sun397": (397, 39_700 + 69_054, 1000, 4000),
}
QUICK: dict[str, tuple[int, int, int, int]] = {
    "caltech10": (10, 600, 50, 100),
    "scene15": (15, 900, 50, 300),
}
LEARNERS = ("mm", "sga", "sga-m", "sga-f", "svi", "vbem")
ITERATIONS = 30  # Lim & Jiang 2024 sec. 5.2: "30 iterations each"
DIM, QUICK_DIM = 4096, 64


def _nmi_max(y: np.ndarray, pred: np.ndarray) -> float:
    """NMI as Lim & Jiang 2024 defines it (sec. 5.1.2): MI / max(H(gt), H(mo))."""
    from sklearn.metrics import normalized_mutual_info_score

    return float(normalized_mutual_info_score(y, pred, average_method="max"))


def _store(root: Path, name: str, classes: int, rows: int, dim: int, seed: int) -> str:
    from pipeline.ingest import ingest

    path = root / f"{name}-{rows}x{dim}-s{seed}.zarr"
    if not path.exists():
        ingest("synthetic", str(path), chunk_rows=8192, rows=rows, dim=dim, classes=classes, seed=seed)
    return str(path)


def _sigma2(store: str, k: int, seed: int) -> float:
    from pipeline.engine.sources import StoreSource
    from pipeline.fit.learners.point.base import estimate_fixed_variance

    src = StoreSource(store)
    need = max(10_000, 20 * k)
    parts, total = [], 0
    for i in range(len(src.chunk_slices())):
        parts.append(src.load(i))
        total += parts[-1].shape[0]
        if total >= need:
            break
    return estimate_fixed_variance(np.concatenate(parts), k, seed)


def _fit(store: str, learner: str, k: int, minibatch: int, sigma2: float, n: int, seed: int,
         iterations: int) -> dict[str, Any]:
    from pipeline import VBMixture
    from pipeline.engine.sources import StoreSource
    from vbcore.data.metrics import acc

    opts = None if learner in ("mm", "vbem") else {"minibatch": minibatch}
    model = VBMixture(k, covariance_type="fixed", fixed_variance=sigma2, weight_concentration_prior=float(n),
                      mean_precision_prior=1.0, init_params="k-means++", max_iter=iterations, tol=0.0,
                      random_state=seed, learner=learner, learner_options=opts)
    sizes: list[int] = []
    cpu, wall = time.process_time(), time.perf_counter()
    model.fit(store, callback=lambda info: sizes.append(int(info["n_components"])))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    src = StoreSource(store)
    y = src.labels()
    assert y is not None, "synthetic stores have labels"
    pred = np.concatenate([model.predict(src.load(i)) for i in range(len(src.chunk_slices()))])
    return {"learner": learner, "nmi": _nmi_max(y, pred), "acc": acc(y, pred),
            "k_effective": int(model.n_effective_), "k_kept": int(model.n_components_),
            "cpu_s": cpu, "wall_s": wall, "elbo": [float(v) for v in model.lower_bounds_],
            "kept_per_iteration": sizes, "n_iter": int(model.n_iter_)}


def _reuse(previous: dict[str, list[dict[str, Any]]], name: str, repeat: int, learner: str, sigma2: float,
           seed: int) -> dict[str, Any]:
    """The fit of an earlier run (``refit``): it must be of the same data set, seed and sigma^2."""
    from vbcore.errors import ConfigError

    found = [p for p in previous.get(name, []) if p["repeat"] == repeat and p["learner"] == learner]
    if not found:
        raise ConfigError(f"seed003: fits.json has no {learner} fit of {name} run {repeat}; refit it too")
    p = dict(found[0])
    if p.get("seed") != seed or not np.isclose(p.get("sigma2", np.nan), sigma2, rtol=1e-12, atol=0.0):
        raise ConfigError(f"seed003: the earlier {learner} fit of {name} run {repeat} used seed "
                          f"{p.get('seed')} and sigma^2 {p.get('sigma2')}, this run {seed} and {sigma2}")
    return p


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([r[key] for r in rows]))


def run(out: Path, *, quick: bool = False, seed: int = 0, datasets: list[str] | None = None,
        refit: list[str] | None = None) -> Path:
    """Run the study into ``out/seed003`` and return that folder (see the module docstring).

    ``datasets`` restricts the full study to some of :data:`DATASETS` (for example without SUN397).
    ``refit`` fits only those learners again and takes every other fit from the folder's
    ``fits.json`` (written by every run; same data sets, seed and ``sigma^2`` required), for example
    after a change that touches some learners only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(out) / "seed003"
    folder.mkdir(parents=True, exist_ok=True)
    stores = folder / "stores"
    stores.mkdir(exist_ok=True)
    sets = QUICK if quick else DATASETS
    if datasets is not None:
        unknown = sorted(set(datasets) - set(sets))
        if unknown:
            from vbcore.errors import ConfigError

            raise ConfigError(f"seed003: unknown data set(s) {unknown}; known: {sorted(sets)}")
        sets = {k: v for k, v in sets.items() if k in datasets}
    dim = QUICK_DIM if quick else DIM
    iterations = 10 if quick else ITERATIONS
    previous: dict[str, list[dict[str, Any]]] = {}
    if refit is not None:
        from vbcore.errors import ConfigError

        if not set(refit) <= set(LEARNERS):
            raise ConfigError(f"seed003: refit names unknown learners {sorted(set(refit) - set(LEARNERS))}; "
                              f"known: {list(LEARNERS)}")
        if not (folder / "fits.json").exists():
            raise ConfigError(f"seed003: refit needs the fits of an earlier run in {folder / 'fits.json'}")
        previous = json.loads((folder / "fits.json").read_text())
    results, csv_rows = _fit_sets(sets, stores, dim, seed, iterations, quick, refit, previous)
    with open(folder / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(csv_rows[0]))
        w.writeheader()
        w.writerows(csv_rows)
    (folder / "fits.json").write_text(json.dumps(results))
    (folder / "curves.json").write_text(json.dumps(
        {n: [{"learner": p["learner"], "repeat": p["repeat"], "elbo": p["elbo"],
              "kept": p["kept_per_iteration"]} for p in ps] for n, ps in results.items()}))

    tables = _tables(results, sets)
    _plot(plt, results, sets, folder)
    text = _readme(quick, seed, iterations, dim, refit, tables)
    (folder / "README.md").write_text("\n".join(text) + "\n")
    return folder


def _fit_sets(sets: dict[str, Any], stores: Path, dim: int, seed: int, iterations: int, quick: bool,
              refit: list[str] | None, previous: dict[str, list[dict[str, Any]]]
              ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Every learner on every data set (repeats with seeds ``seed + r``): the fits and CSV rows."""
    results: dict[str, list[dict[str, Any]]] = {}
    csv_rows = []
    for name, (classes, rows, trunc, mb) in sets.items():
        repeats = 1 if quick or name == "sun397" else 3
        store = _store(stores, name, classes, rows, dim, seed)
        sigma2 = _sigma2(store, trunc, seed)
        for r in range(repeats):
            per = []
            for learner in LEARNERS:
                if refit is not None and learner not in refit:
                    per.append(_reuse(previous, name, r, learner, sigma2, seed + r))
                    continue
                res = _fit(store, learner, trunc, mb, sigma2, rows, seed + r, iterations)
                per.append(res)
                print(f"seed003 {name} run {r} {learner}: NMI {res['nmi']:.3f}, K {res['k_effective']}, "
                      f"{res['wall_s']:.1f} s", flush=True)
            mm_cpu = next(p["cpu_s"] for p in per if p["learner"] == "mm")
            for p in per:
                p["cpu_factor_mm"] = p["cpu_s"] / mm_cpu
                p["repeat"] = r
                p["seed"] = seed + r
                p["sigma2"] = sigma2
                scalars = {k: v for k, v in p.items() if k not in ("elbo", "kept_per_iteration")}
                csv_rows.append({"dataset": name, "classes": classes, "rows": rows, "truncation": trunc,
                                 "minibatch": mb, "sigma2": sigma2, **scalars, "elbo_final": p["elbo"][-1]})
            results.setdefault(name, []).extend(per)
    return results, csv_rows


def _by(results: dict[str, list[dict[str, Any]]], name: str, learner: str) -> list[dict[str, Any]]:
    return [p for p in results[name] if p["learner"] == learner]


def _tables(results: dict[str, list[dict[str, Any]]], sets: dict[str, Any]) -> dict[str, list[str]]:
    """The Markdown tables: clusters (t2), NMI/ACC (t3), CPU factor of MM (t1), wall seconds (t4)."""
    head = "| dataset | classes | truncation | " + " | ".join(LEARNERS) + " |"
    sep = "|" + "---|" * (3 + len(LEARNERS))
    t2 = [head, sep]
    t3 = ["| dataset | " + " | ".join(LEARNERS) + " |", "|" + "---|" * (1 + len(LEARNERS))]
    t1 = ["| dataset | " + " | ".join(LEARNERS) + " |", "|" + "---|" * (1 + len(LEARNERS))]
    t4 = ["| dataset | " + " | ".join(LEARNERS) + " |", "|" + "---|" * (1 + len(LEARNERS))]
    for name, (classes, _rows, trunc, _mb) in sets.items():
        t2.append(f"| {name} | {classes} | {trunc} | " + " | ".join(
            f"{_mean(_by(results, name, lr), 'k_effective'):.1f}" for lr in LEARNERS) + " |")
        t3.append(f"| {name} | " + " | ".join(
            f"{_mean(_by(results, name, lr), 'nmi'):.3f} <{100 * _mean(_by(results, name, lr), 'acc'):.1f}>"
            for lr in LEARNERS) + " |")
        t1.append(f"| {name} | " + " | ".join(
            f"{_mean(_by(results, name, lr), 'cpu_factor_mm'):.2f}" for lr in LEARNERS) + " |")
        t4.append(f"| {name} | " + " | ".join(
            f"{_mean(_by(results, name, lr), 'wall_s'):.1f}" for lr in LEARNERS) + " |")
    return {"t1": t1, "t2": t2, "t3": t3, "t4": t4}


def _plot(plt: Any, results: dict[str, list[dict[str, Any]]], sets: dict[str, Any], folder: Path) -> None:
    """Negative ELBO per row against the iteration, one panel per data set."""
    fig, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 4), squeeze=False)
    for ax, name in zip(axes[0], sets, strict=True):
        rows_n = sets[name][1]
        for learner in LEARNERS:
            curve = np.asarray(_by(results, name, learner)[0]["elbo"]) / rows_n
            ax.plot(np.arange(1, len(curve) + 1), -curve, label=learner)
        ax.set_title(f"{name} (synthetic)")
        ax.set_xlabel("iteration")
        ax.set_ylabel("negative ELBO per row")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "elbo_curves.png", dpi=100)
    plt.close(fig)


def _readme(quick: bool, seed: int, iterations: int, dim: int, refit: list[str] | None,
            tables: dict[str, list[str]]) -> list[str]:
    """The study's README lines."""
    text = [
        "# seed003 study: Lim & Jiang 2024 on synthetic stand-ins (no VGG16 features)",
        "",
        f"Mode: {'quick' if quick else 'full'}; seed {seed}; {iterations} iterations per learner; "
        f"{'1 run' if quick else '3 runs (SUN397: 1)'} per data set; D = {dim}.",
        "Data: `vbcluster ingest synthetic` stores sized like Lim & Jiang 2024 Table 1 (train + test rows). "
        "Model: fixed isotropic variance (one sigma^2 per data set), a0 = N, k-means++ seeds.",
        "Stochastic learners' ELBO values are unbiased minibatch estimates for the distribution "
        "entering each iteration; mm and vbem are exact.",
        *([f"Fitted in this run: {', '.join(refit)}; the other learners' fits are those of the earlier run "
           "in fits.json (same data, seeds and sigma^2)."] if refit is not None else []),
        "",
        "## Estimated number of clusters (the shape of Lim & Jiang 2024 Table 2)",
        "",
        "Components holding at least one row of expected count at the end.",
        "",
        *tables["t2"],
        "",
        "## NMI <ACC %> (the shape of Lim & Jiang 2024 Table 3 and Fig. 2)",
        "",
        "NMI normalised by max(H(gt), H(model)) as in Lim & Jiang 2024 sec. 5.1.2; ACC: Hungarian matching.",
        "",
        *tables["t3"],
        "",
        "## CPU time as a factor of MM (the shape of Lim & Jiang 2024 Fig. 1)",
        "",
        "Process CPU seconds of the whole fit (initialisation included), measured in the same run.",
        "",
        *tables["t1"],
        "",
        "## Wall seconds per fit (same runs, one fit at a time, one BLAS thread as in every study)",
        "",
        *tables["t4"],
        "",
        "ELBO curves: `elbo_curves.png` (Figs. 3-4); every number: `results.csv`, `curves.json`.",
    ]
    return text
