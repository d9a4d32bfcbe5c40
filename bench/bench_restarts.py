"""What the default's one initialisation and its screen cost on the battery (issue 51): restarts and the
screen against a full comparison.

    python bench/bench_restarts.py --out bench/out [--only digits vehicle vowel satellite] [--seeds 5]

For each battery set (bench/bench_battery.py's stores, ``OUT/battery/NAME.zarr``):

* **the screen against a full comparison**: the default's screen (``vbcluster fit`` with nothing set:
  :func:`pipeline.fit.select.screen`), then every screened candidate fitted to all rows with the
  fit's own settings (as ``--select-fits`` = all would), each one's full bound per row (of the original
  rows, at the selection's resolution: :func:`pipeline.fit.select.full_bounds`), clusters and NMI:
  whether the screen's pick is the full comparison's, and how bound and NMI rank the families;
* **restarts of the kept model**: the screen's winner fitted from ``--seeds`` seeds (those ``--n-init``
  would use: :func:`pipeline.service.restart_seeds` of the fit's seed), each one's full bound per row,
  its fit's own bound per row (at its ``reg_covar``: the one ``--n-init`` keeps the highest of),
  clusters and NMI: the spread, and whether the best bound's seed has the higher NMI.

With ``--screen-rows R --chunk-rows C`` the sets are written again in chunks of C rows
(``OUT/restarts-R/NAME.zarr``) and the screen takes R of their rows (:data:`pipeline.fit.select.SCREEN_ROWS`;
at the default 10,000 it takes every row of these sets, so its pick is the full comparison's by
construction): the screen's fidelity on a subsample, measured on the battery's rows.

Prints one JSON line per fit and writes ``OUT/restarts[-R]/README.md`` (the tables) and ``fits.jsonl``;
the load average beside the times (2 shared cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_battery import load_average, loaded, store_of  # noqa: E402


def one_fit(spec: Any, source: Any, labels: np.ndarray, selection: Any, seed: int) -> dict[str, Any]:
    """A fit of ``spec`` from ``seed``: its full bound per row, clusters, NMI and seconds."""
    from pipeline.fit.driver import n_effective
    from pipeline.fit.fitted import fitted_model
    from pipeline.fit.select import full_bounds
    from pipeline.runs.directory import assign_rows
    from pipeline.service import fit
    from vbcore.data.metrics import nmi

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fit(spec, source, "local", random_state=seed)
    seconds = time.perf_counter() - t0
    bound = full_bounds({0: out}, source, selection, spec.normalize)[0]
    pred, _ = assign_rows(fitted_model(out, {}, source), source)
    return {"bound_per_row": bound, "fit_bound_per_row": float(out.terms.total) / source.n_rows,
            "clusters": int(n_effective(out.post, out.prior)),
            "nmi": float(nmi(labels, pred)), "iterations": int(out.n_iter),
            "converged": bool(out.converged), "seconds": seconds, "load": load_average()}


def study(name: str, store: str, seeds: int) -> list[dict[str, Any]]:
    """The full comparison of the screened candidates and the winner's restarts on one set."""
    from pipeline.engine.engines import LocalEngine
    from pipeline.engine.sources import StoreSource
    from pipeline.fit.select import chosen_spec, label, screen
    from pipeline.service import make_spec, restart_seeds

    spec = make_spec(store)  # the default: nothing set
    source = StoreSource(store)
    labels = source.labels()
    t0 = time.perf_counter()
    sel = screen(spec, source, LocalEngine(), spec.seed)
    screen_seconds = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    for rank, cand in enumerate(sel.candidates):
        row = {"set": name, "kind": "candidate", "screen_rank": rank, "model": f"{label(vars(cand))}, "
               f"{cand.priors}", "screen_bound": cand.screen_bound, "screen_seconds": screen_seconds,
               **one_fit(chosen_spec(spec, cand), source, labels, sel, spec.seed)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    win = chosen_spec(spec, sel.candidates[0])
    for i, seed in enumerate(restart_seeds(spec.seed, seeds)):
        row = {"set": name, "kind": "restart", "restart": i, "seed": seed,
               "model": rows[0]["model"], **one_fit(win, source, labels, sel, seed)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def rechunked(name: str, x: np.ndarray, y: np.ndarray, folder: Path, chunk_rows: int) -> str:
    """The set as a store of ``chunk_rows``-row chunks (written once)."""
    from pipeline.store.features import FeatureStore

    path = folder / f"{name}.zarr"
    if not path.exists():
        FeatureStore.create(path, x.shape[1], chunk_rows=chunk_rows, labels=True).append(
            x, labels=y.astype(np.int64))
    return str(path)


def summary(rows: list[dict[str, Any]]) -> str:
    """The tables: per set, the screen's pick against the full comparison, and the restarts' spread."""
    from scipy.stats import spearmanr

    out = ["## The screen against a full comparison", "",
           "| set | candidates | screen's pick | full comparison's pick | same | NMI of each | "
           "Spearman(bound, NMI) over families | screen s (load) | full fits s |",
           "|---|---|---|---|---|---|---|---|---|"]
    sets = list(dict.fromkeys(r["set"] for r in rows))
    for s in sets:
        c = [r for r in rows if r["set"] == s and r["kind"] == "candidate"]
        best = max(c, key=lambda r: r["bound_per_row"])
        rho = spearmanr([r["bound_per_row"] for r in c], [r["nmi"] for r in c])[0]
        out.append(f"| {s} | {len(c)} | {c[0]['model']} | {best['model']} | {best is c[0]} | "
                   f"{c[0]['nmi']:.3f} / {best['nmi']:.3f} | {rho:.2f} | {c[0]['screen_seconds']:.1f} "
                   f"({c[0]['load']:.1f}) | {sum(r['seconds'] for r in c):.1f} |")
    out += ["", "## Restarts of the kept model (the seeds --n-init would use)", "",
            "| set | model | bound per row (min .. max) | NMI (min .. max) | NMI of seed 0 | "
            "NMI of the best bound (--n-init's pick) | Spearman(bound, NMI) over restarts | clusters | "
            "s per fit (load) |", "|---|---|---|---|---|---|---|---|---|"]
    for s in sets:
        r5 = [r for r in rows if r["set"] == s and r["kind"] == "restart"]
        if not r5:
            continue
        b = [r["bound_per_row"] for r in r5]
        n = [r["nmi"] for r in r5]
        top = max(r5, key=lambda r: r["bound_per_row"])
        kept = max(r5, key=lambda r: r["fit_bound_per_row"])  # what --n-init keeps
        out.append(f"| {s} | {r5[0]['model']} | {min(b):.3f} .. {max(b):.3f} | "
                   f"{min(n):.3f} .. {max(n):.3f} | "
                   f"{r5[0]['nmi']:.3f} | {top['nmi']:.3f} ({kept['nmi']:.3f}) | {spearmanr(b, n)[0]:.2f} | "
                   f"{', '.join(str(r['clusters']) for r in r5)} | "
                   f"{np.mean([r['seconds'] for r in r5]):.1f} ({r5[-1]['load']:.1f}) |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--only", nargs="*", default=["digits", "vehicle", "vowel", "satellite"])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--screen-rows", type=int, default=None)
    ap.add_argument("--chunk-rows", type=int, default=None)
    args = ap.parse_args(argv)
    out = Path(args.out)
    (out / "battery").mkdir(parents=True, exist_ok=True)
    folder = out / ("restarts" if args.screen_rows is None else f"restarts-{args.screen_rows}")
    folder.mkdir(parents=True, exist_ok=True)
    if args.screen_rows is not None:
        import pipeline.fit.select as select

        select.SCREEN_ROWS = int(args.screen_rows)
    rows: list[dict[str, Any]] = []
    for name, x, y in loaded(args.only, out):
        store = store_of(name, x, y, out / "battery") if args.chunk_rows is None \
            else rechunked(name, x, y, folder, int(args.chunk_rows))
        rows += study(name, store, args.seeds)
    with open(folder / "fits.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    text = summary(rows)
    (folder / "README.md").write_text("# Restarts and the screen (bench/bench_restarts.py)\n\n" + text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
