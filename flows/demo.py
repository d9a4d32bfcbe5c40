"""``make demo``: cluster_flow end to end on the bundled digits and a small synthetic store.

Runs with Prefect's ephemeral API (no server to start) and a Dask LocalCluster from
``cluster_config/local.yaml``: ingest_flow builds both stores, cluster_flow fits each (checkpoints,
assignments next to the store), then one HTML report compares the runs. Prints a summary table.

    python -m flows.demo [--out DIR] [--learners vbem,...] [--no-cluster]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
LOCAL_CONFIG = ROOT / "cluster_config" / "local.yaml"
DATASETS = {
    # name: (ingest source, ingest options, K)
    "digits": ("digits", {}, 30),
    "synthetic": ("synthetic", {"rows": 6000, "dim": 64, "classes": 12, "seed": 0}, 30),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".vbcluster/demo", help="Where stores, runs and the report go.")
    parser.add_argument("--learners", default="vbem,ncg",
                        help="Comma-separated learners for each store (unregistered ones are skipped).")
    parser.add_argument("--no-cluster", action="store_true", help="Run the passes in-process (no Dask).")
    parser.add_argument("--max-iter", type=int, default=200)
    args = parser.parse_args(argv)

    from flows.cluster import cluster_flow, report
    from flows.ingest import ingest_flow
    from flows.runtime import dask_cluster

    console = Console(markup=False) if Console().is_terminal else Console(width=120, markup=False)
    import distributed  # noqa: F401 - configures its loggers on import; quieten them after that

    for name in list(logging.root.manager.loggerDict):
        if name == "distributed" or name.startswith("distributed."):
            logging.getLogger(name).setLevel(logging.WARNING)  # the cluster's own chatter
    out = Path(args.out)
    t_all = time.perf_counter()
    from pipeline.fit.learners import LEARNERS
    from pipeline.runs.directory import CLUSTERS_FOUND

    wanted = [x.strip() for x in args.learners.split(",") if x.strip()]
    learners = [x for x in wanted if x in LEARNERS]
    if missing := sorted(set(wanted) - set(learners)):
        console.print(f"skipping learners that are not registered: {', '.join(missing)}")
    stores = {}
    for name, (source, options, _) in DATASETS.items():
        stores[name] = str(out / f"{name}.zarr")
        ingest_flow(source, stores[name], chunk_rows=1000, overwrite=True, options=options, quiet=True)
    rows = []
    with dask_cluster(None if args.no_cluster else str(LOCAL_CONFIG)) as engine:
        for name, (_, _, k) in DATASETS.items():
            for learner in learners:
                run = out / "runs" / f"{name}-{learner}"
                shutil.rmtree(run, ignore_errors=True)  # a fresh fit each time (not a resume)
                t0 = time.perf_counter()
                res = cluster_flow(stores[name], str(run), learner=learner, components=k,
                                   max_iter=args.max_iter, cluster=engine.address, write_report=False)
                rows.append((name, learner, res, time.perf_counter() - t0))
    page = report.fn([str(out / "runs" / f"{n}-{lr}") for n, lr, _, _ in rows], str(out / "report"))

    table = Table(title="vbcluster demo: cluster_flow (fit with checkpoints -> assign) on a Dask "
                  "LocalCluster")
    for col in ("store", "learner", "rows x dim", "iterations", "converged", "clusters found", "ELBO", "NMI",
                "ACC", "seconds"):
        table.add_column(col, justify="right")
    for name, learner, r, secs in rows:
        m = r.get("metrics") or {}
        table.add_row(name, learner, f"{r['n_rows']} x {r['n_features']}", str(r["n_iter"]),
                      str(r["converged"]), str(r["n_effective"]), f"{r['elbo']:.6g}",
                      f"{m['nmi']:.3f}" if m else "-", f"{m['acc']:.3f}" if m else "-", f"{secs:.1f}")
    console.print(table)
    console.print(f"{CLUSTERS_FOUND}; NMI/ACC against the labels; seconds = the whole flow run (fit, "
                  "checkpoints, assignments).", soft_wrap=True)
    console.print(f"report: {page}")
    console.print(f"total {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
