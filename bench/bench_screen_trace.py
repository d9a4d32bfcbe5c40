"""Each screened candidate's bound, iteration by iteration, on the screen's own rows.

    python bench/bench_screen_trace.py RUN_DIR [--only full] [--one-blas-thread] [--out OUT.json]

``RUN_DIR`` is a finished fit that selected its model (result.json's ``selection``). The screen's
subsample and candidates are rebuilt from its run.json as :func:`pipeline.fit.select.screen` builds them
(the same rows, resolution and settings), and each candidate (those whose covariance is in ``--only``, or
all) is fitted to them again with its ELBO history kept: the bound per row after each iteration, the
iteration where it ends, and the gap to the leader's final screen bound. What a rule that stops a
candidate early would have seen (VB EM's bound only rises, so a candidate behind the leader may still
overtake it: these traces say by how much each did, on this store). Seconds depend on the load.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace

import numpy as np
from threadpoolctl import threadpool_limits

from pipeline.engine.engines import make_engine
from pipeline.fit.driver import run_fit
from pipeline.fit.select import RESOLUTION, SCREEN_MAX_ITER, chosen_spec, resolution_of, screen_rows, screened
from pipeline.fit.setup import open_source
from pipeline.service import finished_result, read_spec
from vbcore.data.normalize import normalize_chunk


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--only", nargs="*", default=None, help="covariance families to trace (default: all)")
    ap.add_argument("--one-blas-thread", action="store_true",
                    help="each fit inside threadpoolctl's limit of one BLAS thread (the driver's LAPACK too)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    spec = read_spec(a.run)
    result = finished_result(a.run)
    assert result is not None and result.get("selection"), f"{a.run}: not a finished selected run"
    from pipeline.engine.sources import StoreSource

    source = StoreSource(str(spec.store))
    raw = screen_rows(source, spec.seed)
    sub = open_source(raw, int(spec.chunk_rows))
    rows = normalize_chunk(raw, spec.normalize)
    eps = resolution_of([rows], RESOLUTION)
    n = rows.shape[0]
    leader = max(c["screen_bound"] for c in result["selection"]["candidates"])
    engine = make_engine("local", spec.persist)
    traces = []
    for cand in screened(spec, source.n_features, eps):
        if cand.pca is not None or cand.rank is not None:
            continue  # (a projected or low-rank candidate's bound is not its ELBO history)
        if a.only and cand.covariance not in a.only:
            continue
        t = time.perf_counter()
        one = replace(chosen_spec(spec, cand), max_iter=SCREEN_MAX_ITER)
        with threadpool_limits(1 if a.one_blas_thread else None, user_api="blas"):
            out = run_fit(one, sub, engine, random_state=spec.seed)
        hist = np.asarray(out.history) / n
        traces.append(
            {
                "covariance": cand.covariance,
                "priors": cand.priors,
                "n_iter": out.n_iter,
                "converged": out.converged,
                "seconds": time.perf_counter() - t,
                "elbo_per_row": hist.tolist(),
                "leader_screen_bound": leader,
            }
        )
        at = {i: round(float(hist[min(i, hist.size) - 1]), 3) for i in (5, 10, 20, 40, hist.size)}
        print(
            f"{cand.covariance:10s} {cand.priors:9s} iterations {out.n_iter:3d} "
            f"converged {out.converged!s:5s} "
            f"{traces[-1]['seconds']:6.1f} s  ELBO/row at 5/10/20/40/last: {at}  (leader's screen bound "
            f"{leader:.3f}; load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
    engine.close()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(traces, f, indent=1)


if __name__ == "__main__":
    main()
