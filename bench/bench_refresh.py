"""A growing store: the memoized refresh against a cold and a warm-started full-pass fit,
partial_fit over batches against fit on all, and a weighted coreset against the full fit.

Setting: a SUN397-shaped synthetic store (``vbcluster ingest synthetic``) of ``--rows`` x ``--dim``
with ``--classes`` classes, VB EM with diag covariance and ``--components`` components; the store is
fitted keeping memoized statistics (``memo=1``), grown by ``--grow`` (5%), then refitted three ways.

The model is the one users get (``--model cli``, the default): the command line's defaults, the
same for flows and scheduled refreshes (:class:`pipeline.fit.spec.FitSpec`): empirical priors, growth
(births), merge/delete moves and the projected k-means++ start. ``--model sklearn`` fits
``VBMixture``'s scikit-learn defaults instead (k-means start, scikit-learn's priors, no growth, no
moves). ``--components`` defaults to 200, twice the classes: the defaults shrink K on the bound
(moves, pruning) faster and more reliably than births grow it from below the truth. The first fit of
the 500,000 x 128 store at these defaults (load 4-6): from K = 100, 236 s, 73 iterations, 4 births,
105 clusters, NMI 0.9921 with the classes; from 150, 37 s, 111 clusters, NMI 0.9941; from 200, 50 s,
115 clusters, NMI 0.9949 (``VBMixture(100, ...)`` found 82 of 100 classes on a 52,500 x 128 store;
the command line 100 of 100 from ``-k 200`` on a 100,000 x 512 one: docs/guide.md, 'Choosing K').

* cold: the model's start, full passes (the default fit of the grown store);
* warm: from the first fit's posterior, full passes (what a refresh did before memoized statistics);
* memo: from the first fit's posterior and memoized statistics (``memo=--memo``): the new chunks
  first, then the ones whose responsibilities move.

Every figure is printed with the machine's load average; ratios are of times measured in this run.
Run with ``python bench/bench_refresh.py --workdir bench/out`` (``--rows 100000`` for a first figure).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
import warnings
from pathlib import Path

import numpy as np

from pipeline.fit.spec import estimator_params

KW = dict(covariance_type="diag", random_state=0, tol=1e-4, max_iter=300, chunk_rows=8192)
#: the model of ``--model``: the command line's defaults (FitSpec's, less the iterations, tolerance and
#: seed KW sets), or VBMixture's scikit-learn ones
MODELS = {"cli": {k: v for k, v in estimator_params("pipeline").items() if k not in KW}, "sklearn": {}}


def _fit(model, X, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        model.fit(X, **kw)
        return time.perf_counter() - t


def make_stores(workdir: Path, rows: int, grow: float, dim: int, classes: int) -> tuple[str, np.ndarray]:
    """The store (``rows`` rows) and the rows of the append; returns the store path and the labels of all."""
    from pipeline.ingest import ingest
    from pipeline.store.features import FeatureStore

    extra = int(round(rows * grow))
    full = workdir / f"refresh-all-{rows}x{dim}.zarr"
    if not full.exists():
        ingest("synthetic", full, rows=rows + extra, dim=dim, classes=classes, seed=0,
               chunk_rows=8192)
    src = FeatureStore.open(full)
    store = workdir / f"refresh-{rows}x{dim}.zarr"
    shutil.rmtree(store, ignore_errors=True)
    s = FeatureStore.create(store, dim, chunk_rows=8192, labels=True)
    s.append(src.read(slice(0, rows)), labels=src.read_labels(slice(0, rows)))
    return str(store), src.read_labels()


def append_rest(store: str, workdir: Path, rows: int, dim: int) -> None:
    from pipeline.store.features import FeatureStore

    src = FeatureStore.open(workdir / f"refresh-all-{rows}x{dim}.zarr")
    sl = slice(rows, src.n_rows)
    FeatureStore.open(store, "r+").append(src.read(sl), labels=src.read_labels(sl))


def first_fit(args: argparse.Namespace, workdir: Path, store: str, k: int) -> tuple[object, float]:
    """The fit of the store before the append (memoized statistics kept unless ``--memo 0``), pickled
    in ``workdir`` so a rerun with the same settings (``--reuse-first``) starts from the same model."""
    import pickle

    from pipeline import VBMixture

    opts = {"memo": 1.0} if args.memo > 0 else {}
    path = workdir / f"first-{args.rows}x{args.dim}-{args.classes}-{k}-{args.model}-{bool(opts)}.pkl"
    if args.reuse_first and path.exists():
        return pickle.loads(path.read_bytes()), float("nan")
    first = VBMixture(k, learner_options=opts, **KW)
    t_first = _fit(first, store)
    path.write_bytes(pickle.dumps(first))
    return first, t_first


def refresh(args: argparse.Namespace, workdir: Path) -> None:
    from pipeline import VBMixture
    from vbcore.data.metrics import nmi

    store, labels = make_stores(workdir, args.rows, args.grow, args.dim, args.classes)
    k = args.components
    KW.update(MODELS[args.model])
    first, t_first = first_fit(args, workdir, store, k)
    print(f"model: {args.model} ({MODELS[args.model] or 'scikit-learn defaults'}), K = {k}; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"first fit ({args.rows} rows): {t_first:.1f} s, {first.n_iter_} iterations, "
          f"{first.n_effective_} clusters, ELBO/row {first.lower_bound_ / args.rows:.6f}")
    append_rest(store, workdir, args.rows, args.dim)
    n = args.rows + int(round(args.rows * args.grow))

    def warm(opts):  # (the truncation the first fit grew to, if it did)
        m = VBMixture(first.prior_.n_components, learner_options=opts, warm_start=True, **KW)
        m.posterior_, m.prior_, m.warm_state_ = first.posterior_, first.prior_, first.warm_state_
        return m

    warm_full = warm({})
    t_warm = _fit(warm_full, store)
    cold = VBMixture(k, **KW)
    t_cold = _fit(cold, store)
    load = os.getloadavg()[0]
    print(f"grown store: {n} rows; load average {load:.1f}")
    runs = (("cold", cold, t_cold), ("warm full passes", warm_full, t_warm))
    if args.memo > 0:
        memo = warm({"memo": args.memo})
        t_memo = _fit(memo, store)
        runs += (("memo", memo, t_memo),)
    for name, m, t in runs:
        print(f"  {name:>17}: {t:8.1f} s, {m.n_iter_:3d} iterations, {m.n_passes_:3d} passes, "
              f"{m.n_effective_} clusters, "
              f"exact ELBO/row {m.lower_bound_ / n:.6f}, NMI {nmi(labels, m.predict(store)):.4f}")
    print(f"  warm / cold = {t_warm / t_cold:.3f} (target <= 0.20); load average {os.getloadavg()[0]:.1f}")
    if args.memo <= 0:
        return
    print(f"  memo adopted {memo.adopted_chunks_} of {-(-n // 8192)} chunks")
    print(f"  memo / cold = {t_memo / t_cold:.3f} (target <= 0.20); memo / warm = {t_memo / t_warm:.3f} "
          f"(target <= 0.40)")
    gap = abs(memo.lower_bound_ - warm_full.lower_bound_) / abs(warm_full.lower_bound_)
    dk = abs(memo.n_effective_ - warm_full.n_effective_) / max(warm_full.n_effective_, 1)
    print(f"  ELBO/row gap memo vs warm = {100 * gap:.4f}% (target <= 0.01%); clusters differ by "
          f"{100 * dk:.1f}% (target <= 2%)")
    lb = np.asarray(memo.lower_bounds_)
    near = np.flatnonzero(np.abs(lb - warm_full.lower_bound_) <= 1e-4 * abs(warm_full.lower_bound_))
    if near.size:  # what a stopping rule that knew the warm fit's bound could have saved
        print(f"  memo's bound first within 0.01% of the warm fit's at iteration {near[0] + 1} of "
              f"{lb.size}: about {(near[0] + 1) / lb.size * t_memo / t_warm:.3f} of the warm fit's time")
    if args.calibrate:
        calibrate(store, labels, cold, k, n)
    if args.partial:
        partial(store, labels, cold, k, n)
    if args.coreset > 0:
        coreset(store, labels, cold, k, args.coreset, n)


def calibrate(store: str, labels: np.ndarray, cold, k: int, n: int) -> None:
    """What ``fit`` itself reproduces: the cold fit again with another seed (its ELBO per row and
    the NMI of the two labelings), the yardstick of the partial_fit and coreset targets."""
    from pipeline import VBMixture
    from vbcore.data.metrics import nmi

    other = VBMixture(k, **{**KW, "random_state": 1})
    t = _fit(other, store)
    gap = abs(other.lower_bound_ - cold.lower_bound_) / abs(cold.lower_bound_)
    print(f"fit with seed 1: {t:.1f} s, {other.n_effective_} clusters, ELBO/row {other.lower_bound_ / n:.6f} "
          f"(seed 0: {cold.lower_bound_ / n:.6f}, {100 * gap:.3f}% apart); NMI of the two fits' labels "
          f"{nmi(cold.predict(store), other.predict(store)):.4f}; load {os.getloadavg()[0]:.1f}")


def bound_under(model, prior, store: str) -> tuple[float, float]:
    """Two models under one objective, the exact ELBO with ``prior`` of every row of ``store``:
    ``(as it ends, after one iteration)``. As it ends: q(theta) is ``model``'s posterior and q(Z) the
    E-step under it (the best assignments of every row for that posterior; no M-step). After one
    iteration: q(theta) from the M-step under ``prior`` that follows that E-step (each model gets the
    same one full VB EM iteration)."""
    from pipeline.engine.engines import LocalEngine
    from pipeline.fit.driver import CountingEngine
    from pipeline.fit.learners.vbem.learner import vbem_pass
    from pipeline.fit.setup import open_source, setup
    from vbcore.model.elbo import elbo_terms
    from vbcore.model.mstep import m_step

    spec = model.spec()
    ctx = setup(spec, open_source(store, int(spec.chunk_rows), None), CountingEngine(LocalEngine()), 0)
    stats = vbem_pass(ctx, model.posterior_).stats
    ends = elbo_terms(stats, model.posterior_, prior).total
    return ends, elbo_terms(stats, m_step(stats, prior, ctx.reg_covar), prior).total


def partial(store: str, labels: np.ndarray, full, k: int, n: int) -> None:
    """partial_fit over 10 batches of the grown store against fit on all of it (``full``). Each
    ``lower_bound_`` is under its own prior: partial_fit's data defaults follow every row seen (after
    the last batch, fit's) but each model re-estimates its own ``beta0``, and partial_fit's bound
    keeps each earlier batch's assignments from its call; so the two are also compared under fit's
    final prior (:func:`bound_under`: each model's posterior with its E-step on all rows, and after one
    more VB EM iteration over all rows from each)."""
    from pipeline import VBMixture
    from pipeline.store.features import FeatureStore
    from vbcore.data.metrics import nmi

    s = FeatureStore.open(store)
    model = VBMixture(k, **KW)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for b in np.array_split(np.arange(n), 10):
            model.partial_fit(s.read(slice(int(b[0]), int(b[-1]) + 1)))
    t = time.perf_counter() - t
    gap = abs(model.lower_bound_ - full.lower_bound_) / abs(full.lower_bound_)
    print(f"partial_fit, 10 batches: {t:.1f} s, {model.n_effective_} clusters; ELBO/row "
          f"{model.lower_bound_ / n:.6f} vs fit {full.lower_bound_ / n:.6f}: gap {100 * gap:.4f}% "
          f"(each under its own prior); load {os.getloadavg()[0]:.1f}")
    (mine, mine1), (theirs, theirs1) = (bound_under(m, full.prior_, store) for m in (model, full))
    print(f"  under fit's prior, each model as it ends (its posterior, its E-step on all rows): "
          f"ELBO/row {mine / n:.6f} vs fit {theirs / n:.6f}: partial_fit below fit by "
          f"{100 * (theirs - mine) / abs(theirs):.4f}% (target <= 0.1%; negative: above)")
    print(f"  the same after one VB EM iteration over all rows from each: {mine1 / n:.6f} vs "
          f"{theirs1 / n:.6f}: below by {100 * (theirs1 - mine1) / abs(theirs1):.4f}%; NMI with the classes "
          f"{nmi(labels, model.predict(store)):.4f} (fit: {nmi(labels, full.predict(store)):.4f})")
    with warnings.catch_warnings():  # a second lap: each batch passed again replaces its statistics
        warnings.simplefilter("ignore")
        for b in np.array_split(np.arange(n), 10):
            model.partial_fit(s.read(slice(int(b[0]), int(b[-1]) + 1)))
    gap = abs(model.lower_bound_ - full.lower_bound_) / abs(full.lower_bound_)
    mine = bound_under(model, full.prior_, store)[0]
    print(f"  after a second lap over the same batches: ELBO/row {model.lower_bound_ / n:.6f}, gap "
          f"{100 * gap:.4f}%; under fit's prior, as it ends, {mine / n:.6f}, below fit by "
          f"{100 * (theirs - mine) / abs(theirs):.4f}%")


def coreset(store: str, labels: np.ndarray, full, k: int, size: int, n: int) -> None:
    """A lightweight coreset (Bachem et al. 2018): rows drawn with probability
    ``q = 1/(2N) + d^2 / (2 sum d^2)`` (d: distance to the mean), weights ``1 / (size q)``; fitted with
    ``sample_weight`` and compared with the full fit on every row (NMI of the two labelings)."""
    from pipeline import VBMixture
    from pipeline.store.features import FeatureStore
    from vbcore.data.metrics import nmi

    x = FeatureStore.open(store).read()
    d2 = np.sum((x - x.mean(0)) ** 2, axis=1, dtype=np.float64)
    q = 0.5 / n + 0.5 * d2 / d2.sum()
    rng = np.random.default_rng(0)
    rows = rng.choice(n, size=size, replace=True, p=q / q.sum())
    w = 1.0 / (size * q[rows])
    want = full.predict(x)
    start = VBMixture(k, **{**KW, "max_iter": 0})  # the full fit's start: its k-means, one M-step
    _fit(start, store)
    for name, model in (("own start", VBMixture(k, **KW)), ("the full fit's start", VBMixture(k, **KW))):
        if name != "own start":
            model.set_params(warm_start=True)
            model.posterior_, model.prior_, model.n_features_in_ = start.posterior_, start.prior_, x.shape[1]
        t = _fit(model, x[rows], sample_weight=w)
        got = model.predict(x)
        print(f"coreset of {size} weighted rows, {name}: {t:.1f} s, {model.n_effective_} clusters; NMI "
              f"with the full fit's labels {nmi(want, got):.4f} (target >= 0.98); with the classes "
              f"{nmi(labels, got):.4f} (full fit: {nmi(labels, want):.4f}); load {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="bench/out")
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--components", type=int, default=200)
    ap.add_argument("--model", choices=sorted(MODELS), default="cli",
                    help="cli: the command line's defaults (growth, moves, empirical priors); "
                         "sklearn: VBMixture's scikit-learn defaults")
    ap.add_argument("--grow", type=float, default=0.05)
    ap.add_argument("--memo", type=float, default=0.1,
                    help="the memoized refresh's share (0: no memoized statistics, the first fit and "
                         "the refresh at the command line's defaults: the SUN397 shape's truncated E-step)")
    ap.add_argument("--reuse-first", action="store_true",
                    help="reuse the first fit pickled in --workdir by an earlier run of the same settings")
    ap.add_argument("--coreset", type=int, default=10_000)
    ap.add_argument("--no-partial", dest="partial", action="store_false")
    ap.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                    help="skip the second cold fit (seed 1) that measures what fit itself reproduces")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    refresh(args, workdir)


if __name__ == "__main__":
    main()
