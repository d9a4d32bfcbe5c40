"""The diagonal families' block products (vbcore.kernels.blockgemm): padded E-step weights and the sparse
statistics product, against float64 brute force; and a VB EM pass on separated data (sparse
responsibilities) against brute-force statistics."""

import numpy as np
import pytest
import scipy.sparse

from vbcore.kernels.blockgemm import (
    PAD_COLUMNS,
    exp_floor,
    gemm_operands,
    log_rho_block,
    padded_weights,
    resp_t_dot,
    sparse_is_cheaper,
)
from vbcore.kernels.estep import EStepParams, normalise, prepare_chunk, vbem_kernel


def _sparse_resp(n, k, nnz_per_row, dtype, seed=0):
    """Responsibilities with ``nnz_per_row`` non-zero entries per row, rows summing to 1."""
    rng = np.random.default_rng(seed)
    r = np.zeros((n, k))
    for i in range(n):
        cols = rng.choice(k, size=nnz_per_row, replace=False)
        r[i, cols] = rng.dirichlet(np.ones(nnz_per_row))
    return r.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nnz", [1, 2, 12])
def test_resp_t_dot_matches_float64_brute_force(dtype, nnz):
    """1 and 2 non-zero a row take the sparse product at 2D = 2,560; 12 take the GEMM."""
    n, k, m = 300, 24, 2560
    r = _sparse_resp(n, k, nnz, dtype)
    assert sparse_is_cheaper(n, k, m, n * nnz) == (nnz < 12)
    f = np.random.default_rng(1).normal(size=(n, m)).astype(dtype)
    ours = resp_t_dot(np, r, f)
    assert ours.dtype == dtype and ours.shape == (k, m)
    ref = r.astype(np.float64).T @ f.astype(np.float64)
    scale = np.abs(r.astype(np.float64)).T @ np.abs(f.astype(np.float64))
    tol = 1e-5 if dtype == np.float32 else 1e-13
    assert np.all(np.abs(ours - ref) <= tol * scale + 1e-30)


def test_sparse_is_cheaper_is_the_cost_model():
    """Sparse where the non-zero entries' products and the scan cost less than the GEMM's; never for
    narrow features (the scan alone costs more), up to about 9% non-zero for 2D = 2,560."""
    assert not sparse_is_cheaper(2048, 110, 128, 1)  # D = 64: the GEMM, however sparse
    assert sparse_is_cheaper(2048, 110, 256, 2048)  # one non-zero a row at K = 110, 2D = 256
    assert not sparse_is_cheaper(2048, 110, 256, 5 * 2048)
    assert sparse_is_cheaper(2048, 23, 2560, 2130)  # Fashion-MNIST's 1.04 a row
    assert sparse_is_cheaper(2048, 50, 2560, int(0.09 * 2048 * 50))
    assert not sparse_is_cheaper(2048, 50, 2560, int(0.10 * 2048 * 50))


def test_resp_t_dot_takes_the_sparse_product_exactly_where_the_model_says():
    """At the model's last sparse count: SciPy's CSR product (its bits); one more: the GEMM (its bits)."""
    n, k, m = 64, 16, 400
    limit = max(c for c in range(n * k + 1) if sparse_is_cheaper(n, k, m, c))
    assert 0 < limit < n * k
    f = np.random.default_rng(2).normal(size=(n, m)).astype(np.float32)
    flat = np.random.default_rng(3).permutation(n * k)
    for count, sparse in ((limit, True), (limit + 1, False)):
        r = np.zeros(n * k, dtype=np.float32)
        r[flat[:count]] = np.random.default_rng(4).uniform(0.1, 1.0, size=count)
        r = r.reshape(n, k)
        ours = resp_t_dot(np, r, f)
        want = scipy.sparse.csr_array(r.T) @ f if sparse else r.T @ f
        np.testing.assert_array_equal(ours, want)
        assert ours.dtype == np.float32


def test_resp_t_dot_is_the_same_bits_every_time():
    r = _sparse_resp(500, 30, 1, np.float32)
    f = np.random.default_rng(5).normal(size=(500, 64)).astype(np.float32)
    first = resp_t_dot(np, r, f)
    for _ in range(3):
        np.testing.assert_array_equal(resp_t_dot(np, r, f), first)


@pytest.mark.parametrize("k", [1, 7, 8, 9, 23, 24, 50])
def test_padded_weights_and_log_rho_block(k):
    rng = np.random.default_rng(k)
    w = rng.normal(size=(20, k))
    wp = padded_weights(w)
    assert wp.shape == (20, -(-k // PAD_COLUMNS) * PAD_COLUMNS)
    np.testing.assert_array_equal(wp[:, :k], w)
    assert not np.any(wp[:, k:])
    if k % PAD_COLUMNS == 0:
        assert wp is w
    f = rng.normal(size=(33, 20))
    const = rng.normal(size=k)
    out = log_rho_block(f, wp, const)
    assert out.shape == (33, k)
    np.testing.assert_allclose(out, f @ w + const, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_pass_on_separated_data_takes_the_sparse_product_and_matches_brute_force(dtype):
    """Well separated classes: almost every responsibility is exactly 0, so the pass's blocks take the
    sparse product; its statistics equal float64 brute force from the same responsibilities."""
    rng = np.random.default_rng(7)
    k, d = 32, 256
    # corners of a cube, neighbours 50 standard deviations apart (every coordinate within 25 of the
    # mean, so float32's raw second moments keep their digits)
    centres = np.zeros((k, d))
    centres[:, :5] = 50.0 * ((np.arange(k)[:, None] >> np.arange(5)) & 1)
    labels = rng.integers(0, k, size=3000)
    X = (centres[labels] + rng.normal(size=(3000, d)) + 1e3).astype(dtype)
    shift = X.astype(np.float64).mean(0)
    chunk = prepare_chunk(X, shift, "diag")
    # E-step of unit-variance components at the class centres (the diagonal families' GEMM form)
    m, p = centres + 1e3 - shift, np.ones((k, d))
    params = EStepParams("diag", np.log(1.0 / k) - 0.5 * np.sum(p * m * m, axis=1),
                         np.concatenate((-0.5 * p, p * m), axis=1).T, None, None)
    resp = normalise(np.asarray(chunk.features(0, len(X)) @ padded_weights(params.weights).astype(dtype))
                     [:, :k] + params.const.astype(dtype))[0]
    for i in range(0, len(X), 2048):  # every block takes the sparse product
        block = resp[i:i + 2048]
        assert sparse_is_cheaper(*block.shape, 2 * d, np.count_nonzero(block))
    ours = vbem_kernel(chunk, params).stats
    x64, r64 = X.astype(np.float64), resp.astype(np.float64)  # float64 brute force, per component
    nk = r64.sum(0)
    mean = np.stack([(r64[:, j:j + 1] * x64).sum(0) / nk[j] for j in range(k)])
    scatter = np.stack([(r64[:, j:j + 1] * (x64 - mean[j]) ** 2).sum(0) for j in range(k)])
    tol = 1e-4 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(ours.nk, nk, rtol=1e-6 if dtype == np.float32 else 1e-12)
    np.testing.assert_allclose(ours.mean + shift, mean, rtol=tol, atol=tol)
    np.testing.assert_allclose(ours.scatter, scatter, rtol=tol * 10, atol=tol * 10 * np.abs(scatter).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_floor_is_the_least_input_with_a_normal_exp(dtype):
    z = dtype(exp_floor(np.finfo(dtype).bits))
    tiny = np.finfo(dtype).smallest_normal
    assert np.exp(z) >= tiny
    assert np.exp(np.nextafter(z, dtype(-np.inf))) < tiny


def _softmax_flushed(log_r):
    """The softmax of every entry, then responsibilities under the smallest normal number set to 0."""
    z = log_r - np.max(log_r, axis=1, keepdims=True)
    e = np.exp(z)
    s = np.sum(e, axis=1)
    r = e * np.reshape(1.0 / s, (-1, 1))
    return np.where(r < np.finfo(r.dtype).smallest_normal, 0, r), np.log(s), np.vecdot(e, z) / s - np.log(s)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [1.0, 50.0, 500.0])
def test_normalise_skips_subnormal_exps_and_keeps_the_bits(dtype, scale):
    """Leaving out exp of inputs under exp_floor keeps r and ln sum rho bit for bit (those exps are
    below what s >= 1 resolves, and their responsibilities are flushed to 0 either way); sum r ln r
    moves by less than 1e-35 a row."""
    log_r = (np.random.default_rng(8).standard_normal((512, 110)) * scale).astype(dtype)
    r, log_norm, rlogr = normalise(log_r)
    want_r, log_s, want_rlogr = _softmax_flushed(log_r)
    np.testing.assert_array_equal(r, want_r)
    np.testing.assert_array_equal(log_norm, np.max(log_r, axis=1) + log_s)
    assert np.max(np.abs(rlogr - want_rlogr)) < 1e-35
    np.testing.assert_allclose(r.sum(1), 1.0, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_gemm_operands_are_made_once_per_parameters_and_give_the_same_bits(monkeypatch):
    """A pass pads and casts its weights once, not once per chunk: four chunks, one padding; the
    chunks' results are the bits of operands made afresh for each; new parameters (also under a
    reused id) and another dtype get operands of their own."""
    import gc

    import array_api_strict as xps

    import vbcore.kernels.blockgemm as bg

    rng = np.random.default_rng(3)
    k, d = 5, 6
    X = rng.normal(size=(400, d)).astype(np.float32)
    chunks = [prepare_chunk(part, X.mean(0).astype(np.float64), "diag") for part in np.split(X, 4)]

    def make(seed):
        r = np.random.default_rng(seed)
        return EStepParams("diag", r.normal(size=k), r.normal(size=(2 * d, k)), None, None)

    params = make(0)
    fresh = [vbem_kernel(c, make(0)) for c in chunks]  # each with parameters of its own
    calls = []
    monkeypatch.setattr(bg, "padded_weights", lambda w: calls.append(1) or padded_weights(w))
    shared = [vbem_kernel(c, params) for c in chunks]
    assert len(calls) == 1
    for a, b in zip(shared, fresh, strict=True):
        np.testing.assert_array_equal(a.stats.nk, b.stats.nk)
        np.testing.assert_array_equal(a.stats.scatter, b.stats.scatter)
        assert a.log_norm == b.log_norm
    w32, c32 = gemm_operands(params, np, np.float32)
    w64, _ = gemm_operands(params, np, np.float64)
    assert w32.dtype == np.float32 and w64.dtype == np.float64 and len(calls) == 2
    assert w32.shape == (2 * d, PAD_COLUMNS) and np.array_equal(c32, params.const.astype(np.float32))
    ws, _ = gemm_operands(params, xps, xps.float32)  # another namespace: its own arrays
    assert type(ws).__module__.startswith("array_api_strict") and len(calls) == 3
    del params, shared
    gc.collect()
    other = make(1)  # may reuse the id: its operands must be its own
    w_other, _ = gemm_operands(other, np, np.float32)
    np.testing.assert_array_equal(w_other[:, :k], other.weights.astype(np.float32))
    assert len(calls) == 4
