"""The batched truncated E-step of the diagonal families (vbcore.kernels.truncated_blocks) against float64
brute force: search spaces, kept clusters, responsibilities, statistics and neighbour scores."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests._reference import brute_log_rho
from vbcore.kernels.estep import chunk_statistics, estep_params, prepare_chunk, weigh_chunk
from vbcore.kernels.truncated import (
    CandidateState,
    initial_neighbours,
    pivot_clusters,
    truncated_kernel,
    truncated_params,
)
from vbcore.kernels.truncated_blocks import block_search, buckets, stable_top, top_columns
from vbcore.model.mstep import m_step
from vbcore.model.priors import default_prior


def test_block_search_holds_every_rows_candidates_and_neighbour_lists():
    rng = np.random.default_rng(0)
    k, g, c, size = 40, 4, 3, 5
    nb = np.column_stack([np.arange(k), rng.integers(0, k, size=(k, g - 1))]).astype(np.int32)
    nb[3, 2:] = -1  # a short list
    prev = rng.integers(0, k, size=(23, c)).astype(np.int32)
    prev[4, 1:] = -1  # a row with one valid candidate
    for search in ("best", "all"):
        sidx, valid = block_search(prev, prev[:, 0], nb, size, c, 1, search, np.random.default_rng(1))
        assert sidx.shape[0] == 5 and valid.shape == sidx.shape
        for b in range(5):
            got = sidx[b][valid[b]]
            assert np.all(np.diff(got) > 0) and got.size >= c  # sorted, unique, at least C'
            assert np.all(sidx[b][~valid[b]] == got[0])  # padding repeats the first cluster
            rows = np.arange(b * size, min(23, (b + 1) * size))
            want = set(prev[rows][prev[rows] >= 0].tolist())
            lists = nb[prev[rows, 0]] if search == "best" else nb[prev[rows][prev[rows] >= 0]]
            want |= set(lists[lists >= 0].tolist())
            assert want <= set(got.tolist()) and len(got) <= len(want) + 1  # + one random cluster


def test_buckets_order_the_blocks_by_union_size_and_cover_them_once():
    counts = np.random.default_rng(3).integers(8, 40, size=37)
    for n in (1, 4, 37, 50):
        border, runs = buckets(counts, n)
        assert sorted(border.tolist()) == list(range(37))  # a permutation
        assert np.all(np.diff(counts[border]) >= 0)  # smallest unions first
        assert runs[0][0] == 0 and runs[-1][1] == 37 and len(runs) == min(n, 37)
        assert all(a < b and b == c for (a, b), (c, _) in zip(runs[:-1], runs[1:], strict=True))


def test_stable_top_is_the_stable_argsorts_first_columns_ties_included():
    rng = np.random.default_rng(6)
    for logits in (rng.normal(size=(300, 21)), np.round(rng.normal(size=(300, 21)), 1)):
        logits[:, 15:] = -np.inf  # padding
        logits[::7, 3] = logits[::7, 9]  # exact ties in many rows
        for c in (1, 8, 15):
            want = np.argsort(-logits, axis=1, kind="stable")[:, :c]
            top, sel = stable_top(logits, c)
            np.testing.assert_array_equal(top, want)
            np.testing.assert_array_equal(sel, np.take_along_axis(logits, want, axis=1))


def test_top_columns_keeps_the_largest_values_in_order():
    """Without ties the stable argsort's columns (the batched pass's); with ties the same values."""
    rng = np.random.default_rng(2)
    for logits in (rng.normal(size=(50, 9)), np.round(rng.normal(size=(50, 9)), 1)):
        logits[:, 7] = -np.inf
        for c in (1, 3, 8):
            want = np.argsort(-logits, axis=1, kind="stable")[:, :c]
            got = top_columns(logits, c)
            vals = np.take_along_axis(logits, got, 1)
            np.testing.assert_array_equal(vals, np.take_along_axis(logits, want, 1))
            if np.unique(logits[:, :7]).size == logits[:, :7].size:
                np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(5)
    centres = rng.normal(scale=5.0, size=(12, 6)) + 50.0
    return np.vstack([rng.normal(loc=ce, scale=0.5 + 0.1 * i, size=(20, 6)) for i, ce in enumerate(centres)])


@pytest.mark.parametrize("ct", ["diag", "spherical", "fixed"])
@pytest.mark.parametrize(("size", "weighted"), [(4, False), (7, True), (1000, False)])
def test_batched_pass_matches_float64_bruteforce(blobs, ct, size, weighted):
    """Blocks of ``size`` rows (one block: 1000): every row keeps the best C' of its block's search space
    (which holds its previous candidates), its q is the softmax of the brute-force ln rho there, the
    statistics are those of that sparse q, and the neighbour scores sum ln rho_ns - max_j ln rho_nj
    per (best cluster, searched cluster) over the block's search space."""
    X, k, c = blobs, 15, 3
    w = np.random.default_rng(4).uniform(0.5, 2.0, size=X.shape[0]) if weighted else None
    prior = default_prior(covariance_type=ct, weight_type="dirichlet_process", n_components=k,
                          data_mean=X.mean(0), data_covariance=np.cov(X.T),
                          fixed_variance=1.0 if ct == "fixed" else None)
    shift = X[0].copy()
    chunk = weigh_chunk(prepare_chunk(X, shift, ct), w)
    resp = np.random.default_rng(0).dirichlet(np.ones(k), size=X.shape[0])
    post = m_step(chunk_statistics(chunk, resp), prior)
    est = estep_params(post, shift)
    nb = initial_neighbours(post.means, est, shift, ct, 4)
    piv = pivot_clusters(k, c, 4, np.random.default_rng(7))
    p1 = replace(truncated_params(est, nb, c, 1, 11, 1, piv), min_rows=size)
    s0, _ = truncated_kernel(chunk, CandidateState(0), p1)
    p2 = replace(truncated_params(est, nb, c, 1, 11, 2, piv), min_rows=size)
    state, res = truncated_kernel(chunk, s0, p2)
    ref = brute_log_rho(X, post)
    sel = np.take_along_axis(ref, state.idx.astype(np.int64), axis=1)
    old = np.take_along_axis(ref, s0.idx.astype(np.int64), axis=1)
    assert np.all(np.diff(sel, axis=1) <= 1e-9) and np.all(sel >= old - 1e-9)  # best first, never worse
    assert np.logaddexp.reduce(sel, axis=1).sum() >= np.logaddexp.reduce(old, axis=1).sum() - 1e-9
    lse = np.logaddexp.reduce(sel, axis=1)
    q = np.exp(sel - lse[:, None])
    np.testing.assert_allclose(state.resp, q, rtol=1e-6)
    qw = q if w is None else q * w[:, None]
    dense = np.zeros((X.shape[0], k))
    np.put_along_axis(dense, state.idx.astype(np.int64), qw, axis=1)
    xs = X - shift
    np.testing.assert_allclose(res.sums.nk, dense.sum(0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.sums.g, dense.T @ np.hstack([xs * xs, xs]), rtol=1e-9, atol=1e-8)
    wl = 1.0 if w is None else w
    assert res.log_norm == pytest.approx(np.sum(wl * lse), rel=1e-12)
    # the neighbour scores (every row has a previous best cluster): one count per (row, searched cluster)
    assert int(res.scores.counts.sum()) == res.evaluations >= X.shape[0] * c
    if size >= X.shape[0]:  # one block: every row searched the same clusters, its max is its best kept
        best = s0.idx[:, 0].astype(np.int64)
        searched = np.unique(res.scores.keys % k)
        for j in np.unique(best):
            rows = np.flatnonzero(best == j)
            want = np.sum(ref[np.ix_(rows, searched)] - sel[rows, :1], axis=0)
            mine = res.scores.keys // k == j
            np.testing.assert_array_equal(res.scores.keys[mine] % k, searched)
            np.testing.assert_allclose(res.scores.sums[mine], want, rtol=1e-9, atol=1e-6)
            assert np.all(res.scores.counts[mine] == rows.size)


def test_batched_pass_on_another_array_namespace_gives_numpys_bits(blobs):
    """The pass on array-api-strict arrays (the namespace path a CuPy engine takes) gives NumPy's bits."""
    xps = pytest.importorskip("array_api_strict")
    k, c = 10, 3
    prior = default_prior(covariance_type="diag", weight_type="dirichlet_process", n_components=k,
                          data_mean=blobs.mean(0), data_covariance=np.cov(blobs.T))
    shift = blobs[0].copy()
    resp = np.random.default_rng(1).dirichlet(np.ones(k), size=blobs.shape[0])
    post = m_step(chunk_statistics(prepare_chunk(blobs, shift, "diag"), resp), prior)
    est = estep_params(post, shift)
    nb = initial_neighbours(post.means, est, shift, "diag", 4)
    piv = pivot_clusters(k, c, 4, np.random.default_rng(1))
    out = []
    for x in (blobs, xps.asarray(blobs)):
        chunk = prepare_chunk(x, shift, "diag")
        p1, p2 = (replace(truncated_params(est, nb, c, 1, 1, it, piv), min_rows=16) for it in (1, 2))
        s0, _ = truncated_kernel(chunk, CandidateState(0), p1)
        out.append(truncated_kernel(chunk, s0, p2))
    (sa, ra), (sb, rb) = out
    np.testing.assert_array_equal(sa.idx, sb.idx)
    np.testing.assert_array_equal(sa.resp, sb.resp)
    np.testing.assert_array_equal(ra.sums.g, rb.sums.g)
    assert ra.log_norm == rb.log_norm
