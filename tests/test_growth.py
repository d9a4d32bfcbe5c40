"""A truncation that does not decide the answer (pipeline.fit.learners.growth): VB EM grows K exactly when
the truncation is saturated, by births accepted on the exact ELBO (the history stays monotone), the
same bits on both engines and after a resume; a fit whose answer touches a limit says so."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.fit.learners.growth import Growth, saturated
from tests._reference import planted_blobs, same_fit_bits
from vbcore.errors import TruncationWarning


def _fit(x, k, callback=None, **kw):
    from pipeline.estimator import VBMixture

    args = dict(covariance_type="diag", prior_defaults="empirical", grow=True, reg_covar=0.0, max_iter=120,
                random_state=0, chunk_rows=500)
    args.update(kw)
    return VBMixture(k, **args).fit(x, callback=callback)


@pytest.fixture(scope="module")
def blobs():
    return planted_blobs(n=1600, d=5, k=8, seed=4)


def test_saturation_rule() -> None:
    assert saturated(9, 10) and saturated(10, 10) and not saturated(8, 10)
    assert saturated(1, 1) and not saturated(0, 1) and saturated(90, 100) and not saturated(89, 100)
    g = Growth(True, 10, 40, 3)
    assert g.wants(9, 10) and g.next_truncation() == 20
    assert not g.wants(8, 10)  # not saturated, no component pruned: nothing to fill
    assert g.wants(8, 9) and g.next_truncation() == 10  # components pruned: births (if any pass) fill
    g.refused = True
    assert not g.wants(10, 10)
    assert not Growth(True, 40, 40, 3).wants(40, 40)  # at the limit
    assert not Growth(False, 10, 40, 3).wants(10, 10)  # growth off


def test_growth_from_too_few_components_finds_the_classes(blobs) -> None:
    x, lab = blobs
    seen: list[dict] = []
    m = _fit(x, 2, callback=seen.append)
    h = m.lower_bounds_
    assert np.all(np.diff(h) >= -1e-9 * abs(h[-1]))  # births are accepted only where the bound rises
    t = m.truncation_
    assert t["start"] == 2 and t["final"] >= 8 and t["grew"] >= 2 and not t["limit_hit"]
    assert not t["max_iter_hit"]
    assert m.n_effective_ == 8 and m.converged_
    # the truncation grew only after iterations that ended saturated
    ks = [s["n_components"] for s in seen]
    assert max(ks) >= 8 and ks[0] == 2
    from sklearn.metrics import normalized_mutual_info_score

    assert normalized_mutual_info_score(lab, m.predict(x)) > 0.99


def test_no_growth_when_the_truncation_is_not_saturated(blobs) -> None:
    x, _ = blobs
    m = _fit(x, 20)
    assert m.truncation_["grew"] == 0 and m.truncation_["final"] == 20
    assert m.n_effective_ == 8  # merge and delete moves (on where K grows) shrink it on the bound


@pytest.mark.parametrize(("kw", "match"), [
    ({"max_components": 4}, r"the fit uses 4 of its 4 components and the upper limit max_components = 4"),
    ({"grow": False, "learner_options": {"moves": "none"}},
     r"uses 2 of its 2 components and the truncation did not grow"),
    ({"max_iter": 3}, r"uses \d+ of its \d+ components and the fit stopped at its iteration limit while the "
                      r"truncation was still growing: .*; raise max_iter$"),
])
def test_a_limit_hit_warns(blobs, kw, match) -> None:
    """In the estimator's words (issue 53: it named the command line's flags, --max-iter, -k)."""
    x, _ = blobs
    with pytest.warns(TruncationWarning, match=match) as caught:
        m = _fit(x, 2, **kw)
    said = " ".join(str(w.message) for w in caught if w.category is TruncationWarning)
    assert "--" not in said and "-k" not in said, said
    assert ("raise max_components or n_components" in said) == ("max_iter" not in kw)
    if "grow" in kw:
        assert "the truncation did not grow (grow=False, or a learner that does not grow it)" in said
    assert m.truncation_["limit_hit"] and m.truncation_["saturated"]
    assert m.truncation_["max_iter_hit"] == ("max_iter" in kw) and not m.converged_ == ("max_iter" in kw)


def test_resume_with_growth_is_bitwise(blobs, tmp_path) -> None:
    x, _ = blobs
    seen: list[dict] = []
    straight = _fit(x, 2, callback=seen.append)
    ks = [s["n_components"] for s in seen]
    first = next(i for i in range(1, len(ks)) if ks[i] > ks[i - 1])  # 0-based index of the first birth
    # stop on the iteration whose convergence asked for the birth, resume through it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fit(x, 2, max_iter=first, checkpoint_dir=str(tmp_path), checkpoint_every=1)
    resumed = _fit(x, 2, checkpoint_dir=str(tmp_path))
    assert resumed.resumed_from_.endswith(f"ckpt-{first:08d}")
    same_fit_bits(resumed, straight)
    assert resumed.truncation_ == straight.truncation_
    assert np.array_equal(resumed.prior_.covariance, straight.prior_.covariance)
    assert resumed.prior_.mean_precision == straight.prior_.mean_precision


def test_growth_same_bits_on_dask(blobs, client) -> None:
    x, _ = blobs
    local = _fit(x, 2, max_iter=8)
    assert local.truncation_["grew"] >= 1
    same_fit_bits(_fit(x, 2, max_iter=8, engine=client), local)


def test_cli_reports_the_truncation(tmp_path) -> None:
    from pipeline.cli import app
    from pipeline.store.features import FeatureStore

    x, _ = planted_blobs(n=600, d=4, k=6, seed=5)
    s = FeatureStore.create(tmp_path / "s.zarr", 4, chunk_rows=200)
    s.append(x)
    runner = CliRunner()
    res = runner.invoke(app, ["fit", str(tmp_path / "s.zarr"), "--run-dir", str(tmp_path / "r"), "-k", "2",
                              "--max-components", "3", "-q"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "warning: the fit uses 3 of its 3 components and the upper limit --max-components 3 was reached" \
        in said and "raise --max-components or -k" in said  # the command line's words (issue 53)
    assert "max_components" not in said and "n_components" not in said
    result = json.loads((tmp_path / "r" / "result.json").read_text())
    assert result["truncation"]["limit_hit"] and result["truncation"]["final"] == 3
    res = runner.invoke(app, ["fit", str(tmp_path / "s.zarr"), "--run-dir", str(tmp_path / "r2"),
                              "-k", "2", "-q"])
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "r2" / "result.json").read_text())
    assert not result["truncation"]["limit_hit"] and result["n_effective"] == 6
    assert "warning" not in res.output
    # a fixed truncation that every cluster fills is reported too
    res = runner.invoke(app, ["fit", str(tmp_path / "s.zarr"), "--run-dir", str(tmp_path / "r3"),
                              "-k", "2", "--no-grow", "-q"])
    assert res.exit_code == 0, res.output
    assert "warning: the fit uses 2 of its 2 components and the truncation did not grow" in \
        " ".join(res.output.split())
    assert json.loads((tmp_path / "r3" / "result.json").read_text())["truncation"]["limit_hit"]
    # a growing truncation still saturated when the iterations ran out
    res = runner.invoke(app, ["fit", str(tmp_path / "s.zarr"), "--run-dir", str(tmp_path / "r4"),
                              "-k", "2", "--max-iter", "2", "-q"])
    assert res.exit_code == 0, res.output
    assert ("warning: the fit uses 2 of its 2 components and the fit stopped at its iteration limit while "
            "the truncation was still growing") in " ".join(res.output.split())
    t = json.loads((tmp_path / "r4" / "result.json").read_text())["truncation"]
    assert t["limit_hit"] and t["max_iter_hit"] and not t["refused"]


def test_the_bound_after_births_is_exact(blobs) -> None:
    """The bound reported after a birth and an empirical-Bayes update equals a float64 brute-force
    recomputation: responsibilities by explicit loops from the previous iteration's posterior,
    statistics by explicit loops, then the M-step, the prior update and the ELBO."""
    from tests._reference import brute_log_rho, brute_stats
    from vbcore.model.elbo import elbo_terms
    from vbcore.model.empirical import empirical_update
    from vbcore.model.mstep import m_step
    from vbcore.model.stats import SuffStats

    x, _ = blobs
    seen: list[dict] = []
    kw = dict(learner_options={"moves": "none"})
    _fit(x, 2, callback=seen.append, **kw)
    ks = [s["n_components"] for s in seen]
    n = next(i for i in range(1, len(ks)) if ks[i] > ks[i - 1]) + 3  # two plain iterations after a birth
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before = _fit(x, 2, max_iter=n - 1, **kw)
        after = _fit(x, 2, max_iter=n, **kw)
    assert before.truncation_["grew"] >= 1
    lr = brute_log_rho(x, before.posterior_)
    resp = np.exp(lr - lr.max(1, keepdims=True))
    resp /= resp.sum(1, keepdims=True)
    nk, mean, scat = brute_stats(x, resp)
    shift = np.zeros(x.shape[1])
    rlogr = float(np.sum(resp * np.log(np.where(resp > 0, resp, 1.0))))
    stats = SuffStats(nk=nk, mean=mean, scatter=np.einsum("kdd->kd", scat), sum_rlogr=rlogr,
                      n_rows=x.shape[0], shift=shift)
    post = m_step(stats, before.prior_)
    bound = elbo_terms(stats, post, empirical_update(before.prior_, post)).total
    assert after.lower_bound_ == pytest.approx(bound, rel=1e-9)


def test_births_split_merged_groups_not_single_gaussians() -> None:
    """The held-out bimodality test: two groups pass it at every size, one Gaussian fails it even with
    few rows in many dimensions (where a direction fitted to the same rows would separate anything)."""
    from pipeline.fit.learners.growth import bimodal_threshold, held_out_bimodality

    rng = np.random.default_rng(3)
    for n, d in ((20, 512), (60, 32), (400, 128)):
        single = rng.standard_normal((n, d))
        half = n // 2
        merged = np.concatenate([rng.standard_normal((half, d)) + 1.0, rng.standard_normal((half, d)) - 1.0])
        assert held_out_bimodality(merged) > bimodal_threshold(n // 2) > held_out_bimodality(single)


def test_best_cut_share_closed_forms_and_the_threshold_against_a_simulated_null() -> None:
    from pipeline.fit.learners.growth import best_cut_share, bimodal_threshold

    assert best_cut_share(np.array([-2.0, -2.0, 3.0, 3.0, 3.0])) == pytest.approx(1.0)
    assert best_cut_share(np.ones(4)) == 0.0
    # brute force over every threshold of a small sample
    p = np.random.default_rng(0).standard_normal(9)
    tot = ((p - p.mean()) ** 2).sum()
    def within(g):
        return ((g - g.mean()) ** 2).sum()

    brute = max(1 - (within(p[p <= t]) + within(p[p > t])) / tot for t in np.sort(p)[:-1])
    assert best_cut_share(p) == pytest.approx(brute, rel=1e-12)
    # a large Gaussian sample: 2/pi (the mean's split of a normal)
    big = np.random.default_rng(1).standard_normal(200_000)
    assert best_cut_share(big) == pytest.approx(2 / np.pi, abs=2e-3)
    # the statistic of Gaussian rows (two held-out halves' cuts averaged) passes the threshold
    # in at most 1% of draws at any size
    rng = np.random.default_rng(2)
    for half in (5, 10, 40):
        stat = [(best_cut_share(rng.standard_normal(half)) + best_cut_share(rng.standard_normal(half))) / 2
                for _ in range(2000)]
        assert np.mean(np.asarray(stat) > bimodal_threshold(half)) <= 0.01


@pytest.mark.parametrize("k", [5, 20, 200])
def test_the_pipeline_defaults_find_planted_classes_from_any_truncation(k) -> None:
    """Issue 26's planted case: the command line's defaults (empirical priors, growth, moves, the
    projected start) find the 20 planted Gaussian classes from a quarter to ten times the truth."""
    from sklearn.metrics import normalized_mutual_info_score

    from pipeline.estimator import VBMixture
    from pipeline.fit.spec import FitSpec

    x, lab = planted_blobs(n=6000, d=16, k=20, seed=11)
    spec = FitSpec().resolved()
    m = VBMixture(k, covariance_type="diag", prior_defaults=spec.priors, grow=spec.grow,
                  init_params=spec.init, max_iter=200, random_state=0).fit(x.astype(np.float32))
    assert m.n_effective_ == 20
    assert normalized_mutual_info_score(lab, m.predict(x)) > 0.99


@pytest.mark.parametrize(("n", "d", "classes", "seed", "scale"),
                         [(10_000, 2, 6, 13, 15.0), (20_000, 4, 20, 5, 8.0)])
@pytest.mark.parametrize("share", [0.25, 3.0])
def test_the_pipeline_defaults_find_planted_classes_in_few_dimensions(n, d, classes, seed, scale,
                                                                       share) -> None:
    """In 2 and 4 dimensions a prior at the data's variance as heavy as 1% of the rows (100, 200)
    inflated each class until neighbours merged (4 of 6 and 8-12 of 20 classes found, NMI 0.75-0.89);
    the empirical prior's nu0 is 4 D whatever the number of rows (issue 51)."""
    from sklearn.metrics import normalized_mutual_info_score

    from pipeline.estimator import VBMixture
    from pipeline.fit.spec import estimator_params

    x, lab = planted_blobs(n=n, d=d, k=classes, seed=seed, scale=scale)
    m = VBMixture(max(1, int(share * classes)), covariance_type="diag", **estimator_params()).fit(x)
    assert m.prior_.degrees_of_freedom == 4 * d
    assert abs(m.n_effective_ - classes) <= 0.1 * classes
    assert normalized_mutual_info_score(lab, m.predict(x)) > 0.98


def test_fill_births_split_a_component_of_several_classes_no_direction_shows() -> None:
    """40 planted classes of unequal sizes from K = 10: the fill births' two-groups test passed no
    component while one held several classes (34 clusters, NMI 0.992); a component SPREAD_SPLIT times
    as wide as the median one is split too."""
    from sklearn.metrics import normalized_mutual_info_score

    from pipeline.estimator import VBMixture
    from pipeline.fit.spec import estimator_params

    x, lab = planted_blobs(n=20_000, d=64, k=40, seed=26, scale=4.0, unequal=True)
    m = VBMixture(10, covariance_type="diag", **estimator_params()).fit(x.astype(np.float32))
    assert abs(m.n_effective_ - 40) <= 4 and m.truncation_["grew"] >= 2
    assert normalized_mutual_info_score(lab, m.predict(x)) > 0.995


def test_a_warm_start_of_a_converged_grown_fit_spends_no_doubling(blobs) -> None:
    """A warm start continues with a truncation its posterior does not saturate (it is a converged
    answer): refitting the same rows proposes no doubling (passes: the iterations, the move rounds
    among them, the one pass of the worst-rows check that finds no group, and no birth proposal's
    grow_iters passes) and keeps the classes."""
    from pipeline.fit.learners.growth import saturated, unsaturated_truncation

    for n in (0, 1, 2, 9, 100, 397):
        t = unsaturated_truncation(n)
        assert not saturated(n, t) and (t == 1 or saturated(n, t - 1))
    x, _ = blobs
    first = _fit(x, 2)
    assert first.n_effective_ == 8 and first.truncation_["grew"] >= 2
    from pipeline.estimator import VBMixture

    warm = VBMixture(2, covariance_type="diag", prior_defaults="empirical", grow=True, reg_covar=0.0,
                     max_iter=120, random_state=0, chunk_rows=500, warm_start=True)
    warm.posterior_, warm.prior_, warm.n_features_in_ = first.posterior_, first.prior_, x.shape[1]
    warm.fit(x)
    k = first.posterior_.n_components
    assert warm.truncation_["start"] == unsaturated_truncation(k) and warm.truncation_["grew"] == 0
    # one pass an iteration and the worst-rows check's (pipeline.fit.learners.outliers); no proposal
    assert warm.n_effective_ == 8 and warm.n_passes_ == warm.n_iter_ + 1


@pytest.mark.parametrize("shape", [(32, 128), (20, 512), (300, 64), (64, 64)])
def test_principal_direction_is_the_first_right_singular_vector(shape) -> None:
    """The birth check's main direction (eigh of the smaller Gram matrix) against NumPy's SVD."""
    from pipeline.fit.learners.growth import principal_direction

    rng = np.random.default_rng(sum(shape))
    c = rng.normal(size=shape) * np.linspace(3.0, 1.0, shape[1])
    c -= c.mean(0)
    want = np.linalg.svd(c, full_matrices=False)[2][0]
    got = principal_direction(c)
    assert np.linalg.norm(got) == pytest.approx(1.0, abs=1e-12)
    assert abs(float(got @ want)) == pytest.approx(1.0, abs=1e-10)
    for zeros in (np.zeros((5, 3)), np.zeros((3, 5))):  # no spread: any direction, finite
        assert np.isfinite(principal_direction(zeros)).all()


@pytest.mark.parametrize("distinct", [1, 2, 3])
def test_births_on_repeated_rows_neither_fail_nor_split_a_point(distinct) -> None:
    """Rows that repeat a few distinct values (every component's rows alike): the births' reference
    width is 0 there, which once divided by zero (ZeroDivisionError out of ``vbcluster fit``). The
    command line's model ends with one cluster per distinct row, none split."""
    from pipeline.estimator import VBMixture
    from pipeline.fit.spec import estimator_params

    x = np.repeat(np.eye(8, dtype=np.float32)[:distinct] * 3.0, 1500, axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = VBMixture(10, covariance_type="diag", **estimator_params()).fit(x)
    assert m.n_effective_ == distinct
    assert np.unique(m.predict(x)).size == distinct


def test_a_refused_doubling_falls_back_to_the_components_that_look_like_two_groups() -> None:
    """Six planted classes in two dimensions from K = 1: the fit doubled to 4 components, two of them
    holding two classes each; the doubling to 8 split every component, the single classes' splits
    cost more than the merged ones' gained, the bound refused it and the fit ended with 4 clusters
    (NMI 0.82). A refused doubling now tries the splits of the components the two-groups test
    passes alone (accepted: 6 clusters)."""
    from sklearn.metrics import normalized_mutual_info_score

    from pipeline.estimator import VBMixture
    from pipeline.fit.spec import estimator_params

    x, lab = _planted(10_000, 2, 6, 6, 15.0)
    m = VBMixture(1, covariance_type="diag", **estimator_params()).fit(x)
    assert m.n_effective_ == 6
    assert normalized_mutual_info_score(lab, m.predict(x)) > 0.99


def _planted(rows: int, dim: int, classes: int, seed: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """bench/bench_choosing_k.py's ``planted_set`` of equal expected sizes: centres N(0, scale^2 I)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=scale, size=(classes, dim))
    lab = rng.integers(0, classes, size=rows)
    return (centres[lab] + rng.normal(size=(rows, dim))).astype(np.float32), lab


def test_the_held_out_split_gain_tells_several_classes_from_one_gaussian() -> None:
    """The births' third gate: rows of one Gaussian (and of one heavy-tailed or skewed cluster) rarely
    gain on held-out rows from two Gaussians; rows of five classes half a deviation apart per
    dimension in 128 dimensions always do, where the two-groups test passes about half of them."""
    from pipeline.fit.learners.growth import bimodal_threshold, held_out_bimodality, held_out_split_gain

    rng = np.random.default_rng(0)
    draws = ((lambda: rng.standard_normal((40, 2)), 0.1), (lambda: rng.standard_normal((80, 128)), 0.0),
             (lambda: rng.standard_normal((300, 16)), 0.0), (lambda: rng.standard_t(3, (300, 16)), 0.1),
             (lambda: rng.exponential(size=(300, 16)), 0.1))
    for draw, most in draws:
        assert np.mean([held_out_split_gain(draw()) > 0 for _ in range(100)]) <= most
    gains, bimodal = [], []
    for _ in range(30):
        centres = rng.normal(scale=0.5, size=(5, 128))
        z = centres[rng.integers(0, 5, 200)] + rng.standard_normal((200, 128))
        gains.append(held_out_split_gain(z) > 0)
        bimodal.append(held_out_bimodality(z) > bimodal_threshold(100))
    assert all(gains) and np.mean(bimodal) < 0.8


def test_births_split_a_component_of_several_classes_the_two_groups_test_does_not_pass() -> None:
    """30 planted classes half a deviation apart per dimension in 128 dimensions from K = 7: the fit
    ended with 26 clusters, one component holding five classes that no direction showed as two
    groups (its doubling refused, no component passing the gates); the held-out split gain passes
    it."""
    from sklearn.metrics import normalized_mutual_info_score

    from pipeline.estimator import VBMixture
    from pipeline.fit.spec import estimator_params

    x, lab = _planted(30_000, 128, 30, 12, 0.5)
    m = VBMixture(7, covariance_type="diag", **estimator_params()).fit(x)
    assert abs(m.n_effective_ - 30) <= 3
    assert normalized_mutual_info_score(lab, m.predict(x)) > 0.99
