"""What merge and delete moves cost with 'tied' covariances (issue 16's 30% budget), in one run.

20,000 x 32 planted Gaussian rows (20 classes, unit noise around centres drawn with scale 4), K = 100,
20 VB EM iterations with ``tol = 0`` and ``moves`` none / merge / merge,delete, each ``--reps`` times
on the in-process engine (one chunk thread): CPU and wall seconds, components found, ELBO per row,
and each configuration's median time as a ratio of the median without moves.

Run: ``python bench/bench_moves_cost.py [--reps 3] [--covariance tied]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    from pipeline import VBMixture
    from pipeline.engine.engines import LocalEngine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--covariance", default="tied")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n, d, c = 20_000, 32, 20
    centres = rng.normal(scale=4.0, size=(c, d))
    x = (centres[rng.integers(0, c, n)] + rng.normal(size=(n, d))).astype(np.float32)
    cpu: dict[str, list[float]] = {}
    wall: dict[str, list[float]] = {}
    for moves in ["none", "merge", "merge,delete"] * args.reps:
        t, w = time.process_time(), time.perf_counter()
        m = VBMixture(100, covariance_type=args.covariance, max_iter=20, tol=0.0, random_state=0,
                      learner_options={"moves": moves}, engine=LocalEngine(threads=1)).fit(x)
        cpu.setdefault(moves, []).append(time.process_time() - t)
        wall.setdefault(moves, []).append(time.perf_counter() - w)
        print(f"  {moves:13s} CPU {cpu[moves][-1]:6.2f} s, wall {wall[moves][-1]:6.2f} s, "
              f"components found {m.n_effective_:.0f}, ELBO/row {m.lower_bound_ / n:.4f}", flush=True)
    base_c, base_w = statistics.median(cpu["none"]), statistics.median(wall["none"])
    for moves in ("merge", "merge,delete"):
        print(f"{args.covariance}, moves={moves}: median CPU x{statistics.median(cpu[moves]) / base_c:.2f}, "
              f"wall x{statistics.median(wall[moves]) / base_w:.2f} of no moves (budget x1.30)")


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    main()
