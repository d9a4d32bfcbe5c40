"""What model selection's screening costs and how often it picks what a full comparison would
(issue 51, deliver 1).

    python bench/bench_select.py --out bench/out [--only vowel satellite planted] [--screen-rows 1000]

For each set (the battery's small sets, read by bench/bench_battery.py, and a planted set of many small
classes), every candidate of ``--select auto`` is fitted to all rows (``select_fits`` = all) while the
screen runs on a subsample of ``--screen-rows`` rows (whole chunks of 100 rows, drawn from the seed):
the screen's winner against the full comparison's, and the time of the screen against one full fit of
the winner. Writes ``OUT/select/README.md`` and ``results.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def rows_of(name: str, out: Path) -> tuple[np.ndarray, np.ndarray]:
    if name == "planted":
        from tests._reference import planted_small_classes

        return planted_small_classes(n_classes=100, d=32, lo=25, hi=400, seed=0)
    from bench_battery import load

    return load(name, out)


def main(argv: list[str] | None = None) -> int:
    import pipeline.fit.select as select
    from pipeline.fit.setup import open_source
    from pipeline.fit.spec import FitSpec
    from pipeline.service import fit

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--only", nargs="*", default=["digits", "vehicle", "vowel", "satellite", "planted"])
    ap.add_argument("--screen-rows", type=int, default=1000)
    args = ap.parse_args(argv)
    folder = Path(args.out) / "select"
    folder.mkdir(parents=True, exist_ok=True)
    select.SCREEN_ROWS = args.screen_rows
    lines = ["| set | rows | screen winner | full winner | agree | screen s | a full fit s | load |",
             "|---|---|---|---|---|---|---|---|"]
    for name in args.only:
        x, _ = rows_of(name, Path(args.out))
        spec = FitSpec(select="auto", chunk_rows=100, seed=0).resolved()
        n_cand = len(select.screened(spec, x.shape[1], None))  # (every candidate, low-rank and projected)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fit(FitSpec(select="auto", chunk_rows=100, seed=0, select_fits=n_cand).resolved(),
                      open_source(x, 100), "local", random_state=0)
        total = time.perf_counter() - t0
        sel = out.selection
        assert sel is not None
        cands = sel["candidates"]
        screen_win = f"{select.label(cands[0])}, {cands[0]['priors']}"
        full = max((c for c in cands if c["full_bound"] is not None), key=lambda c: c["full_bound"])
        full_win = f"{select.label(full)}, {full['priors']}"
        rec = {"set": name, "rows": int(len(x)), "screen_rows": sel["screen_rows"],
               "screen_seconds": sel["screen_seconds"], "total_seconds": total, "candidates": cands,
               "agree": screen_win == full_win, "load": os.getloadavg()[0]}
        with open(folder / "results.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        lines.append(f"| {name} | {len(x)} ({sel['screen_rows']} screened) | {screen_win} | {full_win} | "
                     f"{'yes' if rec['agree'] else 'no'} | {sel['screen_seconds']:.1f} | "
                     f"{(total - sel['screen_seconds']) / n_cand:.1f} (mean of {n_cand}) | "
                     f"{rec['load']:.1f} |")
        print(lines[-1], flush=True)
    (folder / "README.md").write_text("# Screening against a full comparison (bench/bench_select.py)\n\n"
                                      + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
