"""Randomized range finders against the exact projection pass (``--pca``): cost and captured variance.

The exact pass (:func:`pipeline.fit.projection.data_moments` and
:func:`vbcore.kernels.projection.fit_projection`) costs ``N D^2`` flops. The randomized solver
(``--pca-solver randomized``: :mod:`vbcore.kernels.sketch`, three passes on ``P + 32`` vectors) is
one point of a family, measured here on one store in one run, each variant with the library's
kernel (float32 GEMMs over blocks of 4,096 rows about a common shift, float64 sums, the engine's
fixed-order reduction, in-process on its threads) on chunks read once and kept in memory:

* ``nystrom1_kK``: one pass, ``Y = C Omega`` (``K`` Gaussian columns), the stabilised Nystrom
  approximation ``Y (Omega^T Y)^+ Y^T`` (Tropp et al. 2017) and its ``P``
  leading eigenvectors (its eigenvalues are biased low: not the data's variances);
* ``rrQ_kK``: ``Q`` passes of subspace iteration on ``K`` vectors with the Rayleigh-Ritz step on the
  last span (:func:`vbcore.kernels.sketch.randomized_projection`; Halko et al. 2011).

For each: the CPU seconds of its passes over the exact pass's (which also reads the store), the
variance its ``P`` vectors capture over the optimum (the ``P`` leading eigenvalues of the exact
covariance, ``tr(U^T C U) / sum(lambda_1..P)``) and the largest principal angle to the exact
subspace. ``read_once_cpu_s`` is the one read of the store the variants share. Run ``python
bench/bench_sketch.py --store /work/scratch/sun.zarr --pca 128`` (``make bench`` runs it on its
synthetic store); prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
from typing import Any

import numpy as np
import scipy.linalg


class Sketcher:
    """``S Q`` for the store's centred scatter ``S``: one engine pass of the library's
    :func:`vbcore.kernels.sketch.sketch_kernel` each, on chunks kept in memory (read once), CPU
    seconds kept."""

    def __init__(self, engine: Any, source: Any) -> None:
        from vbcore.kernels.sketch import centred_rows

        self.engine, self.source = engine, source
        self.shift = np.asarray(source.load(0)[0], dtype=np.float64)
        t = cpu()
        self.handles = engine.prepare(source, centred_rows, self.shift, persist="auto")
        self.read_s = cpu() - t
        self.seconds = 0.0

    def apply(self, q: np.ndarray, first: bool = False) -> Any:
        from vbcore.kernels.sketch import sketch_kernel

        t = cpu()
        part = self.engine.map_reduce(sketch_kernel, self.handles, q, None,
                                      per_chunk=[s.start for s in self.source.chunk_slices()])
        self.seconds += cpu() - t
        return part

    def close(self) -> None:
        self.engine.release(self.handles)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def nystrom(omega: np.ndarray, y: np.ndarray, p: int) -> np.ndarray:
    """The ``p`` leading eigenvectors of the shifted, stabilised Nystrom approximation (Tropp et al. 2017)."""
    od = omega.astype(np.float64)
    nu = float(np.finfo(np.float32).eps) * float(np.linalg.norm(y))
    yn = y + nu * od
    core = od.T @ yn
    lower = np.linalg.cholesky((core + core.T) * 0.5)
    b = scipy.linalg.solve_triangular(lower, yn.T, lower=True).T
    return np.linalg.svd(b, full_matrices=False)[0][:, :p]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="/work/scratch/sun.zarr")
    ap.add_argument("--pca", type=int, default=128)
    ap.add_argument("--k", type=int, nargs="+", help="sketch widths (default: P + 32 and 2 P)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from pipeline.engine.blas import blas_libraries, one_blas_thread
    from pipeline.engine.engines import LocalEngine
    from pipeline.engine.sources import StoreSource
    from pipeline.fit.projection import data_moments
    from vbcore.kernels.projection import fit_projection
    from vbcore.kernels.sketch import randomized_projection

    src, engine, p = StoreSource(args.store), LocalEngine(), int(args.pca)
    d = src.n_features
    out: dict[str, Any] = {"store": args.store, "shape": [src.n_rows, d], "pca": p,
                           "threads": engine.threads, "load_before": [round(v, 2) for v in os.getloadavg()]}
    t = cpu()
    moments = data_moments(engine, src)
    with one_blas_thread():
        exact = fit_projection(moments, p, eps=float(np.finfo(np.dtype(src.dtype)).eps))
    exact_s = cpu() - t
    cov = moments.covariance()
    optimum = float(exact.variances.sum())
    out["exact"] = {"cpu_s": round(exact_s, 2),
                    "variance_top_p_over_total": round(optimum / float(np.trace(cov)), 4)}
    out["blas"] = blas_libraries()

    def score(u: np.ndarray, passes: int, seconds: float) -> dict[str, Any]:
        captured = float(np.einsum("ij,ij->", u, cov @ u))
        cos = np.linalg.svd(exact.components.T @ u, compute_uv=False)
        return {"passes": passes, "cpu_s": round(seconds, 2), "over_exact_cpu": round(seconds / exact_s, 3),
                "captured_over_optimum": round(captured / optimum, 5),
                "largest_angle_rad": round(float(np.arccos(np.clip(cos.min(), -1.0, 1.0))), 3)}

    sk = Sketcher(engine, src)
    out["read_once_cpu_s"] = round(sk.read_s, 2)
    eps32 = float(np.finfo(np.float32).eps)
    try:
        for k in args.k or [p + 32, 2 * p]:
            omega = np.random.default_rng(args.seed).standard_normal((d, k)).astype(np.float32)
            sk.seconds = 0.0
            y = sk.apply(omega).scatter_times(omega.astype(np.float64))
            with one_blas_thread():
                out[f"nystrom1_k{k}"] = score(nystrom(omega, y, p), 1, sk.seconds)
            for passes in (2, 3, 4):
                sk.seconds = 0.0
                with one_blas_thread():
                    proj = randomized_projection(sk.apply, sk.shift, p, False,
                                                 np.random.default_rng(args.seed), np.float32, eps32,
                                                 passes=passes, oversample=k - p)
                out[f"rr{passes}_k{k}"] = score(proj.components, passes, sk.seconds)
            print(json.dumps(out), flush=True)
    finally:
        sk.close()
    out["load_after"] = [round(v, 2) for v in os.getloadavg()]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
