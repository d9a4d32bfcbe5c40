"""Helpers of bench/bench_engine.py: worker clusters, pass timing, CPU accounting, stores."""

from __future__ import annotations

import os
import statistics
import threading
import time

import numpy as np


def peak_rss_sampler(pids_fn, stop: threading.Event, out: list[float]) -> None:
    import psutil

    peak = 0.0
    while not stop.is_set():
        total = 0.0
        for pid in pids_fn():
            try:
                total += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
        peak = max(peak, total)
        time.sleep(0.05)
    out.append(peak)


def local_cluster(n_workers: int, memory_limit: str = "4GiB", trim: bool = True, mmap: str | None = None):
    """A LocalCluster of single-thread workers; ``trim=False`` drops the nanny's
    ``MALLOC_TRIM_THRESHOLD_`` from the workers' environment; ``mmap`` sets ``MALLOC_MMAP_THRESHOLD_``."""
    import dask
    from distributed import Client, LocalCluster

    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if mmap is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = mmap
    pre = {k: v for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()
           if trim or k != "MALLOC_TRIM_THRESHOLD_"}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": pre}):
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                               memory_limit=memory_limit, dashboard_address=None, host="127.0.0.1",
                               env=env)
    return cluster, Client(cluster)


def pass_time(engine, handles, params, repeat=3, warmup=2) -> float:
    from vbcore.kernels.estep import vbem_kernel

    for _ in range(warmup):
        engine.map_reduce(vbem_kernel, handles, params)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        engine.map_reduce(vbem_kernel, handles, params)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def pass_params(source, k: int, seed: int = 0):
    from vbcore.kernels.estep import chunk_statistics, estep_params, prepare_chunk
    from vbcore.model.mstep import m_step
    from vbcore.model.priors import default_prior

    x0 = source.load(0)
    shift = x0[0].astype(np.float64)
    prior = default_prior(covariance_type="diag", weight_type="dirichlet_process", n_components=k,
                          data_mean=x0.mean(0, dtype=np.float64), data_covariance=x0.var(0, dtype=np.float64))
    r = np.random.default_rng(seed).dirichlet(np.ones(k), size=x0.shape[0]).astype(np.float32)
    post = m_step(chunk_statistics(prepare_chunk(x0, shift, "diag"), r), prior, 1e-6)
    return shift, estep_params(post, shift)


def make_store(path: str, rows: int, dim: int, classes: int, chunk_rows: int) -> None:
    from pipeline.ingest import ingest

    if os.path.exists(path):
        return
    t = time.perf_counter()
    rep = ingest("synthetic", path, chunk_rows=chunk_rows, rows=rows, dim=dim, classes=classes, seed=0)
    print(f"  made {path}: {rep.n_rows} x {rep.n_features} in {time.perf_counter() - t:.0f}s")


def task_compute_seconds(task_stream: list[dict]) -> float:
    return sum(ss["stop"] - ss["start"] for t in task_stream for ss in t["startstops"]
               if ss["action"] == "compute")


def cpu_split(client, eng, handles, params, repeat: int = 3) -> tuple[float, float, float]:
    """Median wall seconds of a pass, and the CPU seconds per pass of the worker processes and of this
    process (driver + the LocalCluster's scheduler, which runs here)."""
    import psutil

    from vbcore.kernels.estep import vbem_kernel

    workers = [psutil.Process(pid) for pid in client.run(os.getpid).values()]

    def cpu() -> tuple[float, float]:
        w = sum(sum(p.cpu_times()[:2]) for p in workers)
        return w, time.process_time()

    w0, d0 = cpu()
    walls = []
    for _ in range(repeat):
        t = time.perf_counter()
        eng.map_reduce(vbem_kernel, handles, params)
        walls.append(time.perf_counter() - t)
    w1, d1 = cpu()
    return statistics.median(walls), (w1 - w0) / repeat, (d1 - d0) / repeat
