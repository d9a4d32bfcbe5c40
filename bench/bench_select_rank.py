"""Does the bound rank the screened candidates as NMI does? (issue 51: the bound of the original rows,
projected candidates beside the others, and the bound at a stated resolution)

    python bench/bench_select_rank.py --out bench/out [--only digits fashion-mnist] [--resolutions 0 0.01 0.1]

For each battery set (bench/bench_battery.py's loader), every candidate ``--select auto`` screens (the
families x priors, and the projected candidates of ``pipeline.fit.select.PROJECTED`` where P < D) is
fitted to the screening subsample exactly as the screen fits it, and scored by the bound per row of the
original rows at each resolution (``eps_d = r * std_d``; 0: the plain bound), beside its clusters and
its NMI on the subsample. Reports, per set and resolution, the candidate the bound ranks first, its
NMI, and the best NMI among the candidates; writes ``OUT/select_rank/README.md`` and ``results.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def candidates_of(name: str, x: np.ndarray, y: np.ndarray, resolutions: list[float]) -> list[dict]:
    """Every screened candidate of ``x``'s screen: its bounds per row at each resolution, clusters, NMI."""
    from sklearn.metrics import normalized_mutual_info_score as nmi

    import pipeline.fit.select as select
    from pipeline.engine.engines import LocalEngine
    from pipeline.fit.setup import open_source
    from pipeline.fit.spec import FitSpec

    spec = FitSpec(select="auto", seed=0).resolved()
    src = open_source(x, int(spec.chunk_rows))
    chunks = select.screen_chunks(src, 0)
    rows = np.concatenate([src.load(i) for i in chunks])
    slices = src.chunk_slices()
    labels = np.concatenate([y[slices[i].start:slices[i].stop] for i in chunks])
    sub = open_source(rows, int(spec.chunk_rows))
    found = []
    for r in resolutions:
        eps = select.resolution_of([rows], r)
        for cand in select.screened(spec, x.shape[1], eps):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                c, out = select.screen_one(spec, cand, sub, rows, eps, LocalEngine(), 0)
            found.append({"set": name, "resolution": r, "model": select.label(asdict(c)),
                          "priors": c.priors, "clusters": c.screen_clusters,
                          "nmi": float(nmi(labels, _predict(out, rows))), "bound": c.screen_bound,
                          "seconds": c.screen_seconds, "iterations": out.n_iter, "rows": int(len(rows)),
                          "reg_covar": c.reg_covar, "load": os.getloadavg()[0]})
            print(json.dumps(found[-1]), flush=True)
    return found


def _predict(out, rows: np.ndarray) -> np.ndarray:
    """The most responsible component of each row (the VB E-step, as VBMixture.predict)."""
    from vbcore.kernels.estep import estep_params, prepare_chunk, responsibilities

    shift = out.prior.mean
    chunk = prepare_chunk(rows, shift, out.post.covariance_type, projection=out.projection)
    return np.asarray(responsibilities(chunk, estep_params(out.post, shift))).argmax(axis=1)


def main(argv: list[str] | None = None) -> int:
    from bench_battery import Skip, load

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--only", nargs="*", default=["digits", "vehicle", "vowel", "satellite", "fashion-mnist"])
    ap.add_argument("--resolutions", nargs="*", type=float, default=[0.0, 0.01, 0.03, 0.1])
    args = ap.parse_args(argv)
    folder = Path(args.out) / "select_rank"
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["| set | resolution | ranked first (clusters, NMI) | best NMI of the candidates | "
             "rank correlation bound-NMI |", "|---|---|---|---|---|"]
    for name in args.only:
        try:
            x, y = load(name, Path(args.out))
        except Skip as exc:
            print(f"{name}: skipped ({exc})", flush=True)
            continue
        found = candidates_of(name, x, y, args.resolutions)
        with open(folder / "results.jsonl", "a") as f:
            for c in found:
                f.write(json.dumps(c) + "\n")
        best = max(found, key=lambda c: c["nmi"])  # (over every resolution's fits)
        for r in args.resolutions:
            these = [c for c in found if c["resolution"] == r]
            top = max(these, key=lambda c: c["bound"])
            rho = _spearman([c["bound"] for c in these], [c["nmi"] for c in these])
            lines.append(f"| {name} | {r:g} | {top['model']}, {top['priors']} ({top['clusters']}, "
                         f"{top['nmi']:.3f}) | {best['model']}, {best['priors']} ({best['clusters']}, "
                         f"{best['nmi']:.3f}) | {rho:+.2f} |")
            print(lines[-1], flush=True)
    (folder / "README.md").write_text("# The bound's ranking against NMI (bench/bench_select_rank.py)\n\n"
                                      + "\n".join(lines) + "\n")
    return 0


def _spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic) if len(a) > 2 else float("nan")


if __name__ == "__main__":
    raise SystemExit(main())
