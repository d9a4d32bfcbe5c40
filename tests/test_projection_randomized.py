"""The randomized solver of the projection stage (``pca_solver='randomized'``): exact on rows of low
rank, the theorems of Rayleigh-Ritz on any rows (the variances are those of the projected rows,
interlaced below the exact eigenvalues, the captured variance at most the exact subspace's), the
convergence of subspace iteration across a gap, weighted rows, the seed, equal bits on both engines
(a real distributed cluster), streamed or kept, and after resume, the array API, and its errors."""

import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.engine.engines import DaskEngine, LocalEngine
from pipeline.engine.sources import ArraySource, StoreSource
from pipeline.fit.projection import projection_pass
from pipeline.store.features import FeatureStore
from tests._reference import planted_blobs, same_fit_bits
from vbcore.errors import ConfigError
from vbcore.kernels.projection import BLOCK_ROWS, Rows
from vbcore.kernels.sketch import PASSES, centred_rows, randomized_projection, sketch_kernel

F64 = 1e-10  # float64 rows against NumPy on the whole matrix
F32 = 1e-6  # float32 rows: float32 GEMMs summed in float64


def _spectrum(n, d, sd, offset=0.0, seed=0):
    """Rows ``Z diag(sd) V^T + offset`` with ``Z`` orthonormal-ish Gaussian, ``V`` a random rotation:
    the covariance's eigenvalues are about ``sd**2`` (exactly the rank ``len(sd)``)."""
    rng = np.random.default_rng(seed)
    v = np.linalg.qr(rng.normal(size=(d, len(sd))))[0]
    return rng.normal(size=(n, len(sd))) * np.asarray(sd) @ v.T + offset


def _numpy(X, p):
    """The ``p`` leading eigenpairs of ``np.cov`` of the whole matrix, by decreasing eigenvalue, each
    vector's entry of largest magnitude positive (the projection's sign)."""
    values, vectors = np.linalg.eigh(np.cov(np.asarray(X, dtype=np.float64).T))
    values, vectors = values[::-1][:p], vectors[:, ::-1][:, :p]
    big = np.argmax(np.abs(vectors), axis=0)
    return values, vectors * np.sign(vectors[big, np.arange(p)])


def _randomized(X, p, whiten=False, seed=0, chunk_rows=700, weights=None, engine=None):
    src = ArraySource(X, chunk_rows, weights=weights)
    return projection_pass(engine or LocalEngine(threads=2), src, p, whiten, "randomized", seed)


@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_rows_of_low_rank_give_numpys_components(offset):
    """Centred rows spanning at most P + 32 dimensions: the first pass's range is theirs, so the
    Rayleigh-Ritz step gives the exact eigenpairs (NumPy on the whole matrix, to 1e-10)."""
    X = _spectrum(3001, 80, np.geomspace(40.0, 1.0, 30), offset=offset)
    proj = _randomized(X, 6)
    values, vectors = _numpy(X, 6)
    np.testing.assert_allclose(proj.variances, values, rtol=F64)
    assert np.abs(proj.components - vectors).max() <= F64 * 10
    assert np.abs(proj.mean - X.mean(0)).max() <= F64 * max(offset, 1.0)
    assert proj.n_rows == len(X) and not proj.whiten


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rayleigh_ritz_theorems_on_rows_of_full_rank(dtype):
    """Rows of full rank, no gap (the solver is not exact): the variances are those of the projected
    rows, which are uncorrelated (Q^T C Q diagonalised); they interlace below the exact eigenvalues;
    the captured variance is at most the exact subspace's (Ky Fan); on this flat spectrum (the hard
    case: the eight leading eigenvalues within 12% of each other) 97.5% of it was measured, and
    95% is asserted."""
    X = _spectrum(4000, 120, np.linspace(10.0, 1.0, 120), offset=5.0).astype(dtype)
    tol = F64 if dtype == np.float64 else F32
    p = 8
    proj = _randomized(X, p)
    values, _ = _numpy(X, p)
    cov = np.cov(np.asarray(X, dtype=np.float64).T)
    Y = np.asarray(proj.apply(X), dtype=np.float64)
    got = np.cov(Y.T)
    scale = float(values[0])
    assert np.abs(np.diag(got) - proj.variances).max() <= tol * 100 * scale
    assert np.abs(got - np.diag(np.diag(got))).max() <= tol * 100 * scale
    assert np.all(proj.variances <= values * (1 + tol * 100))
    np.testing.assert_allclose(proj.components.T @ proj.components, np.eye(p), atol=1e-12)
    captured = np.einsum("ij,ij->", proj.components, cov @ proj.components)
    assert 0.95 * values.sum() <= captured <= values.sum() * (1 + tol * 100)
    white = _randomized(X, p, whiten=True)
    np.testing.assert_allclose(np.cov(np.asarray(white.apply(X), dtype=np.float64).T), np.eye(p),
                               atol=tol * 1000)


def test_subspace_iteration_converges_across_a_gap():
    """Eight components 100 times above the rest: after the default three passes the basis is
    ``orth(C^2 Omega)``, whose angle to the leading subspace falls like (1/100)^2 times a factor of
    the random start (about 20 here: subspace iteration's classical rate), the Ritz values' error
    like its square; five passes go to (1/100)^4."""
    d, p = 300, 8
    sd = np.concatenate([np.linspace(10.0, 8.0, p), np.full(d - p, 0.8)])
    X = _spectrum(6000, d, sd, seed=3)
    values, vectors = _numpy(X, p)
    src, engine = ArraySource(X, 1000), LocalEngine(threads=2)
    for passes, bound in ((PASSES, 1e-2), (5, 1e-5)):
        got = _run(engine, src, p, passes, oversample=8)
        cosines = np.linalg.svd(vectors.T @ got.components, compute_uv=False)
        assert np.sqrt(np.maximum(1 - cosines.min() ** 2, 0.0)) <= bound, passes
        np.testing.assert_allclose(got.variances, values, rtol=bound ** 2 * 10)


def _run(engine, src, p, passes, oversample):
    """:func:`randomized_projection` with other passes and oversampling, on ``engine``'s passes."""
    shift = np.asarray(src.load(0)[0], dtype=np.float64)
    handles = engine.prepare(src, centred_rows, shift)
    try:
        def apply(basis, first):
            return engine.map_reduce(sketch_kernel, handles, basis, None,
                                     per_chunk=[s.start for s in src.chunk_slices()])

        return randomized_projection(apply, shift, p, False, np.random.default_rng(0), np.float64,
                                     float(np.finfo(np.float64).eps), passes=passes, oversample=oversample)
    finally:
        engine.release(handles)


def test_weights_are_repeated_and_dropped_rows():
    """Integer weights give the projection of the rows repeated, zero weights that of the rows
    dropped (rows of low rank: the solver is exact, so the roundings differ only)."""
    X = _spectrum(2 * BLOCK_ROWS + 77, 50, np.geomspace(20.0, 1.0, 12), offset=3.0)
    w = np.random.default_rng(2).integers(0, 4, len(X)).astype(np.float64)
    weighted = _randomized(X, 5, weights=w, chunk_rows=3000)
    repeated = _randomized(np.repeat(X, w.astype(int), axis=0), 5, chunk_rows=3000)
    np.testing.assert_allclose(weighted.variances, repeated.variances, rtol=F64)
    assert np.abs(weighted.components - repeated.components).max() <= F64 * 10
    assert np.abs(weighted.mean - repeated.mean).max() <= F64 * 10
    assert weighted.n_rows == int(w.sum())


def test_the_seed_drives_the_start():
    X = _spectrum(2000, 90, np.linspace(6.0, 1.0, 90))
    a, b, c = _randomized(X, 5, seed=1), _randomized(X, 5, seed=1), _randomized(X, 5, seed=2)
    assert all(np.array_equal(v, b.to_arrays()[k]) for k, v in a.to_arrays().items())
    assert not np.array_equal(a.components, c.components)


def test_local_and_dask_engines_streamed_or_kept_give_the_same_bits(client, tmp_path):
    """(Before: an xfail -- after the earlier tests of this file, Dask with persist='always' gave other
    float32 bits: a chunk kept on one worker reached a task on the other unaligned, and NumPy's
    matmul computed it without BLAS; tests/test_aligned.py.)"""
    X, _ = planted_blobs(n=1500, d=60, k=5)
    path = str(tmp_path / "s.zarr")
    FeatureStore.create(path, 60, chunk_rows=400).append((X + 1e4).astype(np.float32))
    src = StoreSource(path)
    runs = [projection_pass(LocalEngine(threads=2, persist=mode), src, 4, True, "randomized", 0)
            for mode in ("always", "never")]
    runs += [projection_pass(DaskEngine(client, persist=mode), src, 4, True, "randomized", 0)
             for mode in ("always", "never")]
    for other in runs[1:]:
        for key, value in runs[0].to_arrays().items():
            assert np.array_equal(value, other.to_arrays()[key]), key
    kw = dict(n_components=6, covariance_type="diag", pca=4, pca_solver="randomized", max_iter=4, tol=0.0,
              random_state=0)
    same_fit_bits(VBMixture(**kw).fit(path), VBMixture(engine=client, **kw).fit(path))


def test_resume_keeps_the_randomized_projection(tmp_path):
    X, _ = planted_blobs(n=1500, d=40, k=4)
    kw = dict(n_components=5, covariance_type="full", pca=3, whiten=True, pca_solver="randomized", tol=0.0,
              random_state=0, chunk_rows=400)
    VBMixture(max_iter=6, checkpoint_dir=str(tmp_path), checkpoint_every=3, **kw).fit(X)
    resumed = VBMixture(max_iter=12, checkpoint_dir=str(tmp_path), checkpoint_every=3, **kw).fit(X)
    assert resumed.resumed_from_.endswith("ckpt-00000006")
    whole = VBMixture(max_iter=12, **kw).fit(X)
    same_fit_bits(resumed, whole)
    for key, value in resumed.projection_.to_arrays().items():
        assert np.array_equal(value, whole.projection_.to_arrays()[key]), key
    with pytest.raises(ConfigError, match=r"settings differ from the checkpoint's \(pca_solver 'randomized' "
                       r"-> None\)"):
        VBMixture(max_iter=12, checkpoint_dir=str(tmp_path), **dict(kw, pca_solver="exact")).fit(X)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_kernel_uses_only_the_array_api(dtype):
    """On array-api-strict rows (what CuPy chunks go through) the kernel gives NumPy's sums."""
    xps = pytest.importorskip("array_api_strict")
    X = _spectrum(BLOCK_ROWS + 900, 30, np.linspace(5.0, 1.0, 30), offset=1e3).astype(dtype)
    q = np.random.default_rng(0).normal(size=(30, 7)).astype(dtype)
    w = np.random.default_rng(1).uniform(0.0, 3.0, len(X))
    tol = F64 if dtype == np.float64 else F32
    for weights in (None, w):
        ref = sketch_kernel(Rows(centred_rows(X, X[0]).x, weights), 0, q, None)
        xs = centred_rows(xps.asarray(X), X[0]).x
        strict = sketch_kernel(Rows(xs, None if weights is None else xps.asarray(weights)), 0, xps.asarray(q),
                               None)
        assert strict.n == pytest.approx(ref.n, rel=1e-12)
        assert np.abs(strict.y - ref.y).max() <= tol * np.abs(ref.y).max()
        assert np.abs(strict.total - ref.total).max() <= tol * np.abs(ref.total).max()


def test_one_line_errors(tmp_path):
    from typer.testing import CliRunner

    from pipeline.cli import app

    X, _ = planted_blobs(n=300, d=12, k=2)
    with pytest.raises(ConfigError, match=r"^pca_solver needs pca: it computes the principal components$"):
        VBMixture(2, pca_solver="randomized").fit(X)
    with pytest.raises(ConfigError, match=r"pca_solver must be one of exact, randomized, got 'fast'"):
        VBMixture(2, pca=3, pca_solver="fast").fit(X)
    path = str(tmp_path / "s.zarr")
    FeatureStore.create(path, 12, chunk_rows=100).append(X.astype(np.float32))
    runner = CliRunner()
    res = runner.invoke(app, ["fit", path, "--run-dir", str(tmp_path / "r"), "--pca-solver", "randomized"])
    assert res.exit_code == 2 and "pca_solver (--pca-solver) needs pca (--pca)" in res.output, res.output
    assert not (tmp_path / "r").exists()
    res = runner.invoke(app, ["fit", path, "--run-dir", str(tmp_path / "r"), "--pca", "3", "--pca-solver",
                              "randomized", "-k", "3", "-q"])
    assert res.exit_code == 0, res.output
    from pipeline.estimator import load_model

    model = load_model(tmp_path / "r")
    assert model.projection_.n_components == 3 and model.pca_solver == "randomized"
