"""The projection stage (``pca``/``whiten``): the one-pass moments against NumPy on the whole matrix,
the eigendecomposition, equal bits on both engines (a real distributed cluster) and after resume,
and the projection applied by predict, assign and warm starts."""

import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.engine.engines import DaskEngine, LocalEngine
from pipeline.engine.sources import ArraySource, StoreSource
from pipeline.fit.learners import LEARNERS
from pipeline.fit.projection import data_moments, projection_pass
from pipeline.store.features import FeatureStore
from tests._reference import planted_blobs, same_fit_bits
from vbcore.errors import ConfigError, InputError
from vbcore.kernels.projection import BLOCK_ROWS, RowMoments, fit_projection, row_moments

F64 = 1e-10  # the named tolerance of float64 results against NumPy
F32 = 1e-6  # float32 rows: float32 GEMMs summed in float64


def _skewed(n=3001, d=12, offset=0.0, seed=0):
    """Correlated rows with scales from 0.01 to 10, shifted by ``offset`` (badly conditioned when large)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) * rng.uniform(0.01, 10, d) + offset


def _reference(X):
    """Mean and covariance in extended precision (NumPy's longdouble), rounded to float64."""
    L = np.asarray(X, dtype=np.longdouble)
    mu = L.mean(0)
    c = L - mu
    return mu.astype(np.float64), (c.T @ c / (len(X) - 1)).astype(np.float64)


@pytest.mark.parametrize("offset", [0.0, 1e4, 1e6, 1e8])
@pytest.mark.parametrize("chunk_rows", [3001, 700, 1000, 1])
def test_moments_equal_numpy_on_the_whole_matrix(offset, chunk_rows):
    X = _skewed(n=3001 if chunk_rows > 1 else 64, offset=offset)
    m = data_moments(LocalEngine(threads=2), ArraySource(X, chunk_rows))
    mu, cov = _reference(X)
    assert m.n == len(X)
    scale = np.abs(cov).max()
    assert np.abs(m.covariance() - cov).max() <= F64 * scale
    assert np.abs(np.cov(X.T) - cov).max() <= F64 * scale  # the reference agrees with np.cov
    assert np.abs(m.mean - mu).max() <= F64 * max(abs(offset), 1.0)


def test_moments_of_float32_rows():
    X = _skewed(offset=1e3).astype(np.float32)
    m = data_moments(LocalEngine(threads=1), ArraySource(X, 512))
    cov = np.cov(X.astype(np.float64).T)
    assert np.abs(m.covariance() - cov).max() <= F32 * np.abs(cov).max()
    # weighted float32 rows: the weighted mean's first guess is summed in float64 too
    w = np.random.default_rng(3).integers(0, 4, X.shape[0]).astype(np.float64)
    m = data_moments(LocalEngine(threads=1), ArraySource(X, 512, weights=w))
    cov = np.cov(np.repeat(X.astype(np.float64), w.astype(int), axis=0).T)
    assert np.abs(m.covariance() - cov).max() <= F32 * np.abs(cov).max()


@pytest.mark.parametrize("dtype, tol", [(np.float32, F32), (np.float64, 1e-12)])
def test_syrk_scatter_equals_the_plain_product(dtype, tol):
    """The BLAS path (SYRK blocks of BLOCK_ROWS rows, centred a few rows at a time) against
    ``xc.T @ xc`` in float64 over more than two blocks and a partial one."""
    X = _skewed(n=2 * BLOCK_ROWS + 123, d=300, offset=50.0).astype(dtype)
    m = row_moments(X, X[0].astype(np.float64))
    X64 = X.astype(np.float64)
    xc = X64 - X64.mean(axis=0)
    ref = xc.T @ xc
    assert m.scatter.dtype == np.float64 and m.scatter.flags.c_contiguous
    assert np.abs(m.scatter - ref).max() <= tol * np.abs(ref).max()
    assert np.abs(m.mean - X64.mean(axis=0)).max() <= tol * 50.0
    # the local engine's in-place merge gives the merge's bits
    a, b = row_moments(X[:5000], X[0]), row_moments(X[5000:], X[0])
    merged, owned = a.merge(b), row_moments(X[:5000], X[0]).merge_owned(b)
    assert np.array_equal(merged.scatter, owned.scatter) and np.array_equal(merged.mean, owned.mean)
    assert np.abs(merged.scatter - ref).max() <= tol * np.abs(ref).max()


def test_merge_is_the_pairwise_update_and_empty_parts_are_neutral():
    X = _skewed(n=50)
    shift = X[0]
    a, b = row_moments(X[:20], shift), row_moments(X[20:], shift)
    whole = a.merge(b)
    np.testing.assert_allclose(whole.scatter, row_moments(X, shift).scatter, rtol=1e-12, atol=1e-9)
    empty = row_moments(X[:0], shift)
    assert empty.merge(a) is a and a.merge(empty) is a
    assert isinstance(whole, RowMoments) and whole.n == 50


def test_projection_equals_numpy_eigh_and_whitening_gives_unit_variance():
    X = _skewed(offset=1e6)
    proj = projection_pass(LocalEngine(), ArraySource(X, 800), 5, False)
    _, cov = _reference(X)
    values, vectors = np.linalg.eigh(cov)
    values, vectors = values[::-1][:5], vectors[:, ::-1][:, :5]
    np.testing.assert_allclose(proj.variances, values, rtol=F64)
    signs = np.sign(np.sum(proj.components * vectors, axis=0))  # eigenvectors up to their sign
    assert np.abs(proj.components - vectors * signs).max() <= 1e-8  # well separated eigenvalues
    Y = proj.apply(X)
    np.testing.assert_allclose(Y, (X - X.mean(0)) @ proj.components, rtol=0, atol=1e-6)
    white = projection_pass(LocalEngine(), ArraySource(X, 800), 5, True)
    np.testing.assert_allclose(np.cov(white.apply(X).T), np.eye(5), atol=1e-9)
    np.testing.assert_allclose(white.inverse(white.apply(X)), proj.inverse(Y), atol=1e-6)


def test_float32_moments_take_a_float32_eigensolver_refined_in_float64():
    """The scatter of float32 rows is float32-precise: its leading eigenpairs come from ``ssyevr`` on
    the covariance rounded to float32, then one float64 Rayleigh-Ritz step. Against float64 ``eigh``
    of the same covariance: the eigenvalues to 1e-11, the components within the float32 solver's
    first-order error (eps32 * lambda_1 / gap); float64 rows keep the float64 solver's bits."""
    import scipy.linalg

    from vbcore.kernels.projection import leading_eigh

    X = _skewed(n=4000, d=60, offset=5.0, seed=3).astype(np.float32)
    m = data_moments(LocalEngine(threads=1), ArraySource(X, 1000))
    p = 6
    proj = fit_projection(m, p, eps=float(np.finfo(np.float32).eps))
    cov = m.covariance()
    cov = (cov + cov.T) * 0.5
    values, vectors = scipy.linalg.eigh(cov)
    values, vectors = values[::-1], vectors[:, ::-1]
    np.testing.assert_allclose(proj.variances, values[:p], rtol=1e-11)
    gaps = np.minimum(-np.diff(values)[:p], np.r_[np.inf, -np.diff(values)[:p - 1]])
    bound = 10 * float(np.finfo(np.float32).eps) * values[0] / gaps  # per component
    sines = np.sqrt(np.maximum(0.0, 1.0 - np.sum(proj.components * vectors[:, :p], axis=0) ** 2))
    assert (sines <= bound).all(), (sines, bound)
    assert sines.max() > 1e-7  # a float32 solver (float64 eigh of the same agrees to about 3e-8)
    exact = fit_projection(m, p)  # float64 precision: dsyevr, as before
    w, v = leading_eigh(cov, p)
    assert np.array_equal(exact.variances, np.maximum(w[::-1], 0.0))
    assert np.abs(np.abs(np.sum(exact.components * v[:, ::-1], axis=0)) - 1).max() < 1e-14


def test_float32_rows_are_projected_with_a_float32_gemm():
    X = _skewed(offset=10.0).astype(np.float32)
    proj = projection_pass(LocalEngine(), ArraySource(X, 800), 4, False)
    Y = proj.apply(X)
    assert Y.dtype == np.float32 and Y.shape == (len(X), 4)
    ref = (X.astype(np.float64) - proj.mean) @ proj.components
    assert np.abs(Y - ref).max() <= F32 * np.abs(ref).max() * 10


def test_local_and_dask_engines_give_the_same_bits(client, tmp_path):
    X, _ = planted_blobs(n=1500, d=10, k=5)
    path = str(tmp_path / "s.zarr")
    FeatureStore.create(path, 10, chunk_rows=400).append((X + 1e4).astype(np.float32))
    src = StoreSource(path)
    local = projection_pass(LocalEngine(threads=2), src, 4, True)
    remote = projection_pass(DaskEngine(client), src, 4, True)
    for key, value in local.to_arrays().items():
        assert np.array_equal(value, remote.to_arrays()[key]), key
    kw = dict(n_components=6, covariance_type="diag", pca=4, max_iter=4, tol=0.0, random_state=0)
    same_fit_bits(VBMixture(**kw).fit(path), VBMixture(engine=client, **kw).fit(path))
    streamed = VBMixture(engine=client, persist="never", **kw).fit(path)
    same_fit_bits(VBMixture(**kw).fit(path), streamed)


@pytest.mark.parametrize("weighted", [False, True])
def test_resume_with_pca_is_bitwise(tmp_path, weighted):
    X, _ = planted_blobs(n=1500, d=8, k=4)
    w = np.random.default_rng(4).uniform(0.0, 3.0, X.shape[0]) if weighted else None
    kw = dict(n_components=5, covariance_type="full", pca=3, whiten=True, tol=0.0, random_state=0,
              chunk_rows=400)
    VBMixture(max_iter=6, checkpoint_dir=str(tmp_path), checkpoint_every=3, **kw).fit(X, sample_weight=w)
    resumed = VBMixture(max_iter=12, checkpoint_dir=str(tmp_path), checkpoint_every=3, **kw).fit(
        X, sample_weight=w)
    assert resumed.resumed_from_.endswith("ckpt-00000006")
    whole = VBMixture(max_iter=12, **kw).fit(X, sample_weight=w)
    same_fit_bits(resumed, whole)
    for key, value in resumed.projection_.to_arrays().items():
        assert np.array_equal(value, whole.projection_.to_arrays()[key]), key
    with pytest.raises(ConfigError, match=r"settings differ from the checkpoint's \(pca 3 -> 2"):
        VBMixture(max_iter=12, checkpoint_dir=str(tmp_path), **dict(kw, pca=2)).fit(X, sample_weight=w)


def test_predict_applies_the_projection():
    X, _ = planted_blobs(n=1200, d=8, k=4)
    m = VBMixture(4, covariance_type="diag", pca=3, random_state=0, max_iter=20).fit(X)
    assert m.means_.shape == (4, 3) and m.n_features_in_ == 8
    plain = VBMixture(4, covariance_type="diag")
    plain.set_fitted(m.posterior_, m.prior_, _terms(m), list(m.lower_bounds_), m.converged_, m.n_iter_)
    Y = m.projection_.apply(X)
    np.testing.assert_array_equal(m.predict_proba(X), plain.predict_proba(Y))
    np.testing.assert_array_equal(m.score_samples(X), plain.score_samples(Y))
    with pytest.raises(InputError, match="X has 3 features, but VBMixture is expecting 8"):
        m.predict(Y)
    Xs, _ = m.sample(20)
    assert Xs.shape == (20, 8)


def _terms(m):
    from vbcore.model.elbo import ElboTerms

    return ElboTerms(**{k: m.elbo_terms_[k] for k in ("log_likelihood", "kl_assignments", "kl_weights",
                                                      "kl_components")})


def test_warm_start_keeps_the_projection():
    X, _ = planted_blobs(n=1500, d=8, k=4, seed=1)
    m = VBMixture(4, covariance_type="diag", pca=3, warm_start=True, random_state=0, max_iter=5,
                  tol=0.0).fit(X[:1000])
    first = m.projection_
    m.fit(X)  # more rows: the posterior lives in the first fit's space, so the projection stays
    assert m.projection_ is first and m.means_.shape == (4, 3)
    with pytest.raises(ConfigError, match=r"warm_start: .*pca 3 -> 2"):
        m.set_params(pca=2).fit(X)


@pytest.mark.parametrize("learner", sorted(LEARNERS))
def test_every_learner_fits_projected_rows(learner):
    X, y = planted_blobs(n=1600, d=12, k=4, seed=2)
    m = VBMixture(8, learner=learner, pca=4, random_state=0, max_iter=6, chunk_rows=500).fit(
        (X + 50.0).astype(np.float32))  # 'full' (scikit-learn's default) for the learners that fit it
    assert m.means_.shape[1] == 4 and np.isfinite(m.lower_bound_)
    assert m.predict(X + 50.0).shape == (1600,)
    assert m.posterior_.covariance_type == (LEARNERS[learner].default_covariance or "full")


def test_one_line_errors():
    X, _ = planted_blobs(n=40, d=6, k=2)
    with pytest.raises(ConfigError, match=r"pca \(--pca\) must be at most the number of features \(6\), "
                       r"got 7"):
        VBMixture(2, pca=7).fit(X)
    with pytest.raises(ConfigError, match=r"pca \(--pca\) must be at most the number of rows \(40\), got 41"):
        VBMixture(2, pca=41).fit(np.hstack([X] * 7))
    with pytest.raises(ConfigError, match=r"pca must be an integer >= 1, got 0"):
        VBMixture(2, pca=0).fit(X)
    with pytest.raises(ConfigError, match=r"whiten needs pca"):
        VBMixture(2, whiten=True).fit(X)
    flat = np.hstack([X[:, :2], X[:, :2] * 2.0, X[:, :2] - 1.0])  # rank 2 (centred) in 6 columns
    with pytest.raises(ConfigError, match=r"whiten \(--whiten\): principal component 3 of 3 has variance .* "
                       r"span only 2 dimension\(s\); use --pca 2 or less, or drop --whiten"):
        VBMixture(2, pca=3, whiten=True).fit(flat)
    VBMixture(2, pca=3, random_state=0).fit(flat)  # without whitening a zero variance is harmless
    with pytest.raises(ConfigError, match=r"whiten \(--whiten\): principal component 1 of 1 .* "
                       r"drop --whiten"):
        fit_projection(row_moments(np.ones((5, 3)), np.zeros(3)), 1, whiten=True)


def _store(path, rows, seed=0, offset=100.0):
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(scale=6.0, size=(4, 9))
    y = rng.integers(0, 4, size=rows)
    X = (centres[y] + rng.normal(size=(rows, 9)) + offset).astype(np.float32)
    if not path.exists():
        FeatureStore.create(path, 9, chunk_rows=256, labels=True)
    FeatureStore.open(path, "r+").append(X, labels=y)
    return str(path)


def _same_projection(a, b):
    return all(np.array_equal(v, b.to_arrays()[k]) for k, v in a.to_arrays().items())


def test_cli_fit_assign_and_warm_start_from_a_run(tmp_path):
    from typer.testing import CliRunner

    from pipeline.cli import app
    from pipeline.estimator import load_model
    from pipeline.runs.directory import assign_store
    from pipeline.service import fit_run, make_spec

    runner = CliRunner()
    store = _store(tmp_path / "s.zarr", 700)
    run = tmp_path / "run"
    res = runner.invoke(app, ["fit", store, "--run-dir", str(run), "-k", "5", "--pca", "4", "--whiten", "-q"])
    assert res.exit_code == 0, res.output
    model = load_model(run)
    assert model.projection_.n_components == 4 and model.projection_.whiten
    # moves may merge or delete components of the K = 5 start (the command line's defaults)
    assert model.means_.shape[1] == 4 and 1 <= model.means_.shape[0] <= 5 and model.n_features_in_ == 9
    g = FeatureStore.open(store)
    X = g.read()
    import zarr

    labels = zarr.open_group(str(assign_store(run)), mode="r")["labels"][:]
    np.testing.assert_array_equal(labels, model.predict(X))
    _store(tmp_path / "s.zarr", 300, seed=5)  # grown: the warm start keeps the run's projection
    warm = tmp_path / "warm"
    fit_run(warm, make_spec(store, components=5, pca=4, whiten=True), warm_from=run)
    assert _same_projection(load_model(warm).projection_, model.projection_)
    with pytest.raises(ConfigError, match=r"cannot warm-start from .*pca 4 -> 3"):
        fit_run(tmp_path / "w2", make_spec(store, components=5, pca=3, whiten=True), warm_from=run)
    other = str(tmp_path / "other.zarr")  # a store of other features: the command line's words
    FeatureStore.create(other, 5, chunk_rows=100).append(np.random.default_rng(0).normal(size=(60, 5)))
    res = runner.invoke(app, ["fit", other, "--run-dir", str(tmp_path / "w3"), "--warm-from", str(run)])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and f"cannot warm-start from {run}: the store or settings do not match its " \
        "model (n_features 9 -> 5); drop --warm-from (warm_from) to start over" in said, said
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "r3"), "--whiten"])
    assert res.exit_code == 2 and "whiten (--whiten) needs pca (--pca)" in res.output
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "r3"), "--pca", "10"])
    assert res.exit_code == 2 and "must be at most the number of features (9), got 10" in res.output
    assert not (tmp_path / "r3").exists()


def test_scheduled_refresh_keeps_the_projection_of_its_warm_start(tmp_path, prefect_api):
    from flows.schedule import refresh_flow
    from pipeline.estimator import load_model

    store = _store(tmp_path / "s.zarr", 600)
    out = str(tmp_path / "pub")
    kw = dict(components=5, max_iter=5, pca=3)
    first = refresh_flow(store, out, **kw)
    _store(tmp_path / "s.zarr", 200, seed=3)
    second = refresh_flow(store, out, **kw)
    assert first["action"] == "cold" and second["action"] == "warm"
    a, b = load_model(first["version"]).projection_, load_model(second["version"]).projection_
    assert a.n_components == 3 and _same_projection(a, b)
    fresh = projection_pass(LocalEngine(), StoreSource(store), 3, False)
    assert fresh.n_rows == 800 and b.n_rows == 600  # not recomputed on the grown store


def test_restarts_share_one_projection_pass(monkeypatch):
    import pipeline.fit.setup as fit_setup

    calls = []
    real = fit_setup.projection_pass
    monkeypatch.setattr(fit_setup, "projection_pass", lambda *a: calls.append(1) or real(*a))
    X, _ = planted_blobs(n=900, d=6, k=3)
    three = VBMixture(3, covariance_type="diag", pca=2, n_init=3, random_state=0, max_iter=5).fit(X)
    assert len(calls) == 1 and three.projection_.n_components == 2


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_moments_and_projection_use_only_the_array_api(dtype):
    """On array-api-strict rows (what CuPy chunks go through) the kernels give NumPy's results."""
    xps = pytest.importorskip("array_api_strict")
    X = _skewed(n=5000, offset=1e3).astype(dtype)  # more rows than one block of the scatter
    ref, strict = row_moments(X, X[0]), row_moments(xps.asarray(X), X[0])
    tol = F64 if dtype == np.float64 else F32
    assert np.abs(strict.scatter - ref.scatter).max() <= tol * np.abs(ref.scatter).max()
    np.testing.assert_allclose(strict.mean, ref.mean, rtol=tol)
    w = np.random.default_rng(1).uniform(0.0, 3.0, X.shape[0])  # weighted rows too
    ref_w, strict_w = row_moments(X, X[0], w), row_moments(xps.asarray(X), X[0], xps.asarray(w))
    assert strict_w.n == pytest.approx(ref_w.n, rel=1e-12)
    assert np.abs(strict_w.scatter - ref_w.scatter).max() <= tol * np.abs(ref_w.scatter).max()
    np.testing.assert_allclose(strict_w.mean, ref_w.mean, rtol=tol)
    proj = fit_projection(ref, 3, whiten=True)
    got = np.asarray(proj.apply(xps.asarray(X)))
    assert got.dtype == dtype
    np.testing.assert_allclose(got, proj.apply(X), rtol=tol, atol=tol * np.abs(got).max())


def _weighted_reference(X, w):
    """Weighted mean and covariance ``sum w (x - m)(x - m)^T / (sum w - 1)`` in extended precision."""
    L, lw = np.asarray(X, dtype=np.longdouble), np.asarray(w, dtype=np.longdouble)
    mu = (lw[:, None] * L).sum(0) / lw.sum()
    c = L - mu
    return mu.astype(np.float64), ((c * lw[:, None]).T @ c / (lw.sum() - 1)).astype(np.float64)


@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_weighted_moments_are_those_of_repeated_and_dropped_rows(offset):
    """Weighted rows (issue 28) in the projection pass: integer weights give the moments of the rows
    repeated, zero weights those of the rows dropped, fractional ones the weighted covariance; on
    the BLAS path over several blocks and chunks."""
    X = _skewed(n=2 * BLOCK_ROWS + 77, d=9, offset=offset)
    w = np.random.default_rng(5).integers(0, 4, X.shape[0]).astype(np.float64)
    m = data_moments(LocalEngine(threads=2), ArraySource(X, 3000, weights=w))
    mu, cov = _weighted_reference(X, w)
    rep = np.repeat(X, w.astype(int), axis=0)
    assert m.n == w.sum() == rep.shape[0]
    scale = np.abs(cov).max()
    assert np.abs(m.covariance() - cov).max() <= F64 * scale
    assert np.abs(m.covariance() - np.cov(rep.T)).max() <= F64 * scale
    assert np.abs(m.mean - mu).max() <= F64 * max(offset, 1.0)
    frac = np.random.default_rng(6).uniform(0.0, 2.0, X.shape[0])
    m = data_moments(LocalEngine(threads=1), ArraySource(X, 1000, weights=frac))
    mu, cov = _weighted_reference(X, frac)
    assert m.n == pytest.approx(frac.sum(), rel=1e-12)
    assert np.abs(m.covariance() - cov).max() <= F64 * np.abs(cov).max()
    assert np.abs(m.mean - mu).max() <= F64 * max(offset, 1.0)
    nothing = row_moments(X[:5], X[0], np.zeros(5))  # a chunk of weight 0 is an empty part
    assert nothing.n == 0 and not nothing.scatter.any()


def test_weighted_projection_on_both_engines_and_in_a_fit(client, tmp_path):
    """A store with weights (which the pass once could not read: ``'numpy.ndarray' object has no
    attribute 'x'``): the same bits on both engines, and the fit of integer weights is that of the
    repeated rows (float32 rows: the projection to float32's precision, the clusters the same)."""
    X, _ = planted_blobs(n=900, d=10, k=3)
    w = np.random.default_rng(2).integers(0, 3, X.shape[0])
    path = str(tmp_path / "w.zarr")
    FeatureStore.create(path, 10, chunk_rows=200, weights=True).append(X, weights=w)
    src = StoreSource(path)
    local = projection_pass(LocalEngine(threads=2), src, 4, True)
    remote = projection_pass(DaskEngine(client), src, 4, True)
    for key, value in local.to_arrays().items():
        assert np.array_equal(value, remote.to_arrays()[key]), key
    # two components: the blobs' plane (the noise's eigenvalues are too close for float32's
    # rounding of sqrt(w) x to leave their eigenvectors alone)
    kw = dict(n_components=4, covariance_type="diag", pca=2, max_iter=5, tol=0.0, random_state=0,
              reg_covar=0.0)
    weighted = VBMixture(**kw).fit(path)
    repeated = VBMixture(**kw).fit(np.repeat(X, w, axis=0).astype(np.float32))
    for key, value in weighted.projection_.to_arrays().items():
        ref = repeated.projection_.to_arrays()[key]
        np.testing.assert_allclose(value, ref, rtol=0, atol=F32 * max(np.abs(ref).max(), 1.0))
    assert weighted.projection_.n_rows == w.sum()
    from vbcore.data.metrics import nmi

    assert nmi(weighted.predict(X[w > 0]), repeated.predict(X[w > 0])) == pytest.approx(1.0)


def test_a_truncation_warning_after_pca_with_diag_covariances_names_full_covariances(tmp_path):
    """A fit of diagonal covariances on projected rows that ends bound by its truncation says that
    full covariances may be the model (docs/guide.md, 'Reducing the dimension first'); without the
    projection, or with full covariances, the warning is as before."""
    import json

    from typer.testing import CliRunner

    from pipeline.cli import app
    from vbcore.errors import truncation_message

    store = _store(tmp_path / "s.zarr", 700)
    runner = CliRunner()
    hint = "on principal components (--pca) diag covariances tile each class with several components"
    for name, extra, hinted in (("pca-diag", ["--pca", "4"], True), ("raw", [], False),
                                ("pca-full", ["--pca", "4", "--covariance", "full"], False)):
        run = tmp_path / name
        res = runner.invoke(app, ["fit", store, "--run-dir", str(run), "-k", "2", "--no-grow", *extra])
        assert res.exit_code == 0, res.output
        truncation = json.loads((run / "result.json").read_text())["truncation"]
        assert truncation["limit_hit"]
        said = " ".join(res.output.split())
        assert (hint in said) == hinted and (hint in truncation_message(truncation)) == hinted, said
        in_python = truncation_message(truncation, face="python")  # VBMixture's words (issue 53)
        assert "--" not in in_python and ("(pca) diag" in in_python) == hinted
        assert ("try covariance_type='full'" in in_python) == hinted
        assert "the truncation may have decided the number of clusters" in said
