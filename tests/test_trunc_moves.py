"""Moves with the truncated E-step (vbcore.moves.truncated, VB EM with ``candidates`` and ``moves``): the
exact change of the truncated ELBO against brute-force recomputation from dense float64 weights, and
the learner: monotone, K found, resume bitwise, the same bits on Dask."""

from __future__ import annotations

import numpy as np
import pytest

from vbcore.kernels.estep import chunk_statistics, estep_params, log_rho, prepare_chunk
from vbcore.kernels.truncated import CandidateState, initial_neighbours, truncated_kernel, truncated_params
from vbcore.model.elbo import elbo_terms
from vbcore.model.mstep import m_step
from vbcore.model.priors import default_prior
from vbcore.moves.estep_pass import pair_entropy
from vbcore.moves.exact import apply_merges, reindex_pairs, total_elbo
from vbcore.moves.truncated import TruncMoveRequest, candidate_pair_entropy


def _stats(x, resp, ct, shift):
    rlogr = np.sum(np.where(resp > 0, resp * np.log(np.where(resp > 0, resp, 1.0)), 0.0), axis=1)
    return chunk_statistics(prepare_chunk(x, shift, ct), resp, rlogr)


def _brute(x, resp, ct, prior, shift):
    stats = _stats(x, resp, ct, shift)
    return elbo_terms(stats, m_step(stats, prior), prior).total


def _setup(ct: str, candidates: int, seed: int = 0, n: int = 2500, d: int = 3, k: int = 9):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(k, d))
    x = centres[rng.integers(0, k, size=n)] + rng.normal(size=(n, d))
    shift = x.mean(0)
    prior = default_prior(covariance_type=ct, weight_type="dirichlet_process", n_components=k,
                          data_mean=shift, data_covariance=np.cov(x.T), weight_concentration=0.5)
    post = m_step(_stats(x, rng.dirichlet(np.ones(k), size=n), ct, shift), prior)
    est = estep_params(post, shift)
    chunk = prepare_chunk(x, shift, ct)
    nb = initial_neighbours(post.means, est, shift, ct, 4)
    first = truncated_params(est, nb, candidates, 1, 0, 1, np.arange(k))
    state, _ = truncated_kernel(chunk, CandidateState(0), first)
    return x, shift, prior, est, chunk, nb, state


def _dense(chunk, est, idx):
    """The truncated q from scratch: softmax of the dense ln rho over each row's candidates."""
    lr = np.asarray(log_rho(chunk, est), dtype=np.float64)
    mask = np.zeros(lr.shape, dtype=bool)
    mask[np.arange(lr.shape[0])[:, None], idx] = True
    lr = np.where(mask, lr, -np.inf)
    r = np.exp(lr - lr.max(1, keepdims=True))
    return r / r.sum(1, keepdims=True)


@pytest.mark.parametrize("ct", ["diag", "full", "spherical"])
def test_truncated_merge_and_delete_changes_equal_brute_force(ct: str) -> None:
    x, shift, prior, est, chunk, nb, state = _setup(ct, candidates=3)
    k = 9
    pairs = np.array([[a, b] for a in range(k) for b in range(a + 1, k)])
    keep = np.array([0, 1, 3, 4, 5, 7, 8])
    kp = reindex_pairs(pairs, keep, k)
    params = truncated_params(est, nb, 3, 1, 0, 2, np.arange(k))
    from dataclasses import replace

    new_state, res = truncated_kernel(chunk, state, replace(params, hook=TruncMoveRequest(pairs, keep, kp)))
    extra = res.extra
    r = _dense(chunk, est, new_state.idx)
    base = _brute(x, r, ct, prior, shift)
    assert total_elbo(res.stats, prior, 0.0) == pytest.approx(base, abs=1e-9 * abs(base))
    tol = 1e-8 * abs(base)
    assert (extra.h > 0).any() and (extra.h == 0).any()  # some pairs share rows' candidate sets, some not
    np.testing.assert_allclose(extra.h, pair_entropy(r, pairs), rtol=1e-9, atol=1e-9)
    for p, hp in zip(pairs, extra.h, strict=True):
        merged = r.copy()
        merged[:, p[0]] += r[:, p[1]]
        ref = _brute(x, np.delete(merged, p[1], axis=1), ct, prior, shift)
        got = total_elbo(apply_merges(res.stats, p[None], np.array([hp])), prior, 0.0)
        assert got == pytest.approx(ref, abs=tol)
    # the delete proposal: each row's weights re-normalised over its kept candidates
    assert extra.orphans == 0
    renorm = r[:, keep] / r[:, keep].sum(1, keepdims=True)
    ref = _brute(x, renorm, ct, prior, shift)
    assert total_elbo(extra.alt, prior, 0.0) == pytest.approx(ref, abs=tol)
    np.testing.assert_allclose(extra.alt.nk, renorm.sum(0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(extra.alt_h, pair_entropy(renorm, kp), rtol=1e-9, atol=1e-9)


def test_a_delete_that_leaves_a_row_without_candidates_is_counted() -> None:
    _, _, _, est, chunk, nb, state = _setup("diag", candidates=1)
    k = 9
    from dataclasses import replace

    gone = int(state.idx[0, 0])
    keep = np.setdiff1d(np.arange(k), [gone])
    params = replace(truncated_params(est, nb, 1, 0, 0, 2, np.arange(k)),
                     hook=TruncMoveRequest(np.zeros((0, 2), np.int64), keep, np.zeros((0, 2), np.int64)))
    new_state, res = truncated_kernel(chunk, state, params)
    assert res.extra.orphans == int(np.sum(new_state.idx[:, 0] == gone)) > 0


def test_candidate_pair_entropy_small_case() -> None:
    idx = np.array([[0, 2, 1], [2, 3, 0]])
    resp = np.array([[0.5, 0.3, 0.2], [0.6, 0.4, 0.0]])
    pairs = np.array([[0, 2], [1, 3], [2, 3]])
    dense = np.zeros((2, 4))
    dense[np.arange(2)[:, None], idx] = resp
    np.testing.assert_allclose(candidate_pair_entropy(idx, resp, pairs, 4), pair_entropy(dense, pairs),
                               rtol=1e-14)


# ---- the learner ---------------------------------------------------------------------------------------
def _planted(n: int = 3000, d: int = 6, k: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=6.0, size=(k, d))
    lab = rng.integers(0, k, size=n)
    return centres[lab] + rng.normal(size=(n, d)), lab


def _fit(x, opts=None, **kw):
    from pipeline.estimator import VBMixture

    args = dict(n_components=40, covariance_type="diag", max_iter=60, random_state=0, chunk_rows=700,
                weight_concentration_prior=1.0,
                learner_options={"moves": "merge,delete", "candidates": 4, "neighbours": 6, **(opts or {})})
    args.update(kw)
    return VBMixture(**args).fit(x)


def _occupied(m) -> int:
    return int(np.sum(m.posterior_.mean_precision - m.prior_.mean_precision >= 1.0))


@pytest.mark.parametrize("wt", ["dirichlet_process", "dirichlet_distribution"])
def test_truncated_vbem_with_moves_recovers_k_and_stays_monotone(wt: str) -> None:
    x, _ = _planted()
    m = _fit(x, weight_concentration_prior_type=wt)
    h = m.lower_bounds_
    assert np.all(np.diff(h) >= -1e-9 * abs(h[-1]))
    assert m.converged_ and _occupied(m) == 8
    without = _fit(x, {"moves": "none"}, weight_concentration_prior_type=wt, max_iter=m.n_iter_)
    assert _occupied(without) > 8 and m.lower_bound_ > without.lower_bound_


def _same_bits(a, b) -> None:
    for name in ("means_", "covariances_", "weights_", "lower_bounds_"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.n_iter_ == b.n_iter_


def test_truncated_moves_resume_bitwise(tmp_path) -> None:
    x, _ = _planted(seed=2)
    kw = dict(tol=0.0)
    opts = {"move_every": 3}
    _fit(x, opts, max_iter=7, checkpoint_dir=str(tmp_path), checkpoint_every=7, **kw)
    resumed = _fit(x, opts, max_iter=13, checkpoint_dir=str(tmp_path), **kw)
    assert resumed.resumed_from_.endswith("ckpt-00000007")
    straight = _fit(x, opts, max_iter=13, **kw)
    _same_bits(resumed, straight)
    assert straight.n_components_ < 40


def test_truncated_moves_same_bits_on_dask(client) -> None:
    x, _ = _planted(seed=3)
    kw = dict(max_iter=7)
    opts = {"move_every": 3}
    local = _fit(x, opts, **kw)
    assert local.n_components_ < 40
    _same_bits(_fit(x, opts, engine=client, **kw), local)


def test_partition_shares() -> None:
    from pipeline.studies.moves_sun397 import partition_shares

    y = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    pred = np.array([5, 5, 7, 7, 5, 5, 9, 9])  # class 0 split in two, cluster 5 holds classes 0 and 1
    whole, purity = partition_shares(y, pred)
    assert whole == pytest.approx((2 + 2 + 2) / 8) and purity == pytest.approx((2 + 2 + 2) / 8)
    assert partition_shares(y, y + 3) == (1.0, 1.0)


def test_sun397_study_entry_on_a_small_store(tmp_path) -> None:
    from pipeline.ingest import ingest
    from pipeline.studies import read_table
    from pipeline.studies.moves_sun397 import run_sun397

    store = str(tmp_path / "s.zarr")
    ingest("synthetic", store, chunk_rows=600, rows=1200, dim=16, classes=6, seed=0)
    folder = run_sun397(tmp_path, store, truncation=20, vbem_iterations=4, candidates=3, neighbours=4,
                        learners=("vbem",))
    columns, rows = read_table(folder / "results")
    assert columns[:3] == ["learner", "moves", "iterations"] and len(rows) == 2
    assert [r[1] for r in rows] == ["none", "merge,delete"] and all(r[2] == "4" for r in rows)
    assert (folder / "elbo.png").exists()


def test_partition_bounds_match_a_direct_computation(tmp_path) -> None:
    from pipeline.engine.sources import StoreSource
    from pipeline.ingest import ingest
    from pipeline.studies.moves_sun397 import partition_bounds

    store = str(tmp_path / "b.zarr")
    ingest("synthetic", store, chunk_rows=500, rows=1000, dim=8, classes=4, seed=1)
    got = partition_bounds(store, (None, 1.0), truncation=10)
    src = StoreSource(store)
    x = np.concatenate([src.load(i) for i in range(2)]).astype(np.float64)
    y = src.labels()
    order = np.argsort(-np.bincount(y), kind="stable")
    resp = (y[:, None] == order[None, :]).astype(np.float64)
    for nu0, key in ((None, "D"), (1.0, "1")):
        prior = default_prior(covariance_type="diag", weight_type="dirichlet_process", n_components=10,
                              data_mean=x.mean(0), data_covariance=x.var(0), degrees_of_freedom=nu0)
        ref = _brute(x, resp, "diag", prior, x.mean(0)) / len(y)
        one = _brute(x, np.ones((len(y), 1)), "diag", prior, x.mean(0)) / len(y)
        assert got[f"nu0={key}: 4 classes"] == pytest.approx(ref, rel=1e-9)
        assert got[f"nu0={key}: one component"] == pytest.approx(one, rel=1e-9)
