"""The truncated E-step (issue 15) against the exact one, scikit-learn, and across K. Ratios in one run.

1. ``sun``: a SUN397-shaped synthetic store (``vbcluster ingest synthetic``; default 108,754 x 4096,
   397 classes), K = 1000, diag, DP, both warm-started from one k-means start (``max_iter=0``): VB EM
   with the exact and the truncated E-step, ``--iters`` iterations each: median time per iteration
   (iterations 2.. ; the truncated fit's first iteration scores every cluster, see
   ``first_search``), ELBO per row, NMI;
2. ``converge``: the truncated fit run to convergence (``tol`` 1e-4 per row): wall time (everything
   the fit does), iterations, NMI, clusters used;
3. ``sklearn``: N = 20,000, D = 512, K = 100 (bench_vbem's case), from the same responsibilities:
   time per iteration of scikit-learn's BayesianGaussianMixture and of our truncated and exact
   E-steps, and the NMI / ELBO difference truncated vs exact after ``--iters`` iterations;
4. ``curve``: time per iteration for ``--curve-k`` at fixed N, D, exact and truncated (a PNG with
   ``--plot``);
5. ``sgaf``: sga-f with the candidate MAP search, ``--sgaf-iters`` iterations including loading
   (``--sgaf-exact``: also without candidates);
6. ``tied``: 'tied' covariance on Gaussian blobs (N = 20,000, 100 classes; D = 64, K = 300 and
   D = 512, K = 1000), the same start: median time per iteration exact vs truncated, NMI, ELBO per row.

Run: ``python bench/bench_truncated.py [--parts sun,converge,sklearn,curve,sgaf,tied]
[--rows 108754 --dim 4096] [--workdir DIR] [--candidates 4 --neighbours 16]``. The store is made once
in ``--workdir``.
"""

from __future__ import annotations

import argparse
import copy
import os
import pickle
import statistics
import tempfile
import time
import warnings

import numpy as np


def _store(workdir: str, rows: int, dim: int, classes: int) -> str:
    from pipeline.ingest import ingest

    path = os.path.join(workdir, f"synthetic-{rows}x{dim}-{classes}.zarr")
    if not os.path.exists(path):
        t = time.perf_counter()
        ingest("synthetic", path, chunk_rows=8192, rows=rows, dim=dim, classes=classes, seed=0)
        print(f"  made {path} in {time.perf_counter() - t:.0f}s", flush=True)
    return path


#: the exact E-step: explicit, since the default (candidates=-1) is the truncated one from K = 300
EXACT = {"candidates": 0}
_STARTS: dict = {}
#: a directory where the k-means starts are pickled (``--start-cache``): made once, reused by later runs
_START_CACHE: str | None = None
args_verbose = False
#: the prior's degrees of freedom (``--dof``): at scikit-learn's default nu0 = D this store's bound
#: prefers one component and both fits collapse within 5 iterations (bench_converge.py), so the
#: per-iteration times would be those of a few dozen clusters, not of K
_DOF: float | None = 64.0


def _start(data, k: int) -> object:
    """The k-means start (``max_iter=0``), made once per (data, K) and shared by the fits."""
    from pipeline import VBMixture

    if (str(data), k) in _STARTS:
        return _STARTS[str(data), k]
    cache = None if _START_CACHE is None else os.path.join(_START_CACHE, f"start-{k}-dof{_DOF}.pkl")
    if cache is not None and os.path.exists(cache):
        with open(cache, "rb") as fh:
            model = pickle.load(fh)
        print(f"  k-means start, K={k}: loaded from {cache}", flush=True)
    else:
        t0 = time.perf_counter()
        model = VBMixture(k, covariance_type="diag", max_iter=0, random_state=0,
                          degrees_of_freedom_prior=_DOF).fit(data)
        print(f"  k-means start, K={k}: {time.perf_counter() - t0:.1f} s (not charged to the fits below)",
              flush=True)
        if cache is not None:
            with open(cache, "wb") as fh:
                pickle.dump(model, fh)
    _STARTS[str(data), k] = model
    return model


def _fit(data, start, iters: int, tol: float, opts: dict):
    """Warm-started fit from ``start``; return (model, wall seconds, per-iteration seconds)."""
    secs: list[float] = []
    # persist='always': the prepared chunks stay in memory (5.3 GB at full size, more than 'auto'
    # allows), so an iteration is the E-step and the M-step, not re-reading the store
    model = copy.deepcopy(start).set_params(warm_start=True, max_iter=iters, tol=tol, learner_options=opts,
                                            persist="always")
    t0 = time.perf_counter()

    def note(info: dict) -> None:
        secs.append(info["seconds"])
        if args_verbose:
            print(f"    iteration {len(secs)}: {info['seconds']:.2f} s", flush=True)

    model.fit(data, callback=note)
    return model, time.perf_counter() - t0, secs


def _per_iter(secs: list[float]) -> float:
    """Median seconds per iteration, leaving out the first (k-means start, first search)."""
    return statistics.median(secs[1:] if len(secs) > 1 else secs)


def _nmi(model, data, labels) -> float:
    from vbcore.data.metrics import nmi

    if isinstance(data, str):
        from pipeline.engine.sources import StoreSource

        src = StoreSource(data)
        pred = np.concatenate([model.predict(src.load(i)) for i in range(len(src.chunk_slices()))])
    else:
        pred = model.predict(data)
    return float(nmi(labels, pred))


def part_sun(args, trunc: dict) -> None:
    from pipeline.engine.sources import StoreSource

    store = _store(args.workdir, args.rows, args.dim, args.classes)
    labels = StoreSource(store).labels()
    n = len(labels)
    print(f"\n[sun] {n} x {args.dim}, K={args.k}, diag, DP, {args.iters} iterations each, same start")
    res = {}
    start = _start(store, args.k)
    from threadpoolctl import threadpool_limits

    runs = (("exact", EXACT), ("exact-1t", EXACT), ("truncated", trunc))
    for name, opts in runs if args.exact_1t else (runs[0], runs[2]):
        if name == "exact-1t":  # the exact E-step with one BLAS thread, as the truncated kernel runs
            with threadpool_limits(1, user_api="blas"):
                model, wall, secs = _fit(store, start, args.iters, 0.0, opts)
        else:
            model, wall, secs = _fit(store, start, args.iters, 0.0, opts)
        res[name] = (_per_iter(secs), model.lower_bound_ / n, _nmi(model, store, labels), wall, secs)
        print(f"  {name:9s}: {res[name][0]:7.2f} s/iteration (first {secs[0]:.2f} s), ELBO/row "
              f"{res[name][1]:.4f}, NMI {res[name][2]:.4f}, wall {wall:.1f} s, K kept {model.n_components_}",
              flush=True)
    e, t = res["exact"], res["truncated"]
    one = f"{res['exact-1t'][0] / t[0]:.1f}x" if "exact-1t" in res else "not run"
    print(f"  per-iteration speed-up: {e[0] / t[0]:.1f}x (goal >= 15x), against the exact E-step on one "
          f"BLAS thread {one}; NMI difference {t[2] - e[2]:+.4f} "
          f"(goal within 0.01); ELBO difference {(t[1] - e[1]) / abs(e[1]):+.3%} (goal within 0.1%)")


def part_converge(args, trunc: dict) -> None:
    from pipeline.engine.sources import StoreSource

    store = _store(args.workdir, args.rows, args.dim, args.classes)
    labels = StoreSource(store).labels()
    t0 = time.perf_counter()
    had_start = (store, args.k) in _STARTS
    model, _, secs = _fit(store, _start(store, args.k), args.max_iter, 1e-4, trunc)
    wall = time.perf_counter() - t0
    if had_start:
        print("  (the k-means start was made in the sun part: not in this wall time)")
    print(f"\n[converge] truncated VB EM, tol 1e-4: {wall:.1f} s wall incl. the start (goal <= 300 s), "
          f"{model.n_iter_} iterations, converged {model.converged_}, NMI {_nmi(model, store, labels):.4f}, "
          f"clusters kept {model.n_components_}, ELBO/row {model.lower_bound_ / len(labels):.4f}", flush=True)


def part_sklearn(args, trunc: dict) -> None:
    from bench_vbem import relu_features  # this directory is on sys.path when run as a script
    from sklearn.mixture import BayesianGaussianMixture

    from vbcore.data.metrics import nmi

    n, d, k = 20_000, 512, 100
    X = relu_features(n, d, k, seed=0)
    rng = np.random.default_rng(1)
    centres = X[rng.choice(n, k, replace=False)].astype(np.float64)
    d2 = (X.astype(np.float64) ** 2).sum(1)[:, None] - 2 * X @ centres.T + (centres**2).sum(1)[None]
    resp = np.zeros((n, k))
    resp[np.arange(n), np.argmin(d2, axis=1)] = 1.0
    print(f"\n[sklearn] N={n} D={d} K={k}, diag, DP, {args.iters} iterations from the same hard start")
    out = {}
    for name, opts in (("exact", EXACT), ("truncated", trunc)):
        from pipeline import VBMixture

        secs: list[float] = []
        m = VBMixture(k, covariance_type="diag", max_iter=args.iters, tol=0.0, random_state=0,
                      learner_options=opts)
        m.fit(X, resp_init=resp, callback=lambda info, s=secs: s.append(info["seconds"]))
        out[name] = (_per_iter(secs), m.lower_bound_ / n, m.predict(X))
    sk = BayesianGaussianMixture(n_components=k, covariance_type="diag",
                                 weight_concentration_prior_type="dirichlet_process",
                                 covariance_prior=X.var(0, dtype=np.float64), reg_covar=1e-6, max_iter=1)
    sk._check_parameters(X, xp=np)
    sk._initialize(X, resp)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, log_resp = sk._e_step(X, xp=np)
            sk._m_step(X, log_resp, xp=np)
            sk._compute_lower_bound(log_resp, None)
        times.append(time.perf_counter() - t)
    t_sk = statistics.median(times)
    labels = out["exact"][2]
    ex, tr = out["exact"], out["truncated"]
    print(f"  scikit-learn {t_sk:.3f} s/iteration; exact {ex[0]:.3f} s ({t_sk / ex[0]:.1f}x); "
          f"truncated {tr[0]:.3f} s ({t_sk / tr[0]:.1f}x, goal >= 20x)")
    print(f"  truncated vs exact: NMI(truncated labels, exact labels) {nmi(labels, tr[2]):.4f}, "
          f"ELBO/row {tr[1]:.4f} vs {ex[1]:.4f}", flush=True)


def part_sgaf(args, trunc: dict) -> None:
    """sga-f on the store, ``--sgaf-iters`` iterations from its own start, wall time including loading
    the store, with and without the candidate search (same seed)."""
    from pipeline import VBMixture
    from pipeline.engine.sources import StoreSource

    store = _store(args.workdir, args.rows, args.dim, args.classes)
    labels = StoreSource(store).labels()
    print(f"\n[sgaf] sga-f, K={args.k}, {args.sgaf_iters} iterations, minibatch 4000, wall incl. loading")
    runs = [("candidates", {"candidates": trunc["candidates"], "neighbours": trunc["neighbours"]})]
    if args.sgaf_exact:
        runs.append(("exact", {}))
    for name, opts in runs:
        t0 = time.perf_counter()
        m = VBMixture(args.k, learner="sga-f", max_iter=args.sgaf_iters, tol=0.0, random_state=0,
                      learner_options=opts).fit(store)
        wall = time.perf_counter() - t0
        print(f"  {name:10s}: {wall:6.1f} s wall (goal <= 30 s), NMI {_nmi(m, store, labels):.4f}, "
              f"clusters {m.n_components_}, ELBO/row {m.lower_bound_ / len(labels):.4f}", flush=True)


def part_tied(args, trunc: dict) -> None:
    from pipeline import VBMixture
    from vbcore.data.metrics import nmi

    for d, k in ((64, 300), (512, 1000)):
        rng = np.random.default_rng(0)
        centres = rng.normal(scale=4.0, size=(100, d))
        y = rng.integers(0, 100, size=20_000)
        X = (centres[y] + rng.normal(size=(20_000, d))).astype(np.float32)
        print(f"\n[tied] N=20000 D={d} K={k}, 100 classes, {args.iters} iterations from the same start")
        out = {}
        for name, opts in (("exact", EXACT), ("truncated", trunc)):
            secs: list[float] = []
            m = VBMixture(k, covariance_type="tied", max_iter=args.iters, tol=0.0, random_state=0,
                          init_params="random_from_data", learner_options=opts)
            m.fit(X, callback=lambda info, s=secs: s.append(info["seconds"]))
            out[name] = (_per_iter(secs), float(nmi(y, m.predict(X))), m.lower_bound_ / len(X))
            t, score, bound = out[name]
            print(f"  {name}: {t:.3f} s/iteration, NMI {score:.4f}, ELBO/row {bound:.4f}")
        print(f"  exact / truncated per iteration: {out['exact'][0] / out['truncated'][0]:.2f}x", flush=True)


def part_curve(args, trunc: dict) -> None:
    store = _store(args.workdir, args.rows, args.dim, args.classes)
    print(f"\n[curve] seconds per iteration at N={args.rows}, D={args.dim} ({args.curve_iters} iterations, "
          "median of 2..)")
    rows = []
    for k in args.curve_k:
        start = _start(store, k)
        e = _per_iter(_fit(store, start, args.curve_iters, 0.0, EXACT)[2])
        t = _per_iter(_fit(store, start, args.curve_iters, 0.0, trunc)[2])
        rows.append((k, e, t))
        print(f"  K={k:5d}: exact {e:7.2f} s, truncated {t:7.2f} s, ratio {e / t:5.1f}x", flush=True)
    if args.plot:
        import matplotlib.pyplot as plt

        ks, ex, tr = zip(*rows, strict=True)
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.loglog(ks, ex, "o-", label="exact E-step")
        ax.loglog(ks, tr, "s-", label=f"truncated (C'={trunc['candidates']}, G={trunc['neighbours']})")
        ax.set_xlabel("K")
        ax.set_ylabel("seconds per VB EM iteration")
        ax.set_title(f"N={args.rows}, D={args.dim}, diag, DP")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"  plot: {args.plot}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="sun,converge,sklearn,curve")
    ap.add_argument("--workdir", default=None, help="keep the store here (default: a temp dir)")
    ap.add_argument("--rows", type=int, default=108_754)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--classes", type=int, default=397)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--max-iter", type=int, default=200)
    ap.add_argument("--candidates", type=int, default=3)
    ap.add_argument("--neighbours", type=int, default=8)
    ap.add_argument("--search", default="best")
    ap.add_argument("--block-rows", type=int, default=64)
    ap.add_argument("--curve-k", type=lambda s: [int(v) for v in s.split(",")],
                    default=[100, 300, 1000, 3000])
    ap.add_argument("--curve-iters", type=int, default=4)
    ap.add_argument("--plot", default=None, help="write the cost curve here (PNG)")
    ap.add_argument("--sgaf-iters", type=int, default=30)
    ap.add_argument("--sgaf-exact", action="store_true", help="sgaf: also run sga-f without candidates")
    ap.add_argument("--verbose", action="store_true", help="print every iteration's time")
    ap.add_argument("--start-cache", default=None, help="pickle the k-means starts here and reuse them")
    ap.add_argument("--dof", type=float, default=64.0,
                    help="degrees_of_freedom_prior nu0 of the SUN397-shaped fits (0: scikit-learn's D)")
    ap.add_argument("--no-exact-1t", dest="exact_1t", action="store_false",
                    help="sun: leave out the exact fit on one BLAS thread")
    args = ap.parse_args()
    global _START_CACHE, args_verbose, _DOF
    _START_CACHE = args.start_cache
    _DOF = args.dof or None
    args_verbose = args.verbose
    from threadpoolctl import threadpool_info

    blas = [f"{i['internal_api']} {i.get('version')} ({i['num_threads']} threads)" for i in threadpool_info()]
    print(f"BLAS: {', '.join(blas)}; {os.cpu_count()} CPUs", flush=True)
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="vbcluster-bench-")
    os.makedirs(args.workdir, exist_ok=True)
    trunc = {"candidates": args.candidates, "neighbours": args.neighbours, "search": args.search,
             "block_rows": args.block_rows}
    print(f"truncated E-step options: {trunc}; prior nu0 {_DOF or 'D'} (store fits)")
    parts = {"sun": part_sun, "converge": part_converge, "sklearn": part_sklearn, "curve": part_curve,
             "sgaf": part_sgaf, "tied": part_tied}
    for name in args.parts.split(","):
        parts[name](args, trunc)


if __name__ == "__main__":
    main()
