"""The truncated E-step (vbcore.kernels.truncated) against the exact one and float64 brute force."""

from __future__ import annotations

import numpy as np
import pytest

from tests._reference import brute_log_rho, brute_stats
from vbcore.kernels.estep import chunk_statistics, estep_params, prepare_chunk, responsibilities, vbem_kernel
from vbcore.kernels.truncated import (
    CandidateState,
    NeighbourScores,
    compose_remaps,
    initial_neighbours,
    pivot_clusters,
    relabel_neighbours,
    truncated_kernel,
    truncated_params,
    update_neighbours,
)
from vbcore.model.elbo import elbo_terms
from vbcore.model.mstep import m_step
from vbcore.model.priors import default_prior

TYPES = ["full", "tied", "diag", "spherical", "fixed"]
WEIGHTS = ["dirichlet_process", "dirichlet_distribution"]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    centres = rng.normal(scale=6.0, size=(10, 4))
    return np.vstack([rng.normal(loc=c, scale=0.3 + 0.2 * i, size=(25, 4)) for i, c in enumerate(centres)])


def _setup(X, ct, wt, k, seed=0):
    rng = np.random.default_rng(seed)
    prior = default_prior(covariance_type=ct, weight_type=wt, n_components=k, data_mean=X.mean(0),
                          data_covariance=np.cov(X.T), fixed_variance=1.0 if ct == "fixed" else None)
    shift = X[0].astype(np.float64)
    chunk = prepare_chunk(X, shift, ct)
    post = m_step(chunk_statistics(chunk, rng.dirichlet(np.ones(k), size=X.shape[0])), prior)
    return prior, shift, chunk, post


def _params(post, shift, ct, candidates, neighbours, iteration=1, n_random=1, pivots=None, nb=None,
            remap=None):
    est = estep_params(post, shift)
    k = post.n_components
    if nb is None:
        nb = initial_neighbours(post.means, est, shift, ct, neighbours)
    if pivots is None:
        pivots = pivot_clusters(k, candidates, neighbours, np.random.default_rng(7))
    return truncated_params(est, nb, candidates, n_random, 11, iteration, pivots, remap)


@pytest.mark.parametrize("wt", WEIGHTS)
@pytest.mark.parametrize("ct", TYPES)
def test_all_candidates_equal_the_exact_e_step(data, ct, wt):
    """C' = K: the same responsibilities, statistics and ELBO as the exact E-step, to 1e-12."""
    k = 6
    prior, shift, chunk, post = _setup(data, ct, wt, k)
    params = _params(post, shift, ct, candidates=k, neighbours=k)
    state, res = truncated_kernel(chunk, CandidateState(0), params)
    exact = vbem_kernel(chunk, estep_params(post, shift))
    dense = np.zeros((chunk.n_rows, k))
    np.put_along_axis(dense, state.idx, state.resp.astype(np.float64), axis=1)
    np.testing.assert_allclose(dense, responsibilities(chunk, estep_params(post, shift)), atol=1e-6)
    assert np.all(np.sort(state.idx, axis=1) == np.arange(k))
    np.testing.assert_allclose(res.stats.nk, exact.stats.nk, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(res.stats.mean, exact.stats.mean, rtol=1e-12, atol=1e-11)
    np.testing.assert_allclose(res.stats.scatter, exact.stats.scatter, rtol=1e-12, atol=1e-10)
    assert res.log_norm == pytest.approx(exact.log_norm, rel=1e-12)
    assert res.stats.sum_rlogr == pytest.approx(exact.stats.sum_rlogr, rel=1e-12, abs=1e-10)
    a = elbo_terms(res.stats, post, prior).total
    b = elbo_terms(exact.stats, post, prior).total
    assert a == pytest.approx(b, rel=1e-12)


@pytest.mark.parametrize("ct", TYPES)
def test_sparse_statistics_match_float64_bruteforce(data, ct):
    """C' = 2 of K = 8: q is the softmax of the brute-force ln rho restricted to the kept clusters,
    which are the best of their search space, and the statistics are those of that dense q."""
    k, c = 8, 2
    prior, shift, chunk, post = _setup(data + 100.0, ct, "dirichlet_process", k)
    X = data + 100.0
    params = _params(post, shift, ct, candidates=c, neighbours=3)
    state0, _ = truncated_kernel(chunk, CandidateState(0), params)
    state, res = truncated_kernel(chunk, state0, _params(post, shift, ct, c, 3, iteration=2))
    ref = brute_log_rho(X, post)
    sel = np.take_along_axis(ref, state.idx.astype(np.int64), axis=1)
    assert np.all(np.diff(sel, axis=1) <= 1e-9)  # best first
    # the kept clusters are at least as good as the previous ones (they were in the search space)
    prev = np.take_along_axis(ref, state0.idx.astype(np.int64), axis=1)
    assert np.all(sel >= prev - 1e-9)
    lse = np.logaddexp.reduce(sel, axis=1)
    q = np.exp(sel - lse[:, None])
    np.testing.assert_allclose(state.resp, q, rtol=1e-6)
    dense = np.zeros((X.shape[0], k))
    np.put_along_axis(dense, state.idx.astype(np.int64), q, axis=1)
    nk, mean, scat = brute_stats(X - shift, dense)
    np.testing.assert_allclose(res.stats.nk, nk, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.stats.mean[nk > 0], mean[nk > 0], rtol=1e-9, atol=1e-9)
    want = {"full": scat, "tied": scat.sum(0, keepdims=True)}.get(ct, np.diagonal(scat, axis1=1, axis2=2))
    np.testing.assert_allclose(res.stats.scatter, want, rtol=1e-9, atol=1e-8)
    assert res.log_norm == pytest.approx(lse.sum(), rel=1e-12)
    assert res.stats.sum_rlogr == pytest.approx(np.sum(q * np.log(q)), rel=1e-9, abs=1e-9)


def _run(chunks, prior, shift, ct, post, iters, c, g, n_random=1):
    """Truncated VB EM over several chunks; returns the ELBO after every iteration."""
    k = post.n_components
    states = [CandidateState(i * 1000) for i in range(len(chunks))]
    pivots = pivot_clusters(k, c, g, np.random.default_rng(1))
    est = estep_params(post, shift)
    nb = initial_neighbours(post.means, est, shift, ct, g)
    out = []
    for it in range(1, iters + 1):
        params = truncated_params(estep_params(post, shift), nb, c, n_random, 5, it, pivots)
        pairs = [truncated_kernel(ch, s, params) for ch, s in zip(chunks, states, strict=True)]
        states = [p[0] for p in pairs]
        res = pairs[0][1]
        for p in pairs[1:]:
            res = res.merge(p[1])
        nb = update_neighbours(res.scores, nb)
        post = m_step(res.stats, prior)
        out.append(elbo_terms(res.stats, post, prior).total)
    return np.asarray(out), post, res


@pytest.mark.parametrize("wt", WEIGHTS)
@pytest.mark.parametrize("ct", TYPES)
def test_elbo_never_decreases(data, ct, wt):
    k = 12
    prior, shift, chunk, post = _setup(data, ct, wt, k, seed=2)
    chunks = [prepare_chunk(data[i : i + 90], shift, ct) for i in range(0, data.shape[0], 90)]
    elbo, _, _ = _run(chunks, prior, shift, ct, post, 10, c=2, g=3)
    assert np.all(np.diff(elbo) >= -1e-9 * np.abs(elbo[:-1])), np.diff(elbo)


@pytest.mark.parametrize("ct", TYPES)
def test_truncated_bound_is_below_the_exact_one_for_the_same_q_theta(data, ct):
    """The truncated q(Z) is a restriction of the exact one: for the same q(theta) its ELBO is lower."""
    k = 10
    prior, shift, chunk, post = _setup(data, ct, "dirichlet_process", k, seed=4)
    for c in (1, 2, 3):
        params = _params(post, shift, ct, candidates=c, neighbours=3)
        _, res = truncated_kernel(chunk, CandidateState(0), params)
        exact = vbem_kernel(chunk, estep_params(post, shift))
        a, b = elbo_terms(res.stats, post, prior).total, elbo_terms(exact.stats, post, prior).total
        assert a <= b + 1e-9 * abs(b)
        assert res.log_norm <= exact.log_norm + 1e-9 * abs(exact.log_norm)


@pytest.mark.parametrize("ct", ["diag", "full", "tied"])
def test_float32_data_close_to_float64(data, ct):
    k = 8
    X = data + 1e3
    prior, shift, chunk64, post = _setup(X, ct, "dirichlet_process", k)
    chunk32 = prepare_chunk(X.astype(np.float32), shift, ct)
    params = _params(post, shift, ct, candidates=3, neighbours=4)
    s64, r64 = truncated_kernel(chunk64, CandidateState(0), params)
    s32, r32 = truncated_kernel(chunk32, CandidateState(0), params)
    assert s32.idx.dtype == np.int32 and r32.stats.nk.dtype == np.float64
    same = np.all(s32.idx == s64.idx, axis=1)
    assert same.mean() > 0.95
    np.testing.assert_allclose(r32.log_norm, r64.log_norm, rtol=1e-5)
    np.testing.assert_allclose(r32.stats.nk, r64.stats.nk, rtol=1e-3, atol=1e-2)


def test_update_neighbours_takes_the_best_mean_scores():
    k = 4
    prev = np.array([[0, 1, 2], [1, 0, -1], [2, 3, 1], [3, 2, 0]], dtype=np.int32)
    # cluster 0: means s=1 -0.5, s=2 -5, s=3 -1; cluster 1: only s=2 (mean -2)
    keys = np.array([0 * k + 0, 0 * k + 1, 0 * k + 2, 0 * k + 3, 1 * k + 2], dtype=np.int64)
    sums = np.array([0.0, -1.0, -10.0, -2.0, -6.0])
    counts = np.array([2, 2, 2, 2, 3], dtype=np.int64)
    out = update_neighbours(NeighbourScores(keys, sums, counts), prev)
    np.testing.assert_array_equal(out[0], [0, 1, 3])
    np.testing.assert_array_equal(out[1], [1, 2, 0])  # filled from the previous list
    np.testing.assert_array_equal(out[2], [2, 3, 1])  # no scores: the previous list
    # equal means: the lower cluster first, whatever the order of the keys' means
    ties = NeighbourScores(np.array([3 * k + 0, 3 * k + 1, 3 * k + 2], dtype=np.int64),
                           np.array([-4.0, -2.0, -1.0]), np.array([4, 2, 1], dtype=np.int64))
    np.testing.assert_array_equal(update_neighbours(ties, prev)[3], [3, 0, 1])
    left = NeighbourScores(keys[:2], sums[:2], counts[:2])
    merged = left.merge(NeighbourScores(keys[1:], sums[1:], counts[1:]))
    np.testing.assert_array_equal(merged.keys, keys)
    np.testing.assert_allclose(merged.sums, [0.0, -2.0, -10.0, -2.0, -6.0])
    np.testing.assert_array_equal(merged.counts, [2, 4, 2, 2, 3])


def test_relabel_after_pruning_drops_and_renumbers():
    nb = np.array([[0, 2, 1], [1, 3, 0], [2, 0, 3], [3, 1, 2]], dtype=np.int32)
    kept = np.array([3, 0, 2])  # new 0 = old 3, new 1 = old 0, new 2 = old 2; old 1 dropped
    new, remap = relabel_neighbours(nb, kept)
    np.testing.assert_array_equal(remap, [1, -1, 2, 0])
    np.testing.assert_array_equal(new, [[0, 2, -1], [1, 2, -1], [2, 1, 0]])
    np.testing.assert_array_equal(compose_remaps(remap, np.array([-1, 0, 1])), [0, -1, 1, -1])


@pytest.mark.parametrize("ct", ["diag", "full"])
def test_pruned_candidates_are_remapped(data, ct):
    """After dropping clusters the stored candidates are renumbered; rows whose every candidate was
    dropped search all clusters; the result equals a run that never had the dropped clusters as
    candidates when the kept ones were all of them."""
    k = 8
    prior, shift, chunk, post = _setup(data, ct, "dirichlet_process", k)
    params = _params(post, shift, ct, candidates=2, neighbours=3)
    state, res = truncated_kernel(chunk, CandidateState(0), params)
    kept = np.setdiff1d(np.arange(k), state.idx[0])  # row 0 loses every candidate
    post2 = m_step(res.stats, prior)
    from pipeline.fit.learners.vbem.learner import prune_components

    mask = np.zeros(k, dtype=bool)
    mask[kept] = True
    post2 = prune_components(post2, mask)
    nb, remap = relabel_neighbours(params.neighbours, kept)
    p2 = truncated_params(estep_params(post2, shift), nb, 2, 1, 11, 2, np.arange(kept.size), remap)
    state2, res2 = truncated_kernel(chunk, state, p2)
    assert state2.idx.min() >= 0 and state2.idx.max() < kept.size
    ref = brute_log_rho(data, post2)
    sel = np.take_along_axis(ref, state2.idx.astype(np.int64), axis=1)
    lost = ~np.isin(state.idx[:, 0], kept)
    # rows that lost every candidate searched everything: they hold their exact best cluster
    lost_all = ~np.isin(state.idx, kept).any(axis=1)
    np.testing.assert_array_equal(state2.idx[lost_all, 0], np.argmax(ref[lost_all], axis=1))
    assert lost.any() and lost_all[0]
    assert np.all(np.diff(sel, axis=1) <= 1e-9)
    assert res2.stats.nk.shape == (kept.size,)


# ---- the learner: options, fits, checkpoints, engines -------------------------------------------------
from pipeline import VBMixture  # noqa: E402
from pipeline.engine.engines import LocalEngine  # noqa: E402
from pipeline.store.features import FeatureStore  # noqa: E402
from vbcore.errors import ConfigError  # noqa: E402


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(5)
    centres = rng.normal(scale=5.0, size=(12, 6))
    X = np.vstack([rng.normal(loc=c, size=(60, 6)) for c in centres])
    return X[rng.permutation(len(X))]


def _bits(m):
    return [getattr(m, a) for a in ("means_", "covariances_", "weights_", "lower_bounds_")]


def _same_bits(a, b):
    for x, y in zip(_bits(a), _bits(b), strict=True):
        assert np.array_equal(x, y)
    assert a.n_iter_ == b.n_iter_


@pytest.mark.parametrize("ct", TYPES)
def test_fit_with_all_candidates_equals_the_exact_fit(blobs, ct):
    kw = dict(n_components=8, covariance_type=ct, max_iter=6, tol=0.0, random_state=0, chunk_rows=200)
    exact = VBMixture(**kw).fit(blobs)
    trunc = VBMixture(learner_options={"candidates": 8, "neighbours": 8}, **kw).fit(blobs)
    np.testing.assert_allclose(trunc.lower_bounds_, exact.lower_bounds_, rtol=1e-12)
    np.testing.assert_allclose(trunc.means_, exact.means_, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("wt", "search"), [("dirichlet_process", "best"), ("dirichlet_distribution", "all")])
def test_fit_bound_never_decreases_and_is_close_to_exact(blobs, wt, search):
    kw = dict(n_components=16, covariance_type="diag", max_iter=25, tol=0.0, random_state=1, chunk_rows=250,
              weight_concentration_prior_type=wt)
    hist = []
    trunc = VBMixture(learner_options={"candidates": 2, "neighbours": 4, "search": search, "block_rows": 8},
                      **kw)
    trunc.fit(blobs, callback=lambda info: hist.append(info["passes"]))
    lb = trunc.lower_bounds_
    assert np.all(np.diff(lb) >= -1e-9 * np.abs(lb[:-1]))
    exact = VBMixture(**kw).fit(blobs)
    assert trunc.lower_bound_ <= exact.lower_bound_ + 1e-6 * abs(exact.lower_bound_) or \
        abs(trunc.lower_bound_ - exact.lower_bound_) < 0.01 * abs(exact.lower_bound_)
    assert hist == list(range(1, 26))  # one engine pass per iteration


def test_options_are_checked():
    with pytest.raises(ConfigError, match=r"learner option 'candidates' of 'vbem' must be an integer >= -1 "
                       r"\(-1: automatic, 0: the exact E-step\), got -2"):
        VBMixture(2, learner_options={"candidates": -2}).fit(np.random.default_rng(0).normal(size=(20, 2)))
    with pytest.raises(ConfigError, match=r"learner option 'neighbours' of 'vbem' must be an integer >= 1"):
        VBMixture(2, learner_options={"candidates": 2, "neighbours": 0}).fit(np.ones((20, 2)))
    with pytest.raises(ConfigError, match=r"option 'search' of 'vbem' must be one of \('best', 'all'\)"):
        VBMixture(2, learner_options={"search": "near"}).fit(np.ones((20, 2)))
    with pytest.raises(ConfigError, match=r"learner option 'block_rows' of 'vbem' must be an integer >= 1"):
        VBMixture(2, learner_options={"block_rows": 0}).fit(np.ones((20, 2)))
    with pytest.raises(ConfigError, match=r"learner option 'first_search' of 'vbem' must be one of"):
        VBMixture(2, learner_options={"first_search": "some"}).fit(np.ones((20, 2)))
    with pytest.raises(ConfigError, match=r"options 'candidates' and 'moves' of 'vbem' cannot be combined "
                       r"for covariance 'tied' yet; use candidates=0 \(the exact E-step\) with moves"):
        VBMixture(2, covariance_type="tied",
                  learner_options={"candidates": 2, "moves": "merge"}).fit(np.ones((20, 2)))
    with pytest.raises(ConfigError, match=r"option 'candidates' of 'vbem' must be an integer, got 1.5"):
        VBMixture(2, learner_options={"candidates": 1.5}).fit(np.ones((20, 2)))


@pytest.mark.parametrize(("first_search", "reorder", "ct"), [
    ("all", False, "diag"), ("all", True, "diag"), ("pivots", False, "diag"), ("pivots", True, "diag"),
    ("all", True, "tied")])
def test_resume_is_bitwise(tmp_path, blobs, first_search, reorder, ct):
    opts = {"candidates": 3, "neighbours": 4, "first_search": first_search, "reorder": reorder,
            "prune_below": 0.5}
    kw = dict(n_components=20, covariance_type=ct, tol=0.0, random_state=0, chunk_rows=200,
              learner_options=opts)
    VBMixture(max_iter=5, checkpoint_dir=str(tmp_path), checkpoint_every=5, **kw).fit(blobs)
    resumed = VBMixture(max_iter=12, checkpoint_dir=str(tmp_path), **kw).fit(blobs)
    assert resumed.resumed_from_.endswith("ckpt-00000005")
    whole = VBMixture(max_iter=12, **kw).fit(blobs)
    _same_bits(resumed, whole)
    # components were pruned: the relabelling was exercised ('tied' keeps all K; its re-ordering relabels)
    assert whole.n_components_ < 20 or ct == "tied"


@pytest.fixture(scope="module")
def store(tmp_path_factory, blobs):
    path = tmp_path_factory.mktemp("stores") / "blobs.zarr"
    s = FeatureStore.create(path, blobs.shape[1], chunk_rows=180, labels=False)
    s.append(blobs.astype(np.float32))
    return str(path)


@pytest.mark.parametrize("ct", ["full", "tied", "diag"])  # diag: the batched blocks (truncated_blocks.py)
def test_local_and_dask_engines_are_bitwise_identical(client, store, ct):
    kw = dict(n_components=10, covariance_type=ct, max_iter=3, tol=0.0, random_state=0,
              learner_options={"candidates": 3, "neighbours": 4, "prune_below": 0.5, "block_rows": 8})
    local2 = VBMixture(engine=LocalEngine(threads=2), **kw).fit(store)  # two chunks at a time
    _same_bits(VBMixture(engine=client, **kw).fit(store), local2)


def test_dask_resume_matches_local_run(tmp_path, client, store):
    kw = dict(n_components=10, covariance_type="diag", tol=0.0, random_state=0,
              learner_options={"candidates": 2, "neighbours": 4, "first_search": "pivots"})
    VBMixture(max_iter=3, engine=client, checkpoint_dir=str(tmp_path), checkpoint_every=3, **kw).fit(store)
    resumed = VBMixture(max_iter=5, engine=client, checkpoint_dir=str(tmp_path), **kw).fit(store)
    _same_bits(resumed, VBMixture(max_iter=5, **kw).fit(store))


def test_automatic_candidates_rule():
    from pipeline.fit.learners.truncated import AUTO_CANDIDATES, AUTO_MIN_COMPONENTS, auto_candidates

    k = AUTO_MIN_COMPONENTS
    assert auto_candidates(k, "diag") == AUTO_CANDIDATES == 3
    assert auto_candidates(k, "spherical") == auto_candidates(k, "fixed") == 3
    assert auto_candidates(k - 1, "diag") == 0  # small K: the exact E-step (measured 1.3x at K = 100)
    assert auto_candidates(10 * k, "full") == auto_candidates(10 * k, "tied") == 0
    assert auto_candidates(10 * k, "diag", "cupy") == 0  # on a GPU the exact E-step is the faster


def test_default_candidates_on_a_gpu_engine_are_the_exact_e_step():
    """``candidates=-1`` is resolved against the fit's engine: on a CuPy backend (here a Dask engine
    that names it: CuPy is checked on its workers, not here) the exact E-step, with the C' it used
    written back into the options; on NumPy the truncated one."""
    from types import SimpleNamespace

    from pipeline.engine.engines import DaskEngine
    from pipeline.fit.learners.truncated import TRUNCATED_OPTIONS, truncated_e_step

    engine = DaskEngine(client=None, array_backend="cupy")
    ctx = SimpleNamespace(prior=SimpleNamespace(n_components=1000), covariance_type="diag", engine=engine)
    opts = dict(TRUNCATED_OPTIONS)
    assert truncated_e_step("vbem", ctx, opts) is None and opts["candidates"] == 0


@pytest.mark.parametrize("k, truncated", [(299, False), (300, True)])
def test_default_candidates_follow_the_rule(k, truncated):
    """The default (-1) is the truncated E-step with C' = 3 from K = 300 (diag) and the exact one
    below: the fit's evaluations per row say which ran (K for the exact pass, fewer for C' = 3)."""
    x = np.random.default_rng(3).normal(size=(900, 2))
    exact = VBMixture(k, covariance_type="diag", max_iter=3, tol=0.0, random_state=0,
                      learner_options={"candidates": 0}).fit(x)
    auto = VBMixture(k, covariance_type="diag", max_iter=3, tol=0.0, random_state=0).fit(x)
    explicit = VBMixture(k, covariance_type="diag", max_iter=3, tol=0.0, random_state=0,
                         learner_options={"candidates": 3}).fit(x)
    same_as = explicit if truncated else exact
    other = exact if truncated else explicit
    np.testing.assert_array_equal(auto.lower_bounds_, same_as.lower_bounds_)
    assert not np.array_equal(auto.lower_bounds_, other.lower_bounds_)
    # the fit reports the C' it resolved -1 to (result.json's learner_options come from here)
    assert auto.learner_options_["candidates"] == (3 if truncated else 0)
    assert explicit.learner_options_["candidates"] == 3
