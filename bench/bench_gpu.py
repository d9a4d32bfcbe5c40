"""One VB EM kernel pass on a CUDA GPU (CuPy) against the same pass with NumPy on this machine's
CPU, and the share of the GPU's own float32 GEMM rate that the device pass reaches.

Setting: diag components, N=100,000, D=512, K=100, float32 data shaped like ReLU CNN features (as
in bench/bench_vbem.py), the same chunks and E-step parameters on both sides. The pass is
``vbem_pass_kernel`` over every chunk (E-step GEMM, softmax, statistics GEMM, block by block) with
the statistics merged in chunk order where they live, then copied to the host once: 8 N D K flops.
Run with ``python bench/bench_gpu.py`` (``--help`` for the settings); it needs the gpu extra (CuPy)
and a CUDA device, and says so when either is missing. CuPy multiplies float32 with TF32 tensor cores
only when ``CUPY_TF32=1``; the default (off) is what the kernels' float32 accuracy assumes, and the
reference GEMM uses the same setting.

``--sun397`` times the pass at the SUN397 shape of issue 27's target (N=108,754, D=4096, K=1000:
3.6e12 flop per pass; target <= 0.15 s and >= 50% of the GEMM rate). ``--json PATH`` writes the
figures for ``scripts/gpu_check.py``. ``--backend strict`` runs the same code with array-api-strict in
place of CuPy on the CPU (a dry run of the script: no device, the rate is the host's NumPy sgemm).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import reduce
from typing import Any

import numpy as np


def load_cupy() -> Any:
    """Import CuPy and check that it sees a device; exit with a message (no traceback) otherwise."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - ImportError, or CUDA libraries failing to load
        sys.exit(f"bench_gpu: CuPy cannot be imported ({type(exc).__name__}: {exc}).\n"
                 "Install the gpu extra (pip install -e '.[gpu]') on a machine with a CUDA GPU.")
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - no driver, no device, driver too old
        sys.exit(f"bench_gpu: no CUDA device ({type(exc).__name__}: {exc}).")
    if count == 0:
        sys.exit("bench_gpu: no CUDA device (getDeviceCount() == 0).")
    return cupy


def device_name(cp: Any) -> str:
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def check_namespace(cp: Any) -> None:
    """The kernels must see CuPy's namespace in CuPy arrays, or they would compute on the host."""
    from vbcore.kernels.estep import array_namespace

    x = cp.ones((2, 2), dtype=cp.float32)
    xp = array_namespace(x)
    ok = isinstance(xp.asarray(np.ones(2), dtype=x.dtype), cp.ndarray)
    missing = [f for f in ("concat", "matrix_transpose", "vecdot", "astype") if not hasattr(xp, f)]
    if not ok or missing:
        sys.exit(f"bench_gpu: vbcore.kernels.estep.array_namespace(cupy array) is "
                 f"{getattr(xp, '__name__', xp)!r}"
                 + ("" if ok else ", which does not make CuPy arrays")
                 + (f", lacking {missing}" if missing else "")
                 + f" (CuPy {cp.__version__}); the kernels cannot run on this CuPy.")


def gpu_gemm_rate(cp: Any, size: int, repeat: int) -> float:
    """float32 GEMM rate of the device (flop/s): ``size^3`` matmul timed with CUDA events."""
    a = cp.random.standard_normal((size, size), dtype=cp.float32)
    b = cp.random.standard_normal((size, size), dtype=cp.float32)
    a @ b  # warm up (cuBLAS handle, kernel selection)
    cp.cuda.Stream.null.synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(repeat):
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    del a, b
    return 2.0 * size**3 / statistics.median(times)


def time_pass(fn: Any, repeat: int, sync: Any = None) -> float:
    """Median wall time of ``fn()`` after one warm-up call; ``sync()`` before and after each."""
    fn()
    times = []
    for _ in range(repeat):
        if sync is not None:
            sync()
        t = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class Device:
    """The array library the device side runs on: CuPy on a GPU, or array-api-strict on the CPU."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        if backend == "cupy":
            self.cp = load_cupy()
            try:
                self.name = device_name(self.cp)
            except Exception as exc:  # noqa: BLE001 - the device is listed but cannot be used
                sys.exit(f"bench_gpu: the CUDA device cannot be used ({type(exc).__name__}: {exc}).")
            check_namespace(self.cp)
            self.version = (f"CuPy {self.cp.__version__}, CUDA runtime "
                            f"{self.cp.cuda.runtime.runtimeGetVersion()}, "
                            f"CUPY_TF32={os.environ.get('CUPY_TF32', '(unset)')}")
        else:
            import array_api_strict

            self.xps, self.name = array_api_strict, "array-api-strict on the CPU (dry run, no device)"
            self.version = f"array-api-strict {array_api_strict.__version__}"

    def asarray(self, x: np.ndarray) -> Any:
        return self.cp.asarray(x) if self.backend == "cupy" else self.xps.asarray(x)

    def sync(self) -> None:
        if self.backend == "cupy":
            self.cp.cuda.Stream.null.synchronize()

    def free(self) -> None:
        if self.backend == "cupy":
            self.cp.get_default_memory_pool().free_all_blocks()

    def gemm_rate(self, size: int) -> float:
        if self.backend == "cupy":
            return gpu_gemm_rate(self.cp, size, repeat=10)
        from bench_vbem import sgemm  # the host's NumPy sgemm (a dry run has no device)

        size = min(size, 2048)
        product = sgemm(size)
        product()  # warm up
        times = []
        for _ in range(3):
            t = time.perf_counter()
            product()
            times.append(time.perf_counter() - t)
        return 2.0 * size**3 / statistics.median(times)


def random_params(X: np.ndarray, k: int, chunk_rows: int) -> tuple[list[Any], Any]:
    """The host chunks of ``X`` (diag) and E-step parameters of K components from an M-step on random
    responsibilities (a posterior such as a fit's first iterations have)."""
    from pipeline.engine.engines import split_rows
    from vbcore.kernels.estep import chunk_statistics, estep_params, prepare_chunk
    from vbcore.model.mstep import m_step
    from vbcore.model.priors import default_prior

    prior = default_prior(covariance_type="diag", weight_type="dirichlet_process", n_components=k,
                          data_mean=X.mean(0, dtype=np.float64), data_covariance=X.var(0, dtype=np.float64))
    host_chunks = [prepare_chunk(c, prior.mean, "diag") for c in split_rows(X, chunk_rows)]
    stats, rng = None, np.random.default_rng(1)
    for c in host_chunks:  # random responsibilities, chunk by chunk (no N x K float64 array)
        r = rng.gamma(1.0, size=(c.n_rows, k)).astype(np.float32)
        s = chunk_statistics(c, r / r.sum(1, keepdims=True))
        stats = s if stats is None else stats.merge(s)
    return host_chunks, estep_params(m_step(stats, prior, 1e-6), prior.mean)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--components", type=int, default=100)
    ap.add_argument("--sun397", action="store_true",
                    help="N=108,754, D=4096, K=1000 (overrides the three above)")
    ap.add_argument("--chunk-rows", type=int, default=65_536)
    ap.add_argument("--repeat", type=int, default=5, help="timed device passes")
    ap.add_argument("--cpu-repeat", type=int, default=0,
                    help="timed NumPy passes (default: repeat // 2, >= 1)")
    ap.add_argument("--gemm-size", type=int, default=8192)
    ap.add_argument("--backend", choices=("cupy", "strict"), default="cupy")
    ap.add_argument("--json", type=str, default=None, help="write the figures to this file")
    args = ap.parse_args()
    if args.sun397:
        args.rows, args.dim, args.components = 108_754, 4096, 1000
    return args


def main() -> None:
    args = parse_args()
    dev = Device(args.backend)

    from bench_vbem import relu_features  # same data as `make bench`
    from threadpoolctl import threadpool_info

    from pipeline.engine.engines import split_rows
    from vbcore.kernels.estep import KernelResult, prepare_chunk, vbem_pass_kernel

    n, d, k = args.rows, args.dim, args.components
    print(f"vbcluster GPU bench: one VB EM kernel pass (E-step + statistics), diag, "
          f"N={n} D={d} K={k}, float32")
    print(f"  device: {dev.name} ({dev.version})")
    for info in threadpool_info():
        print(f"  host threadpool: {info['internal_api']} {info.get('version')} "
              f"threads={info['num_threads']}")

    t0 = time.perf_counter()
    X = relu_features(n, d, k, seed=0)
    host_chunks, params = random_params(X, k, args.chunk_rows)
    shift = host_chunks[0].shift
    dev_chunks = [prepare_chunk(dev.asarray(c), shift, "diag") for c in split_rows(X, args.chunk_rows)]
    dev.sync()
    setup_s = time.perf_counter() - t0

    def one_pass(chunks: list[Any]) -> KernelResult:  # as an engine's map_reduce: merged where they live
        return reduce(KernelResult.merge, [vbem_pass_kernel(c, params) for c in chunks]).on_host()

    t_gpu = time_pass(lambda: one_pass(dev_chunks), args.repeat, dev.sync)
    t_cpu = time_pass(lambda: one_pass(host_chunks), args.cpu_repeat or max(1, args.repeat // 2))
    res_gpu, res_cpu = one_pass(dev_chunks), one_pass(host_chunks)
    nk_diff = float(np.max(np.abs(res_gpu.stats.nk - res_cpu.stats.nk)) / n)
    ln_diff = abs(res_gpu.log_norm - res_cpu.log_norm) / abs(res_cpu.log_norm)

    dev_chunks.clear()
    dev.free()
    rate = dev.gemm_rate(args.gemm_size)
    flops = 8.0 * n * d * k  # E-step [x*x, x] @ W (4NDK) + statistics R^T [x*x, x] (4NDK)
    achieved = flops / t_gpu

    print()
    print(f"  set-up (data, statistics, upload): {setup_s:.1f} s")
    print(f"  NumPy (host): {t_cpu * 1e3:9.1f} ms per pass")
    print(f"  {args.backend} (device): {t_gpu * 1e3:8.1f} ms per pass -> NumPy / device time = "
          f"{t_cpu / t_gpu:.1f}x")
    print(f"  device pass: {achieved / rate:6.1%} of this device's float32 GEMM rate "
          f"({achieved / 1e12:.2f} of {rate / 1e12:.2f} TFLOP/s, {args.gemm_size}^3 sgemm, same run)")
    print(f"  agreement: max |N_k(device) - N_k(numpy)| / N = {nk_diff:.1e}, "
          f"sum ln sum rho rel. diff = {ln_diff:.1e}")
    if args.json:
        out = {"device": dev.name, "backend": args.backend, "versions": dev.version, "rows": n, "dim": d,
               "components": k, "flop_per_pass": flops, "device_pass_s": t_gpu, "numpy_pass_s": t_cpu,
               "gemm_flops": rate, "gemm_size": args.gemm_size, "gemm_share": achieved / rate,
               "nk_max_rel_diff": nk_diff, "log_norm_rel_diff": ln_diff, "setup_s": setup_s}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
