"""Study ``moves``: finding K with merge and delete moves (Hughes & Sudderth 2013) on stores with known
classes, with and without moves, for VB EM (``covariance_type='diag'``) and SGA+F (``'fixed'``).

Data sets (``run(out)``):

* ``digits``: scikit-learn's 1,797 x 64 handwritten digits, 10 classes, truncation 50;
* ``planted``: 20,000 x 32 rows of 40 unit-variance Gaussian classes (the model's own family for
  both ``diag`` and ``fixed``), truncations 80 and 400 (2x and 10x the truth);
* ``synthetic100``: ``vbcluster ingest synthetic --rows 20000 --dim 64 --classes 100`` (a rank-64
  class signal through a ReLU: not Gaussian), truncation 300.

Per fit: K found (components holding at least one row), NMI, ACC, the ELBO per row, iterations, CPU
and wall seconds, and CPU seconds per iteration (the moves' cost against the same learner without
them). ``quick=True`` runs digits only with few iterations (seconds; the tests use it).

The SUN397-shaped store (397 classes, 108,754 x 4096, truncation 1000) has its own entry,
:mod:`pipeline.studies.moves_sun397` (tens of minutes).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.studies import Report, pyplot, save_figure, study_dir

LEARNERS = {"vbem": ("diag", "merge,delete"), "sga-f": ("fixed", "merge")}
COLUMNS = ["data", "classes", "truncation", "learner", "moves", "K found", "K kept", "NMI", "ACC",
           "ELBO/row", "iterations", "CPU s", "wall s", "CPU s/iter"]


def _planted(n: int, d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(16,)))
    centres = rng.normal(scale=2.0, size=(k, d))
    weights = rng.dirichlet(np.full(k, 5.0))
    y = rng.choice(k, size=n, p=weights)
    return (centres[y] + rng.normal(size=(n, d))).astype(np.float32), y


def _data(name: str, folder: Path, seed: int, quick: bool) -> tuple[Any, np.ndarray, Any]:
    """(data for ``fit``: an array or a store path, labels, rows as an array for sigma^2)."""
    if name == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        return x.astype(np.float64), y, x
    if name == "planted":
        x, y = _planted(20_000, 32, 40, seed)
        return x, y, x
    from pipeline.engine.sources import StoreSource
    from pipeline.ingest import ingest

    path = folder / "stores" / f"synthetic100-20000x64-s{seed}.zarr"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        ingest("synthetic", str(path), chunk_rows=8192, rows=20_000, dim=64, classes=100, seed=seed)
    src = StoreSource(str(path))
    y = src.labels()
    assert y is not None, "synthetic stores have labels"
    return str(path), y, src.load(0)


def fit_one(data: Any, y: np.ndarray, sample: np.ndarray, learner: str, k: int, moves: str, seed: int,
            quick: bool, fixed_iterations: int | None = None,
            options: dict[str, Any] | None = None, init: str = "k-means++", merge_check: bool = False,
            **model: Any) -> dict[str, Any]:
    """Fit ``learner`` with ``moves`` and return the study's row (plus ``elbo``, ``predictions``;
    with ``merge_check``, a hard learner's row adds :func:`full_data_merges` of its final point)."""
    from sklearn.metrics import normalized_mutual_info_score

    from pipeline import VBMixture
    from pipeline.fit.learners.point.base import estimate_fixed_variance
    from vbcore.data.metrics import acc

    ct = LEARNERS.get(learner, ("fixed",))[0]  # mm: 'fixed', as the SGA learners
    opts: dict[str, Any] = {"moves": moves, **(options or {})}
    kw: dict[str, Any] = dict(model)
    if learner != "vbem":
        if learner.startswith("sga"):
            opts.setdefault("minibatch", min(2000, len(y) // 4))
        kw["fixed_variance"] = estimate_fixed_variance(np.asarray(sample, dtype=np.float64), k, seed)
    iters = 8 if quick else (100 if learner == "vbem" else 60)
    if fixed_iterations is not None:  # the cost of the same number of iterations: no convergence test
        iters, kw["tol"] = fixed_iterations, 0.0
    model = VBMixture(k, covariance_type=ct, max_iter=iters, random_state=seed, learner=learner,
                      learner_options=opts, init_params=init, **kw)
    cpu, wall = time.process_time(), time.perf_counter()
    model.fit(data)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if isinstance(data, str):
        from pipeline.engine.sources import StoreSource

        src = StoreSource(data)
        pred = np.concatenate([model.predict(src.load(i)) for i in range(len(src.chunk_slices()))])
    else:
        pred = model.predict(data)
    extra = {} if not merge_check or learner == "vbem" else full_data_merges(model, data, pred)
    return {**extra, "K found": int(model.n_effective_), "K kept": int(model.n_components_),
            "NMI": float(normalized_mutual_info_score(y, pred)), "ACC": float(acc(y, pred)),
            "ELBO/row": float(model.lower_bound_ / len(y)), "iterations": int(model.n_iter_),
            "CPU s": cpu, "wall s": wall, "CPU s/iter": cpu / max(1, int(model.n_iter_)),
            "elbo": [float(v) / len(y) for v in model.lower_bounds_], "predictions": pred}


def full_data_merges(model: Any, data: Any, pred: np.ndarray, neighbours: int = 8) -> dict[str, float]:
    """The merges the full data's exact ELBO accepts at a hard learner's final point: the hard
    statistics of every row under ``pred`` (one pass, float64), pairs among each cluster's
    ``neighbours`` nearest means, :func:`vbcore.moves.hard.select_hard_merges` (the learners' own
    rule; a fit with merges on should leave none)."""
    from vbcore.kernels.estep import chunk_statistics, prepare_chunk
    from vbcore.moves.hard import nearest_pairs, select_hard_merges

    prior, means = model.prior_, model.posterior_.means
    k = means.shape[0]
    if isinstance(data, str):
        from pipeline.engine.sources import StoreSource

        src = StoreSource(data)
        parts = [(np.asarray(src.load(i), dtype=np.float64), sl) for i, sl in enumerate(src.chunk_slices())]
    else:
        parts = [(np.asarray(data, dtype=np.float64), slice(0, len(pred)))]
    stats = None
    for x, sl in parts:
        onehot = np.eye(k)[pred[sl]]
        part = chunk_statistics(prepare_chunk(x, prior.mean, "fixed"), onehot, np.zeros(x.shape[0]))
        stats = part if stats is None else stats.merge(part)
    assert stats is not None
    pairs = nearest_pairs(means, neighbours)
    acc, gain = select_hard_merges(stats, pairs, prior, 256)
    return {"full-data merges": int(acc.shape[0]), "full-data merge gain/row": gain / len(pred)}


def run(out: Path, *, quick: bool = False, seed: int = 0) -> Path:
    """Run the study into ``out/moves`` and return that folder (see the module docstring)."""
    folder = study_dir(out, "moves")
    plan = [("digits", 10, 50)] if quick else [("digits", 10, 50), ("planted", 40, 80), ("planted", 40, 400),
                                               ("synthetic100", 100, 300)]
    rep = Report(folder, "Moves study: finding K with merge and delete moves")
    rows, curves, cost = [], {}, []
    for name, classes, k in plan:
        data, y, sample = _data(name, folder, seed, quick)
        for learner, (_, kinds) in LEARNERS.items():
            for moves in ("none", kinds):
                res = fit_one(data, y, sample, learner, k, moves, seed, quick)
                curves[f"{name} K={k} {learner} moves={moves}"] = res.pop("elbo")
                res.pop("predictions")
                rows.append({"data": name, "classes": classes, "truncation": k, "learner": learner,
                             "moves": moves, **res})
                print(f"moves {name} K={k} {learner} moves={moves}: K found {res['K found']}, "
                      f"NMI {res['NMI']:.3f}, {res['wall s']:.1f} s", flush=True)
            if k == plan[-1][2] or (name == "planted" and k == 400):
                n_it = 4 if quick else 20
                cpu = [fit_one(data, y, sample, learner, k, m, seed, quick, n_it)["CPU s"]
                       for m in ("none", kinds)]
                cost.append([name, k, learner, kinds, n_it, cpu[0], cpu[1], cpu[1] / cpu[0]])
    (folder / "curves.json").write_text(json.dumps(curves))
    rep.text(f"Mode: {'quick' if quick else 'full'}; seed {seed}. VB EM: covariance_type='diag', "
             "moves=merge,delete; SGA+F: covariance_type='fixed', moves=merge, minibatch 2000. "
             "Timings on a shared, loaded 2-core machine: compare CPU s/iter within a pair of rows.")
    rep.table("results", COLUMNS, [[r[c] for c in COLUMNS] for r in rows], title="All fits")
    rep.table("cost", ["data", "truncation", "learner", "moves", "iterations", "CPU s without",
                       "CPU s with", "ratio"], cost,
              title="Cost: the same number of iterations (tol = 0) without and with moves, CPU seconds")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, elbo in curves.items():
        if label.startswith(plan[-1][0]):
            ax.plot(np.arange(1, len(elbo) + 1), elbo, label=label.split(" ", 2)[-1])
    ax.set_xlabel("iteration")
    ax.set_ylabel("ELBO per row")
    ax.set_title(f"{plan[-1][0]}, truncation {plan[-1][2]}")
    ax.legend(fontsize=8)
    save_figure(fig, folder / "elbo.png")
    rep.image("elbo.png", "ELBO per row by iteration, with and without moves")
    rep.write()
    return folder
