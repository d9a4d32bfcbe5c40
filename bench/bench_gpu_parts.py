"""Where a VB EM kernel pass spends its time on a GPU: each part of the diagonal pass (E-step GEMM,
softmax, statistics GEMM, the float64 running sums) timed over every block, at several block sizes,
against the device's float32 GEMM rate measured in the same run; and the whole ``vbem_kernel`` at
the same block sizes.

Run with ``python bench/bench_gpu_parts.py`` on a machine with CuPy and a CUDA device (default shape:
SUN397's D = 4096 and K = 1000, N = 32,768 rows); ``--backend strict`` runs the same code on
array-api-strict (a dry run, no device). Each part is timed between two device synchronisations, so
the figures are per part, not overlapped; the whole kernel is timed as it runs.

    python bench/bench_gpu_parts.py [--rows 32768] [--dim 4096] [--components 1000]
                                    [--blocks 2048,8192,32768] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from bench_gpu import Device, random_params, time_pass  # noqa: E402


def part_times(dev: Device, chunk: Any, params: Any, block: int) -> dict[str, float]:
    """Seconds of each part of a diagonal pass over ``chunk`` in blocks of ``block`` rows, each part
    timed between two synchronisations (one warm-up pass first)."""
    from vbcore.kernels.blockgemm import log_rho_block, padded_weights, resp_t_dot
    from vbcore.kernels.estep import Sum64, array_namespace, normalise

    xp = array_namespace(chunk.x)
    dt = chunk.x.dtype
    w = xp.asarray(padded_weights(params.weights), dtype=dt)
    const = xp.asarray(params.const, dtype=dt)
    k, d = params.const.shape[0], chunk.x.shape[1]
    times: dict[str, float] = defaultdict(float)

    @contextmanager
    def timed(name: str) -> Iterator[None]:
        dev.sync()
        t = time.perf_counter()
        yield
        dev.sync()
        times[name] += time.perf_counter() - t

    for _rep in range(2):  # the first pass warms up
        times.clear()
        g, nk = Sum64(xp, (k, 2 * d)), Sum64(xp, (k,))
        for i in range(0, chunk.n_rows, block):
            f = chunk.features(i, min(i + block, chunk.n_rows))
            with timed("estep_gemm"):
                lr = log_rho_block(f, w, const)
            with timed("softmax"):
                resp = normalise(lr)[0]
            with timed("stats_gemm"):
                part = resp_t_dot(xp, resp, f)
            with timed("sum64_g"):
                g.add(part)
            with timed("sum64_nk"):
                nk.add(xp.sum(resp, axis=0, dtype=xp.float64))
        with timed("to_host"):
            g.result(), nk.result()
    return dict(times)


def kernel_time(dev: Device, chunk: Any, params: Any, block: int, repeat: int) -> float:
    """Median seconds of ``vbem_kernel`` over ``chunk`` with the kernels' block size set to ``block``."""
    import vbcore.kernels.estep as estep

    saved = estep.BLOCK_ROWS
    estep.BLOCK_ROWS = block
    try:
        return time_pass(lambda: estep.vbem_kernel(chunk, params), repeat, dev.sync)
    finally:
        estep.BLOCK_ROWS = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32_768)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--components", type=int, default=1000)
    ap.add_argument("--blocks", default="2048,8192,32768", help="block sizes (rows), comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gemm-size", type=int, default=8192)
    ap.add_argument("--backend", choices=("cupy", "strict"), default="cupy")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = Device(a.backend)
    from bench_vbem import relu_features

    from vbcore.kernels.estep import prepare_chunk

    n, d, k = a.rows, a.dim, a.components
    X = relu_features(n, d, k, seed=0)
    host, params = random_params(X, k, n)
    chunk = prepare_chunk(dev.asarray(X), host[0].shift, "diag")
    del X, host
    rate = dev.gemm_rate(a.gemm_size)
    flops = 8.0 * n * d * k
    print(f"vbcluster GPU pass parts: diag, N={n} D={d} K={k}, float32, on {dev.name} ({dev.version})")
    print(f"  float32 GEMM rate ({a.gemm_size}^3, same run): {rate / 1e12:.2f} TFLOP/s; the pass's GEMMs "
          f"({flops:.2e} flop) at that rate: {flops / rate * 1e3:.1f} ms")
    out: dict[str, Any] = {"device": dev.name, "versions": dev.version, "rows": n, "dim": d, "components": k,
                           "gemm_flops": rate, "flop_per_pass": flops, "blocks": {}}
    for block in (int(b) for b in a.blocks.split(",")):
        parts = part_times(dev, chunk, params, block)
        whole = kernel_time(dev, chunk, params, block, a.repeat)
        out["blocks"][block] = {"parts_s": parts, "kernel_s": whole, "gemm_share": flops / whole / rate}
        shown = "  ".join(f"{name} {secs * 1e3:.1f}" for name, secs in parts.items())
        print(f"  block {block:6d}: kernel {whole * 1e3:8.1f} ms = {flops / whole / rate:6.1%} of the GEMM "
              f"rate | parts (ms, synchronised): {shown}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
