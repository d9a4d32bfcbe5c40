"""The ceiling of a model on planted classes: VB EM started from the TRUE labels.

    python bench/bench_truth_start.py STORE --run RUN_DIR [--nu0 V] [--exact] [--moves] [--out OUT.json]

``RUN_DIR`` is a finished default fit of ``STORE`` (``vbcluster fit STORE --run-dir RUN_DIR``); the fit
here uses the model that run kept (:func:`pipeline.fit.select.kept_model`: its family, priors and
``reg_covar`` at the selection's resolution) with ``components`` = the number of planted classes, started
from responsibilities that are the store's labels one-hot (``resp_init``: one M-step from them, then VB
EM). ``--nu0 V`` holds the prior's ``nu0`` at V: under the 'bound' priors the first M-step from the
labels is otherwise under the start's ``nu0 = min(4 D, 512)``, heavier than the small classes, and its
first E-step merges them before the bound re-estimates ``nu0``; pass the value the default run ended
with (its posterior's ``degrees_of_freedom``). ``--exact``: the exact E-step at any K (else the
truncated one from K = 300, as the defaults decide at the start). Without ``--moves`` the growth and the
merge/delete moves are off (plain VB EM: which planted classes the bound keeps); with ``--moves`` the
defaults' growth and moves run too. Printed beside the default run's: clusters, the exact bound per row
(the fit's ELBO, and the bound of the original rows at the selection's resolution as result.json's
``selection`` records it), NMI and ACC, and the planted classes that share a component (merged).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np

from pipeline.engine.sources import StoreSource
from pipeline.fit.driver import n_effective
from pipeline.fit.select import Selection, full_bounds, kept_model
from pipeline.service import finished_result, fit, read_spec
from vbcore.data.metrics import acc, nmi
from vbcore.kernels.estep import estep_params, log_rho, prepare_chunk


def hard_labels(source: StoreSource, post) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Each row's most responsible component (the exact E-step's argmax, chunk by chunk)."""
    shift = np.zeros(source.n_features)
    params = estep_params(post, shift)
    out = [
        np.argmax(
            np.asarray(log_rho(prepare_chunk(source.load(i), shift, post.covariance_type), params)), axis=1
        )
        for i in range(len(source.chunk_slices()))
    ]
    return np.concatenate(out)


def merged_classes(y: np.ndarray, z: np.ndarray) -> list[list[int]]:
    """Planted classes grouped by the component holding most of their rows (groups of two or more)."""
    owner = {int(c): int(np.bincount(z[y == c]).argmax()) for c in np.unique(y)}
    groups: dict[int, list[int]] = {}
    for c, k in owner.items():
        groups.setdefault(k, []).append(c)
    return [g for g in groups.values() if len(g) > 1]


def truth_spec(a: argparse.Namespace, run_spec, result: dict, n_classes: int):  # type: ignore[no-untyped-def]
    """The model the run kept, ``n_classes`` components, nothing selected, with the options of ``a``."""
    spec = replace(kept_model(run_spec, result), max_iter=a.max_iter, components=n_classes, select="none")
    opts = dict(spec.learner_options)
    if not a.moves:
        spec, opts["moves"] = replace(spec, grow=False), "none"
    if a.exact:
        opts["candidates"] = 0
    if a.priors is not None:
        spec = replace(spec, priors=a.priors)
    if a.nu0 is not None:
        spec = replace(spec, degrees_of_freedom_prior=a.nu0)
    return replace(spec, learner_options=opts).resolved("pipeline")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--run", required=True, help="a finished default fit of STORE")
    ap.add_argument("--moves", action="store_true", help="keep the defaults' growth and moves")
    ap.add_argument("--exact", action="store_true", help="the exact E-step (candidates=0) at any K")
    ap.add_argument("--nu0", type=float, default=None, help="hold the prior's nu0 at this value")
    ap.add_argument("--priors", default=None, help="another prior ('sklearn', 'empirical') than the run kept")
    ap.add_argument("--max-iter", type=int, default=200)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    source = StoreSource(a.store)
    y = np.asarray(source.labels())
    result = finished_result(a.run)
    assert result is not None, f"{a.run}: not a finished run"
    sel = Selection.from_dict(result["selection"])
    classes = np.unique(y)
    spec = truth_spec(a, read_spec(a.run), result, int(classes.size))
    resp = np.zeros((y.size, classes.size))
    resp[np.arange(y.size), np.searchsorted(classes, y)] = 1.0
    t = time.perf_counter()
    out = fit(spec, source, "local", random_state=spec.seed, resp_init=resp)
    wall = time.perf_counter() - t
    del resp
    n = source.n_rows
    z = hard_labels(source, out.post)
    terms = ("log_likelihood", "kl_assignments", "kl_weights", "kl_components")
    row = {
        "model": f"{spec.covariance}, {spec.priors}",
        "reg_covar": spec.reg_covar,
        "moves": a.moves,
        "options": out.options,
        "clusters": n_effective(out.post, out.prior),
        "components": out.post.n_components,
        "elbo_per_row": out.terms.total / n,
        "terms_per_row": {f: getattr(out.terms, f) / n for f in terms},
        "original_bound_per_row": full_bounds({0: out}, source, sel, spec.normalize)[0],
        "default_elbo_per_row": float(result["elbo"]) / n,
        "default_original_bound_per_row": sel.winner().full_bound,
        "default_clusters": result.get("n_effective"),
        "nmi": nmi(y, z),
        "acc": acc(y, z),
        "n_iter": out.n_iter,
        "converged": out.converged,
        "nu0": float(out.prior.degrees_of_freedom),
        "seconds": wall,
        "merged_groups": merged_classes(y, z),
    }
    print(json.dumps(row, indent=1, default=float))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(row, f, indent=1, default=float)


if __name__ == "__main__":
    main()
