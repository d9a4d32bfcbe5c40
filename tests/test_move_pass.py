"""The E-step pass of a move round (vbcore.moves.estep_pass): the pair entropies on the rows where they are
non-zero against the dense float64 formula, and the delete proposal's statistics against the
brute-force statistics of the q(Z) it defines."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp, softmax

from tests._reference import stats_of as _stats
from vbcore.kernels.estep import estep_params, log_rho, normalise, prepare_chunk, weigh_chunk
from vbcore.model.mstep import m_step
from vbcore.model.priors import default_prior
from vbcore.moves.estep_pass import GATHER_SHARE, MoveParams, move_kernel, pair_entropy
from vbcore.moves.exact import reindex_pairs


def _dense_h(resp: np.ndarray, pairs: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """``h_ab`` by the dense formula in float64, every (row, pair) entry."""
    r = np.asarray(resp, dtype=np.float64)

    def xlogx(v):
        return np.where(v > 0, v * np.log(np.where(v > 0, v, 1.0)), 0.0)

    a, b = r[:, pairs[:, 0]], r[:, pairs[:, 1]]
    h = xlogx(a + b) - xlogx(a) - xlogx(b)
    return (h if w is None else h * np.asarray(w, dtype=np.float64)[:, None]).sum(0)


def _sparse_resp(rng, n: int, k: int, dense_rows: float) -> np.ndarray:
    """Rows with one to three non-zero responsibilities (exact zeros elsewhere), a share ``dense_rows``
    of them with every responsibility non-zero."""
    resp = np.zeros((n, k))
    for i in range(n):
        cols = rng.choice(k, size=k if rng.random() < dense_rows else rng.integers(1, 4), replace=False)
        resp[i, cols] = rng.dirichlet(np.ones(cols.size))
    return resp


PAIRS = np.array([[0, 1], [0, 5], [2, 3], [1, 7], [4, 6], [3, 7], [5, 6]])


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dense_rows", [0.0, 0.05, 0.6, 1.0])
def test_pair_entropy_equals_the_dense_formula(dense_rows: float, weighted: bool) -> None:
    # dense_rows 0 and 0.05: mostly exact zeros (the gathered entries); 0.6 and 1.0 (no zero at all):
    # the bound of the entries with both non-zero exceeds GATHER_SHARE (the dense formula)
    rng = np.random.default_rng(int(dense_rows * 100) + weighted)
    resp = _sparse_resp(rng, 1500, 30, dense_rows)
    share = np.mean((resp > 0).mean(0)[PAIRS].min(1))
    assert (share <= GATHER_SHARE) == (dense_rows < 0.5)
    if dense_rows == 1.0:
        assert np.all(resp > 0)
    w = rng.uniform(0.0, 3.0, size=1500) if weighted else None
    ref = _dense_h(resp, PAIRS, w)
    assert np.count_nonzero(ref) >= PAIRS.shape[0] - 2 and np.all(ref >= 0)  # (a pair never both non-zero: 0)
    np.testing.assert_allclose(pair_entropy(resp, PAIRS, w), ref, rtol=1e-12, atol=0)
    # float32 responsibilities: terms in float32, sums in float64
    r32 = resp.astype(np.float32)
    w32 = None if w is None else w.astype(np.float32)
    np.testing.assert_allclose(pair_entropy(r32, PAIRS, w32), _dense_h(r32, PAIRS, w32), rtol=1e-5)


def test_pair_entropy_of_one_hot_rows_and_no_pairs_is_zero() -> None:
    resp = np.eye(5)[np.random.default_rng(0).integers(0, 5, size=50)]
    assert pair_entropy(resp, np.array([[0, 1], [2, 4]])).tolist() == [0.0, 0.0]
    assert pair_entropy(resp, np.zeros((0, 2), dtype=np.int64)).shape == (0,)


@pytest.mark.parametrize("dense_rows", [0.02, 1.0])
def test_pair_entropy_has_the_bits_of_the_dense_column_sum(dense_rows: float) -> None:
    # the generic path (array-api-strict: no data-dependent shapes) sums every entry down the column in
    # float64; NumPy's skips exact-zero terms and adds the others in the same row order
    xps = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(3)
    resp = _sparse_resp(rng, 3000, 30, dense_rows).astype(np.float32)
    w = rng.uniform(0.0, 2.0, size=3000).astype(np.float32)
    flags = {"boolean_indexing": False, "data_dependent_shapes": False, "enabled_extensions": ()}
    with xps.ArrayAPIStrictFlags(**flags):
        ref = pair_entropy(xps.asarray(resp), PAIRS, xps.asarray(w))
    assert np.array_equal(pair_entropy(resp, PAIRS, w), ref)


def _separated(seed: int = 0, n: int = 3000, d: int = 4, k: int = 7):
    """Float64 rows of k well-separated classes and a posterior of k components fitted to them, with
    component 6 three times wider (float64 flushes only responsibilities below 2.2e-308, so many rows
    keep tiny non-zero ones of other components), and 81 rows on the segment between the centres of
    components 1 and 2 where the log-odds of component 2 run from -40 to 40."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=100.0, size=(k, d))
    lab = rng.integers(0, k, size=n)
    x = centres[lab] + rng.normal(size=(n, d))
    x[lab == 6] = centres[6] + rng.normal(scale=3.0, size=(int(np.sum(lab == 6)), d))
    prior = default_prior(covariance_type="diag", weight_type="dirichlet_process", n_components=k,
                          data_mean=x.mean(0), data_covariance=np.cov(x.T), weight_concentration=1.0)
    shift = x.mean(0)
    post = m_step(_stats(x, np.eye(k)[lab], "diag", shift), prior)
    line = centres[1] + np.linspace(0.0, 1.0, 40001)[:, None] * (centres[2] - centres[1])
    lr = log_rho(prepare_chunk(line, shift, "diag"), estep_params(post, shift))
    odds = lr[:, 2] - logsumexp(np.delete(lr, 2, axis=1), axis=1)
    near = np.abs(odds[None, :] - np.linspace(-40.0, 40.0, 81)[:, None]).argmin(1)
    return np.concatenate((x, line[near])), shift, post


@pytest.mark.parametrize("weighted", [False, True])
def test_delete_proposal_statistics_equal_the_brute_force_of_its_q(weighted: bool) -> None:
    x, shift, post = _separated()
    k = post.n_components
    chunk = prepare_chunk(x, shift, "diag")
    w = np.random.default_rng(1).uniform(0.0, 2.0, size=x.shape[0]) if weighted else None
    chunk = weigh_chunk(chunk, w)
    params = estep_params(post, shift)
    keep = np.array([0, 1, 3, 4, 5])  # components 2 and 6 deleted
    pairs = np.array([[0, 1], [3, 6], [4, 5], [0, 3]])
    kp = reindex_pairs(pairs, keep, k)
    res = move_kernel(chunk, MoveParams(params, pairs, keep, kp))
    # the q(Z) defined: the kept responsibilities over 1 - d (d: the deleted ones summed); rows with
    # d >= 1/2, the softmax of ln rho over the kept components
    lr = log_rho(chunk, params)
    resp = normalise(lr)[0]
    share = resp[:, [2, 6]].sum(1)
    for lo, hi in ((0.0, 0.0), (1e-300, 1e-15), (1e-15, 0.5), (0.5, 1.0)):  # every kind of row
        assert np.sum((share >= lo) & (share <= hi)) >= 10, (lo, hi)
    scaled = resp[:, keep] / np.where(share < 0.5, 1.0 - share, 1.0)[:, None]
    q = np.where(share[:, None] >= 0.5, softmax(lr[:, keep], axis=1), scaled)
    ref = _stats(x, q if w is None else q * w[:, None], "diag", shift)
    assert res.alt is not None
    np.testing.assert_allclose(res.alt.nk, ref.nk, rtol=1e-10)
    np.testing.assert_allclose(res.alt.mean, ref.mean, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(res.alt.scatter, ref.scatter, rtol=1e-10, atol=1e-10)
    ent = np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0), axis=1)
    assert res.alt.sum_rlogr == pytest.approx(np.sum(ent if w is None else w * ent), rel=1e-10)
    np.testing.assert_allclose(res.alt_h, _dense_h(q, kp, w), rtol=1e-10)
    # the regular statistics and pair entropies are those of the full E-step
    full = _stats(x, resp if w is None else resp * w[:, None], "diag", shift)
    np.testing.assert_allclose(res.stats.nk, full.nk, rtol=1e-12)
    np.testing.assert_allclose(res.h, _dense_h(resp, pairs, w), rtol=1e-10)


def test_delete_proposal_is_the_same_q_on_strict_arrays() -> None:
    xps = pytest.importorskip("array_api_strict")
    x, shift, post = _separated(seed=2, n=1500)
    keep = np.array([0, 1, 2, 3, 5])
    pairs = np.array([[0, 1], [2, 6], [3, 5]])
    params = MoveParams(estep_params(post, shift), pairs, keep, reindex_pairs(pairs, keep, 7))
    ref = move_kernel(prepare_chunk(x, shift, "diag"), params)
    flags = {"boolean_indexing": False, "data_dependent_shapes": False, "enabled_extensions": ()}
    with xps.ArrayAPIStrictFlags(**flags):
        got = move_kernel(prepare_chunk(xps.asarray(x), shift, "diag"), params)
    assert got.alt is not None and ref.alt is not None
    np.testing.assert_allclose(got.alt.nk, ref.alt.nk, rtol=1e-12)
    np.testing.assert_allclose(got.alt.scatter, ref.alt.scatter, rtol=1e-10, atol=1e-10)
    assert got.alt.sum_rlogr == pytest.approx(ref.alt.sum_rlogr, rel=1e-12)
    np.testing.assert_allclose(got.alt_h, ref.alt_h, rtol=1e-12)


@pytest.mark.parametrize("ct", ["diag", "spherical"])
@pytest.mark.parametrize("weighted", [False, True])
def test_a_round_that_moves_nothing_is_a_regular_pass_bit_for_bit(ct: str, weighted: bool) -> None:
    """The round's regular statistics are the VB EM kernel's own (float32 rows, several blocks): a
    round that accepts no move reports a regular iteration's bound. They used to be centred per
    block and merged, which put the bound of a converged 100,000 x 512 fit 0.6 nats below the
    regular pass's, a decrease in the history at every round that found nothing."""
    from vbcore.kernels.estep import BLOCK_ROWS, vbem_kernel

    x, shift, post = _separated(n=2 * BLOCK_ROWS + 777)
    x = x.astype(np.float32)
    prior = default_prior(covariance_type=ct, weight_type="dirichlet_process", n_components=7,
                          data_mean=x.mean(0), data_covariance=np.cov(x.T), weight_concentration=1.0)
    post = m_step(_stats(x, normalise(log_rho(prepare_chunk(x, shift, "diag"),
                                              estep_params(post, shift)))[0], ct, shift), prior)
    w = np.random.default_rng(2).uniform(0.0, 2.0, size=x.shape[0]).astype(np.float32) if weighted else None
    chunk = weigh_chunk(prepare_chunk(x, shift, ct), w)
    params = estep_params(post, shift)
    keep, pairs = np.array([0, 1, 3, 4, 5]), np.array([[0, 1], [3, 6], [4, 5]])
    res = move_kernel(chunk, MoveParams(params, pairs, keep, reindex_pairs(pairs, keep, 7)))
    reg = vbem_kernel(chunk, params)
    for name in ("nk", "mean", "scatter"):
        np.testing.assert_array_equal(getattr(res.stats, name), getattr(reg.stats, name))
    assert res.stats.sum_rlogr == reg.stats.sum_rlogr and res.log_norm == reg.log_norm
    assert res.alt is not None and res.alt.nk.shape == (5,)
