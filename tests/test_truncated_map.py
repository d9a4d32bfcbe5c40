"""The MAP learners' candidate search (vbcore.kernels.truncated_map): the exact argmax when every cluster is
searched, never a worse label than the previous one, bitwise resume and engine equality."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError
from vbcore.kernels.estep import prepare_chunk
from vbcore.kernels.neighbours import pivot_clusters
from vbcore.kernels.sga_stats import DPPoint, hard_kernel, map_params
from vbcore.kernels.truncated import CandidateState
from vbcore.kernels.truncated_map import (
    MapSearchResult,
    map_initial_neighbours,
    map_search_kernel,
    map_search_params,
)

warnings.filterwarnings("ignore", message="Best performing initialization did not converge")


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(5)
    centres = rng.normal(scale=5.0, size=(12, 6))
    X = np.vstack([rng.normal(loc=c, size=(60, 6)) for c in centres])
    return X[rng.permutation(len(X))]


def _point(X, k, seed=0):
    rng = np.random.default_rng(seed)
    means = X[rng.choice(X.shape[0], k, replace=False)] + rng.normal(scale=0.5, size=(k, X.shape[1]))
    return DPPoint(means, rng.uniform(0.05, 0.5, size=k))


def _params(point, shift, c, g, iteration=1, rows=None, remap=None, nb=None, extra=1, min_rows=8):
    mp = map_params(point, 2.0, shift)
    k = point.n_components
    if nb is None:
        nb = map_initial_neighbours(mp.weights, mp.const, point.means - shift[None, :], g)
    piv = pivot_clusters(k, c, g, np.random.default_rng(3))
    return mp, map_search_params(mp.weights, mp.const, nb, c, 1, 11, iteration, piv, rows, remap, extra,
                                 min_rows)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_all_candidates_give_the_exact_map_labels(blobs, dtype):
    """C' = G = K: every cluster is searched, so labels and hard statistics are the exact ones."""
    k = 9
    X = blobs.astype(dtype)
    shift = blobs[0].astype(np.float64)
    chunk = prepare_chunk(X, shift, "fixed", squares=False)
    point = _point(blobs, k)
    mp, params = _params(point, shift, k, k)
    state, res = map_search_kernel(chunk, CandidateState(0), params)
    exact = hard_kernel(chunk, None, map_params(point, 2.0, shift, dtype))
    scores = (X.astype(np.float64) - shift) @ mp.weights + mp.const
    np.testing.assert_array_equal(state.idx[:, 0], np.argmax(scores, axis=1))
    np.testing.assert_array_equal(res.hard.nk, exact.nk)
    np.testing.assert_array_equal(res.hard.idx, exact.idx)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(res.hard.s1, exact.s1, rtol=tol, atol=tol)
    np.testing.assert_allclose(res.hard.s2, exact.s2, rtol=tol, atol=tol)


def test_search_never_loses_the_previous_label_and_keeps_unvisited_rows(blobs):
    """Small C' and G: each label is the argmax over the row's search set, which holds its previous
    label, so the new label scores at least as high under the new point. Rows outside the pass
    keep their candidates."""
    k = 24
    shift = blobs[0].astype(np.float64)
    chunk = prepare_chunk(blobs, shift, "fixed", squares=False)
    point = _point(blobs, k)
    _, params = _params(point, shift, 2, 3)
    state, _ = map_search_kernel(chunk, CandidateState(0), params)
    moved = DPPoint(point.means + np.random.default_rng(1).normal(scale=0.7, size=point.means.shape),
                    point.sticks)
    rows = {0: np.arange(0, blobs.shape[0], 2)}
    mp, params2 = _params(moved, shift, 2, 3, iteration=2, rows=rows, nb=params.neighbours)
    state2, res = map_search_kernel(chunk, state, params2)
    scores = (blobs - shift) @ mp.weights + mp.const
    sel = rows[0]
    new, old = state2.idx[sel, 0], state.idx[sel, 0]
    assert np.all(scores[sel, new] >= scores[sel, old])
    assert res.hard.n_rows == sel.size and res.hard.nk.sum() == sel.size
    assert res.evaluations < sel.size * k  # fewer scores than the exact argmax
    rest = np.setdiff1d(np.arange(blobs.shape[0]), sel)
    np.testing.assert_array_equal(state2.idx[rest], state.idx[rest])


def test_rows_scored_against_every_cluster_give_their_neighbour_scores(blobs):
    """Fresh rows with every cluster as pivot: labels and neighbour scores are read off the all-K
    scores. For each label c and each s of G_c (in every such row's search set, counted once per
    row): the count is the rows labelled c, the sum that of score_s - max over them (brute force)."""
    k, g = 24, 4
    shift = blobs[0].astype(np.float64)
    chunk = prepare_chunk(blobs, shift, "fixed", squares=False)
    point = _point(blobs, k)
    mp, params = _params(point, shift, 2, g)
    params = replace(params, pivots=np.arange(k))
    state, res = map_search_kernel(chunk, CandidateState(0), params)
    scores = (blobs - shift) @ mp.weights + mp.const
    lab = state.idx[:, 0]
    np.testing.assert_array_equal(lab, np.argmax(scores, axis=1))
    assert res.evaluations == blobs.shape[0] * k  # one all-K GEMM, no second search
    pairs = zip(res.scores.sums, res.scores.counts, strict=True)
    got = dict(zip(res.scores.keys.tolist(), pairs, strict=True))
    for c in np.unique(lab):
        rows = lab == c
        for s_ in params.neighbours[c]:
            total, count = got[int(c) * k + int(s_)]
            assert count == rows.sum()
            np.testing.assert_allclose(total, np.sum(scores[rows, s_] - scores[rows].max(axis=1)),
                                       rtol=1e-10, atol=1e-9)


def test_minibatch_results_combine_to_their_pairwise_merges(blobs):
    """A minibatch's chunk results summed at once (MapSearchResult.combine, used by the minibatch
    passes) equal the fixed tree of pairwise merges: the same clusters, counts and score keys, sums
    to float64 rounding; and the sums of the rows computed in one piece."""
    k = 24
    shift = blobs[0].astype(np.float64)
    point = _point(blobs, k)
    chunks = [prepare_chunk(blobs[a : a + 180], shift, "fixed", squares=False) for a in range(0, 720, 180)]
    rows = {0: np.arange(0, 180, 3), 180: np.arange(1, 180, 4), 360: np.arange(5, 90),
            540: np.arange(0, 180, 7)}
    _, params = _params(point, shift, 2, 3, rows=rows)
    parts = [map_search_kernel(c, CandidateState(a), params)[1] for c, a in zip(chunks, rows, strict=True)]
    at_once = MapSearchResult.combine(parts)
    paired = parts[0].merge(parts[1]).merge(parts[2].merge(parts[3]))
    np.testing.assert_array_equal(at_once.hard.idx, paired.hard.idx)
    np.testing.assert_array_equal(at_once.hard.nk, paired.hard.nk)
    np.testing.assert_allclose(at_once.hard.s1, paired.hard.s1, rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(at_once.hard.s2, paired.hard.s2, rtol=1e-13, atol=1e-12)
    np.testing.assert_array_equal(at_once.scores.keys, paired.scores.keys)
    np.testing.assert_array_equal(at_once.scores.counts, paired.scores.counts)
    np.testing.assert_allclose(at_once.scores.sums, paired.scores.sums, rtol=1e-13, atol=1e-12)
    assert at_once.evaluations == paired.evaluations
    sel = np.concatenate([a + r for a, r in rows.items()])
    labels = np.concatenate([map_search_kernel(c, CandidateState(a), params)[0].idx[r, 0]
                             for c, (a, r) in zip(chunks, rows.items(), strict=True)])
    x = blobs[sel] - shift
    for j, lab in enumerate(at_once.hard.idx):
        np.testing.assert_allclose(at_once.hard.s1[j], x[labels == lab].sum(axis=0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("learner", "extra"), [("mm", {}), ("sga-f", {"minibatch": 200}), ("sga", {})])
def test_fit_with_all_candidates_equals_the_exact_fit(blobs, learner, extra):
    kw = dict(n_components=20, max_iter=8, tol=0.0, random_state=0, chunk_rows=200, learner=learner)
    exact = VBMixture(**kw, learner_options={**extra, "moves": "none"}).fit(blobs)  # no moves, as the search
    cand = VBMixture(**kw, learner_options={**extra, "candidates": 20, "neighbours": 20}).fit(blobs)
    # the same labels; the minibatch sums are merged in another order (a tree, not one combine)
    np.testing.assert_allclose(cand.lower_bounds_, exact.lower_bounds_, rtol=1e-12)
    np.testing.assert_allclose(cand.means_, exact.means_, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(cand.predict(blobs), exact.predict(blobs))


def _same_bits(a, b):
    for name in ("means_", "weights_", "lower_bounds_"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.n_iter_ == b.n_iter_


@pytest.mark.parametrize(("learner", "extra"), [("mm", {}), ("sga-f", {"minibatch": 150}),
                                                ("sga-f", {"minibatch": 150, "first_search": "pivots"})])
def test_resume_is_bitwise(tmp_path, blobs, learner, extra):
    opts = {**extra, "candidates": 2, "neighbours": 4}
    kw = dict(n_components=20, tol=0.0, random_state=0, chunk_rows=200, learner=learner, learner_options=opts)
    VBMixture(max_iter=4, checkpoint_dir=str(tmp_path), checkpoint_every=4, **kw).fit(blobs)
    resumed = VBMixture(max_iter=9, checkpoint_dir=str(tmp_path), **kw).fit(blobs)
    assert resumed.resumed_from_.endswith("ckpt-00000004")
    whole = VBMixture(max_iter=9, **kw).fit(blobs)
    _same_bits(resumed, whole)
    assert whole.n_components_ < 20  # clusters were pruned: the relabelling was exercised


@pytest.fixture(scope="module")
def store(tmp_path_factory, blobs):
    path = tmp_path_factory.mktemp("stores") / "blobs.zarr"
    s = FeatureStore.create(path, blobs.shape[1], chunk_rows=180, labels=False)
    s.append(blobs.astype(np.float32))
    return str(path)


@pytest.mark.parametrize(("learner", "extra"), [("mm", {}), ("sga-m", {"minibatch": 150})])
def test_local_and_dask_engines_are_bitwise_identical(client, store, learner, extra):
    kw = dict(n_components=12, max_iter=4, tol=0.0, random_state=0, learner=learner,
              learner_options={**extra, "candidates": 2, "neighbours": 3, "block_rows": 8})
    _same_bits(VBMixture(engine=client, **kw).fit(store), VBMixture(**kw).fit(store))


def test_options_are_checked(blobs):
    with pytest.raises(ConfigError, match=r"learner option 'candidates' of 'mm' must be an integer >= 0"):
        VBMixture(3, learner="mm", learner_options={"candidates": -1}).fit(blobs)
    with pytest.raises(ConfigError, match=r"learner option 'extra_steps' of 'sga-f' must be an integer >= 0"):
        VBMixture(3, learner="sga-f", learner_options={"candidates": 2, "extra_steps": -1}).fit(blobs)
    with pytest.raises(ConfigError, match=r"learner option 'first_search' of 'sga' must be one of"):
        VBMixture(3, learner="sga", learner_options={"candidates": 2, "first_search": "some"}).fit(blobs)
    with pytest.raises(ConfigError, match=r"options 'candidates' and 'moves' of 'mm' cannot be combined"):
        VBMixture(3, learner="mm", learner_options={"candidates": 2, "moves": "merge"}).fit(blobs)


@pytest.mark.parametrize("learner", ["mm", "sga-m"])
def test_pruning_relabels_the_search_instead_of_restarting_it(blobs, monkeypatch, learner):
    """Pruned and re-ordered clusters are relabelled in the stored candidates; the search starts
    once per fit (a restart every iteration would forget every row's candidates)."""
    from pipeline.fit.learners.truncated import MapSearch

    calls = []
    original = MapSearch.start_point
    monkeypatch.setattr(MapSearch, "start_point", lambda self, point: (calls.append(point.n_components),
                                                                        original(self, point))[1])
    m = VBMixture(n_components=20, max_iter=8, tol=0.0, random_state=0, chunk_rows=200, learner=learner,
                  learner_options={"minibatch": 150, "candidates": 2, "neighbours": 4} if learner != "mm"
                  else {"candidates": 2, "neighbours": 4}).fit(blobs)
    assert m.n_components_ < 20
    assert len(calls) == 1 and calls[0] <= 20  # once, after the start's pruning
