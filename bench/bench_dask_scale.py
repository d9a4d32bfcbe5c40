"""Memory-limited Dask workers on a store larger than their memory (issue 52, deliver 4).

The 16M x 256 store of ``bench/bench_scale.py`` (16 GB of float32, 32 GB prepared) is fitted three
ways, each in a fresh process, and the fitted posteriors are compared bit for bit:

* ``inprocess``: the in-process engine, one BLAS thread per chunk task (the reference bits);
* ``dask``: ``cluster_config/memory_limited.yaml`` (4 worker processes x 3 GB, one thread each;
  ``persist: auto`` streams a store whose prepared chunks exceed half of the workers' 12 GB);
* ``dask-kill``: the same cluster, one worker SIGKILLed ``--kill-delay`` seconds into the second
  iteration; its nanny restarts it and the lost tasks are recomputed.

The fit is ``bench_scale.py``'s (diag, K = 100, ``k-means++-projected`` start, ``tol`` 0, no moves,
exact E-step), ``--iters`` iterations. Every child prints one JSON line: wall seconds, seconds per
iteration (median of the differences between iteration callbacks), the driver's peak RSS, the workers'
peak RSS, and a SHA-256 digest of the fitted arrays (means, covariances, weights, precisions'
Cholesky factors, the bound's history). The table gives each mode's ratio to the in-process fit.

Run (heavy: under the machine's benchmark lock; about 3 fits of the store):
  flock /work/wt/bench.lock python bench/bench_dask_scale.py --store STORE [--iters 3]
  [--modes inprocess,dask,dask-kill] [--kill-delay 5]
``STORE`` is made by ``bench/bench_scale.py --rows 16000000 --modes streamed`` (kept in its workdir).
``--child`` is internal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

CONFIG = Path(__file__).resolve().parents[1] / "cluster_config" / "memory_limited.yaml"
POSTERIOR = ("means_", "covariances_", "weights_", "precisions_cholesky_", "lower_bounds_")


def digest(model) -> str:
    h = hashlib.sha256()
    for name in POSTERIOR:
        h.update(np.ascontiguousarray(getattr(model, name)).tobytes())
    return h.hexdigest()[:16]


def _worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


def _worker_peak_gb(client) -> float:
    peaks = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9)
    return max(peaks.values())


def child(store: str, mode: str, k: int, iters: int, kill_delay: float) -> None:
    from distributed import Client

    from pipeline import VBMixture
    from pipeline.engine.cluster import load_cluster_config

    client = cluster = None
    engine: object = "local"
    if mode != "inprocess":
        cluster = load_cluster_config(CONFIG).make_cluster()
        client = Client(cluster)
        client.wait_for_workers(4, timeout=120)
        engine = client
    stamps: list[float] = []
    kill: dict = {}

    def send_kill() -> None:
        time.sleep(kill_delay)
        pids = _worker_pids(client)
        victim = sorted(pids)[0]
        os.kill(pids[victim], signal.SIGKILL)
        kill.update(victim=victim, pid=pids[victim], at_s=time.perf_counter() - t0)

    def callback(info: dict) -> None:
        stamps.append(time.perf_counter())
        if mode == "dask-kill" and len(stamps) == 1:
            threading.Thread(target=send_kill, daemon=True).start()

    t0 = time.perf_counter()
    model = VBMixture(k, covariance_type="diag", max_iter=iters, tol=0, random_state=0, engine=engine,
                      init_params="k-means++-projected", prior_defaults="empirical",
                      learner_options={"moves": "none", "candidates": 0}).fit(store, callback=callback)
    wall = time.perf_counter() - t0
    out = {"mode": mode, "wall": wall, "iters": len(stamps), "digest": digest(model),
           "s_iter": statistics.median(np.diff(stamps)) if len(stamps) > 1 else float("nan"),
           "driver_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}
    if client is not None:
        out["worker_peak_gb"] = _worker_peak_gb(client)  # of the workers alive now (a restarted one: its own)
        out["kill"] = dict(kill, mid_fit=bool(kill) and kill["at_s"] < wall)
        client.close()
        cluster.close()
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--modes", default="inprocess,dask,dask-kill")
    ap.add_argument("--kill-delay", type=float, default=5.0)
    ap.add_argument("--child", metavar="MODE")
    a = ap.parse_args()
    if a.child:
        child(a.store, a.child, a.k, a.iters, a.kill_delay)
        return
    print(f"load {os.getloadavg()[0]:.2f}; store {a.store}; {a.iters} iterations, K = {a.k}", flush=True)
    results = {}
    for mode in a.modes.split(","):
        out = subprocess.run([sys.executable, __file__, "--store", a.store, "--child", mode, "--k", str(a.k),
                              "--iters", str(a.iters), "--kill-delay", str(a.kill_delay)],
                             capture_output=True, text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        if out.returncode != 0:
            print(f"{mode:>10}  failed: {out.stderr.strip().splitlines()[-3:]}", flush=True)
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results[mode] = r
        print(json.dumps(r), f"load {os.getloadavg()[0]:.2f}", flush=True)
    ref = results.get("inprocess")
    for mode, r in results.items():
        same = ref is not None and r["digest"] == ref["digest"]
        ratio = r["s_iter"] / ref["s_iter"] if ref else float("nan")
        print(f"{mode:>10}: s/iter {r['s_iter']:.1f} ({ratio:.2f}x in-process), wall {r['wall']:.0f} s, "
              f"driver peak {r['driver_peak_gb']:.2f} GB, workers' peak {r.get('worker_peak_gb', 0):.2f} GB, "
              f"same bits as in-process: {same}")


if __name__ == "__main__":
    main()
