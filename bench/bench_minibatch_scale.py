"""Minibatch learners at scale (issue 52, deliver 3): do ``sga-f`` and ``svi`` at their defaults reach
VB EM's converged NMI - 0.01 in at most a quarter of VB EM's wall time, from the same K?

VB EM is ``VBMixture(K, covariance_type="diag", random_state=0)`` at its defaults (run to
convergence); ``sga-f`` and ``svi`` are ``VBMixture(K, learner=NAME, random_state=0)`` at theirs
(fixed covariance, DP weights) but ``max_iter`` (their 100 steps of 4,000 rows are 0.1% of 4M
rows), optionally with ``learner_options`` from ``--options``. Every fit runs
in a fresh process on the in-process engine with the default ``persist='auto'`` (a store over half
of the memory budget is streamed). The learner's ``step`` is wrapped to keep the posterior after
every iteration and its wall time since ``fit`` began (the setup and initialisation included); a
minibatch learner is stopped once it has run ``--stop`` times VB EM's wall time. Afterwards (not
timed) each kept posterior labels the first ``--eval-rows`` rows of the store (the VB E-step's
argmax, as ``predict``) and its NMI against the store's labels is computed; the synthetic stores'
rows are in random order, so these rows stand for all of them.

Run (heavy: under the machine's benchmark lock):
  flock /work/wt/bench.lock python bench/bench_minibatch_scale.py --store STORE [--k 100]
  [--learners sga-f,svi] [--stop 0.5] [--eval-rows 262144] [--options '{"minibatch_slice": 1}']
  [--vbem-limit SECONDS]
``--vbem-limit`` stops VB EM after that many seconds (its last iteration finished) where it cannot
converge in the time there is (the 16M store: tens of minutes); the output then says "NOT converged"
and the target is the NMI it reached. Every fit writes ``step ITERATION SECONDS K COMPONENTS`` to
stderr as it runs. ``--child`` is internal (one fit; prints one JSON line).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Stop(Exception):
    """Raised inside a step once the fit has run its time budget."""


def child(store: str, learner: str, k: int, limit: float, options: dict, eval_rows: int) -> None:
    from pipeline import VBMixture
    from pipeline.fit.learners import learner_class

    kept: list[tuple[int, float, object]] = []
    cls = learner_class(learner)
    real_step = cls.step
    t0 = time.perf_counter()

    def step(self, iteration):  # type: ignore[no-untyped-def]
        post, terms = real_step(self, iteration)
        kept.append((iteration, time.perf_counter() - t0, post))
        print(f"step {iteration} {kept[-1][1]:.2f} s K {post.n_components}", file=sys.stderr, flush=True)
        if limit > 0 and time.perf_counter() - t0 > limit:
            raise Stop
        return post, terms

    cls.step = step
    # a minibatch fit ends at its time budget, not at max_iter's default (100 steps: 0.4M rows)
    kw = {"covariance_type": "diag"} if learner == "vbem" else {"learner": learner, "max_iter": 10**6}
    m = VBMixture(k, random_state=0, learner_options=options or None, **kw)
    t0 = time.perf_counter()
    stopped = False
    try:
        m.fit(store)
    except Stop:
        stopped = True
    wall = time.perf_counter() - t0
    shift = np.asarray(m.prior_.mean) if hasattr(m, "prior_") else None
    print(json.dumps({"learner": learner, "wall": wall, "stopped": stopped, "iters": len(kept),
                      "curve": evaluate(store, kept, eval_rows, shift)}), flush=True)


def evaluate(store: str, kept: list, eval_rows: int, shift: np.ndarray | None) -> list[list[float]]:
    """[iteration, seconds, NMI, components] of a geometric subset of the kept posteriors (every one
    of the first 20), labelling the first ``eval_rows`` rows of the store."""
    from pipeline.engine.sources import StoreSource
    from vbcore.data.metrics import nmi
    from vbcore.kernels.estep import estep_params, prepare_chunk, responsibilities

    src = StoreSource(store)
    n_chunks = max(1, min(len(src.chunk_slices()), -(-eval_rows // src.chunk_rows)))
    x = np.concatenate([src.load(i) for i in range(n_chunks)])
    y = src.labels()[: x.shape[0]]
    picks = sorted({*range(min(20, len(kept))),
                    *np.unique(np.geomspace(1, len(kept), 40).astype(int) - 1).tolist(), len(kept) - 1})
    out = []
    for i in picks:
        it, sec, post = kept[i]
        sh = np.asarray(shift if shift is not None else np.zeros(x.shape[1]), dtype=np.float64)
        params = estep_params(post, sh)
        lab = np.concatenate([np.asarray(responsibilities(prepare_chunk(x[a:a + 8192], sh,
                                                                        post.covariance_type), params))
                              .argmax(1) for a in range(0, x.shape[0], 8192)])
        out.append([it, round(sec, 2), round(float(nmi(y, lab)), 4), int(post.n_components)])
    return out


def run(store: str, learner: str, k: int, limit: float, options: str, eval_rows: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", store, learner, "--k", str(k),
                          "--limit", str(limit), "--options", options, "--eval-rows", str(eval_rows)],
                         stdout=subprocess.PIPE, text=True)  # stderr: the steps, as they run
    if out.returncode != 0:
        raise SystemExit(f"{learner} failed (exit {out.returncode}; its stderr is above)")
    return json.loads(out.stdout.strip().splitlines()[-1])


def reached(curve: list[list[float]], target: float) -> list[float] | None:
    return next((c for c in curve if c[2] >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--learners", default="sga-f,svi")
    ap.add_argument("--stop", type=float, default=0.5, help="stop a minibatch fit at this share of VB EM")
    ap.add_argument("--eval-rows", type=int, default=262144)
    ap.add_argument("--options", default="{}", help="learner_options of the minibatch learners (JSON)")
    ap.add_argument("--vbem-wall", type=float, default=None, help="skip VB EM: its wall (s) and NMI")
    ap.add_argument("--vbem-nmi", type=float, default=None)
    ap.add_argument("--vbem-limit", type=float, default=0.0,
                    help="stop VB EM after this many seconds (0: run it to convergence)")
    ap.add_argument("--child", nargs=2, metavar=("STORE", "LEARNER"))
    ap.add_argument("--limit", type=float, default=0.0)
    a = ap.parse_args()
    if a.child:
        opts = json.loads(a.options) if a.child[1] != "vbem" else {}
        child(a.child[0], a.child[1], a.k, a.limit, opts, a.eval_rows)
        return
    print(f"store {a.store}; K = {a.k}; load {os.getloadavg()[0]:.2f}", flush=True)
    if a.vbem_wall is None:
        v = run(a.store, "vbem", a.k, a.vbem_limit, "{}", a.eval_rows)
        wall, best = v["wall"], v["curve"][-1][2]
        state = "stopped at --vbem-limit, NOT converged" if v["stopped"] else "converged"
        print(f"vbem ({state}): {v['iters']} iterations, {wall:.1f} s, NMI {best:.4f}; curve {v['curve']}; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
    else:
        wall, best = a.vbem_wall, a.vbem_nmi
    target = best - 0.01
    for learner in a.learners.split(","):
        r = run(a.store, learner, a.k, a.stop * wall, a.options, a.eval_rows)
        hit = reached(r["curve"], target)
        when = ("never" if hit is None
                else f"iteration {hit[0]} at {hit[1]:.1f} s = {hit[1] / wall:.2f} of VB EM")
        print(f"{learner} {a.options}: {r['iters']} iterations in {r['wall']:.1f} s; NMI >= {target:.4f}: "
              f"{when}; last NMI {r['curve'][-1][2]:.4f}; curve {r['curve']}; load {os.getloadavg()[0]:.2f}",
              flush=True)


if __name__ == "__main__":
    main()
