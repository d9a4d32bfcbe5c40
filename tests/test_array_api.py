"""The chunk kernels use only the array API standard: run them on array-api-strict arrays.

array-api-strict is a deliberately minimal implementation of the standard: any non-standard call
(NumPy-only functions or keywords, out-of-bounds slices, positive ``vecdot`` axes, flat indexing of a
2-D array, mixed float32/float64 arithmetic, ...) raises there. The kernels take their namespace from
their input (``array_namespace(x)``), so feeding them array-api-strict chunks and getting the NumPy
results back shows they would run on any compliant library (CuPy: ``tests/test_gpu.py``).

The posterior and the E-step parameters stay NumPy float64 on the host by design; only the chunk
(``Chunk.x``, ``Chunk.feats``) and what the kernels derive from it live in the array's namespace.

The standard *allows* float32 op float64 (it promotes to float64), so array-api-strict does not
catch a float64 operand slipping into float32 work. ``_float64_spy`` does: during a float32 run
every array created must be float32, except the deliberate float64 accumulations
``xp.sum(..., dtype=xp.float64)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from tests._kernel_checks import close as _close
from tests._kernel_checks import close_stats as _close_stats
from tests._kernel_checks import posterior as _posterior
from tests._kernel_checks import run_kernels as _run_kernels
from tests._kernel_checks import three_clusters
from tests._kernel_checks import vbem_loop as _vbem_loop
from vbcore.kernels.estep import (
    array_namespace,
    chunk_statistics,
    estep_params,
    prepare_chunk,
    to_host,
    to_numpy,
)

TYPES = ["full", "tied", "diag", "spherical", "fixed"]
DTYPES = [np.float64, np.float32]
RTOL = {np.float64: 1e-12, np.float32: 1e-5}
#: 2023.12 is the version NumPy 2.0 implements (the oldest the kernels need); 2025.12 the newest.
API_VERSIONS = ["2023.12", "2025.12"]
K = 4


@pytest.fixture(scope="module")
def xps():
    return pytest.importorskip("array_api_strict")


@pytest.fixture(scope="module")
def data():
    """Three clusters far from the origin; more rows than two blocks, the last block partial."""
    return three_clusters()


@contextmanager
def _float64_spy(xps, monkeypatch) -> Iterator[list[tuple[int, ...]]]:
    """Record the shape of every float64 strict array created, other than by a call that names float64:
    ``xp.sum(..., dtype=xp.float64)``, ``xp.zeros(..., dtype=xp.float64)`` and ``xp.astype(x,
    xp.float64)`` (deliberate float64 accumulators). Hooks array-api-strict's private constructor
    ``Array._new``, through which every array it returns is built."""
    array_cls = type(xps.asarray(0.0))
    new = array_cls.__dict__.get("_new")
    if not isinstance(new, classmethod):
        pytest.skip("array_api_strict.Array._new is gone; update _float64_spy")
    seen: list[tuple[int, ...]] = []
    allowed = [False]

    def spy_new(cls, x, /, device):
        a = new.__func__(cls, x, device=device)
        if a.dtype == xps.float64 and not allowed[0]:
            seen.append(tuple(a.shape))
        return a

    def explicit(orig, dtype_pos=None):
        """``orig`` with arrays it makes allowed when float64 is asked for by name."""
        def call(*args, **kwargs):
            dtype = kwargs.get("dtype", args[dtype_pos] if dtype_pos is not None and len(args) > dtype_pos
                               else None)
            allowed[0] = dtype == xps.float64
            try:
                return orig(*args, **kwargs)
            finally:
                allowed[0] = False
        return call

    with monkeypatch.context() as m:
        m.setattr(array_cls, "_new", classmethod(spy_new))
        m.setattr(xps, "sum", explicit(xps.sum))  # float64 accumulations (xp.sum(..., dtype=xp.float64))
        m.setattr(xps, "zeros", explicit(xps.zeros))  # float64 accumulators (vbcore.kernels.estep.Sum64)
        m.setattr(xps, "astype", explicit(xps.astype, dtype_pos=1))  # blocks cast into them
        yield seen


# ---- the namespace and the host copy ------------------------------------------------------------
def test_namespace_is_taken_from_the_array(xps):
    x = xps.asarray(np.ones((3, 2), dtype=np.float32))
    assert array_namespace(x) is xps
    assert array_namespace(np.ones(2)) is np


def test_to_numpy_copies_standard_arrays_to_host_float64(xps):
    host = np.arange(12, dtype=np.float32).reshape(4, 3)
    for x in (xps.asarray(host), xps.asarray(host, device=xps.Device("device1"))):
        got = to_numpy(x)
        assert type(got) is np.ndarray and got.dtype == np.float64
        np.testing.assert_array_equal(got, host)
    s = to_numpy(xps.sum(xps.asarray(host), dtype=xps.float64))  # 0-d results of reductions
    assert s.shape == () and float(s) == 66.0
    kept = to_host(xps.asarray(host))  # to_host keeps the dtype
    assert type(kept) is np.ndarray and kept.dtype == np.float32
    np.testing.assert_array_equal(kept, host)
    assert to_host(host) is host and to_host([1.5]).dtype == np.float64


def test_strict_arrays_catch_what_the_kernels_must_not_do(xps, monkeypatch):
    """The guarantees these tests rely on: array-api-strict refuses NumPy-only indexing, converts
    host NumPy float64 arrays given an explicit dtype, and -- the standard promotes float32 op
    float64 to float64 -- ``_float64_spy`` sees such a promotion (and ignores float64 sums)."""
    a32 = xps.ones((3, 2), dtype=xps.float32)
    with pytest.raises(IndexError):
        a32[0:10, :]  # out-of-bounds stop
    with pytest.raises(IndexError):
        a32[0:2]  # fewer indices than dimensions
    with pytest.raises(ValueError):
        xps.vecdot(a32, a32, axis=1)  # the standard wants a negative axis
    assert xps.asarray(np.ones(2), dtype=xps.float32).dtype == xps.float32
    assert (a32 + xps.ones((3, 2), dtype=xps.float64)).dtype == xps.float64  # allowed by the standard
    with _float64_spy(xps, monkeypatch) as seen:
        xps.sum(a32, axis=0, dtype=xps.float64)
        acc = xps.zeros((3, 2), dtype=xps.float64)
        acc += xps.astype(a32, xps.float64)
        assert seen == []
        acc + a32  # float64 + float32 by promotion, not by name
        assert seen == [(3, 2)]
        seen.clear()
        a32 @ xps.asarray(np.ones((2, 4)))
        assert seen == [(2, 4), (3, 4)]
    assert (a32 + 1.0).dtype == xps.float32


# ---- the kernels on strict arrays equal the NumPy kernels ----------------------------------------
@pytest.mark.parametrize("api_version", API_VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("ct", TYPES)
def test_kernels_on_strict_arrays_match_numpy(xps, monkeypatch, data, ct, dtype, api_version):
    prior, post = _posterior(data, ct)
    params = estep_params(post, prior.mean)
    X = data.astype(dtype)
    ref = _run_kernels(X, prior.mean, ct, params)
    x = xps.asarray(X)
    flags = {"api_version": api_version, "boolean_indexing": False, "data_dependent_shapes": False,
             "enabled_extensions": ()}  # the strictest setting: no data-dependent shapes, no linalg
    with xps.ArrayAPIStrictFlags(**flags), _float64_spy(xps, monkeypatch) as float64_arrays:
        ours = _run_kernels(x, prior.mean, ct, params)
    if dtype == np.float32:
        assert float64_arrays == [], "float64 arrays were computed from float32 data"
    tol = RTOL[dtype]
    want = xps.float64 if dtype == np.float64 else xps.float32
    # the arrays stay in the strict namespace and in the data's dtype (never promoted)
    chunk = ours["chunk"]
    arrays = {"chunk.x": chunk.x, **{n: ours[n] for n in ("log_rho", "resp", "log_norm", "rlogr",
                                                           "responsibilities")}}
    if ct not in ("full", "tied"):
        arrays["chunk.feats"] = chunk.feats
    else:
        assert chunk.feats is None
    for name, arr in arrays.items():
        assert array_namespace(arr) is xps, f"{name} left the strict namespace"
        assert arr.dtype == want, f"{name} has dtype {arr.dtype}, not {want}"
    np.testing.assert_array_equal(chunk.shift, prior.mean)
    assert chunk.n_rows == X.shape[0]
    # and the numbers are NumPy's
    _close(chunk.x, ref["chunk"].x, tol, "chunk.x")
    if ct not in ("full", "tied"):
        _close(chunk.feats, ref["chunk"].feats, tol, "chunk.feats")
    for name in ("log_rho", "resp", "log_norm", "rlogr", "responsibilities"):
        _close(ours[name], ref[name], tol, name)
    _close_stats(ours["stats"], ref["stats"], tol, "chunk_statistics")
    _close_stats(ours["kernel"].stats, ref["kernel"].stats, tol, "vbem_kernel")
    assert ours["kernel"].log_norm == pytest.approx(ref["kernel"].log_norm, rel=tol)


@pytest.mark.parametrize("ct", TYPES)
def test_statistics_accept_responsibilities_of_another_float_dtype(xps, data, ct):
    """chunk_statistics casts float64 responsibilities to a float32 chunk's dtype (xp.astype)."""
    prior, _ = _posterior(data, ct)
    X = data[:300].astype(np.float32)
    R = np.random.default_rng(2).dirichlet(np.ones(K), size=X.shape[0])
    ref = chunk_statistics(prepare_chunk(X, prior.mean, ct), R)
    ours = chunk_statistics(prepare_chunk(xps.asarray(X), prior.mean, ct), xps.asarray(R))
    _close_stats(ours, ref, RTOL[np.float32], "chunk_statistics")


# ---- a whole VB EM loop on strict chunks -----------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("ct", TYPES)
def test_vbem_loop_on_strict_chunks_matches_numpy(xps, data, ct, dtype):
    prior, post0 = _posterior(data, ct)
    X = data.astype(dtype)
    parts = np.array_split(np.arange(X.shape[0]), 3)
    np_chunks = [prepare_chunk(X[p], prior.mean, ct) for p in parts]
    xp_chunks = [prepare_chunk(xps.asarray(X[p]), prior.mean, ct) for p in parts]
    post_np, elbo_np = _vbem_loop(np_chunks, prior, post0, 10)
    post_xp, elbo_xp = _vbem_loop(xp_chunks, prior, post0, 10)
    tol = RTOL[dtype]
    steps = np.diff(elbo_xp)
    slack = (1e-9 if dtype == np.float64 else 1e-5) * np.abs(elbo_xp).max()
    assert steps.min() >= -slack, f"ELBO decreased by {-steps.min():.3e}"
    assert elbo_xp[-1] > elbo_xp[0]
    np.testing.assert_allclose(elbo_xp, elbo_np, rtol=tol)
    _close(post_xp.means, post_np.means, tol, "means")
    _close(post_xp.covariances, post_np.covariances, 100 * tol, "covariances")


# ---- the hard-assignment kernel of the DP learners (seed 003) -------------------------------------
@pytest.mark.parametrize("rows", [None, np.array([0, 3, 4, 9, 17, 40])])
def test_hard_kernel_on_standard_arrays_matches_numpy(xps, rows):
    """MAP assignments and hard statistics through the standard namespace (the CuPy route: one-hot
    GEMMs, float64 accumulators on the device) give the NumPy kernel's counts and sums."""
    from vbcore.kernels.sga_stats import DPPoint, hard_kernel, map_params

    rng = np.random.default_rng(4)
    X = np.concatenate([rng.normal(c, 0.3, size=(30, 5)) for c in (-2.0, 0.0, 3.0)]).astype(np.float32)
    shift = X[0].astype(np.float64)
    point = DPPoint(np.array([[-2.0] * 5, [0.0] * 5, [3.0] * 5, [9.0] * 5]), np.array([0.3, 0.4, 0.5, 0.5]))
    params = map_params(point, 0.09, shift, np.float32)
    ref = hard_kernel(prepare_chunk(X, shift, "fixed", squares=False), rows, params)
    got = hard_kernel(prepare_chunk(xps.asarray(X), shift, "fixed", squares=False), rows, params)
    assert np.array_equal(got.nk, ref.nk) and np.array_equal(got.idx, ref.idx)
    assert 3 not in got.idx  # the far cluster owns no row
    np.testing.assert_allclose(got.s1, ref.s1, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(got.s2, ref.s2, rtol=1e-6, atol=1e-5)


def test_finiteness_check_of_standard_chunks(xps):
    """``check_kernel`` checks a device chunk where it lives and copies it to the host only to name the
    first non-finite value."""
    from vbcore.errors import InputError
    from vbcore.kernels.init import check_kernel

    X = np.arange(24, dtype=np.float32).reshape(8, 3)
    check_kernel(prepare_chunk(xps.asarray(X), np.zeros(3), "diag"), 0, "store.zarr")
    X[5, 2] = np.inf
    with pytest.raises(InputError, match=r"store.zarr.*non-finite value at row 105, column 2"):
        check_kernel(prepare_chunk(xps.asarray(X), np.zeros(3), "diag"), 100, "store.zarr")


def test_assignments_of_standard_chunks_equal_numpys(xps, data):
    """``vbcluster assign``'s kernel reduces a chunk's responsibilities to labels and their value where
    the chunk lives (on a GPU: two vectors cross the bus, not n x K)."""
    from pipeline.runs.directory import _assign_kernel

    prior, post = _posterior(data, "diag")
    params = estep_params(post, prior.mean)
    X = data.astype(np.float32)
    ref = _assign_kernel(prepare_chunk(X, prior.mean, "diag"), params)
    got = _assign_kernel(prepare_chunk(xps.asarray(X), prior.mean, "diag"), params)
    assert got[0].dtype == np.int32 and got[1].dtype == np.float32
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5)
    assert np.unique(ref[0]).size == K


def test_typical_rows_of_standard_chunks_equal_numpys(xps, data):
    """The report's kernel (pipeline/runs/typical.py) keeps the n x K log responsibilities where the chunk
    lives and returns labels and a K x m table, the same on standard arrays as on NumPy's."""
    from pipeline.runs.typical import typical_kernel

    prior, post = _posterior(data, "diag")
    params = estep_params(post, prior.mean)
    X = data.astype(np.float32)
    ref = typical_kernel(prepare_chunk(X, prior.mean, "diag"), params, 3)
    got = typical_kernel(prepare_chunk(xps.asarray(X), prior.mean, "diag"), params, 3)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-5)
    assert (ref[1] >= 0).all() and ref[1].shape == (K, 3)
    # weighted rows (a store's weights): rows of weight 0 are no cluster's row, on either namespace
    from vbcore.kernels.estep import weigh_chunk

    w = np.random.default_rng(1).integers(0, 3, X.shape[0]).astype(np.float64)
    ref = typical_kernel(weigh_chunk(prepare_chunk(X, prior.mean, "diag"), w), params, 3)
    got = typical_kernel(weigh_chunk(prepare_chunk(xps.asarray(X), prior.mean, "diag"), w), params, 3)
    for a, b in zip((got[0], got[1], got[3]), (ref[0], ref[1], ref[3]), strict=True):
        np.testing.assert_array_equal(a, b)
    assert ref[3].sum() == np.count_nonzero(w) and not np.isin(ref[1], np.flatnonzero(w == 0)).any()


def test_gathered_rows_and_weights_of_standard_chunks_equal_numpys(xps, data):
    """The point learners' samples gather rows with their weights next to the data, leaving rows of
    weight 0 where they are (pipeline/fit/learners/point/base.py), the same on standard arrays."""
    from pipeline.fit.learners.sampling import gather_weighted_kernel
    from vbcore.kernels.estep import weigh_chunk

    X = data.astype(np.float32)
    w = np.random.default_rng(2).integers(0, 3, X.shape[0]).astype(np.float64)
    rows = np.arange(0, X.shape[0], 3)
    ref = gather_weighted_kernel(weigh_chunk(prepare_chunk(X, np.zeros(X.shape[1]), "diag"), w), rows)
    got = gather_weighted_kernel(weigh_chunk(prepare_chunk(xps.asarray(X), np.zeros(X.shape[1]), "diag"), w),
                                 rows)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    assert ref[1] is not None and np.array_equal(ref[1], w[rows][w[rows] > 0])
    np.testing.assert_array_equal(ref[0], X[rows][w[rows] > 0])


# ---- a pass's statistics merged where they live (a device engine's reduction) ---------------------
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("ct", ["diag", "spherical", "fixed"])
def test_pass_statistics_merged_where_they_live_are_the_host_merges_bits(xps, data, ct, dtype, weighted):
    """``vbem_pass_kernel`` keeps a chunk's diagonal statistics in its namespace; merged there over the
    engines' fixed tree (``merge`` as the Dask engine, ``merge_owned`` as the in-process one) and
    copied to the host once by ``on_host``, they are bit for bit the statistics copied chunk by chunk
    and merged on the host: centring and merging are elementwise."""
    from pipeline.engine.engines import on_host, tree_reduce
    from vbcore.kernels.estep import KernelResult, vbem_kernel, vbem_pass_kernel, weigh_chunk

    rng = np.random.default_rng(5)  # 24 features, 12 components: 288 entries a chunk in mean and scatter
    X = np.concatenate([data] * 5, axis=1)[:, :24] + rng.normal(scale=0.3, size=(data.shape[0], 24))
    prior, post = _posterior(X, ct, k=12)
    params = estep_params(post, prior.mean)
    X = X.astype(dtype)
    w = rng.integers(0, 3, size=X.shape[0]).astype(float) if weighted else None
    parts = np.array_split(np.arange(X.shape[0]), 5)  # five chunks: the tree has a lone position
    chunks = [weigh_chunk(prepare_chunk(xps.asarray(X[p]), prior.mean, ct), None if w is None else w[p])
              for p in parts]
    per_chunk = [vbem_kernel(c, params) for c in chunks]
    for c, ref in zip(chunks, per_chunk, strict=True):  # each chunk's centred statistics, then the tree
        one = on_host(vbem_pass_kernel(c, params)).stats
        for name in ("nk", "mean", "scatter"):
            np.testing.assert_array_equal(getattr(one, name), getattr(ref.stats, name), err_msg=name)
    host = tree_reduce(per_chunk, KernelResult.merge_owned)
    assert isinstance(host.stats.nk, np.ndarray)
    for merge in (KernelResult.merge, KernelResult.merge_owned):
        kept = [vbem_pass_kernel(c, params) for c in chunks]
        assert all(array_namespace(r.stats.mean) is xps for r in kept)  # not copied chunk by chunk
        got = on_host(tree_reduce(kept, merge))
        for name in ("nk", "mean", "scatter"):
            a = getattr(got.stats, name)
            assert type(a) is np.ndarray and a.dtype == np.float64, name
            np.testing.assert_array_equal(a, getattr(host.stats, name), err_msg=name)
        assert (got.log_norm, got.log_norm_m2, got.stats.sum_rlogr, got.stats.n_rows, got.stats.weight) == (
            host.log_norm, host.log_norm_m2, host.stats.sum_rlogr, host.stats.n_rows, host.stats.weight)
    assert on_host(host) is host  # host results pass through


def test_a_dask_device_reduction_reaches_the_driver_on_the_host(xps, data, client):
    """The Dask engine of a device backend merges ``vbem_pass_kernel``'s results on the workers and
    copies the root to the host there (the driver may have no device): the driver gets NumPy arrays,
    bit for bit the host path's. Worker processes of a real cluster; the chunks are array-api-strict
    arrays, the engine's backend name is set to 'cupy' (its workers need no device for these)."""
    from pipeline.engine.engines import DaskEngine, LocalEngine
    from vbcore.kernels.estep import vbem_kernel, vbem_pass_kernel

    prior, post = _posterior(data, "diag")
    params = estep_params(post, prior.mean)
    chunks = [prepare_chunk(xps.asarray(data[p]), prior.mean, "diag")
              for p in np.array_split(np.arange(data.shape[0]), 5)]
    engine = DaskEngine(client)
    engine.array_backend = "cupy"
    got = engine.map_reduce(vbem_pass_kernel, chunks, params)
    ref = LocalEngine().map_reduce(vbem_kernel, chunks, params)
    for name in ("nk", "mean", "scatter"):
        a = getattr(got.stats, name)
        assert type(a) is np.ndarray, f"{name} reached the driver as {type(a)}"
        np.testing.assert_array_equal(a, getattr(ref.stats, name), err_msg=name)
    assert got.log_norm == ref.log_norm
