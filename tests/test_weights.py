"""Weighted rows (issue 28): ``fit(X, sample_weight=w)`` and a store's ``weights`` array.

For every learner and option that reads rows (the truncated E-step, the moves, the candidate MAP
search), from the same start: integer weights give the posterior of the rows repeated (float64
data, to 1e-10) and zero weights that of the rows dropped. Bad weights are one-line errors.
"""

import warnings

import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.store.features import FeatureStore
from vbcore.data.limits import weight_range
from vbcore.errors import InputError

RNG = np.random.default_rng(28)
X = np.concatenate([RNG.normal(c, 0.6, (40, 3)) for c in (0.0, 3.0, 6.0)])  # float64, 3 blobs
W = RNG.integers(0, 4, X.shape[0])  # 0 (dropped), 1, 2, 3 (repeated)
W[:3] = (0, 2, 3)
K = 4

#: (learner, options, covariance): every learner once, and each option that reads rows differently
CASES = [
    ("vbem", {}, "full"), ("vbem", {}, "diag"), ("vbem", {}, "tied"), ("vbem", {}, "spherical"),
    ("vbem", {"candidates": 2, "neighbours": 4}, "diag"),
    ("vbem", {"candidates": 2, "neighbours": 4}, "full"),
    ("vbem", {"moves": "merge,delete", "move_every": 2}, "diag"),
    ("vbem", {"candidates": 2, "neighbours": 4, "moves": "merge,delete", "move_every": 2}, "diag"),
    ("vbem-ps", {}, "diag"), ("ncg", {}, "diag"), ("gd", {}, "diag"), ("cg", {}, "full"), ("ng", {}, "diag"),
    ("mm", {}, "fixed"), ("mm", {"candidates": 2, "neighbours": 4}, "fixed"),
    ("sga", {"minibatch": 10**6}, "fixed"), ("sga-m", {"minibatch": 10**6}, "fixed"),
    ("sga-f", {"minibatch": 10**6}, "fixed"), ("svi", {"minibatch": 10**6, "elbo": "full"}, "fixed"),
]


def _resp(n: int) -> np.ndarray:
    """The same start for every fit: responsibilities from the row's blob (plus a little of the rest)."""
    r = np.full((n, K), 0.05)
    r[np.arange(n), np.arange(n) * 3 // n] = 1.0
    return r / r.sum(1, keepdims=True)


def _fit(learner, opts, cov, X_, resp, w=None, chunk_rows=50):
    model = VBMixture(K, covariance_type=cov, learner=learner, learner_options=dict(opts), max_iter=6,
                      tol=0.0, random_state=0, chunk_rows=chunk_rows, reg_covar=0.0,
                      weight_concentration_prior_type="dirichlet_process",
                      fixed_variance=0.5 if cov == "fixed" else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.fit(X_, resp_init=resp, sample_weight=w)


def _same(a: VBMixture, b: VBMixture, tol: float = 1e-10) -> None:
    assert a.n_components_ == b.n_components_
    np.testing.assert_allclose(a.means_, b.means_, rtol=tol, atol=tol)
    np.testing.assert_allclose(a.weights_, b.weights_, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(a.covariances_), np.asarray(b.covariances_), rtol=tol, atol=tol)
    assert a.lower_bound_ == pytest.approx(b.lower_bound_, rel=1e-10, abs=1e-9)
    np.testing.assert_allclose(a.lower_bounds_, b.lower_bounds_, rtol=1e-10)


def test_the_cases_cover_every_registered_learner():
    """CASES holds every learner once (issue 54: checked against the registry, not a list)."""
    from pipeline.fit.learners import LEARNERS

    assert sorted({case[0] for case in CASES}) == sorted(LEARNERS)


@pytest.mark.parametrize("learner, opts, cov", CASES, ids=[f"{a}-{c}-{'+'.join(b) or 'plain'}"
                                                            for a, b, c in CASES])
def test_integer_weights_equal_repeated_rows_and_zero_weights_dropped_rows(learner, opts, cov):
    resp = _resp(X.shape[0])
    weighted = _fit(learner, opts, cov, X, resp, W)
    repeated = _fit(learner, opts, cov, np.repeat(X, W, axis=0), np.repeat(resp, W, axis=0), chunk_rows=37)
    _same(weighted, repeated)
    ones = np.minimum(W, 1)  # weight 0 or 1: the rows of weight 0 dropped
    _same(_fit(learner, opts, cov, X, resp, ones), _fit(learner, opts, cov, X[ones > 0], resp[ones > 0]))


@pytest.mark.parametrize("init", ["kmeans", "k-means++", "random_from_data"])
def test_the_data_start_weighs_the_rows(init):
    """The start from the data (no resp_init): a row of weight 0 seeds no centre and moves none
    (the fit is that of the rows dropped), and k-means weighs the rows it clusters, so a weighted
    coreset starts as its data would. (The projected k-means++ start seeds among the rows of positive
    weight too, but its draw of them depends on their number: not the dropped rows' bits.)"""
    def fit(X_, w=None, **kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return VBMixture(K, covariance_type="diag", init_params=init, random_state=0, tol=0.0,
                             chunk_rows=50, reg_covar=0.0, **kw).fit(X_, sample_weight=w)

    ones = np.minimum(W, 1)
    _same(fit(X, ones, max_iter=3), fit(X[ones > 0], max_iter=3))
    if init != "kmeans":
        return
    # two blobs of 400 rows of weight 1, and 4 rows of weight 300 away from both: the weighted
    # 2-means puts one centre on the heavy rows (cost 20,000 against 30,000 and more for the others)
    rng = np.random.default_rng(3)
    heavy = np.concatenate([rng.normal(c, 0.3, (n, 2)) for c, n in (((0, 0), 400), ((10, 0), 400),
                                                                      ((0, 10), 4))])
    w = np.r_[np.ones(800), np.full(4, 300.0)]
    weighted, repeated = fit(heavy, w, max_iter=0), fit(np.repeat(heavy, w.astype(int), axis=0), max_iter=0)
    assert np.abs(weighted.means_ - [0.0, 10.0]).sum(1).min() < 0.5  # a centre on the heavy rows
    _same(weighted, repeated)


def test_unit_weights_change_no_bit():
    resp = _resp(X.shape[0])
    a, b = _fit("vbem", {}, "diag", X, resp), _fit("vbem", {}, "diag", X, resp, np.ones(X.shape[0]))
    assert np.array_equal(a.means_, b.means_) and a.lower_bound_ == b.lower_bound_


def test_a_store_with_weights_fits_as_the_weighted_array(tmp_path):
    store = FeatureStore.create(tmp_path / "w.zarr", 3, chunk_rows=32, weights=True)
    store.append(X[:70], weights=W[:70])
    store.append(X[70:], weights=W[70:])
    assert np.array_equal(FeatureStore.open(tmp_path / "w.zarr").read_weights(), W.astype(np.float64))
    resp = _resp(X.shape[0])
    from_store = _fit("vbem", {}, "diag", str(tmp_path / "w.zarr"), resp)
    from_array = _fit("vbem", {}, "diag", X.astype(np.float32), resp, W, chunk_rows=32)
    _same(from_store, from_array, tol=1e-12)


@pytest.mark.parametrize("w, message", [
    (np.r_[1.0, -2.0, np.ones(X.shape[0] - 2)],
     r"sample_weight: row 1 has weight -2\.0; weights must be >= 0"),
    (np.r_[np.ones(5), np.nan, np.ones(X.shape[0] - 6)],
     r"sample_weight: row 5 has weight nan; weights must be finite"),
    (np.zeros(X.shape[0]), r"sample_weight: Sample weights must contain at least one non-zero number"),
    (np.r_[np.inf, np.ones(X.shape[0] - 1)], r"sample_weight: row 0 has weight inf; weights must be finite"),
    (np.ones(3), r"sample_weight: expected one weight per row, shape \(120,\), got shape \(3,\)"),
    (np.array(["a"] * X.shape[0]), r"sample_weight: weights must be numbers, got dtype <U1"),
])
def test_bad_weights_are_one_line_errors(w, message):
    with pytest.raises(InputError, match=message):
        VBMixture(2).fit(X, sample_weight=w)


@pytest.mark.parametrize("dtype, w, message", [
    (np.float32, 1e30, r"sample_weight: row 4 has weight 1e\+30, above the largest weight, 2\.94e\+16, "
                       r"that float32 sums over 3 features compute with \(the features' limit\); "
                       r"rescale the weights"),
    (np.float64, 1e-320, r"sample_weight: row 4 has weight 1e-320, below the smallest positive weight, "
                         r"4\.68e-152, that float64 sums over 3 features compute with"),
    (np.float64, 1e160, r"row 4 has weight 1e\+160, above the largest weight, 2\.14e\+151"),
])
def test_weights_out_of_the_range_computed_with_are_refused(dtype, w, message):
    """Issue 53, item 6: 1e30 overflowed float32 sums (NumPy's raw warning), 1e-320 raised SciPy's
    'array must not contain infs or NaNs'; both are refused, the features' limit applied to weights."""
    weights = np.ones(X.shape[0])
    weights[4] = w
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # refused before any sum
        with pytest.raises(InputError, match=message):
            VBMixture(2, random_state=0).fit(X.astype(dtype), sample_weight=weights)
    lo, hi = weight_range(3, dtype)
    weights[4], weights[5] = hi, lo  # the ends of the range are allowed, and 0 drops a row
    weights[6] = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        VBMixture(2, max_iter=3, random_state=0).fit(X.astype(dtype), sample_weight=weights)


def test_a_weight_out_of_range_in_an_append_names_the_row(tmp_path):
    store = FeatureStore.create(tmp_path / "w.zarr", 3, chunk_rows=32, weights=True)
    with pytest.raises(InputError, match=r"appended rows: weights: row 2 has weight 1e\+30, above the "
                                         r"largest weight, 2\.94e\+16, that float32 sums"):
        store.append(X[:5], weights=[1, 1, 1e30, 1, 1])
    assert store.n_rows == 0


def test_bad_weights_in_an_append_name_the_row(tmp_path):
    store = FeatureStore.create(tmp_path / "w.zarr", 3, chunk_rows=32, weights=True)
    store.append(X[:10], weights=np.ones(10))
    message = r"appended rows: weights: row 12 has weight -1\.0; weights must be >= 0"
    with pytest.raises(InputError, match=message):
        store.append_batches([(X[:10], None, None, np.ones(10)), (X[:5], None, None, [1, 1, -1, 1, 1])])
    assert FeatureStore.open(tmp_path / "w.zarr", mode="r+").n_rows == 10  # rolled back
    with pytest.raises(InputError, match=r"the store has 'weights'; pass them for every batch"):
        store.append(X[:5])


def test_weighted_score_is_the_weighted_mean():
    model = VBMixture(2, random_state=0).fit(X)
    ll = model.score_samples(X)
    assert model.score(X, sample_weight=W) == pytest.approx(np.sum(W * ll) / W.sum(), rel=1e-12)
    assert model.score(X, sample_weight=W) != pytest.approx(model.score(X), rel=1e-6)


def test_ingest_weights_file_and_append(tmp_path):
    from typer.testing import CliRunner

    from pipeline.cli import app

    np.save(tmp_path / "a.npy", X[:70].astype(np.float32))
    np.save(tmp_path / "b.npy", X[70:].astype(np.float32))
    np.save(tmp_path / "wa.npy", W[:70].astype(np.float64))
    np.save(tmp_path / "wb.npy", W[70:].astype(np.float64))
    out = str(tmp_path / "s.zarr")
    run = CliRunner().invoke
    r = run(app, ["ingest", str(tmp_path / "a.npy"), "--out", out, "--weights", str(tmp_path / "wa.npy"),
                  "--chunk-rows", "32", "-q"])
    assert r.exit_code == 0, r.output
    r = run(app, ["ingest", str(tmp_path / "b.npy"), "--out", out, "--append", "-q"])
    said = " ".join(r.output.split())
    assert r.exit_code != 0 and "the store has 'weights'; pass them for every batch" in said
    np.save(tmp_path / "short.npy", np.ones(5))
    r = run(app, ["ingest", str(tmp_path / "b.npy"), "--out", out, "--append", "-q", "--weights",
                  str(tmp_path / "short.npy")])
    said = " ".join(r.output.split())
    assert r.exit_code != 0 and "short.npy: 5 weights, but the source has more rows" in said
    r = run(app, ["ingest", str(tmp_path / "b.npy"), "--out", out, "--append", "-q", "--weights",
                  str(tmp_path / "wb.npy")])
    assert r.exit_code == 0, r.output
    store = FeatureStore.open(out)
    assert store.n_rows == X.shape[0] and np.array_equal(store.read_weights(), W.astype(np.float64))


def test_a_store_of_zero_weights_is_a_one_line_error(tmp_path):
    store = FeatureStore.create(tmp_path / "z.zarr", 3, chunk_rows=32, weights=True)
    store.append(X, weights=np.zeros(X.shape[0]))
    message = r"z\.zarr \(120 x 3\): every row has weight 0 \(the store's weights sum to 0\): nothing to fit"
    for learner in ("vbem", "sga-f"):
        with pytest.raises(InputError, match=message):
            VBMixture(2, learner=learner).fit(str(tmp_path / "z.zarr"))


@pytest.mark.parametrize("learner", ["vbem", "sga-f", "mm"])
def test_the_starts_leave_rows_of_weight_zero_out(tmp_path, learner):
    """Every start from the data ignores rows of weight 0, whatever it samples: the rows of positive
    weight are the last chunk's 40 of 20,040 (the projected k-means++ start reads whole chunks until
    it holds 10,000 rows of positive weight; it once took the first 10,000-row chunk it drew, only rows
    of weight 0 at this seed, and failed on an empty sample), and 40 far rows of weight 0 sit among the
    others (k-means++ seeds the point learners' start from a uniform sample of all rows, and would
    seed those first)."""
    rng = np.random.default_rng(0)
    far = rng.normal(500.0, 1.0, (40, 3))
    rows = np.concatenate([rng.normal(0.0, 1.0, (19_960, 3)), far, X[:40] + 20.0])
    w = np.r_[np.zeros(20_000), np.ones(40)]
    store = FeatureStore.create(tmp_path / "s.zarr", 3, chunk_rows=10_000, weights=True)
    store.append(rows, weights=w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = VBMixture(4, learner=learner, covariance_type="fixed" if learner != "vbem" else "diag",
                          random_state=1, max_iter=0 if learner != "vbem" else 3)
        model.fit(str(tmp_path / "s.zarr"))
    assert model.weights_.sum() == pytest.approx(1.0)
    # every component's mean among the rows of positive weight (none on the far rows of weight 0)
    assert np.all(np.abs(model.means_ - (X[:40] + 20.0).mean(0)).max(1) < 10.0)


@pytest.mark.parametrize("learner, kw", [("sga-f", {}), ("vbem", {"pca": 2})])
def test_weighted_store_fits_the_same_bits_on_both_engines(tmp_path, client, learner, kw):
    """The point learners' start gathers the rows' weights with the rows on the workers, and the
    projection pass weighs them there: a real distributed cluster gives the local engine's bits."""
    from tests._reference import same_fit_bits

    path = str(tmp_path / "w.zarr")
    FeatureStore.create(path, 3, chunk_rows=32, weights=True).append(X, weights=W)
    model = dict(n_components=K, learner=learner, random_state=0, max_iter=5, tol=0.0, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local, remote = VBMixture(**model).fit(path), VBMixture(engine=client, **model).fit(path)
    same_fit_bits(local, remote)


def test_the_point_learners_start_draws_rows_of_positive_weight_until_it_has_enough():
    """Where most rows weigh 0 the start draws more rows until it holds as many of positive weight
    as it asked for (or all of them): 5% of 20,000 rows weigh 1, and a draw of 500 rows alone holds
    about 25 of them (on Fashion-MNIST features with 10% of the rows weighted, sga-f from K = 100
    found 43 clusters from that thin a start, 17 now, 13 with the other rows dropped)."""
    from pipeline.engine.engines import LocalEngine
    from pipeline.fit.learners.sampling import gather_sample
    from pipeline.fit.setup import open_source, setup

    rng = np.random.default_rng(1)
    rows, w = rng.normal(size=(20_000, 3)), (rng.random(20_000) < 0.05).astype(np.float64)
    spec = VBMixture(4, learner="sga-f", covariance_type="fixed", random_state=0).spec()
    for weights, want in ((w, 500), (w, 5_000), (None, 500)):
        ctx = setup(spec, open_source(rows, 1_000, weights), LocalEngine(threads=1), 0)
        try:
            x, got = gather_sample(ctx, want, (0, 1))
        finally:
            ctx.engine.release(ctx.handles)
        if weights is None:  # unweighted rows: one draw of the size asked
            assert got is None and x.shape[0] == want
        else:  # at least the rows asked for (more than 5,000: every row of positive weight)
            assert np.all(got == 1.0) and x.shape[0] >= min(want, int(w.sum()))
            assert x.shape[0] == int(w.sum()) or want == 500


@pytest.mark.parametrize("kind", ["parquet", "csv", "npz", "h5"])
def test_ingest_weights_from_the_sources_own_column_array_or_dataset(tmp_path, kind):
    """``--weights NAME`` for a table (a column), an .npz (an array) or an HDF5 file (a dataset): the
    store holds the same weights as from a .npy file, the column is no feature, and a name the
    source lacks is one line listing what it has."""
    import h5py
    import pandas as pd

    from pipeline.ingest import ingest

    src = tmp_path / f"t.{kind}"
    frame = pd.DataFrame(X, columns=["a", "b", "c"]).assign(wt=W.astype(np.float64))
    if kind == "parquet":
        frame.to_parquet(src)
    elif kind == "csv":
        frame.to_csv(src, index=False)
    elif kind == "npz":
        np.savez(src, X=X, wt=W.astype(np.float64))
    else:
        with h5py.File(src, "w") as f:
            f["X"], f["wt"] = X, W.astype(np.float64)
    opts = {"npz": {"key": "X"}, "h5": {"dataset": "X"}}.get(kind, {})
    ingest(str(src), tmp_path / "s.zarr", weights="wt", chunk_rows=32, **opts)
    store = FeatureStore.open(tmp_path / "s.zarr")
    assert store.n_features == 3 and np.array_equal(store.read_weights(), W.astype(np.float64))
    np.testing.assert_allclose(store.read(), X.astype(np.float32))
    what = {"parquet": "column", "csv": "column", "npz": "array", "h5": "dataset"}[kind]
    with pytest.raises(InputError, match=rf"t\.{kind}: no {what} 'nope' for weights"):
        ingest(str(src), tmp_path / "n.zarr", weights="nope", **opts)
    assert not (tmp_path / "n.zarr").exists()
    if kind == "parquet":  # a column of text is no weights
        frame.assign(wt=[f"w{i}" for i in range(len(frame))]).to_parquet(src)
        text = r"weights column 'wt' has type \w*string; weights must be numbers"
        with pytest.raises(InputError, match=text):
            ingest(str(src), tmp_path / "n.zarr", weights="wt")


def test_a_weighted_stores_metrics_count_rows_by_their_weight(tmp_path):
    """result.json's NMI/ACC/ARI (the fit summary's) weigh the rows as the fit did: rows of weight 0,
    labelled with a class of their own here, are not there (they once lowered every metric)."""
    from pipeline.estimator import load_model
    from pipeline.service import fit_run, make_spec
    from vbcore.data.metrics import nmi

    labels = np.r_[np.repeat([0, 1, 2], 40), 9, 9, 9]
    rows = np.concatenate([X, X[:3] + 0.01])
    w = np.r_[np.ones(X.shape[0]), 0.0, 0.0, 0.0]
    path = str(tmp_path / "w.zarr")
    store = FeatureStore.create(path, 3, chunk_rows=32, weights=True, labels=True)
    store.append(rows, labels=labels, weights=w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = fit_run(tmp_path / "run", make_spec(path, components=4, seed=0))["metrics"]
    pred = load_model(tmp_path / "run").predict(rows.astype(np.float32))
    assert metrics["nmi"] == pytest.approx(nmi(labels, pred, w), abs=1e-12)
    assert metrics["nmi"] > nmi(labels, pred) + 1e-3


@pytest.mark.parametrize("learner", ["vbem", "mm", "sga-f"])
def test_the_k_means_pp_starts_draw_seeds_by_weight_and_count_weights(learner, monkeypatch):
    """The pipeline's default start (k-means++-projected) and the point learners' start draw their
    k-means++ seeds in proportion to the rows' weights (the seeding gets the sample's weights), and
    their statistics count the weights: two blobs of 400 rows of weight 1 and 4 rows of weight 5,000
    away from both, 96% of the weight. (The projected start's statistics of the diagonal families
    once counted rows: the heavy rows' cluster held 0.6% of the weight.)"""
    import pipeline.fit.learners.sampling as dpm
    import vbcore.kernels.sga_stats as sga_stats

    seen = []

    def spy(x, k, rng, project=256, weights=None):
        seen.append(weights)
        return seeding(x, k, rng, project, weights)

    seeding = sga_stats.kmeanspp_seeds
    monkeypatch.setattr(sga_stats, "kmeanspp_seeds", spy)  # the projected start imports it when it runs
    monkeypatch.setattr(dpm, "kmeanspp_seeds", spy)
    rng = np.random.default_rng(3)
    rows = np.concatenate([rng.normal(c, 0.3, (n, 2)) for c, n in (((0, 0), 400), ((10, 0), 400),
                                                                   ((0, 10), 4))])
    w = np.r_[np.ones(800), np.full(4, 5000.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(3):
            model = VBMixture(2, learner=learner, covariance_type="diag" if learner == "vbem" else "fixed",
                              init_params="k-means++-projected", random_state=seed, max_iter=0)
            model.fit(rows, sample_weight=w)
            near = int(np.argmin(np.abs(model.means_ - [0.0, 10.0]).max(1)))
            assert np.abs(model.means_[near] - [0.0, 10.0]).max() < 0.5, (seed, model.means_)
            assert model.weights_[near] > 0.9, (seed, model.weights_)
    assert len(seen) == 3 and all(np.array_equal(np.sort(s), np.sort(w)) for s in seen), seen


def test_weighted_k_means_pp_seeding_is_the_unweighted_bits_for_equal_weights():
    """``kmeanspp_seeds(weights=...)``: equal weights draw the unweighted seeds bit for bit, and rows
    carrying nearly all the weight are seeds at every draw (as their copies would be)."""
    from vbcore.kernels.sga_stats import kmeanspp_seeds

    x = np.random.default_rng(1).normal(size=(300, 5))
    plain = kmeanspp_seeds(x, 7, np.random.default_rng(5))
    np.testing.assert_array_equal(kmeanspp_seeds(x, 7, np.random.default_rng(5), weights=np.full(300, 2.5)),
                                  plain)
    heavy = np.ones(300)
    heavy[[17, 230]] = 1e9  # two rows carrying nearly all the weight are seeds at every draw
    for s in range(5):
        assert {17, 230} <= set(kmeanspp_seeds(x, 3, np.random.default_rng(s), weights=heavy).tolist())
