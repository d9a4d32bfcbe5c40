"""The fit setup: everything between a validated spec and the first iteration.

:func:`setup` wraps the data as a row source, computes its projection when the spec asks for
one (:mod:`pipeline.fit.projection`), prepares its chunks on the engine (rows projected, shifted by the
first row, the ``[x*x, x]`` cache where the learner uses it), checks the rows of sources not
validated on the driver, reduces the data moments, estimates ``sigma^2`` for covariance 'fixed'
(the learner's own estimate or k-means), builds the prior, and returns a :class:`FitContext`.
:func:`initial_posterior` gives the first posterior (given responsibilities, the learner's own
initialisation, random responsibilities, or nearest centres of k-means / k-means++ / random rows,
or the pipeline's projected k-means++ start).
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from pipeline.engine.sources import (
    ArraySource,
    DaskArraySource,
    StoreSource,
    chunk_weights,
    is_dask_array,
    is_store_path,
)
from pipeline.fit.learners import FitContext, learner_class
from pipeline.fit.projection import ProjectedSource, Stage, projection_pass
from pipeline.fit.spec import FitSpec
from vbcore.data.validation import check_array_2d, check_weights
from vbcore.errors import ConfigError, FacedWarning, InputError
from vbcore.kernels.estep import prepare_chunk
from vbcore.kernels.init import (
    check_kernel,
    moments_kernel,
    nearest_stats_kernel,
    projected_nearest_kernel,
    random_stats_kernel,
    resp_stats_kernel,
)
from vbcore.kernels.projection import Projection
from vbcore.model.mstep import m_step
from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior, default_prior
from vbcore.model.stats import SuffStats


def open_source(X: Any, chunk_rows: int, sample_weight: Any = None) -> Any:
    """``X`` as a row source: a feature-store path, a dask array, or an array-like (validated), with
    the rows' weights ``sample_weight`` (validated; a store's own ``weights`` array otherwise)."""
    if is_store_path(X):
        source: Any = StoreSource(str(getattr(X, "path", X)))
        if sample_weight is not None:
            raise InputError(f"{source.path}: a feature store carries its own row weights (ingest with "
                             "--weights); sample_weight is for arrays")
        return source
    source = DaskArraySource(X) if is_dask_array(X) else ArraySource(check_array_2d(X), int(chunk_rows))
    if sample_weight is not None:
        source.weights = check_weights(sample_weight, source.n_rows, some_positive=True,
                                       n_features=source.n_features, dtype=source.dtype)
    return source


def seed_entropy(random_state: Any) -> int | None:
    """The integer seed of a fit (None for unseeded fits and RandomState instances)."""
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return int(random_state)
    return None


def setup(spec: FitSpec, raw: Any, engine: Any, random_state: Any,
          projection: Projection | None = None, shift: np.ndarray | None = None,
          stage: Stage | None = None) -> FitContext:
    """Project (``spec.pca``), prepare the chunks, reduce the moments, build the prior: the context
    of the learner.

    ``spec`` is resolved (:meth:`FitSpec.resolved`); ``random_state`` is the seed or RandomState
    of the k-means and sampling draws; ``projection`` is a warm start's or a checkpoint's (else
    one is computed when ``spec.pca`` is set); ``shift`` the rows' offset (default: the first row;
    batches of ``partial_fit`` share the first batch's); ``stage(text, step)`` is told the projection's
    passes and the reading of the rows (a progress display's). The caller releases ``ctx.handles`` on
    the engine."""
    cls = learner_class(spec.learner)
    ct = spec.covariance
    assert ct is not None, "resolve the spec first"
    if spec.pca is not None and projection is None:
        projection = projection_pass(engine, raw, int(spec.pca), bool(spec.whiten), spec.pca_solver,
                                     seed_entropy(random_state), stage, spec.normalize)
    if stage is not None:
        stage("reading the rows (chunks, moments, prior)", None)
    source = raw if projection is None else ProjectedSource(raw, projection)
    shift = np.asarray(source.load(0)[0] if shift is None else shift, dtype=np.float64)
    squares = ct not in ("full", "tied") and cls.cache_squares
    # chunks are made from the raw rows (projected inside prepare_chunk, on the workers)
    expansion = (2.0 if squares else 1.0) * source.n_features / raw.n_features  # [x*x, x]; x a view
    handles = engine.prepare(raw, prepare_chunk, shift, ct, squares, projection, expansion=expansion)
    try:
        if not isinstance(source, ArraySource):  # arrays were checked by check_array_2d
            engine.map(check_kernel, handles, source.describe(),
                       per_chunk=[s.start for s in source.chunk_slices()])
        moments = engine.map_reduce(moments_kernel, handles)
        if not moments.total_weight > 0:  # (arrays' sample_weight: checked by open_source)
            raise InputError(f"{source.describe()}: every row has weight 0 (the store's weights sum to 0): "
                             "nothing to fit; ingest it again with positive --weights, or without them")
        sigma2 = spec.fixed_variance
        if ct == "fixed" and sigma2 is None:
            sigma2 = _estimate_sigma2(spec, cls, engine, handles, source, random_state)
        prior = build_prior(spec, moments, source.n_features, sigma2)
        check_reg_covar(float(spec.reg_covar), ct, moments)
        if not cls.empirical_bayes:  # held at their initial values by learners that do not update them
            prior = replace(prior, empirical=())
    except BaseException:
        engine.release(handles)
        raise
    return FitContext(engine=engine, handles=handles, source=source, prior=prior, shift=shift,
                      reg_covar=float(spec.reg_covar), n_rows=source.n_rows,
                      n_features=source.n_features, covariance_type=ct, weight_type=spec.weights,
                      seed=seed_entropy(random_state),
                      chunk_starts=[sl.start for sl in source.chunk_slices()], projection=projection,
                      total_weight=moments.weight, moments=moments,
                      grow=bool(spec.grow),
                      max_components=None if spec.max_components is None else int(spec.max_components))


def _estimate_sigma2(spec: FitSpec, cls: Any, engine: Any, handles: list[Any], source: Any,
                     random_state: Any) -> float:
    """The learner's own ``sigma^2`` estimate on rows gathered through the engine, or the default:
    the mean per-dimension within-cluster variance of k-means with K clusters."""
    if cls.sigma2_sample_rows is not None:
        from pipeline.fit.learners.sampling import gather_drawn

        seq = np.random.SeedSequence(seed_entropy(random_state), spawn_key=(0, 4))
        bounds = np.asarray([*(sl.start for sl in source.chunk_slices()), source.n_rows], dtype=np.int64)
        sample = gather_drawn(engine, handles, bounds, source.n_rows, int(cls.sigma2_sample_rows),
                              np.random.default_rng(seq))[0]  # (rows of positive weight)
        value = cls.estimate_fixed_variance(sample, int(spec.components), random_state) \
            if sample.shape[0] > 1 else None
        if value is not None:
            return float(value)
    sample, w = sample_rows(source, int(spec.components), random_state, weights=True)
    return default_fixed_variance(sample if w is None else sample[w > 0], int(spec.components), random_state)


def default_fixed_variance(X: np.ndarray, k: int, random_state: Any) -> float:
    """Mean per-dimension within-cluster variance of k-means with ``k`` clusters on (a sample of at
    most 20,000 rows of) X: the scale of one cluster, not of the whole data set."""
    from sklearn.cluster import KMeans

    rng = check_random_state(random_state)
    n, d = X.shape
    rows = np.sort(rng.choice(n, size=20_000, replace=False)) if n > 20_000 else np.arange(n)
    sample = X[rows].astype(np.float64)
    k = min(k, len(np.unique(sample, axis=0)))
    km = KMeans(n_clusters=k, n_init=1, random_state=rng).fit(sample)
    var = km.inertia_ / (len(sample) * d)
    if not var > 0:
        var = float(np.mean(sample.var(0))) or 1.0
    return float(var)


def check_prior_settings(spec: FitSpec, d: int) -> None:
    """The prior settings checked against the number of features alone, before any data pass or
    write (:func:`pipeline.service.check_fit`): the prior is built with stand-in data moments (zero
    mean, unit variances), so every message is :func:`vbcore.model.priors.validate_prior`'s."""
    assert spec.covariance is not None, "resolve the spec first"
    wishart = spec.covariance in ("full", "tied")
    stand_in = SuffStats(nk=np.array([2.0]), mean=np.zeros((1, d)),
                         scatter=np.eye(d)[None] if wishart else np.ones((1, d)), sum_rlogr=0.0,
                         n_rows=2, shift=np.zeros(d))
    build_prior(spec, stand_in, d, spec.fixed_variance or 1.0)


def check_components(k: int, n_rows: int, where: str) -> None:
    """Refuse a start of more components than rows (``-k 100000`` on 500 rows asked for 74.5 GiB of
    K x D x D statistics before failing); checked before any data pass. Growth (``grow``) stays
    bounded by the rows on its own (:attr:`FitSpec.max_components`)."""
    if k > n_rows:
        raise ConfigError(f"{where}: n_components (-k) is {k} but the data hold {n_rows} rows; a fit "
                          f"starts with at most one component per row: use at most {n_rows}")


#: ``reg_covar`` at least this share of the data's mean variance per dimension draws a warning
REG_COVAR_SHARE = 0.1


def check_reg_covar(reg_covar: float, covariance_type: str, moments: SuffStats) -> None:
    """Warn when ``reg_covar`` (absolute, as scikit-learn's) is not small against the data's mean
    variance per dimension: it then widens every cluster past the data's own spread and the clusters
    merge (features of scale 1e-4, three classes 5 deviations apart: one cluster found)."""
    if covariance_type == "fixed" or reg_covar <= 0:  # (the fixed variance takes no reg_covar)
        return
    s = np.asarray(moments.scatter[0])
    var = float(np.mean(np.diagonal(s) if s.ndim == 2 else s)) / max(moments.total_weight - 1, 1)
    if var > 0 and reg_covar >= REG_COVAR_SHARE * var:  # (rows all alike have no spread to swamp)
        warnings.warn(FacedWarning(
            f"{{reg_covar}} {reg_covar:g} is {reg_covar / var:.3g} times the data's mean variance per "
            f"dimension ({var:.3g}): it widens every cluster past the data's own spread, so clusters "
            "merge; rescale (standardise) the features or lower {reg_covar}"), stacklevel=2)


def build_prior(spec: FitSpec, moments: SuffStats, d: int, fixed_variance: float | None) -> Prior:
    """The prior of the spec, with data-dependent defaults from the moments (``spec.priors``: the
    pipeline's empirical defaults or scikit-learn's; :func:`vbcore.model.priors.default_prior`)."""
    mean_prior = None if spec.mean_prior is None else np.asarray(spec.mean_prior, dtype=np.float64)
    if mean_prior is not None and mean_prior.shape != (d,):
        raise ConfigError(f"mean_prior must have shape (n_features,) = ({d},), got {mean_prior.shape}")
    wc = spec.weight_concentration_prior
    if wc is None:  # a learner's default, e.g. a0 = N (Lim & Jiang 2024, Algorithm 1)
        wc = learner_class(spec.learner).default_weight_concentration(moments.total_weight)
    assert spec.covariance is not None, "resolve the spec first"
    return default_prior(
        covariance_type=spec.covariance, weight_type=spec.weights, n_components=int(spec.components),
        data_mean=moments.raw_mean()[0], data_covariance=moments.data_covariance(),
        weight_concentration=wc, mean_precision=spec.mean_precision_prior, mean=mean_prior,
        degrees_of_freedom=spec.degrees_of_freedom_prior,
        covariance=None if spec.covariance_prior is None
        else np.asarray(spec.covariance_prior, dtype=np.float64),
        fixed_variance=fixed_variance, defaults=spec.priors, n_rows=float(moments.total_weight),
    )


def initial_posterior(spec: FitSpec, ctx: FitContext, resp_init: Any, random_state: Any) -> Posterior:
    """The first posterior from ``resp_init`` or ``spec.init``: one M-step from the initial
    responsibilities (given, random, or each row to its nearest centre)."""
    return m_step(initial_stats(spec, ctx, resp_init, random_state), ctx.prior, ctx.reg_covar)


def initial_stats(spec: FitSpec, ctx: FitContext, resp_init: Any, random_state: Any) -> SuffStats:
    source, engine, handles = ctx.source, ctx.engine, ctx.handles
    n, k = source.n_rows, int(spec.components)
    slices = source.chunk_slices()
    if resp_init is not None:
        r = check_resp_init(resp_init, n, k)
        return engine.map_reduce(resp_stats_kernel, handles, per_chunk=[r[s] for s in slices])
    rng = check_random_state(random_state)
    if spec.init == "random":
        seeds = np.random.SeedSequence(int(rng.randint(2**31 - 1))).spawn(len(slices))
        return engine.map_reduce(random_stats_kernel, handles, k, per_chunk=seeds)
    sample, w = sample_rows(source, k, random_state, weights=True)
    if w is not None:  # weighted rows: a row of weight 0 is no row, and none may seed a centre
        sample, w = sample[w > 0], w[w > 0]
    if spec.init in ("kmeans", "k-means++") and sample.shape[0] > sample_size(k):
        # whole chunks overshoot the sample size (one 65,536-row chunk of an array: every row);
        # scikit-learn's k-means costs O(rows K D) an iteration, so it gets sample_size(k) of them
        gen = np.random.default_rng(int(rng.randint(2**31 - 1)))
        keep = np.sort(gen.choice(sample.shape[0], size=sample_size(k), replace=False))
        sample, w = sample[keep], None if w is None else w[keep]
    m = min(k, sample.shape[0])
    if spec.init == "k-means++-projected":  # seeds drawn by weight among the rows of positive weight
        return projected_init_stats(ctx, sample, m, k, rng, w)  # converts only the rows it draws
    sample = sample.astype(np.float64)
    if spec.init == "kmeans":  # k-means of the weighted rows (a weighted coreset: of the data)
        from sklearn.cluster import KMeans

        km = KMeans(n_clusters=m, n_init=1, random_state=rng)
        centres = km.fit(sample, sample_weight=w).cluster_centers_
    elif spec.init == "k-means++":
        from sklearn.cluster import kmeans_plusplus

        centres, _ = kmeans_plusplus(sample, m, sample_weight=w, random_state=rng)
    else:  # random_from_data: rows drawn in proportion to their weight
        p = None if w is None or np.all(w == w[0]) else w / w.sum()  # equal weights: uniform
        centres = sample[rng.choice(sample.shape[0], size=m, replace=False, p=p)]
    return engine.map_reduce(nearest_stats_kernel, handles, np.asarray(centres, dtype=np.float64), k)


#: the projected k-means++ start: sample rows max(PROJECTED_MIN_ROWS, PROJECTED_ROWS_PER_CLUSTER * K)
#: and the projection's width
PROJECTED_MIN_ROWS = 5000
PROJECTED_ROWS_PER_CLUSTER = 5
PROJECTED_WIDTH = 256


def projected_init_stats(ctx: FitContext, sample: np.ndarray, m: int, k: int, rng: Any,
                         w: np.ndarray | None = None) -> SuffStats:
    """The pipeline's default start (``init='k-means++-projected'``): greedy k-means++ seeds
    (Arthur & Vassilvitskii 2007) among at most ``max(5000, 5 K)`` sample rows, distances in a
    Gaussian random projection to 256 dimensions when D is larger (as the SGA learners seed,
    :func:`vbcore.kernels.sga_stats.kmeanspp_seeds`), then every row to its nearest seed in that projection
    (:func:`vbcore.kernels.init.projected_nearest_kernel`): no Lloyd iterations, O(N p K + N D).
    ``w``: the sample rows' weights (all positive); the seeds are drawn by weight."""
    from vbcore.kernels.sga_stats import kmeanspp_seeds

    seed = int(rng.randint(2**31 - 1))
    gen = np.random.default_rng(np.random.SeedSequence(seed))
    size = min(sample.shape[0], max(PROJECTED_MIN_ROWS, PROJECTED_ROWS_PER_CLUSTER * k))
    rows = np.sort(gen.choice(sample.shape[0], size=size, replace=False))
    sub = np.asarray(sample[rows], dtype=np.float64) - ctx.shift  # float64, exact for float32 rows
    idx = kmeanspp_seeds(sub, m, gen, weights=None if w is None else w[rows])
    d = sub.shape[1]
    proj = (np.eye(d) if d <= PROJECTED_WIDTH
            else gen.standard_normal((d, PROJECTED_WIDTH)) / np.sqrt(PROJECTED_WIDTH)).astype(np.float32)
    centres = sub[idx].astype(np.float32) @ proj
    return ctx.engine.map_reduce(projected_nearest_kernel, ctx.handles, proj, centres, k)


def check_resp_init(resp_init: Any, n: int, k: int) -> np.ndarray:
    """``resp_init`` checked: shape (n, k), finite, >= 0, rows summing to one."""
    r = np.asarray(resp_init, dtype=np.float64)
    if r.shape != (n, k):
        raise InputError(f"resp_init must have shape (n_samples, n_components) = ({n}, {k}), got {r.shape}")
    if not np.all(np.isfinite(r)) or np.any(r < 0):
        row = int(np.argwhere(~np.isfinite(r) | (r < 0))[0][0])
        raise InputError(f"resp_init must be finite and >= 0; row {row} is not")
    sums = r.sum(1)
    if not np.allclose(sums, 1.0, rtol=0, atol=1e-6):
        row = int(np.flatnonzero(~np.isclose(sums, 1.0, rtol=0, atol=1e-6))[0])
        raise InputError(f"resp_init rows must sum to 1; row {row} sums to {sums[row].item()}")
    return r


def sample_size(k: int) -> int:
    """Rows the starts sample for ``k`` components: ``max(10000, 20 K)``."""
    return max(10_000, 20 * int(k))


def sample_rows(source: Any, k: int, random_state: Any, weights: bool = False) -> Any:
    """Whole chunks picked at random (seeded) until :func:`sample_size` rows: k-means input. With
    ``weights``: ``(rows, their weights)``, the weights None for unweighted rows; rows of weight 0
    are left out as each chunk is read and do not count towards the sample's size (the starts would
    drop them: on a store of mostly weight-0 rows every chunk may be read, never all kept)."""
    rng = check_random_state(random_state)
    target = sample_size(k)
    slices = source.chunk_slices()
    order = range(len(slices)) if source.n_rows <= target else rng.permutation(len(slices))
    picked: list[tuple[int, np.ndarray, np.ndarray | None]] = []
    total = 0
    for i in order:
        w = chunk_weights(source, int(i)) if weights else None
        rows = source.load(int(i))
        if w is not None:
            rows, w = rows[w > 0], w[w > 0]
        picked.append((int(i), rows, w))
        total += rows.shape[0]
        if total >= target:
            break
    picked.sort(key=lambda p: p[0])
    rows = np.concatenate([p[1] for p in picked])
    if not weights:
        return rows
    return rows, None if any(p[2] is None for p in picked) else np.concatenate([p[2] for p in picked])
