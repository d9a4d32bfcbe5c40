"""The battery of real data sets (issue 51, deliver 7): what the defaults choose and find on each.

    python bench/bench_battery.py --out bench/out [--only digits vowel] [--modes default select]

Sets (no download at run time; a set whose package is absent is skipped with the command that
installs it):

* ``digits``: scikit-learn's 1,797 8x8 digit images (64 features, 10 classes);
* ``satellite``, ``vehicle``, ``vowel``: Debian's ``r-cran-mlbench`` (``apt-get install -y
  r-cran-mlbench``) read with the PyPI package ``rdata`` (the ``dev`` extra): Landsat pixels (6,435 x 36,
  6 classes), vehicle silhouettes (846 x 18, 4 classes), vowels (990 x 9 numeric features, 11
  classes; the speaker factor left out);
* ``fashion-mnist``: the ``real`` study's EfficientNet-Lite0 features of Fashion-MNIST (70,000 x 1280,
  10 classes; ``apt-get install -y dataset-fashion-mnist`` and ``../shared/models``), extracted once
  into ``OUT/real/features`` (pipeline/studies/real.py).

Each set is ingested into ``OUT/battery/NAME.zarr`` with its labels and fitted with ``vbcluster fit``'s
settings (:func:`pipeline.service.fit_run`): ``default`` (nothing set: on stores of at most 256
dimensions the model selected by its bound, without the low-rank candidates) and ``select``
(``--select auto``, the low-rank family among its candidates), and on request ``select-gauss``
(``--select auto`` with the low-rank candidates left out: the default's screen on these stores),
``bound`` and ``empirical``
(``--priors``), ``full``
(``--covariance full``), ``lowrank2`` and ``lowrank8`` (``--covariance lowrank --rank 2 / 8``); beside them
scikit-learn's ``BayesianGaussianMixture`` (diag, K = 50, its defaults otherwise) and k-means told
the true K (``n_init=10``). Writes ``OUT/battery/README.md`` (the table), ``results.csv`` and
``fits.jsonl``; prints the load average beside the times (2 shared cores).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MLBENCH = Path("/usr/lib/R/site-library/mlbench/data")
SETS = ("digits", "vehicle", "vowel", "satellite", "fashion-mnist")
#: the fits of each set: the defaults, ``--select auto``, and the prior rules side by side (issue 51,
#: deliver 3: ``--priors bound`` and ``--priors empirical`` whichever the default is)
MODES = {"default": {}, "select": {"select": "auto"}, "bound": {"priors": "bound"},
         "empirical": {"priors": "empirical"}, "full": {"covariance": "full"},
         "lowrank2": {"covariance": "lowrank", "rank": 2}, "lowrank8": {"covariance": "lowrank", "rank": 8},
         "select-gauss": {"select": "auto"}}
#: the modes whose screen leaves the low-rank candidates out (pipeline.fit.select.LOWRANK_RANKS emptied)
NO_LOWRANK = ("select-gauss",)


class Skip(Exception):
    """A set whose data or reader is not installed here."""


def _mlbench(name: str, label: str) -> tuple[np.ndarray, np.ndarray]:
    path = MLBENCH / f"{name}.rda"
    if not path.exists():
        raise Skip(f"{path} missing: apt-get install -y r-cran-mlbench")
    try:
        import rdata
    except ImportError:
        raise Skip("the PyPI package rdata is missing: pip install -e '.[dev]'") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = rdata.read_rda(str(path))[name]
    y = np.asarray(frame[label].cat.codes)
    x = frame.select_dtypes("number").to_numpy(dtype=np.float32)  # factors (Vowel's speaker) left out
    return x, y


def load(name: str, out: Path) -> tuple[np.ndarray, np.ndarray]:
    """(rows float32, labels) of a battery set; :class:`Skip` where it is not installed."""
    if name == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        return x.astype(np.float32), y
    if name in ("satellite", "vehicle", "vowel"):
        return _mlbench(name.capitalize(), {"satellite": "classes"}.get(name, "Class"))
    if name == "fashion-mnist":
        from pipeline.studies.real import features
        from vbcore.errors import VBClusterError

        try:
            x, y, _ = features(out / "real", quick=False)
        except (VBClusterError, FileNotFoundError) as exc:
            raise Skip(str(exc)) from None
        return x, y
    raise ValueError(f"unknown set {name!r}; known: {', '.join(SETS)}")


def store_of(name: str, x: np.ndarray, y: np.ndarray, folder: Path) -> str:
    """The set's feature store (written once, with its labels)."""
    from pipeline.ingest import ingest

    store = folder / f"{name}.zarr"
    if not store.exists():
        np.save(folder / f"{name}.x.npy", x)
        np.save(folder / f"{name}.y.npy", y.astype(np.int64))
        ingest(str(folder / f"{name}.x.npy"), store, labels=str(folder / f"{name}.y.npy"))
    return str(store)


def loaded(names: list[str], out: Path) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(name, rows, labels) of each battery set in ``names`` that is installed; the others skipped,
    one line each."""
    for name in names:
        try:
            x, y = load(name, out)
        except Skip as exc:
            print(f"{name}: skipped ({exc})", flush=True)
            continue
        yield name, x, y


def load_average() -> float:
    return os.getloadavg()[0]


def fit_default(name: str, store: str, folder: Path, mode: str, n_rows: int) -> dict[str, Any]:
    """``vbcluster fit STORE --run-dir R`` with the mode's settings; its result's numbers."""
    import pipeline.fit.select as select
    from pipeline.service import fit_run, make_spec

    run = folder / "runs" / f"{name}-{mode}"
    ranks = select.LOWRANK_RANKS
    t0 = time.perf_counter()
    try:
        select.LOWRANK_RANKS = () if mode in NO_LOWRANK else ranks
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = fit_run(run, make_spec(store, **MODES[mode]), restart=True)
    finally:
        select.LOWRANK_RANKS = ranks
    row = {"set": name, "fit": mode, "clusters": r["n_effective"], "nmi": r["metrics"]["nmi"],
           "seconds": time.perf_counter() - t0, "load": load_average(),
           "model": _model(r["settings"]),
           "bound_per_row": r["elbo"] / n_rows,
           "iterations": r["n_iter"], "converged": r["converged"]}
    if r.get("selection"):
        row["selection"] = r["selection"]
        kept = next(c for c in r["selection"]["candidates"] if c["chosen"])
        row["selected_bound"] = kept["full_bound"]  # per row, at the selection's resolution
        row["screen_seconds"] = r["selection"]["screen_seconds"]
    return row


def _model(settings: dict[str, Any]) -> str:
    """The model a run fitted: family (its rank, on its projection), priors."""
    if settings["covariance_type"] == "lowrank":
        return f"lowrank Q={settings['rank']}, {settings['prior_defaults']}"
    pca = settings.get("pca")
    on = "" if pca is None else f" on pca {pca}" + (" whitened" if settings.get("whiten") else "")
    return f"{settings['covariance_type']}{on}, {settings['prior_defaults']}"


def fit_sklearn(name: str, x: np.ndarray, y: np.ndarray) -> list[dict[str, Any]]:
    """scikit-learn's BGM (diag, K = 50) and k-means told the true K."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import normalized_mutual_info_score as nmi
    from sklearn.mixture import BayesianGaussianMixture

    rows = []
    k = len(np.unique(y))
    for fit, make in (("sklearn BGM diag K=50", lambda: BayesianGaussianMixture(
            n_components=50, covariance_type="diag", random_state=0)),
                      (f"k-means K={k}", lambda: KMeans(k, n_init=10, random_state=0))):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pred = make().fit(x.astype(np.float64)).predict(x.astype(np.float64))
        rows.append({"set": name, "fit": fit, "clusters": int(len(np.unique(pred))),
                     "nmi": float(nmi(y, pred)), "seconds": time.perf_counter() - t0,
                     "load": load_average(), "model": "-"})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| set | fit | model | clusters | NMI | seconds (load) |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['set']} | {r['fit']} | {r['model']} | {r['clusters']} | {r['nmi']:.3f} | "
                   f"{r['seconds']:.1f} ({r['load']:.1f}) |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--only", nargs="*", default=list(SETS))
    ap.add_argument("--modes", nargs="*", default=["default", "select"], choices=list(MODES))
    ap.add_argument("--no-sklearn", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    folder = out / "battery"
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for name, x, y in loaded(args.only, out):
        store = store_of(name, x, y, folder)
        for mode in args.modes:
            rows.append(fit_default(name, store, folder, mode, len(x)))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "selection"}), flush=True)
        if not args.no_sklearn:
            for r in fit_sklearn(name, x, y):
                rows.append(r)
                print(json.dumps(r), flush=True)
    with open(folder / "fits.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    keys = ["set", "fit", "model", "clusters", "nmi", "seconds", "load"]
    with open(folder / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    (folder / "README.md").write_text("# The battery (bench/bench_battery.py)\n\n" + table(rows) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
