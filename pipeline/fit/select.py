"""Model selection by the exact bound (issue 51): screen candidate models on a subsample, fit the best.

The candidates are the covariance families (diag, spherical, and full and tied up to
``FULL_MAX_FEATURES`` dimensions) times the ways of filling the priors (``PRIORS``: the 'empirical'
defaults, 'bound' and scikit-learn's), restricted to the parts of the model the user left unset
(``FitSpec.select``, resolved from ``--covariance`` / ``--priors`` given or not). Each candidate is fitted
to the same rows -- a subsample of whole chunks drawn from the fit's seed, at most ``SCREEN_ROWS``
rows -- with every other setting of the fit, and scored by its exact ELBO per row
(:func:`vbcore.model.elbo.elbo_terms`, which keeps every constant, so the bounds of different families
and priors are bounds on the evidence of the same rows and compare), made a bound of the original rows
at a stated resolution (:mod:`vbcore.model.projected`): the candidates are fitted and scored as the
rows dequantized at ``eps = RESOLUTION`` times the rows' spread (uniform noise of variance ``eps^2 /
12``: ``reg_covar``, and the bound's penalty), so a precision along a dimension without spread no
longer gains without end. With ``--pca`` given every candidate projects the subsample with the same
projection pass (same rows, same space); with ``--pca`` and ``--covariance`` unset the projected
candidates (``PROJECTED``) are screened beside the others, their bounds made bounds of the original
rows by the whitening's log-Jacobian and an isotropic Gaussian on the dropped dimensions. With the
covariance selected (vbem, no ``--pca``) the low-rank family is screened too, one candidate per rank of
``LOWRANK_RANKS`` below D (:func:`lowrank_ranks`), fitted with its noise at the resolution and scored by
:func:`lowrank_bound` (:func:`vbcore.model.mfa.resolution_penalty`); a low-rank winner is fitted by
:func:`pipeline.fit.lowrank.run_lowrank`. On wide stores (more than ``FULL_MAX_FEATURES`` dimensions,
the covariance selected, no ``--pca``) every candidate but the low-rank ones is fitted and compared
within one space instead, the rows' ``select_pca`` leading principal components
whitened (:func:`wide_space`): a comparison of the projected rows' bounds. The
``select_fits`` best are then fitted to all rows, and the one with the highest full bound (of the
original rows, at the resolution) is kept.

Deterministic: the subsample and every candidate fit derive from the fit's seed, so a resumed run
screens the same candidates to the same bounds and resumes the same winner's checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from pipeline.engine.blas import one_blas_thread
from pipeline.fit.setup import open_source
from pipeline.fit.spec import FitSpec
from vbcore.data.normalize import normalize_chunk
from vbcore.errors import ConfigError

#: the covariance families screened, in the order ties are broken
FAMILIES = ("diag", "full", "tied", "spherical")
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
#: components each candidate of a wide store's space starts from in the screen (the fit's K where
#: smaller; the winner's full fit starts from the fit's K). The screen ranks families on about 10,000
#: rows: from ``-k 1000`` a candidate has ten rows a component and its full covariances in 128
#: dimensions did not finish in 321 s on the SUN397-shaped store; from 50 they grow within the screen
#: (docs/decisions.md, the wide default switched on)
SCREEN_WIDE_K = 50
#: the seed's spawn key of the subsample (other draws of the fit use other keys)
SCREEN_KEY = 51
#: projected candidates screened beside the families when ``--covariance`` and ``--pca`` are left unset,
#: as (covariance, P, whiten): the guide's best Fashion-MNIST configuration. Each is scored by the
#: bound of the original rows (:mod:`vbcore.model.projected`: the whitening's log-Jacobian and an
#: isotropic Gaussian on the D - P dropped dimensions), so it compares with the unprojected ones;
#: screened only where P < D.
PROJECTED = (("full", 64, True),)
#: the resolution at which candidates are fitted and scored (:mod:`vbcore.model.projected`, Theis et al.
#: 2016), relative to the screened rows' spread: ``eps = RESOLUTION * sqrt(mean_d var_d)`` for every
#: feature (:func:`resolution_of`); 0 fits and scores the plain bound. 0.03 was the best of 0.03, 0.1
#: and 0.3 on the battery (docs/decisions.md): chosen on those sets, not derived
RESOLUTION = 0.03
#: the resolution is pooled over the features (one ``eps`` for all) rather than each feature's own
POOLED = True
#: the low-rank family's name (``--covariance lowrank``, :mod:`pipeline.fit.lowrank`)
LOWRANK = "lowrank"
#: the ranks of the low-rank candidates (:func:`lowrank_ranks`; those below D): 2, a few directions per
#: class at a cost near diag's, and 8, the rank whose bound was the best of 2, 4 and 8 on digits, Vowel
#: and Vehicle (bench/bench_battery.py, K = 50): a value measured on the battery, not derived
LOWRANK_RANKS = (2, 8)
#: whether ``vbcluster fit`` selects the model on stores of more than ``FULL_MAX_FEATURES`` dimensions
#: when no ``--select`` is given (:func:`default_select`: ``auto`` there too; stores of at most
#: ``FULL_MAX_FEATURES`` dimensions select by default either way). Off: on Fashion-MNIST the selection in
#: the whitened space keeps full covariances under scikit-learn's priors, 62 clusters, NMI 0.52
#: (docs/decisions.md), so wide stores keep the diag model with the empirical priors
SELECT_WIDE_BY_DEFAULT = False
#: the settings that name the model or its priors: a fit of a store of at most ``FULL_MAX_FEATURES``
#: dimensions that gives any of them (or a learner other than vbem) and no ``--select`` fits that model,
#: nothing screened (:func:`default_select`; the screen would override ``reg_covar`` and the priors)
DEFAULT_FIXES = ("covariance", "priors", "pca", "degrees_of_freedom_prior", "mean_precision_prior",
                 "weight_concentration_prior", "covariance_prior", "mean_prior", "reg_covar",
                 "fixed_variance")


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
    #: the projection of a projected candidate (--pca P, --whiten), None for the rows themselves
    pca: int | None = None
    whiten: bool = False
    #: the reg_covar it was fitted with where the resolution set it (``eps^2 / 12``), else None (the fit's)
    reg_covar: float | None = None
    #: the rank Q of a low-rank candidate (``--covariance lowrank --rank Q``), None for the others
    rank: int | None = None


@dataclass(frozen=True)
class Selection:
    """What the selection stage did (result.json's ``selection``)."""

    candidates: tuple[Candidate, ...]
    screen_rows: int
    screen_seconds: float
    parts: str
    #: the resolution the bounds are at (:data:`RESOLUTION`; 0: the plain bound)
    resolution: float = 0.0
    #: the rows' normalisation before the candidates' projection (``FitSpec.normalize``)
    normalize: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return {"parts": self.parts, "screen_rows": self.screen_rows,
                "screen_seconds": self.screen_seconds, "resolution": self.resolution,
                "normalize": self.normalize, "candidates": [asdict(c) for c in self.candidates]}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Selection:
        return cls(tuple(Candidate(**c) for c in values["candidates"]), int(values["screen_rows"]),
                   float(values["screen_seconds"]), str(values["parts"]),
                   float(values.get("resolution", 0.0)), str(values.get("normalize", "none")))

    def winner(self) -> Candidate:
        return next(c for c in self.candidates if c.chosen)


def candidates(spec: FitSpec, n_features: int) -> list[tuple[str, str]]:
    """(covariance, priors) pairs to screen for a resolved ``spec`` (its own values for fixed parts)."""
    from pipeline.fit.learners import learner_class

    parts = set(spec.select.split("+")) if spec.select != "none" else set()
    allowed = learner_class(spec.learner).covariance_types
    families = [f for f in FAMILIES if f in allowed
                and (f not in ("full", "tied") or n_features <= FULL_MAX_FEATURES)]
    covs = families if "covariance" in parts else [spec.covariance]
    covs = [c for c in covs if c != LOWRANK]  # (its candidates: lowrank_ranks)
    priors = list(PRIORS) if "priors" in parts else [spec.priors]
    # 'bound' frees nu0 of the diagonal families only: for full and tied it is 'empirical' again
    return [(c, p) for c in covs for p in priors
            if not (p == "bound" and c in ("full", "tied") and "empirical" in priors)]


def screen_chunks(source: Any, seed: Any) -> list[int]:
    """The chunks of the screening subsample: drawn from ``seed`` until ``SCREEN_ROWS`` rows (all chunks
    of a smaller store), in chunk order."""
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
    return sorted(picked)


def screen_rows(source: Any, seed: Any) -> np.ndarray:
    """The rows of :func:`screen_chunks`."""
    return np.concatenate([source.load(i) for i in screen_chunks(source, seed)])


def projected(spec: FitSpec, n_features: int) -> list[tuple[str, str, int, bool]]:
    """(covariance, priors, P, whiten) of the projected candidates (:data:`PROJECTED`) to screen: only
    when the covariance is selected and no ``--pca`` is given, and only where ``P < D``."""
    from pipeline.fit.learners import learner_class

    parts = set(spec.select.split("+")) if spec.select != "none" else set()
    if "covariance" not in parts or spec.pca is not None:
        return []
    allowed = learner_class(spec.learner).covariance_types
    priors = list(PRIORS) if "priors" in parts else [spec.priors]
    return [(c, p, int(n), bool(w)) for c, n, w in PROJECTED for p in priors
            if c in allowed and n < n_features
            and not (p == "bound" and c in ("full", "tied") and "empirical" in priors)]


def resolution_of(chunks: Any, relative: float, pooled: bool | None = None) -> np.ndarray | None:
    """The resolution ``eps`` (per feature) of the rows of ``chunks`` at ``relative`` (None when 0):
    ``relative`` times the root of the features' mean variance, the same for every feature
    (``pooled``, default :data:`POOLED`; a constant feature gets the resolution of the others), or
    times each feature's own standard deviation. Float64 sums."""
    if not relative:
        return None
    n, s1, s2 = 0, 0.0, 0.0
    for x in chunks:
        x = np.asarray(x, dtype=np.float64)
        n, s1, s2 = n + x.shape[0], s1 + x.sum(0), s2 + np.einsum("nd,nd->d", x, x)
    mean = s1 / n
    var = np.maximum(s2 / n - mean * mean, 0.0)
    if POOLED if pooled is None else pooled:
        var = np.full_like(var, var.mean())
    return float(relative) * np.sqrt(var)


def original_bound(out: Any, chunks: Any, eps: np.ndarray | None) -> float:
    """The bound of the original rows (all of ``chunks``, those the fit saw) at resolution ``eps``:
    the fit's exact ELBO, plus for a projected fit the whitening's log-Jacobian and the dropped
    dimensions' isotropic Gaussian, less the dequantization penalty (:mod:`vbcore.model.projected`);
    a low-rank fit's: :func:`lowrank_bound`."""
    from pipeline.fit.lowrank import LowRankOutcome
    from vbcore.model.projected import (
        Complement,
        complement,
        log_jacobian,
        noise_covariance,
        resolution_penalty,
        soft_counts,
    )

    if isinstance(out, LowRankOutcome):
        return lowrank_bound(out, eps)
    total = float(out.terms.total)
    proj = out.projection
    nk = soft_counts(out.post, float(out.prior.weight_concentration))
    if proj is not None:
        parts = [complement(x, proj.mean, proj.components, eps) for x in chunks]
        comp = Complement(sum(c.n_rows for c in parts), parts[0].dims,
                          sum(c.residual_sum for c in parts), parts[0].noise)
        total += comp.n_rows * log_jacobian(proj.variances, proj.whiten) + comp.log_likelihood()
    if eps is not None:
        total -= resolution_penalty(out.post, nk, noise_covariance(eps, None if proj is None
                                                                   else proj.matrix()))
    return total


def screen(spec: FitSpec, source: Any, engine: Any, random_state: Any) -> Selection:
    """Fit every candidate to the same subsample; their bounds per row of the original rows, best first."""
    t0 = time.perf_counter()
    raw = screen_rows(source, spec.seed if random_state is None else random_state)
    sub = open_source(raw, int(spec.chunk_rows))
    rows = normalize_chunk(raw, spec.normalize)  # as the candidates' projections see them: their bounds'
    eps = resolution_of([rows], RESOLUTION)
    found: list[Candidate] = []
    refused: ConfigError | None = None
    shared = space_projection(spec, source.n_features, sub, engine, random_state)
    with one_blas_thread():  # the driver's small factorisations too (docs/decisions.md: 4x faster)
        for cand in screened(spec, source.n_features, eps):
            try:
                found.append(screen_one(spec, cand, sub, rows, eps, engine, random_state, shared)[0])
            except ConfigError as exc:  # a model the rows refuse (a singular covariance prior, whitening
                refused = exc           # a direction without spread): not a candidate; all refused: raised
    if not found and refused is not None:
        raise refused
    ranked = sorted(range(len(found)), key=lambda i: -found[i].screen_bound)  # stable: FAMILIES order
    ordered = tuple(found[i] for i in ranked)
    return Selection(ordered, int(rows.shape[0]), time.perf_counter() - t0, spec.select, RESOLUTION,
                     spec.normalize)


def screened(spec: FitSpec, n_features: int, eps: np.ndarray | None) -> list[Candidate]:
    """The candidates to screen (bounds not yet known). Fitted at the resolution ``eps``: its variance
    ``eps^2 / 12`` added to each component's is the M-step of the dequantized rows (the smallest eps
    where they differ; a projected candidate keeps the fit's reg_covar, its noise is not isotropic)."""
    wide = wide_space(spec, n_features)
    if wide is not None:
        return wide_candidates(spec, wide)
    reg = None if eps is None else max(float(spec.reg_covar), float(np.min(eps)) ** 2 / 12.0)
    plain = [Candidate(c, p, 0.0, 0, 0.0, reg_covar=reg)
             for c, p in candidates(spec, int(spec.pca) if spec.pca is not None else n_features)]
    plain += [Candidate(LOWRANK, str(spec.priors), 0.0, 0, 0.0, reg_covar=reg, rank=q)
              for q in lowrank_ranks(spec, n_features)]
    return plain + [Candidate(c, p, 0.0, 0, 0.0, pca=n, whiten=w)
                    for c, p, n, w in projected(spec, n_features)]


def screen_one(spec: FitSpec, cand: Candidate, sub: Any, rows: np.ndarray, eps: np.ndarray | None,
               engine: Any, random_state: Any, projection: Any = None) -> tuple[Candidate, Any]:
    """One candidate fitted to the subsample ``sub`` (whose rows are ``rows``): with its bound per row
    of the original rows at ``eps``, clusters and seconds; and the fit's outcome. ``projection``: the
    subsample's projection shared by every candidate of one space (:func:`space_projection`)."""
    from pipeline.fit.driver import n_effective, run_fit
    from pipeline.fit.lowrank import run_lowrank

    t = time.perf_counter()
    if cand.covariance == LOWRANK:
        out = run_lowrank(replace(chosen_spec(spec, cand), max_iter=SCREEN_MAX_ITER), sub, engine,
                          random_state=random_state)
        clusters = out.n_effective
    else:
        chosen = replace(chosen_spec(spec, cand), max_iter=SCREEN_MAX_ITER)
        if projection is not None:  # the wide store's space (:func:`space_projection`)
            chosen = replace(chosen, components=min(int(chosen.components), SCREEN_WIDE_K))
        out = run_fit(chosen, sub, engine, random_state=random_state,
                      projection=projection if cand.pca is not None else None)
        clusters = n_effective(out.post, out.prior)
    return replace(cand, screen_bound=original_bound(out, [rows], eps) / rows.shape[0],
                   screen_clusters=clusters,
                   screen_seconds=time.perf_counter() - t), out


def finish(selection: Selection, full_bounds: dict[int, float]) -> Selection:
    """The selection with the full fits' bounds (per row) of the candidates fitted in full (by their
    rank), the one with the highest marked chosen."""
    best = max(full_bounds, key=lambda i: (full_bounds[i], -i))
    cands = tuple(replace(c, full_bound=full_bounds.get(i), chosen=i == best)
                  for i, c in enumerate(selection.candidates))
    return replace(selection, candidates=cands)


def chosen_spec(spec: FitSpec, cand: Candidate) -> FitSpec:
    """``spec`` with a candidate's covariance, priors, projection and reg_covar, nothing left to select."""
    return replace(spec, **choice(cand)).resolved()


def choice(cand: Candidate) -> dict[str, Any]:
    """The settings a candidate fixes (a VBMixture or ``vbcluster fit`` with them fits its model)."""
    more: dict[str, Any] = {} if cand.pca is None else {"pca": cand.pca, "whiten": cand.whiten}
    if cand.reg_covar is not None:
        more["reg_covar"] = cand.reg_covar
    if cand.rank is not None:
        more["rank"] = cand.rank
    return {"covariance": cand.covariance, "priors": cand.priors, "select": "none", **more}


def kept_model(spec: FitSpec, result: dict[str, Any] | None) -> FitSpec:
    """A run's spec (its run.json) made the model it kept where it selected one (its result.json's
    ``selection``): what a warm start from the run continues (``--warm-from``, a warm refresh)."""
    sel = (result or {}).get("selection")
    return spec if not sel else replace(spec, **choice(Selection.from_dict(sel).winner()))


def full_bounds(outs: dict[int, Any], source: Any, selection: Selection,
                normalize: str = "none") -> dict[int, float]:
    """The bound per row of the original rows (normalised by ``normalize``: the rows the fits' projection
    sees; at the selection's resolution) of each full fit."""
    def chunks() -> Any:
        return (normalize_chunk(source.load(i), normalize) for i in range(len(source.chunk_slices())))

    eps = resolution_of(chunks(), selection.resolution)  # (reads nothing at resolution 0)
    rows = float(source.n_rows)
    return {i: original_bound(o, chunks(), eps) / rows for i, o in outs.items()}


def label(c: dict[str, Any]) -> str:
    """A candidate's model as the summary and report show it: its family (and rank), and its projection."""
    if c.get("rank") is not None:
        return f"{c['covariance']} Q={c['rank']}"
    if c.get("pca") is None:
        return str(c["covariance"])
    return f"{c['covariance']} on pca {c['pca']}" + (" whitened" if c.get("whiten") else "")


def lowrank_ranks(spec: FitSpec, n_features: int) -> list[int]:
    """The ranks of the low-rank candidates to screen (one candidate each: the family's hyperparameters
    are chosen by the bound, so it has no ``priors`` variants): ``--rank`` when ``--covariance lowrank``
    is given, else :data:`LOWRANK_RANKS` below ``n_features`` (at rank D a component would be a full
    covariance plus the noise) when the covariance is selected and the family fits this spec (vbem, one
    start, no ``--pca``: :func:`pipeline.fit.spec.FitSpec.resolved`) and ``select_lowrank`` is on (off
    where ``vbcluster fit`` selects by default: :func:`default_select`)."""
    parts = set(spec.select.split("+")) if spec.select != "none" else set()
    if spec.covariance == LOWRANK:
        return [int(spec.rank)] if parts else []
    if "covariance" not in parts or spec.learner != "vbem" or spec.pca is not None or int(spec.n_init) != 1 \
            or not spec.select_lowrank:
        return []
    return [q for q in LOWRANK_RANKS if q < n_features]


def lowrank_bound(out: Any, eps: np.ndarray | None) -> float:
    """The bound of a low-rank fit's rows at resolution ``eps`` (None: the plain bound): its bound (of the
    rows dequantized at its ``reg_covar`` with q(z, x) held, :func:`vbcore.model.mfa.held_penalty`) made
    the plain one, less the penalty at ``eps^2 / 12`` per feature with q(z) held and q(x | z) the optimum
    for each dequantized row (:func:`vbcore.model.mfa.resolution_penalty`: the components' marginal
    precisions, as the Gaussian families pay theirs). Exact for the fitted ``Psi`` and q(L); a lower
    bound on the dequantized rows' evidence."""
    from vbcore.model.mfa import held_penalty, resolution_penalty

    nk = np.asarray(out.counts, dtype=np.float64)
    plain = float(out.terms.total) + held_penalty(out.post.noise, float(nk.sum()),
                                                  float(out.options.get("reg_covar", 0.0)))
    return plain if eps is None else plain - resolution_penalty(out.post, nk, np.asarray(eps) ** 2 / 12.0)


# ---- wide stores: every candidate within one whitened principal subspace ----------------------------
def wide_space(spec: FitSpec, n_features: int) -> int | None:
    """P of the one space every candidate of a wide store is fitted and compared in (the rows' P leading
    principal components, whitened: ``FitSpec.select_pca``), or None (the candidates see the rows).

    Where the covariance is selected, no ``--pca`` is given and the store has more than
    ``FULL_MAX_FEATURES`` dimensions (where full and tied are not screened on the rows), with
    ``select_pca`` > 0 and below D. Within that space the candidates' bounds compare as bounds of the
    same projected rows: the whitening's log-Jacobian and the dropped dimensions' isotropic Gaussian
    that :func:`original_bound` adds are the same for all of them (the projection is one), so the
    ranking is the projected rows' -- not a comparison with models of the rows themselves."""
    parts = set(spec.select.split("+")) if spec.select != "none" else set()
    p = int(spec.select_pca)
    if "covariance" not in parts or spec.pca is not None or n_features <= FULL_MAX_FEATURES:
        return None
    return p if 0 < p < n_features else None


def wide_candidates(spec: FitSpec, p: int) -> list[Candidate]:
    """The candidates of the space of :func:`wide_space`: every (covariance, priors) of
    :func:`candidates` for a P-dimensional space (full and tied too while P <= ``FULL_MAX_FEATURES``),
    each on the P whitened components, fitted with the fit's reg_covar (the projected noise of the
    resolution is not isotropic)."""
    return [Candidate(c, pr, 0.0, 0, 0.0, pca=p, whiten=True) for c, pr in candidates(spec, p)]


def space_projection(spec: FitSpec, n_features: int, sub: Any, engine: Any, random_state: Any) -> Any:
    """The subsample's projection onto the wide space (:func:`wide_space`), computed once for every
    candidate (the pass each would make: the same bits), or None."""
    from pipeline.fit.projection import projection_pass
    from pipeline.fit.setup import seed_entropy

    p = wide_space(spec, n_features)
    if p is None:
        return None
    return projection_pass(engine, sub, p, True, spec.pca_solver, seed_entropy(random_state),
                           normalize=spec.normalize)


def default_select(n_features: int, given: Mapping[str, Any] | None = None) -> str:
    """``vbcluster fit``'s ``--select`` when none is given (``given``: the names of the settings the fit
    gives). On stores of at most ``FULL_MAX_FEATURES`` dimensions ``auto`` where the model is left to
    the default (:data:`DEFAULT_FIXES` unset, the learner vbem: issue 51's default, docs/decisions.md),
    else ``none``: a fit that names its family, priors, projection or learner fits that model exactly as
    before (``--select auto`` with them selects the rest). On wider stores ``auto`` only where
    :data:`SELECT_WIDE_BY_DEFAULT` (its own rule, unchanged: the parts given are not selected), else
    ``none`` (the diag model, the empirical priors). ``FitSpec``'s own default stays ``none``: a
    run.json written without the setting, and ``VBMixture``, keep fitting the model they name."""
    if n_features > FULL_MAX_FEATURES:
        return "auto" if SELECT_WIDE_BY_DEFAULT else "none"
    given = dict(given or {})
    fixed = any(name in given for name in DEFAULT_FIXES) or given.get("learner", "vbem") != "vbem"
    return "none" if fixed else "auto"
