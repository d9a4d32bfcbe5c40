"""NCG vs VB EM (issue 5). Ratios measured in one run; never bare times alone.

1. per iteration: engine passes and seconds of ``ncg`` vs ``vbem`` on a 1,000,000-row feature store
   (D = 16, K = 16, float32, ``diag`` and ``full``, in-process LocalEngine, the process's BLAS
   threads), median over the iterations after the first two;
2. time to converge on the Kuusela et al. 2009 cluster data (sec. V-A: 5 spherical Gaussians at (0,0) and
   (+-R, +-R), std 0.1, N = 1000) for small R: ``vbem``, ``vbem-ps`` and ``ncg`` from the same paper's
   initialisations (K = 8, means ~ N(0, 0.16 I), alpha_k = 1, beta_k = 10, nu_k = D, W_k = 4/D I), the
   priors of sec. V, and the sec. V stopping rule (``C_{k-1} - C_k < 1e-8 N`` on two consecutive
   iterations); per initialisation the ratio to VB EM's time and passes, and their medians.

Run: `python bench/bench_ncg.py [--only store,cluster] [--workdir DIR] [--inits N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

STORE_ROWS, STORE_D, STORE_K = 1_000_000, 16, 16


def _make_store(path: str) -> None:
    from pipeline.store.features import FeatureStore

    if os.path.exists(path):
        return
    t = time.perf_counter()
    rng = np.random.default_rng(0)
    centres = rng.normal(0.0, 3.0, size=(STORE_K, STORE_D))
    store = FeatureStore.create(path, STORE_D, chunk_rows=65536)

    def batches():
        for _ in range(STORE_ROWS // 100_000):
            z = rng.integers(0, STORE_K, 100_000)
            x = centres[z] + rng.normal(size=(100_000, STORE_D)) * rng.uniform(0.5, 1.5, size=(1, STORE_D))
            yield x.astype(np.float32), None, None

    store.append_batches(batches())
    print(f"  made {path}: {STORE_ROWS} x {STORE_D} float32 in {time.perf_counter() - t:.0f}s")


def store_iterations(workdir: str, iters: int = 8) -> None:
    from pipeline import VBMixture

    path = os.path.join(workdir, "ncg1m.zarr")
    _make_store(path)
    print(f"1. per iteration on a {STORE_ROWS:,} x {STORE_D} store, K = {STORE_K} (LocalEngine, median of "
          f"iterations 3..{iters})")
    for ct in ("diag", "full"):
        res = {}
        for learner in ("vbem", "ncg"):
            seen: list[dict] = []
            m = VBMixture(STORE_K, covariance_type=ct, learner=learner, max_iter=iters, tol=0.0,
                          random_state=0, weight_concentration_prior_type="dirichlet_distribution")
            m.fit(path, callback=seen.append)
            secs = [s["seconds"] for s in seen[2:]]
            passes = np.diff([0] + [s["passes"] for s in seen])[2:]  # per iteration (after start)
            res[learner] = (statistics.median(secs), float(np.mean(passes)), m.lower_bound_)
            print(f"   {ct:4s} {learner:4s}: {res[learner][1]:.2f} passes/iteration, "
                  f"{res[learner][0]:.2f} s/iteration, ELBO after {iters} iterations {m.lower_bound_:.6e}")
        (tv, pv, _), (tn, pn, _) = res["vbem"], res["ncg"]
        print(f"   {ct:4s} ncg/vbem: {pn / pv:.2f}x passes, {tn / tv:.2f}x time per iteration "
              f"({tn / pn / (tv / pv):.2f}x per pass)")


def cluster_data(r: float, seed: int, n: int = 1000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.array([[0, 0], [r, r], [r, -r], [-r, r], [-r, -r]])
    return centres[rng.integers(0, 5, n)] + rng.normal(0.0, 0.1, size=(n, 2))


def seed000_posterior(k: int, d: int, seed: int):
    """Kuusela et al. 2009 sec. V initialisation: m_k ~ N(0, 0.16 I), alpha_k = 1, beta_k = 10, nu_k = D,
    W_k = 4/D I (so E[Lambda_k]^-1 = (nu_k W_k)^-1 = I / 4)."""
    from vbcore.model.posterior import Posterior

    rng = np.random.default_rng(seed)
    return Posterior("full", "dirichlet_distribution", np.ones(k), np.full(k, 10.0),
                     rng.normal(0.0, 0.4, size=(k, d)), np.full(k, float(d)),
                     np.repeat(np.eye(d)[None] / 4.0, k, axis=0))


def _vbem_seed000():
    """VB EM with the Kuusela et al. 2009 stopping rule (the registered 'vbem' stops on |dELBO|/N < tol)."""
    from pipeline.fit.learners import LEARNERS
    from pipeline.fit.learners.gradient.learners import seed000_converged
    from pipeline.fit.learners.vbem.learner import VBEM

    class VBEMSeed000(VBEM):
        def converged(self, history, tol):
            return seed000_converged(history, 1e-8, self.ctx.n_rows)

    LEARNERS.setdefault("vbem-seed000-bench", VBEMSeed000)
    return "vbem-seed000-bench"


def converge_times(inits: int, radii: tuple[float, ...] = (0.15, 0.2, 0.3)) -> None:
    from pipeline import VBMixture

    vbem = _vbem_seed000()
    learners = {"vbem": (vbem, None), "vbem-ps": ("vbem-ps", {"convergence": "seed000"}),
                "ncg": ("ncg", {"convergence": "seed000"})}
    print(f"2. time to converge on Kuusela et al. 2009 cluster data (N = 1000, K = 8, {inits} inits per R, "
          "medians; eps = 1e-8 N twice)")
    for r in radii:
        X = cluster_data(r, seed=0)
        d = X.shape[1]
        out: dict[str, list[tuple[float, int, float, int]]] = {k: [] for k in learners}
        for i in range(inits):
            for label, (name, opts) in learners.items():
                m = VBMixture(8, covariance_type="full",
                              weight_concentration_prior_type="dirichlet_distribution",
                              weight_concentration_prior=1.0, mean_precision_prior=1.0,
                              mean_prior=np.zeros(d), degrees_of_freedom_prior=float(d),
                              covariance_prior=np.eye(d) * d / 4.0, reg_covar=0.0, learner=name,
                              learner_options=opts, max_iter=20000, tol=0.0, warm_start=True,
                              chunk_rows=4096)
                m.posterior_ = seed000_posterior(8, d, seed=100 + i)
                t = time.perf_counter()
                m.fit(X)
                out[label].append((time.perf_counter() - t, m.n_iter_, m.lower_bound_, m.n_passes_))
        base = out["vbem"]
        print(f"   R = {r}: vbem median {statistics.median(v[1] for v in base):.0f} iterations; to converge "
              "vs vbem from the same initialisation (median of the ratios):")
        for k, vals in out.items():
            if k == "vbem":
                continue
            t_ratio = statistics.median(a[0] / b[0] for a, b in zip(vals, base, strict=True))
            p_ratio = statistics.median(a[3] / b[3] for a, b in zip(vals, base, strict=True))
            print(f"      {k:8s} {t_ratio:.2f}x time, {p_ratio:.2f}x passes (median "
                  f"{statistics.median(v[1] for v in vals):.0f} iterations, "
                  f"{statistics.median(v[3] for v in vals):.0f} passes)")
        best = max(v[2] for vals in out.values() for v in vals)
        for k, vals in out.items():
            hits = sum(v[2] > best - 1e-3 * abs(best) for v in vals)
            conv = sum(v[1] < 20000 for v in vals)
            print(f"      {k:8s} median ELBO {statistics.median(v[2] for v in vals):.4f} (best {best:.4f}); "
                  f"{hits}/{len(vals)} within 0.1% of the best; {conv}/{len(vals)} converged")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="store,cluster")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--inits", type=int, default=5)
    args = ap.parse_args()
    parts = args.only.split(",")
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-ncg-")
    os.makedirs(workdir, exist_ok=True)
    from threadpoolctl import threadpool_info, threadpool_limits

    # One BLAS thread for every learner: on this shared 2-core machine a multi-threaded OpenBLAS
    # spin-waits when the cores are busy (one VB EM pass of part 1 took 8-40 s instead of 1 s).
    with threadpool_limits(1):
        blas = [f"{i['internal_api']} {i['version']} ({i['num_threads']} thread)" for i in threadpool_info()]
        print(f"BLAS: {', '.join(blas)}")
        if "store" in parts:
            store_iterations(workdir)
        if "cluster" in parts:
            converge_times(args.inits)


if __name__ == "__main__":
    main()
