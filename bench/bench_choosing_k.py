"""Issue 26's measurements: the bound of the true classes under each prior, the start's time, and
the number of clusters found from truncations of a quarter to ten times the truth.

    python bench/bench_choosing_k.py truth STORE [--iters 6]      # bound of the labels per prior
    python bench/bench_choosing_k.py init STORE -k 1000           # seconds of each start
    python bench/bench_choosing_k.py planted [--classes 40]       # K found from T/4 ... 10 T

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=("truth", "init", "planted"))
    p.add_argument("store", nargs="?")
    p.add_argument("-k", type=int, default=1000)
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--classes", type=int, default=40)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--rows", type=int, default=12000)
    a = p.parse_args()
    warnings.simplefilter("ignore")
    if a.part == "truth":
        truth(a.store, a.iters)
    elif a.part == "init":
        init(a.store, a.k)
    else:
        planted(a.classes, a.dim, a.rows)


if __name__ == "__main__":
    main()
