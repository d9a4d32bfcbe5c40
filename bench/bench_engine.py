"""Engine benchmarks (issue 3). Ratios and shares measured in one run; never bare times alone.

1. streaming: one VB EM pass over a ~2 GB store streamed from Zarr by 2 worker processes
   (persist='never'); peak resident memory of driver + workers (sampled with psutil);
2. scaling: the same compute-bound pass on 1 worker vs 2 workers (one BLAS thread each);
3. overhead: a pass of 100 chunks on a 1-worker Dask cluster vs the same kernels in-process with
   one BLAS thread (the difference is scheduling and transfer overhead);
4. SUN397-shaped: 108,754 x 4096 synthetic store, K = 1000 truncation, diag, DP: seconds per VB EM
   iteration on this machine, and the share of its float32 GEMM rate;
5. inworker: the same chunk kernel timed inside the task (no scheduling in the figure) on a
   1-worker LocalCluster under each worker environment -- the nanny's default
   (``MALLOC_TRIM_THRESHOLD_=65536`` and one OpenMP/MKL/OpenBLAS thread), and without
   ``MALLOC_TRIM_THRESHOLD_`` -- against the driver (medians of several repeats);
6. threads: one pass on the in-process engine, the old way (chunk after chunk, OpenBLAS's own
   threads) against the engine's way (one BLAS thread per kernel, chunks on a pool of threads);
7. many: a LocalCluster of 8 single-thread workers on tiny chunks (1,000 chunks of 32 rows, placed by Dask
   or in contiguous ranges per worker):
   seconds per pass and per task (scheduler + reduction overhead: the kernels are ~free), and the
   bytes each pass moves between processes from Dask's own counters (every worker's
   ``transfer_outgoing_count_total`` and ``transfer_outgoing_bytes_total``: to peers and to the
   driver), against the model of docs/scaling.md (cross-worker merges of the fixed tree x the
   statistics' size, plus the state fetched once per worker, plus the root to the driver);
8. kernel-threads: the kernel in the main thread vs a pool thread, with minor page faults per call,
   one fresh process per malloc / OpenBLAS environment setting.

Run: `python bench/bench_engine.py [--only streaming,scaling,scaling-notrim,scaling-mmap,scaling-large,
overhead,sun397,inworker,threads,many,kernel-threads] [--workdir DIR]` (``scaling-notrim``: the scaling
pass with the workers' ``MALLOC_TRIM_THRESHOLD_`` unset; ``scaling-mmap``: kept, with
``MALLOC_MMAP_THRESHOLD_`` 32 MiB; ``scaling-large``: unset, 25 chunks of 16,384 rows). Each scaling
run also prints the in-process 2-thread ceiling and the CPU seconds per pass of the workers and of the
driver + scheduler.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_helpers import (  # noqa: E402  (a sibling module of this script)
    cpu_split,
    local_cluster,
    make_store,
    pass_params,
    pass_time,
    peak_rss_sampler,
    task_compute_seconds,
)


def streaming(workdir: str) -> None:
    from pipeline.engine.engines import DaskEngine
    from pipeline.engine.sources import StoreSource
    from vbcore.kernels.estep import prepare_chunk

    path = os.path.join(workdir, "stream2g.zarr")
    make_store(path, rows=250_000, dim=2048, classes=50, chunk_rows=8192)
    source = StoreSource(path)
    size = source.n_rows * source.n_features * 4
    cluster, client = local_cluster(2)
    try:
        engine = DaskEngine(client, persist="never")
        shift, params = pass_params(source, 20)
        handles = engine.prepare(source, prepare_chunk, shift, "diag")

        worker_pids = list(client.run(os.getpid).values())

        def pids():
            return [os.getpid(), *worker_pids]

        stop, out = threading.Event(), []
        th = threading.Thread(target=peak_rss_sampler, args=(pids, stop, out))
        th.start()
        t = pass_time(engine, handles, params, repeat=2)
        stop.set()
        th.join()
        print(f"streaming: store {size / 2**30:.2f} GiB ({source.n_rows} x {source.n_features}, "
              f"{len(handles)} chunks), one pass streamed from Zarr by 2 workers: {t:.1f}s "
              f"({size / t / 2**20:.0f} MiB/s); peak RSS driver + workers {out[0] / 2**30:.2f} GiB "
              f"= {out[0] / size:.2f}x the store (target <= 1.5 GiB)")
    finally:
        client.close()
        cluster.close()


def scaling_and_overhead(workdir: str, trim: bool = True, mmap: str | None = None,
                         chunk_rows: int = 4096) -> None:
    from threadpoolctl import threadpool_limits

    from pipeline.engine.engines import DaskEngine, LocalEngine
    from pipeline.engine.sources import StoreSource
    from vbcore.kernels.estep import prepare_chunk, vbem_kernel

    path = os.path.join(workdir, "scale.zarr" if chunk_rows == 4096 else f"scale-{chunk_rows}.zarr")
    make_store(path, rows=100 * 4096, dim=512, classes=50, chunk_rows=chunk_rows)  # 100 chunks of 4096
    n_chunks = -(-100 * 4096 // chunk_rows)
    source = StoreSource(path)
    shift, params = pass_params(source, 100)
    with threadpool_limits(1):
        local = LocalEngine(persist="always", threads=1)  # one kernel at a time, as one worker
        lh = local.prepare(source, prepare_chunk, shift, "diag")
        t_local = pass_time(local, lh, params)
        # the machine's own ceiling for this pass: the same kernels on 2 threads of this process
        # (no scheduler, no transfers): what 2 workers can reach at best
        both = LocalEngine(persist="always", threads=2)
        t_local2 = pass_time(both, both.prepare(source, prepare_chunk, shift, "diag"), params)
    del lh  # free the driver's copy before the clusters run
    from distributed import get_task_stream

    times, compute, split = {}, {}, {}
    for n in (1, 2):
        cluster, client = local_cluster(n, memory_limit="8GiB", trim=trim, mmap=mmap)
        try:
            eng = DaskEngine(client, persist="always")
            h = eng.prepare(source, prepare_chunk, shift, "diag")
            times[n] = pass_time(eng, h, params, repeat=5)
            with get_task_stream(client) as ts:
                t = time.perf_counter()
                eng.map_reduce(vbem_kernel, h, params)
                wall = time.perf_counter() - t
            compute[n] = (task_compute_seconds(ts.data), wall)
            split[n] = cpu_split(client, eng, h, params)
        finally:
            client.close()
            cluster.close()
    busy, wall = compute[1]
    print(f"scaling: compute-bound pass ({source.n_rows} x 512, K=100, {n_chunks} chunks, "
          f"{chunk_rows:,} rows each): "
          f"2 workers are {times[1] / times[2]:.2f}x faster than 1 worker (target >= 1.8x; workers' "
          f"MALLOC_TRIM_THRESHOLD_ {'as the nanny sets it' if trim else 'unset'}"
          f"{'' if mmap is None else ', MALLOC_MMAP_THRESHOLD_ ' + mmap}); the same pass in-process on 2 "
          f"threads is {t_local / t_local2:.2f}x faster than on 1 (the machine's ceiling; {t_local:.2f}s "
          f"vs {t_local2:.2f}s), so the engine reaches "
          f"{times[1] / times[2] / (t_local / t_local2):.0%} of it")
    for n, (w, cw, cd) in split.items():
        print(f"cpu: {n} worker(s): a pass takes {w:.2f}s; CPU per pass: workers {cw:.2f}s, driver + "
              f"scheduler {cd:.2f}s: {(cw + cd) / w:.2f} of the machine's {os.cpu_count()} cores busy")
    print(f"overhead: 1 worker, {n_chunks} chunks: {1 - busy / wall:.1%} of the pass is outside task compute "
          f"(scheduling, transfers, merges on the driver side; target <= 10%); the same kernels take "
          f"{busy / t_local:.2f}x as long inside the worker as in-process with one BLAS thread "
          f"(1 worker: {t_local:.2f}s in-process vs {busy:.2f}s of task compute)")


def sun397_setup(workdir: str, k: int = 1000):
    """The SUN397-shaped store (made once), its chunks prepared in memory, and E-step parameters."""
    from pipeline.engine.engines import LocalEngine
    from pipeline.engine.sources import StoreSource
    from vbcore.kernels.estep import prepare_chunk

    path = os.path.join(workdir, "sun397.zarr")
    make_store(path, rows=108_754, dim=4096, classes=397, chunk_rows=8192)
    source = StoreSource(path)
    shift, params = pass_params(source, k)
    engine = LocalEngine(persist="always")
    handles = engine.prepare(source, prepare_chunk, shift, "diag")
    return source, engine, handles, params


def sun397(workdir: str) -> None:
    k = 1000
    t = time.perf_counter()
    source, engine, handles, params = sun397_setup(workdir, k)
    t_prep = time.perf_counter() - t
    t_pass = pass_time(engine, handles, params, repeat=2)
    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    a @ a
    t0 = time.perf_counter()
    for _ in range(5):
        a @ a
    rate = 5 * 2 * 2048**3 / (time.perf_counter() - t0)
    flops = 8.0 * source.n_rows * source.n_features * k
    print(f"sun397: {source.n_rows} x {source.n_features}, K={k}, diag, DP: one VB EM pass "
          f"{t_pass:.1f}s per iteration on 2 cores (load + prepare once: {t_prep:.1f}s); "
          f"{flops / t_pass / rate:.1%} of this machine's float32 GEMM rate ({rate / 1e9:.0f} GFLOP/s)")


def _time_kernel_here(chunk, params, repeat: int) -> list[float]:
    """Seconds per run of the VB EM kernel on ``chunk``, timed where it runs (one BLAS thread)."""
    from pipeline.engine.engines import one_blas_thread
    from vbcore.kernels.estep import vbem_kernel

    out = []
    with one_blas_thread():
        vbem_kernel(chunk, params)
        for _ in range(repeat):
            t = time.perf_counter()
            vbem_kernel(chunk, params)
            out.append(time.perf_counter() - t)
    return out


def inworker(workdir: str, rounds: int = 5, repeat: int = 5) -> None:
    """The in-worker slowdown: the same kernel on the same chunk, driver vs worker environments."""
    import dask
    from distributed import Client, LocalCluster

    from pipeline.engine.sources import StoreSource
    from vbcore.kernels.estep import prepare_chunk

    path = os.path.join(workdir, "scale.zarr")
    make_store(path, rows=100 * 4096, dim=512, classes=50, chunk_rows=4096)
    source = StoreSource(path)
    shift, params = pass_params(source, 100)
    chunk = prepare_chunk(source.load(0), shift, "diag")
    default = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    no_trim = {k: v for k, v in default.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    envs = {"nanny default": default, "no MALLOC_TRIM_THRESHOLD_": no_trim}
    clients = {}
    try:
        for name, env in envs.items():
            with dask.config.set({"distributed.nanny.pre-spawn-environ": env}):
                cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                       dashboard_address=None, host="127.0.0.1", memory_limit="8GiB")
            client = Client(cluster)
            clients[name] = (cluster, client, client.scatter(chunk))
        times: dict[str, list[float]] = {"driver": [], "driver, pool thread": [], **{n: [] for n in envs}}
        pool = ThreadPoolExecutor(max_workers=1)
        for _ in range(rounds):  # interleaved, so load from other sessions hits every variant alike
            times["driver"] += _time_kernel_here(chunk, params, repeat)
            times["driver, pool thread"] += pool.submit(_time_kernel_here, chunk, params, repeat).result()
            for name, (_, client, fut) in clients.items():
                times[name] += client.submit(_time_kernel_here, fut, params, repeat, pure=False).result()
        base = statistics.median(times["driver"])
        print(f"inworker: VB EM kernel on one 4,096 x 512 chunk, K=100, one BLAS thread, median of "
              f"{rounds * repeat}: driver {base * 1e3:.1f} ms")
        pool.shutdown()
        for name in times:
            med = statistics.median(times[name])
            where = name if name.startswith("driver") else f"worker, {name}"
            print(f"  {where}: {med * 1e3:.1f} ms = {med / base:.2f}x the driver")
    finally:
        for cluster, client, _ in clients.values():
            client.close()
            cluster.close()


def threads(workdir: str, repeat: int = 3, n_chunks: int = 16) -> None:
    """In-process pass: OpenBLAS threads inside each GEMM (old) vs one BLAS thread + chunk threads."""
    from threadpoolctl import threadpool_limits

    from pipeline.engine.engines import LocalEngine, default_threads
    from pipeline.engine.sources import StoreSource
    from vbcore.kernels.estep import prepare_chunk, vbem_kernel

    path = os.path.join(workdir, "scale.zarr")
    make_store(path, rows=100 * 4096, dim=512, classes=50, chunk_rows=4096)
    source = StoreSource(path)
    shift, params = pass_params(source, 100)
    engine = LocalEngine(persist="always")
    handles = engine.prepare(source, prepare_chunk, shift, "diag")[:n_chunks]
    cores = default_threads()

    def old_way() -> None:  # what LocalEngine did before: chunk after chunk, BLAS threads inside
        with threadpool_limits(cores, user_api="blas"):
            for h in handles:
                vbem_kernel(h, params)

    t_old, t_new = [], []
    for _ in range(repeat):  # interleaved
        t = time.perf_counter()
        old_way()
        t_old.append(time.perf_counter() - t)
        t = time.perf_counter()
        engine.map_reduce(vbem_kernel, handles, params)
        t_new.append(time.perf_counter() - t)
    old, new = statistics.median(t_old), statistics.median(t_new)
    print(f"threads: in-process pass, {len(handles)} chunks of 4,096 x 512, K=100, {cores} cores: "
          f"{cores} BLAS threads per GEMM {old:.2f}s, 1 BLAS thread x {engine.threads} chunk threads "
          f"{new:.2f}s ({old / new:.2f}x; medians of {repeat})")


def _transfer_bytes(dask_worker) -> tuple[int, int]:
    """(transfers this worker sent, bytes it sent) to peers and clients, from Dask's counters."""
    return (int(dask_worker.transfer_outgoing_count_total), int(dask_worker.transfer_outgoing_bytes_total))


def _cross_worker_merges(n_chunks: int, where: list[str]) -> int:
    """Merges of the fixed tree whose two inputs sit on different workers (Dask runs a merge where
    one input is and fetches the other), placing each merge's output with its left input."""
    from pipeline.engine.engines import tree_pairs

    loc = list(where)
    cross = 0
    for level in tree_pairs(n_chunks):
        nxt = []
        for p in level:
            if isinstance(p, tuple):
                cross += loc[p[0]] != loc[p[1]]
                nxt.append(loc[p[0]])
            else:
                nxt.append(loc[p])
        loc = nxt
    return cross


def many(workdir: str, n_workers: int = 8, rows_per_chunk: int = 32, d: int = 32, k: int = 16,
         repeat: int = 5) -> None:
    """Scheduler and reduction overhead per pass with many workers and thousands of tiny chunks."""
    import pickle

    from distributed import Client, LocalCluster, wait

    from pipeline.engine.engines import DaskEngine
    from pipeline.engine.sources import ArraySource
    from vbcore.kernels.estep import prepare_chunk, vbem_kernel

    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                           dashboard_address=None, host="127.0.0.1", memory_limit="1GiB")
    client = Client(cluster)
    try:
        for n_chunks, contiguous in ((1000, False), (1000, True)):
            engine = DaskEngine(client, persist="always", contiguous=contiguous)
            rng = np.random.default_rng(0)
            X = rng.normal(size=(n_chunks * rows_per_chunk, d)).astype(np.float32)
            source = ArraySource(X, rows_per_chunk)
            shift, params = pass_params(source, k)
            handles = engine.prepare(source, prepare_chunk, shift, "diag")
            wait(handles)
            who = client.who_has(handles)
            where = [sorted(who[h.key])[0] for h in handles]
            result = engine.map_reduce(vbem_kernel, handles, params)  # warm-up
            before = client.run(_transfer_bytes)
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                engine.map_reduce(vbem_kernel, handles, params)
                times.append(time.perf_counter() - t)
            after = client.run(_transfer_bytes)
            sends = sum(after[w][0] - before[w][0] for w in after) / repeat
            moved = sum(after[w][1] - before[w][1] for w in after) / repeat
            stats_b = len(pickle.dumps(result))
            state_b = len(pickle.dumps(params))
            cross = _cross_worker_merges(n_chunks, where)
            predicted = (cross + 1) * stats_b + (n_workers - 1) * state_b
            med = statistics.median(times)
            tasks = 2 * n_chunks + 1  # kernels, merges (n - 1), the state, the root's result
            print(f"many: {n_workers} workers x 1 thread, {n_chunks} chunks of {rows_per_chunk} x {d} "
                  f"({'contiguous ranges per worker' if contiguous else 'placed by Dask'}), "
                  f"K={k}: "
                  f"{med:.2f}s per pass (median of {repeat}), {med / tasks * 1e3:.2f} ms per task "
                  f"({tasks} tasks); sent by the workers per pass: {sends:.0f} transfers, "
                  f"{moved / 1e6:.2f} MB "
                  f"(Dask's counters, the root to the driver included); model: {cross} cross-worker merges x "
                  f"{stats_b / 1e3:.1f} kB + the root + {n_workers - 1} x {state_b / 1e3:.1f} kB state = "
                  f"{predicted / 1e6:.2f} MB")
            engine.release(handles)
    finally:
        client.close()
        cluster.close()


def _kernel_threads_child(path: str, rounds: int = 3, repeat: int = 10) -> None:
    """In this process: the kernel on the first chunk in the main thread and in a pool thread, with
    the minor page faults per call (``RUSAGE_THREAD``); prints one line."""
    import resource

    from pipeline.engine.sources import StoreSource
    from vbcore.kernels.estep import prepare_chunk

    source = StoreSource(path)
    shift, params = pass_params(source, 100)
    chunk = prepare_chunk(source.load(0), shift, "diag")

    def timed() -> tuple[float, float]:
        faults = []
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        t = _time_kernel_here(chunk, params, repeat)
        faults.append((resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before) / (repeat + 1))
        return statistics.median(t), faults[0]

    pool = ThreadPoolExecutor(max_workers=1)
    main_t, pool_t = [], []
    for _ in range(rounds):  # interleaved
        main_t.append(timed())
        pool_t.append(pool.submit(timed).result())
    m, p = (statistics.median(t for t, _ in x) for x in (main_t, pool_t))
    fm, fp = (statistics.median(f for _, f in x) for x in (main_t, pool_t))
    env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                   if k.startswith(("MALLOC_", "OPENBLAS_"))) or "default environment"
    print(f"  {env}: main thread {m * 1e3:.0f} ms ({fm:.0f} page faults per call), pool thread "
          f"{p * 1e3:.0f} ms ({fp:.0f}) = {p / m:.2f}x", flush=True)


def kernel_threads(workdir: str) -> None:
    """The kernel in the main thread vs a pool thread, one fresh process per malloc/BLAS setting."""
    import subprocess
    import sys

    path = os.path.join(workdir, "scale.zarr")
    make_store(path, rows=100 * 4096, dim=512, classes=50, chunk_rows=4096)
    print("kernel-threads: VB EM kernel on one 4,096 x 512 chunk, K=100, one BLAS thread")
    settings = [{}, {"MALLOC_TRIM_THRESHOLD_": "65536"}, {"MALLOC_ARENA_MAX": "1"},
                {"MALLOC_TRIM_THRESHOLD_": "1073741824", "MALLOC_MMAP_THRESHOLD_": "33554432"},
                {"OPENBLAS_NUM_THREADS": "1"}, {"OPENBLAS_NUM_THREADS": "2"}]
    code = f"import bench.bench_engine as b; b._kernel_threads_child({path!r})"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for extra in settings:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "OPENBLAS_"))}
        subprocess.run([sys.executable, "-c", code], env={**env, **extra}, cwd=root, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="streaming,scaling,sun397")
    ap.add_argument("--workdir", default=None, help="keep the stores here (default: a temp dir)")

    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="vbcluster-bench-")

    os.makedirs(workdir, exist_ok=True)
    try:
        only = set(args.only.split(","))
        if "streaming" in only:
            streaming(workdir)
        if "scaling" in only or "overhead" in only:
            scaling_and_overhead(workdir)
        if "scaling-notrim" in only:
            scaling_and_overhead(workdir, trim=False)
        if "scaling-mmap" in only:  # the nanny's trim threshold kept, glibc's mmap threshold raised
            scaling_and_overhead(workdir, mmap=str(32 * 2**20))
        if "scaling-large" in only:  # 25 chunks of 16,384 rows: a quarter of the tasks per pass
            scaling_and_overhead(workdir, trim=False, chunk_rows=16384)
        if "sun397" in only:
            sun397(workdir)
        if "inworker" in only:
            inworker(workdir)
        if "threads" in only:
            threads(workdir)
        if "many" in only:
            many(workdir)
        if "kernel-threads" in only:
            kernel_threads(workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
