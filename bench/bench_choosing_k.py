"""Issue 26's measurements: the bound of the true classes under each prior, the start's time, and
the number of clusters found from truncations of a quarter to ten times the truth.

    python bench/bench_choosing_k.py truth STORE [--iters 6]      # bound of the labels per prior
    python bench/bench_choosing_k.py init STORE -k 1000           # seconds of each start
    python bench/bench_choosing_k.py planted [--classes 40]       # K found from T/4 ... 10 T
    python bench/bench_choosing_k.py wider [--learners vbem sga-f] [--fresh]  # 21 (10) planted sets

Each line is printed as it is measured (with the load average): run it in the background with a log.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np

# 'empirical' re-estimates beta0 only; the covariance prior is held at nu0 = 512 times the data's
# variance (with it re-estimated too the bound has no maximum on ReLU features: vbcore/model/empirical.py)
PRIORS = {"sklearn": dict(prior_defaults="sklearn", weight_concentration_prior=1.0),
          "empirical": dict(prior_defaults="empirical")}


def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def truth(store: str, iters: int) -> None:
    """VB EM started from the labels under each prior: the bound the model gives the classes."""
    from pipeline.engine.sources import StoreSource
    from pipeline.estimator import VBMixture

    y = StoreSource(store).labels()
    assert y is not None, "the store has no labels"
    n, t = len(y), int(y.max()) + 1
    resp = np.zeros((n, t))
    resp[np.arange(n), y] = 1.0
    for name, kw in PRIORS.items():
        t0 = time.perf_counter()
        m = VBMixture(t, covariance_type="diag", max_iter=iters, random_state=0, **kw)
        m.fit(store, resp_init=resp)
        print(f"truth {name}: used {m.n_effective_} ELBO/row {m.lower_bound_ / n:.4f} nu0 "
              f"{m.degrees_of_freedom_prior_:.4g} {time.perf_counter() - t0:.0f}s {_load()}", flush=True)


def init(store: str, k: int) -> None:
    """Seconds from the prepared chunks to the first posterior, for each start."""
    from pipeline.engine.engines import make_engine
    from pipeline.fit.setup import initial_posterior, open_source, setup
    from pipeline.fit.spec import FitSpec

    source = open_source(store, 65536)
    for method in ("k-means++-projected", "kmeans"):
        spec = FitSpec(store=store, components=k, init=method).resolved()
        engine = make_engine("local", spec.persist)
        try:
            ctx = setup(spec, source, engine, 0)
            t0 = time.perf_counter()
            post = initial_posterior(spec, ctx, None, 0)
            print(f"init {method} K={k}: {time.perf_counter() - t0:.1f}s, {post.n_components} components "
                  f"{_load()}", flush=True)
            engine.release(ctx.handles)
        finally:
            engine.close()


def planted(classes: int, dim: int, rows: int) -> None:
    """Diagonal Gaussian classes (the model's family); the pipeline's defaults from T/4 to 10 T."""
    from sklearn.metrics import normalized_mutual_info_score

    from pipeline.estimator import VBMixture

    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3.0, size=(classes, dim))
    scales = rng.uniform(0.5, 1.5, size=(classes, dim))
    y = rng.integers(0, classes, size=rows)
    x = (centres[y] + rng.normal(size=(rows, dim)) * scales[y]).astype(np.float32)
    for k in sorted({max(1, classes // 4), classes // 2, classes, 2 * classes, 10 * classes}):
        t0 = time.perf_counter()
        m = VBMixture(k, covariance_type="diag", prior_defaults="empirical", grow=True,
                      init_params="k-means++-projected", max_iter=500, tol=1e-4, random_state=0).fit(x)
        found = m.n_effective_
        print(f"planted T={classes} from K={k}: {found} clusters ({abs(found - classes) / classes:.0%} off), "
              f"NMI {normalized_mutual_info_score(y, m.predict(x)):.3f}, "
              f"truncation {m.truncation_['final']}, "
              f"{time.perf_counter() - t0:.0f}s {_load()}", flush=True)


#: docs/algorithms.md "Wider checks": (rows, dims, classes, seed, scale of the centres, class shares, the
#: classes' standard deviations): shares "equal", or the alpha of Dirichlet(alpha) shares; sd 1, or
#: drawn from U(0.7, 1.4) per class ("hetero")
WIDER = {
    "equal sizes": [(8000, 64, 40, 1, 6.0), (20000, 64, 50, 2, 6.0), (40000, 128, 100, 3, 6.0),
                    (20000, 16, 20, 4, 6.0), (10000, 8, 12, 5, 6.0), (10000, 2, 6, 6, 15.0),
                    (5000, 3, 8, 7, 10.0), (20000, 4, 20, 8, 8.0), (30000, 64, 60, 9, 2.0),
                    (12000, 256, 30, 10, 1.0), (30000, 256, 30, 11, 1.0), (30000, 128, 30, 12, 0.5),
                    (20000, 64, 40, 13, 6.0, "equal", "hetero")],
    "Dirichlet(2) sizes": [(20000, 16, 20, 1, 6.0, 2.0), (20000, 64, 40, 2, 4.0, 2.0),
                           (30000, 64, 40, 3, 6.0, 2.0), (40000, 128, 60, 4, 3.0, 2.0)],
    "long-tailed sizes": [(100000, 32, 30, 3, 6.0, 0.5), (20000, 32, 30, 8, 6.0, 1.0),
                          (20000, 32, 30, 3, 6.0, 0.5), (50000, 64, 40, 14, 6.0, 0.5)],
}

#: the same kinds with other seeds and shapes, never tuned on (``wider --fresh``): a check that what
#: :data:`WIDER` measures is not fitted to its sets
WIDER_FRESH = {
    "equal sizes": [(10000, 32, 40, 101, 6.0), (20000, 128, 60, 102, 3.0), (10000, 4, 12, 103, 10.0),
                    (20000, 256, 40, 104, 1.0), (30000, 64, 30, 105, 0.7),
                    (15000, 32, 25, 106, 6.0, "equal", "hetero")],
    "Dirichlet(2) sizes": [(20000, 32, 30, 107, 5.0, 2.0), (30000, 128, 50, 108, 2.0, 2.0)],
    "long-tailed sizes": [(50000, 32, 25, 109, 6.0, 0.5), (30000, 64, 30, 110, 6.0, 1.0)],
    # diagonal covariances of their own (VB EM's family, not the point learners' isotropic one)
    "diag classes": [(20000, 32, 30, 201, 6.0, "equal", "diag"), (20000, 64, 40, 202, 3.0, "equal", "diag"),
                     (10000, 8, 15, 203, 8.0, "equal", "diag"), (30000, 128, 50, 204, 2.0, 2.0, "diag"),
                     (40000, 32, 30, 205, 6.0, 0.5, "diag")],
}


def planted_set(rows: int, dim: int, classes: int, seed: int, scale: float, shares: object = "equal",
                sd: str = "unit") -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes: centres N(0, scale^2 I), labels uniform or of Dirichlet shares; unit
    deviations, or ``sd='hetero'`` one deviation per class in U(0.7, 1.4), or ``sd='diag'`` one per
    class and dimension in U(0.5, 2)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=scale, size=(classes, dim))
    if shares == "equal":
        y = rng.integers(0, classes, size=rows)
    else:
        y = rng.choice(classes, size=rows, p=rng.dirichlet(np.full(classes, float(shares))))  # type: ignore[arg-type]
    if sd == "diag":
        spread = rng.uniform(0.5, 2.0, size=(classes, dim))[y]
    else:
        spread = (rng.uniform(0.7, 1.4, size=classes) if sd == "hetero" else np.ones(classes))[y, None]
    return (centres[y] + spread * rng.normal(size=(rows, dim))).astype(np.float32), y


def wider(learners: list[str], sets_by_group: dict | None = None) -> None:
    """Each set of :data:`WIDER` (or ``sets_by_group``) from a quarter, half, 1x, 3x and 10x the truth
    (classes holding rows), the command line's model (its covariance: ``diag`` for VB EM, ``fixed``
    for the point learners); fits within 10% counted."""
    from sklearn.metrics import normalized_mutual_info_score

    from pipeline.estimator import VBMixture
    from pipeline.fit.spec import FitSpec, estimator_params

    tally: dict[tuple[str, str], list[int]] = {}
    for group, sets in (sets_by_group or WIDER).items():
        for args in sets:
            x, y = planted_set(*args)  # type: ignore[arg-type]
            truth = int(np.unique(y).size)
            for learner in learners:
                for k in (max(1, truth // 4), truth // 2, truth, 3 * truth, 10 * truth):
                    params = estimator_params()  # and the command line's covariance for the learner
                    params["covariance_type"] = FitSpec.from_dict({"store": "-", "learner": learner}) \
                        .resolved("pipeline").covariance
                    t0 = time.perf_counter()
                    m = VBMixture(k, learner=learner, **params).fit(x)
                    ok = abs(m.n_effective_ - truth) <= 0.1 * truth
                    tally.setdefault((group, learner), []).append(int(ok))
                    print(f"{group} {args} truth {truth} {learner} K={k}: {m.n_effective_} clusters, NMI "
                          f"{normalized_mutual_info_score(y, m.predict(x)):.3f}, {'ok' if ok else 'MISS'} "
                          f"{time.perf_counter() - t0:.1f}s {_load()}", flush=True)
    for (group, learner), oks in tally.items():
        print(f"{group}, {learner}: {sum(oks)} of {len(oks)} fits within 10% of the truth")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=("truth", "init", "planted", "wider"))
    p.add_argument("store", nargs="?")
    p.add_argument("-k", type=int, default=1000)
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--classes", type=int, default=40)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--rows", type=int, default=12000)
    p.add_argument("--learners", nargs="+", default=["vbem", "sga-f"])
    p.add_argument("--fresh", action="store_true", help="wider: the sets of WIDER_FRESH")
    a = p.parse_args()
    warnings.simplefilter("ignore")
    if a.part == "truth":
        truth(a.store, a.iters)
    elif a.part == "init":
        init(a.store, a.k)
    elif a.part == "wider":
        wider(a.learners, WIDER_FRESH if a.fresh else None)
    else:
        planted(a.classes, a.dim, a.rows)


if __name__ == "__main__":
    main()
