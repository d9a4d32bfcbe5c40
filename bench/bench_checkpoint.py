"""Checkpoint cost for the SUN397-shaped run (issue 4): time and bytes of one checkpoint of the
VB EM state (K = 1000, D = 4096, diag), and its share of one VB EM iteration measured in the same run.

Run: `python bench/bench_checkpoint.py [--workdir DIR]` (the 1.8 GB synthetic store is made once).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--every", type=int, default=10, help="the checkpoint interval (iterations)")
    args = ap.parse_args()
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from bench_engine import sun397_setup

    from pipeline.fit.checkpoint import Checkpointer
    from vbcore.kernels.estep import vbem_kernel
    from vbcore.model.mstep import m_step
    from vbcore.model.posterior import posterior_arrays
    from vbcore.model.priors import default_prior

    workdir = args.workdir or tempfile.mkdtemp(prefix="vbcluster-bench-")
    os.makedirs(workdir, exist_ok=True)
    try:
        k = 1000
        source, engine, handles, params = sun397_setup(workdir, k)
        t = time.perf_counter()
        res = engine.map_reduce(vbem_kernel, handles, params)
        x0 = source.load(0)
        prior = default_prior(covariance_type="diag", weight_type="dirichlet_process", n_components=k,
                              data_mean=x0.mean(0, dtype=np.float64),
                              data_covariance=x0.var(0, dtype=np.float64))
        post = m_step(res.stats, prior, 1e-6)
        t_iter = time.perf_counter() - t
        ck = Checkpointer(os.path.join(workdir, "ckpts"), keep=3)
        state = posterior_arrays(post)
        manifest = {"learner": "vbem", "elbo_history": [0.0] * 100}
        times = []
        for i in range(5):
            t = time.perf_counter()
            p = ck.save(i + 1, state, manifest)
            times.append(time.perf_counter() - t)
        nbytes = sum(f.stat().st_size for f in p.iterdir())
        t_ck = statistics.median(times)
        print(f"checkpoint: {nbytes / 2**20:.1f} MiB in {t_ck:.2f}s (median of 5, fsync included); "
              f"one VB EM iteration (108,754 x 4096, K=1000, diag): {t_iter:.1f}s; a checkpoint is "
              f"{t_ck / t_iter:.1%} of an iteration, {t_ck / (args.every * t_iter):.2%} at the default "
              f"interval of {args.every} iterations (target <= 5%)")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
