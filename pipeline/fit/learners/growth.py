"""A truncation that does not decide the answer: VB EM grows K while the fit uses nearly all of it.

When VB EM has converged with DP weights and at least :data:`SATURATED_SHARE` of the truncation holds
a row's worth of responsibility or more (:func:`saturated`), the truncation doubles (at most to the
limit) by **births** (Hughes & Sudderth 2013 grow and shrink K by moves on the exact bound):

1. a uniform sample of rows (seeded by the iteration, gathered through the engine) is scored under
   the current posterior; each component's sample rows are tested for two groups on held-out rows
   (:func:`held_out_bimodality`: one half's main direction projects the other half, whose best cut
   is compared with a Gaussian's, :func:`bimodal_threshold`); the components most clearly two groups
   are cut in two by 2-means from their principal component's two sides (a split move);
2. the parent takes one half's mean, a child the other's, with the parent's covariance and half its
   count each; the children's sticks follow the existing ones;
3. up to ``grow_iters`` exact VB EM iterations (E-step pass, M-step, empirical Bayes, pruning) run on
   the proposal; the first whose exact ELBO exceeds the converged fit's by more than ``tol`` per row
   is accepted and the fit goes on from it with the larger truncation. If none does, the proposal is
   refused: the bound prefers the fit it had, which ends the growth.

A converged fit that does not saturate its truncation is *filled*: births of only the components
that pass the test, up to the truncation (none pass: no proposal, the fit ends), so a fit started
from as many components as classes parts the classes its start merged. After an accepted proposal
the next convergence proposes births again; merge and delete moves (:mod:`pipeline.fit.learners.moves`,
on by default where the truncation grows) shrink K on the bound.

Refused proposals never enter the ELBO history, so the history stays monotone; the proposal's
iterations run inside one iteration of the fit (its passes are counted). No draw depends on the
engine or on a resume: the sample is ``ctx.rng(GROW_TAG, iteration)``.

The SGA learners grow with the same rules and proposals (:mod:`pipeline.fit.learners.point.growth`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.engine.blas import one_blas_thread
from pipeline.fit.learners.outliers import outlier_births
from pipeline.fit.learners.sampling import chunk_bounds, gather_drawn
from pipeline.fit.learners.state import LearnerState
from vbcore.kernels.estep import estep_params, log_rho, prepare_chunk
from vbcore.model.elbo import ElboTerms
from vbcore.model.mstep import weight_posterior
from vbcore.model.posterior import Posterior

if TYPE_CHECKING:
    from pipeline.fit.learners.base import FitContext

#: a truncation is saturated when at least this share of it holds a row's worth or more
SATURATED_SHARE = 0.9
#: the random stream of the birth samples: ``ctx.rng(GROW_TAG, iteration)``
GROW_TAG = 7_426
#: rows scored to place the children: max(GROW_MIN_ROWS, GROW_ROWS_PER_CLUSTER * new truncation), at
#: most GROW_MAX_BYTES of float64 sample
GROW_MIN_ROWS = 2000
GROW_ROWS_PER_CLUSTER = 32
GROW_MAX_BYTES = 1 << 27
#: a component is split only with this many sample rows; Lloyd iterations of the split's 2-means
SPLIT_MIN_ROWS = 8
SPLIT_ITERS = 5
#: a component whose rows spread about their mean more than this many times as far as one component
#: of the model does (:func:`spread_ratio`; with a fixed covariance ``sigma^2 I``, the point learners'
#: sigma^2, otherwise the median component's spread) is split too: single classes of real features
#: reach 4x, components of several planted classes 9-32x (docs/decisions.md)
SPREAD_SPLIT = 8.0


def saturated(n_used: int, truncation: int) -> bool:
    """Whether a fit using ``n_used`` components of a truncation of ``truncation`` is bound by it:
    ``n_used >= ceil(SATURATED_SHARE * truncation)``."""
    return int(n_used) >= math.ceil(SATURATED_SHARE * int(truncation) - 1e-9)


#: what a truncation warning adds for diagonal covariances on projected rows (docs/guide.md, "Reducing
#: the dimension first": Fashion-MNIST after --pca 64, diag ran to the limit, full found 38 clusters)
#: the hint a truncation entry names after a fit of diagonal covariances on projected rows
#: (:data:`vbcore.errors.TRUNCATION_HINTS`: its words on each face)
PROJECTED_DIAG_HINT = "projected_diag"


def stopped_growing(info: dict[str, Any], converged: bool, projected_diag: bool = False) -> dict[str, Any]:
    """The truncation entry of a fit as it ended (``info``: :meth:`Growth.info` or a learner's
    ``truncation_info``): a growing truncation below its limit, still saturated or grown by a birth
    since its last refusal, when the fit stopped unconverged had not settled, so the iteration limit
    decided the count (``max_iter_hit``, which counts as ``limit_hit``). A refused proposal settles
    it (the point learners' steady state: they never declare convergence). (Saturation alone missed
    a fill in progress: `sga-f` at defaults on 200 classes, 100,000 x 256, ended at its 200
    iterations with 146 of a truncation of 200 grown 10 times, unwarned; 203 at 800 iterations.)"""
    growing = bool(info.get("saturated")) or int(info.get("grew") or 0) > 0
    cut = bool(info.get("growth") and growing and not info.get("limit_hit")
               and not info.get("refused") and not converged)
    out = {**info, "max_iter_hit": cut, "limit_hit": bool(info.get("limit_hit")) or cut}
    if out["limit_hit"] and projected_diag:  # (a fit of diagonal covariances on projected rows)
        out["hint"] = PROJECTED_DIAG_HINT
    return out


def unsaturated_truncation(n_used: int) -> int:
    """The smallest truncation that ``n_used`` components do not saturate."""
    t = int(math.floor(int(n_used) / SATURATED_SHARE + 1e-9)) + 1
    while saturated(n_used, t):
        t += 1
    return t


def default_limit(start: int, n_rows: int) -> int:
    """The default upper limit of a growing truncation: ``max(4 K, 1024)``, at most N."""
    return int(min(max(4 * int(start), 1024), max(int(n_rows), int(start))))


def n_used(post: Posterior) -> int:
    """Components holding at least one row's worth of responsibility."""
    return int(np.sum(used_counts(post) >= 1.0))


def used_counts(post: Posterior) -> np.ndarray:
    """Expected rows per component from the weights' posterior (``N_k``)."""
    wc = post.weight_concentration
    return wc[0] - 1.0 if post.weight_type == "dirichlet_process" else wc


def two_means(rows: np.ndarray, first: np.ndarray, second: np.ndarray,
              iters: int = SPLIT_ITERS) -> np.ndarray:
    """Lloyd's 2-means on ``rows`` from the centres ``first`` and ``second``; the label of each row."""
    c = np.stack((first, second))
    lab = np.zeros(rows.shape[0], dtype=np.int64)
    for _ in range(iters):  # nearest centre: the smaller |c|^2 - 2 x.c (two GEMV, no n x 2 x D array)
        lab = np.argmin(np.einsum("ij,ij->i", c, c)[None, :] - 2.0 * (rows @ c.T), axis=1)
        for j in (0, 1):
            if np.any(lab == j):
                c[j] = rows[lab == j].mean(0)
    return lab


def pc_two_means(rows: np.ndarray, z: np.ndarray, direction: np.ndarray | None = None) -> np.ndarray:
    """:func:`two_means` of ``rows`` started from the two sides of the first principal component of
    ``z`` (the rows, scaled; ``direction``, where known): the label of each row."""
    centred = z - z.mean(0)
    side = centred @ (principal_direction(centred) if direction is None else direction) > 0
    if side.all() or not side.any():
        return side.astype(np.int64)
    return two_means(rows, rows[~side].mean(0), rows[side].mean(0))


def best_cut_share(p: np.ndarray) -> float:
    """The largest share of the scatter of the 1-D values ``p`` that one threshold explains (exact
    1-D 2-means): ``2/pi`` for a large Gaussian sample, near 1 for two separated groups."""
    p = np.sort(np.asarray(p, dtype=np.float64))
    n = p.size
    total = float(((p - p.mean()) ** 2).sum())
    if n < 2 or total <= 0.0:
        return 0.0
    cs = np.cumsum(p)
    i = np.arange(1, n)
    left, right = cs[:-1] / i, (cs[-1] - cs[:-1]) / (n - i)
    return float(np.max(i * (n - i) / n * (left - right) ** 2) / total)


def halves(z: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(fit, test, fit's first principal direction)`` for the rows ``z`` halved at even and odd
    positions, each half fitting once and testing once (the held-out statistics below)."""
    return [(fit, test, principal_direction(fit - fit.mean(0)))
            for fit, test in ((z[0::2], z[1::2]), (z[1::2], z[0::2]))]


def held_out_bimodality(z: np.ndarray, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
                        ) -> float:
    """How bimodal the rows ``z`` are along their main direction, judged on rows that did not choose
    it: the rows are halved (even and odd positions), each half's first principal direction projects
    the other half, and the mean of the two :func:`best_cut_share` is returned. A direction fitted to
    few rows in many dimensions separates them whatever they are; projected held-out rows of one
    Gaussian are a 1-D Gaussian sample, whatever the dimension (see :func:`bimodal_threshold`).
    ``parts``: :func:`halves` of ``z``, where known."""
    return float(np.mean([best_cut_share(test @ u) for _, test, u in parts or halves(z)]))


def held_out_split_gain(z: np.ndarray, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
                        ) -> float:
    """How much better two Gaussians explain the rows ``z`` than one, judged on rows that did not
    fit them: the rows are halved (even and odd positions); on each half, one Gaussian (its mean and
    per-dimension variance) and a two-component mixture (:func:`pc_two_means`' groups: their shares,
    means and pooled per-dimension variance) are fitted, and the other half's mean log-likelihood
    gain of the mixture's density over the one Gaussian is taken; the mean of the two. Its
    expectation is the two Kullback-Leibler divergences' difference, ``KL(p || one) - KL(p || two)``:
    negative for rows of one Gaussian (the one Gaussian is the truth's fit, the mixture is not, and
    it has more to estimate), positive for rows of several classes the two groups part, even where
    no direction shows two groups (:func:`held_out_bimodality`: several classes along no one line).
    ``parts``: :func:`halves` of ``z``, where known."""
    out = []
    for fit, test, u in parts or halves(z):
        centre = fit.mean(0)
        fit, test = fit - centre, test - centre
        lab = pc_two_means(fit, fit, u)
        if lab.min() == lab.max() or test.shape[0] == 0:
            return -math.inf
        var = fit.var(0)
        floor = 1e-6 * max(float(var.mean()), 1e-300)
        means = np.stack([fit[lab == j].mean(0) for j in (0, 1)])
        within = ((fit - means[lab]) ** 2).mean(0) + floor
        var = var + floor
        # the log densities through GEMMs: sum_d (x - m)^2 / v = x^2 . (1/v) - 2 x . (m/v) + m^2 . (1/v)
        sq = (test * test) @ np.stack((1.0 / var, 1.0 / within)).T
        one = -0.5 * (sq[:, 0] + np.log(2.0 * np.pi * var).sum())
        lin = test @ (means / within).T
        two = (np.log(np.bincount(lab, minlength=2) / lab.size)[None, :]
               - 0.5 * (sq[:, 1:] - 2.0 * lin + (means * means / within).sum(1)[None, :]
                        + np.log(2.0 * np.pi * within).sum()))
        out.append(float(np.mean(np.logaddexp(two[:, 0], two[:, 1]) - one)))
    return float(np.mean(out))


def spread_ratio(rows: np.ndarray, sigma2: float) -> float:
    """The mean squared distance of ``rows`` to their mean over ``D sigma2``: about 1 for rows of one
    component of the fixed-covariance model, far above it for rows of several of its classes."""
    rows = np.asarray(rows, dtype=np.float64)
    return float(((rows - rows.mean(0)) ** 2).sum(1).mean() / (rows.shape[1] * float(sigma2)))


def principal_direction(centred: np.ndarray) -> np.ndarray:
    """The first right singular vector of ``centred`` (a unit vector; its sign is arbitrary), from
    the eigendecomposition of the smaller of its two Gram matrices: a few microseconds where a
    thin SVD of a 32 x 128 block costs 1.5 ms of LAPACK set-up (the birth check scores hundreds)."""
    c = np.asarray(centred, dtype=np.float64)
    if c.shape[0] < c.shape[1]:
        v = c.T @ np.linalg.eigh(c @ c.T)[1][:, -1]
    else:
        v = np.linalg.eigh(c.T @ c)[1][:, -1]
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def bimodal_threshold(n_half: int) -> float:
    """The share above which :func:`held_out_bimodality` of ``2 n_half`` rows calls a component two
    groups: ``2/pi + 1/sqrt(n_half)``, above the 99.9th percentile of the statistic for Gaussian rows
    (simulated: 0.86 at 10 rows a half, 0.79 at 20, 0.70 at 100 are the 99th percentiles), so a fit
    of hundreds of single Gaussians proposes almost no births."""
    return 2.0 / math.pi + 1.0 / math.sqrt(max(int(n_half), 1))


def split_proposals(ctx: Any, post: Posterior, n_births: int, iteration: int,
                    gated: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Splits of the components that look most like merged groups: ``(parents, parent means, child
    means)``, shifted, at most ``n_births``. A uniform sample of rows is scored under ``post``; the rows
    of each component (at least ``SPLIT_MIN_ROWS`` of them, dimensions scaled by the sample's spread)
    are cut in two by 2-means started from the sign of their first principal component; the components
    are ranked by how far their :func:`held_out_bimodality` exceeds :func:`bimodal_threshold` (ties:
    larger first) and split, the parent taking one half's mean, a child the other's. ``gated``: only
    components above the threshold, or that two Gaussians explain better than one on held-out rows
    (:func:`held_out_split_gain`, ranked after them), are split (a fit that is not short of
    components splits only those). A
    component ``SPREAD_SPLIT`` times as wide as one of the model (:func:`spread_ratio` against the
    fixed covariance's sigma^2, or the median component's spread) is split too, before the others
    (widest first): several classes held by one component need not look like two groups along one
    direction."""
    size = min(ctx.n_rows, max(GROW_MIN_ROWS, GROW_ROWS_PER_CLUSTER * (post.n_components + n_births)),
               max(GROW_MIN_ROWS, GROW_MAX_BYTES // (8 * post.n_features)))
    sample = np.asarray(gather_drawn(ctx.engine, ctx.handles, chunk_bounds(ctx), ctx.n_rows, size,
                                     ctx.rng(GROW_TAG, iteration))[0], dtype=np.float64)
    chunk = prepare_chunk(sample.astype(np.float32), np.zeros(sample.shape[1]), ctx.covariance_type)
    scores = np.asarray(log_rho(chunk, estep_params(post, ctx.shift)), dtype=np.float64)
    owner = np.argmax(scores, axis=1)
    spread = sample.std(0)
    scale = np.where(spread > 0, spread, 1.0)
    members = [(rank, int(k), np.flatnonzero(owner == k))
               for rank, k in enumerate(np.argsort(-used_counts(post), kind="stable"))]
    members = [m for m in members if m[2].size >= SPLIT_MIN_ROWS]
    spreads = {k: spread_ratio(sample[mine], 1.0) for _, k, mine in members}  # mean squared distance / D
    typical = float(np.median(list(spreads.values()))) if spreads else 1.0
    cuts = []  # (not wide, -(spread or excess bimodality), order by size, component, kept, child mean)
    with one_blas_thread():  # hundreds of small eigh/GEMM calls: threads only cost (7 ms each at load 3)
        for rank, k, mine in members:
            z = sample[mine] / scale
            parts = halves(z)
            excess = held_out_bimodality(z, parts) - bimodal_threshold(mine.size // 2)
            ref = float(post.covariances[k]) if post.covariance_type == "fixed" else typical
            # (rows all alike, as most components' may be on data of repeated rows: no reference width)
            ratio = spreads[k] / ref if ref > 0 else (math.inf if spreads[k] > 0 else 0.0)
            wide = ratio > SPREAD_SPLIT
            if gated and excess <= 0.0 and not wide and not held_out_split_gain(z, parts) > 0.0:
                continue
            lab = pc_two_means(sample[mine], z)
            if lab.min() == lab.max():
                continue
            cuts.append((not wide, -(ratio if wide else excess), rank, int(k),
                         sample[mine[lab == 0]].mean(0), sample[mine[lab == 1]].mean(0)))
    cuts.sort(key=lambda c: c[:3])
    chosen = cuts[:max(int(n_births), 0)]
    d = sample.shape[1]
    parents = np.asarray([c[3] for c in chosen], dtype=np.int64)
    return (parents, np.asarray([c[4] for c in chosen]).reshape(-1, d),
            np.asarray([c[5] for c in chosen]).reshape(-1, d))


def with_children(post: Posterior, prior: Any, shift: np.ndarray, parents: np.ndarray, kept: np.ndarray,
                  children: np.ndarray) -> Posterior:
    """``post`` with each parent's mean moved to ``kept`` and a child per row of ``children`` (shifted
    means) appended: the parent's covariance and half its count, the parent keeping the other half."""
    nk = used_counts(post).copy()
    half = nk.copy()
    half[parents] = nk[parents] / 2.0
    nk_new = np.concatenate((half, half[parents]))
    beta0 = prior.mean_precision
    means = np.concatenate((post.means, children + shift))
    means[parents] = kept + shift
    nu = None
    if post.degrees_of_freedom is not None and np.ndim(post.degrees_of_freedom) > 0:
        nu = prior.degrees_of_freedom + nk_new
    # every component, then a copy of each parent: the children's covariances (and factors) are the parents'
    grown = post.take(np.concatenate((np.arange(post.n_components), parents)))
    return replace(grown, weight_concentration=weight_posterior(nk_new, prior), mean_precision=beta0 + nk_new,
                   means=means, degrees_of_freedom=nu)


def propose(ctx: Any, post: Posterior, prior: Any, truncation: int, iteration: int,
            gated: bool = False) -> Posterior | None:
    """The birth proposal towards ``truncation`` components (None when no component can be split);
    ``gated``: only components that look like two groups (:func:`split_proposals`)."""
    return propose_splits(ctx, post, prior, truncation, iteration, gated)[0]


def propose_splits(ctx: Any, post: Posterior, prior: Any, truncation: int, iteration: int,
                   gated: bool = False) -> tuple[Posterior | None, np.ndarray]:
    """:func:`propose` and its splits as pairs ``(parent, child)`` of the proposal's indices (each
    parent below each child: the children are appended), shape (B, 2)."""
    parents, kept, children = split_proposals(ctx, post, truncation - post.n_components, iteration, gated)
    if parents.size == 0:
        return None, np.zeros((0, 2), dtype=np.int64)
    pairs = np.stack((parents, post.n_components + np.arange(parents.size)), axis=1).astype(np.int64)
    return with_children(post, replace(prior, n_components=truncation), ctx.shift, parents, kept,
                         children), pairs


def pairs_after_pruning(pairs: np.ndarray, kept: np.ndarray, k: int) -> np.ndarray:
    """``pairs`` of components among ``k`` in the indexing after keeping ``kept`` (ascending indices):
    pairs that lost a member are dropped."""
    new = np.full(int(k), -1, dtype=np.int64)
    new[kept] = np.arange(kept.size)
    out = new[pairs]
    return out[(out >= 0).all(axis=1)]


def propose_outliers(ctx: Any, post: Posterior, prior: Any, limit: int,
                     chunks: np.ndarray | None = None) -> tuple[int, Posterior] | None:
    """Births from groups of the worst-explained rows (:mod:`pipeline.fit.learners.outliers`; of the
    chunks ``chunks`` only, where given), on their own: a child at each group's mean (its component
    keeps its mean), up to ``limit`` components; the truncation that holds them and the proposal, or
    None (no group, no room)."""
    if post.n_components >= limit:
        return None
    means = post.means - ctx.shift
    groups = outlier_births(ctx, estep_params(post, ctx.shift), means, SPREAD_SPLIT, chunks)
    if not groups:
        return None
    k = min(limit, max(int(prior.n_components), post.n_components + len(groups)))
    chosen = groups[: k - post.n_components]
    parents = np.asarray([g[1] for g in chosen], dtype=np.int64)
    children = np.asarray([g[2] for g in chosen]).reshape(-1, post.n_features)
    return k, with_children(post, replace(prior, n_components=k), ctx.shift, parents, means[parents],
                            children)


class Growth:
    """The growth state of one VB EM fit: the truncation, the limit, what happened (checkpointed)."""

    def __init__(self, enabled: bool, start: int, limit: int, iters: int) -> None:
        self.enabled = enabled
        self.start = int(start)
        self.truncation = int(start)
        self.limit = max(int(limit), int(start))
        self.iters = int(iters)
        self.pending = False  # the last iteration converged on a saturated truncation: grow next
        self.refused = False  # a proposal was refused: the bound prefers the fit it had
        self.grown = 0  # accepted doublings
        self.last: ElboTerms | None = None  # the bound of the last iteration (the one to beat)
        self.min_gain = 0.0  # nats a proposal must gain (tol x N, set by the learner)
        self.double = False  # the pending proposal doubles the truncation (else it fills it)
        self.grow_tol = 0.0  # per-row bound change under which a fit not yet converged grows (0: never)
        self.early = False  # the pending proposal comes before convergence (:meth:`wants_early`)
        self.early_off = False  # an early proposal was refused: none again until one is accepted
        self.early_refused = False  # the last step refused an early proposal (its bound repeats)

    @classmethod
    def of(cls, ctx: FitContext, iters: int, eligible: bool = True) -> Growth:
        """The growth of a fit on ``ctx`` (VB EM's and the SGA learners'): from the prior's truncation up
        to ``ctx.max_components`` (default :func:`default_limit`), on where ``ctx.grow`` (the pipeline's
        default), the weights are a DP and the learner's own condition ``eligible`` holds."""
        start = int(ctx.prior.n_components)
        limit = ctx.max_components if ctx.max_components is not None else default_limit(start, ctx.n_rows)
        enabled = bool(ctx.grow) and ctx.weight_type == "dirichlet_process" and eligible
        return cls(enabled, start, limit, iters)

    def warm(self, ctx: FitContext, n_components: int) -> None:
        """A warm start from a finished fit's posterior of ``n_components``: ``ctx.prior`` with the
        truncation :meth:`warm_prior` gives."""
        ctx.prior = self.warm_prior(ctx.prior, n_components)

    def wants_early(self, history: list[float], n_weight: float, n_used: int, n_components: int) -> bool:
        """Whether a fit that has not converged proposes births now: the bound changed by less than
        ``grow_tol`` per unit of weight in the last iteration (births gain nats per row where the
        fit's last steps gain hundredths: waiting for ``tol`` spent 50 of 183 iterations of a
        500-class fit at its start of 50), no early proposal was refused since the last accepted one,
        and the truncation doubles (:meth:`wants`: saturated, below the limit; a fit that does not
        fill its truncation waits for convergence, so a warm start of a converged answer spends no
        round). Records the wish (``early``)."""
        close = len(history) > 1 and abs(history[-1] - history[-2]) / n_weight < self.grow_tol
        if not (self.enabled and close and not self.refused and not self.early_off):
            return False
        self.early = self.wants(n_used, n_components) and self.double
        self.pending = self.early
        return self.early

    def refuse(self) -> None:
        """Every proposal of a round was refused: the growth ends, unless the round was early (then
        only early rounds end, until the fit converges and proposes again)."""
        if self.early:
            self.early_off, self.early_refused = True, True
        else:
            self.refused = True
        self.early = False

    def accepted(self, truncation: int) -> None:
        """A proposal of ``truncation`` components was accepted."""
        self.truncation, self.grown = int(truncation), self.grown + 1
        self.early = self.early_off = False

    def warm_prior(self, prior: Any, n_components: int) -> Any:
        """A warm start from a finished fit's posterior of ``n_components``: ``prior`` with a truncation
        that posterior does not saturate (:func:`unsaturated_truncation`, at least ``prior``'s), which
        becomes the growth's start. That posterior is a converged answer, not a fit bound by its
        truncation, so the refresh spends no doubling proposal on it; births still fill the truncation
        where new rows bring new groups. Disabled growth: ``prior`` as it is."""
        if not self.enabled:
            return prior
        k = max(int(prior.n_components), unsaturated_truncation(n_components))
        self.truncation = self.start = k
        return replace(prior, n_components=k)

    def wants(self, n_used: int, n_components: int) -> bool:
        """Whether a converged fit using ``n_used`` components (``n_components`` kept) proposes births,
        and records the wish: a saturated truncation below the limit doubles; one that is not
        saturated is filled by births of the components that look like two groups (a fit started
        from as many components as classes, or grown from fewer, ends with some classes merged and
        others split; the merge moves join the second, these births part the first)."""
        self.double = saturated(n_used, self.truncation) and self.truncation < self.limit
        fill = n_components < self.truncation
        self.pending = self.enabled and not self.refused and (self.double or fill)
        return self.pending

    def next_truncation(self) -> int:
        return min(2 * self.truncation, self.limit) if self.double else self.truncation

    def info(self, n_used: int) -> dict[str, Any]:
        """What result.json says about the truncation (``truncation`` entry)."""
        sat = saturated(n_used, self.truncation)
        return {"start": self.start, "final": self.truncation, "limit": self.limit, "grew": self.grown,
                "used": int(n_used), "saturated": bool(sat), "growth": bool(self.enabled),
                "refused": bool(self.refused),
                "limit_hit": bool(sat and (self.truncation >= self.limit or not self.enabled))}

    def to_state(self) -> GrowthState:
        return GrowthState(self.truncation, self.pending, self.refused, self.grown, self.double, self.early,
                           self.early_off, self.early_refused, self.last, self.min_gain)

    def load(self, state: GrowthState | None) -> None:
        """The record of :meth:`to_state` (None: as started)."""
        if state is None:
            return
        self.truncation, self.grown = int(state.truncation), int(state.grown)
        self.min_gain = float(state.min_gain)
        self.pending, self.refused, self.double = bool(state.pending), bool(state.refused), bool(state.double)
        self.early, self.early_off = bool(state.early), bool(state.early_off)
        self.early_refused, self.last = bool(state.early_refused), state.last


@dataclass
class GrowthState(LearnerState):
    """:class:`Growth`'s record in a checkpoint (its settings come from the options and the context)."""

    truncation: int
    pending: bool
    refused: bool
    grown: int
    double: bool
    early: bool
    early_off: bool
    early_refused: bool
    last: ElboTerms | None  # the last reported bound
    min_gain: float
