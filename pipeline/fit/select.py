"""Model selection by the exact bound (issue 51): screen candidate models on a subsample, fit the best.

The candidates are the covariance families (diag, spherical, and full and tied up to
``FULL_MAX_FEATURES`` dimensions) times the ways of filling the priors (``PRIORS``: the 'empirical'
defaults, 'bound' and scikit-learn's), restricted to the parts of the model the user left unset
(``FitSpec.select``, resolved from ``--covariance`` / ``--priors`` given or not). Each candidate is fitted
to the same rows -- a subsample of whole chunks drawn from the fit's seed, at most ``SCREEN_ROWS``
rows -- with every other setting of the fit, and scored by its exact ELBO per row
(:func:`vbcore.model.elbo.elbo_terms`, which keeps every constant, so the bounds of different families
and priors are bounds on the evidence of the same rows and compare). With ``--pca`` every candidate
projects the subsample with the same projection pass (same rows, same space): the comparison is within
that projected space. The ``select_fits`` best are then fitted to all rows, and the one with the
highest full bound is kept.

Deterministic: the subsample and every candidate fit derive from the fit's seed, so a resumed run
screens the same candidates to the same bounds and resumes the same winner's checkpoints.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from pipeline.fit.setup import open_source
from pipeline.fit.spec import FitSpec

#: the covariance families screened, in the order ties are broken
FAMILIES = ("diag", "full", "tied", "spherical", "lowrank")
#: the ways of filling unset priors screened (vbcore.model.priors.default_prior): the pipeline's fixed
#: weight, the weight the bound chooses, scikit-learn's
PRIORS = ("empirical", "bound", "sklearn")
#: full and tied are screened only up to this many dimensions: above, a D x D precision per
#: component needs more rows than the classes of a store usually hold (D (D + 1) / 2 parameters)
#: and its screen alone costs K D^3 per iteration
FULL_MAX_FEATURES = 256
#: rows of the screening subsample (whole chunks, drawn from the fit's seed)
SCREEN_ROWS = 10_000
#: iterations of each screening fit (its own, not the fit's max_iter: a resumed run with another
#: max_iter screens to the same bounds and keeps the same winner)
SCREEN_MAX_ITER = 100
#: the seed's spawn key of the subsample (other draws of the fit use other keys)
SCREEN_KEY = 51


@dataclass(frozen=True)
class Candidate:
    """One candidate model and its bounds (nats per row)."""

    covariance: str
    priors: str
    screen_bound: float
    screen_clusters: int
    screen_seconds: float
    full_bound: float | None = None
    chosen: bool = False


@dataclass(frozen=True)
class Selection:
    """What the selection stage did (result.json's ``selection``)."""

    candidates: tuple[Candidate, ...]
    screen_rows: int
    screen_seconds: float
    parts: str

    def to_dict(self) -> dict[str, Any]:
        return {"parts": self.parts, "screen_rows": self.screen_rows,
                "screen_seconds": self.screen_seconds,
                "candidates": [asdict(c) for c in self.candidates]}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Selection:
        return cls(tuple(Candidate(**c) for c in values["candidates"]), int(values["screen_rows"]),
                   float(values["screen_seconds"]), str(values["parts"]))

    def winner(self) -> Candidate:
        return next(c for c in self.candidates if c.chosen)


def candidates(spec: FitSpec, n_features: int) -> list[tuple[str, str]]:
    """(covariance, priors) pairs to screen for a resolved ``spec`` (its own values for fixed parts)."""
    from pipeline.fit.learners import learner_class

    parts = set(spec.select.split("+")) if spec.select != "none" else set()
    allowed = learner_class(spec.learner).covariance_types
    families = [f for f in FAMILIES if (f in allowed or (f == "lowrank" and lowrank_fits(spec)))
                and (f not in ("full", "tied") or n_features <= FULL_MAX_FEATURES)]
    covs = families if "covariance" in parts else [spec.covariance]
    priors = list(PRIORS) if "priors" in parts else [spec.priors]
    # 'bound' frees nu0 of the diagonal families only: for full and tied it is 'empirical' again;
    # lowrank chooses its own hyperparameters by the bound: one candidate
    return [(c, p) for c in covs for p in priors
            if not (p == "bound" and c in ("full", "tied") and "empirical" in priors)
            and not (c == "lowrank" and p != priors[0])]


def lowrank_fits(spec: FitSpec) -> bool:
    """Whether the lowrank family (pipeline.fit.lowrank) can fit ``spec``: VB EM, no projection."""
    return spec.learner == "vbem" and spec.pca is None and int(spec.n_init) == 1


def screen_rows(source: Any, seed: Any) -> np.ndarray:
    """Whole chunks drawn from ``seed`` until ``SCREEN_ROWS`` rows (all rows of a smaller store), in
    chunk order."""
    slices = source.chunk_slices()
    if source.n_rows <= SCREEN_ROWS:
        order: Any = range(len(slices))
    else:
        entropy = 0 if seed is None else int(seed)
        rng = np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(SCREEN_KEY,)))
        order = rng.permutation(len(slices))
    picked: list[int] = []
    total = 0
    for i in order:
        picked.append(int(i))
        total += slices[int(i)].stop - slices[int(i)].start
        if total >= SCREEN_ROWS:
            break
    return np.concatenate([source.load(i) for i in sorted(picked)])


def screen(spec: FitSpec, source: Any, engine: Any, random_state: Any) -> Selection:
    """Fit every candidate to the same subsample; their exact bounds per row, best first chosen."""
    from pipeline.fit.driver import n_effective, run_fit

    t0 = time.perf_counter()
    rows = screen_rows(source, spec.seed if random_state is None else random_state)
    sub = open_source(rows, int(spec.chunk_rows))
    found: list[Candidate] = []
    for cov, priors in candidates(spec, source.n_features):
        t = time.perf_counter()
        cand = replace(spec, covariance=cov, priors=priors, select="none",
                       max_iter=SCREEN_MAX_ITER).resolved()
        if cov == "lowrank":  # its own VB EM (pipeline.fit.lowrank)
            from pipeline.fit.lowrank import run_lowrank

            low = run_lowrank(cand, sub, engine, random_state=random_state)
            total, clusters = float(low.terms.total), low.n_effective
        else:
            out = run_fit(cand, sub, engine, random_state=random_state)
            total, clusters = float(out.terms.total), n_effective(out.post, out.prior)
        found.append(Candidate(cov, priors, total / rows.shape[0], clusters, time.perf_counter() - t))
    ranked = sorted(range(len(found)), key=lambda i: -found[i].screen_bound)  # stable: FAMILIES order
    ordered = tuple(found[i] for i in ranked)
    return Selection(ordered, int(rows.shape[0]), time.perf_counter() - t0, spec.select)


def finish(selection: Selection, full_bounds: dict[int, float]) -> Selection:
    """The selection with the full fits' bounds (per row) of the candidates fitted in full (by their
    rank), the one with the highest marked chosen."""
    best = max(full_bounds, key=lambda i: (full_bounds[i], -i))
    cands = tuple(replace(c, full_bound=full_bounds.get(i), chosen=i == best)
                  for i, c in enumerate(selection.candidates))
    return replace(selection, candidates=cands)


def chosen_spec(spec: FitSpec, cand: Candidate) -> FitSpec:
    """``spec`` with a candidate's covariance and priors, nothing left to select."""
    return replace(spec, covariance=cand.covariance, priors=cand.priors, select="none").resolved()
