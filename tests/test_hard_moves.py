"""Merges for the hard-assignment learners (vbcore.moves.hard, pipeline.fit.learners.point.moves.HardMoves):
the exact change of the ELBO of all rows against brute force, full-data rounds, K recovered, resume."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.fit.learners import learner_names
from tests._reference import planted_blobs as _planted
from tests._reference import same_fit_bits as _same_bits
from tests._reference import stats_of as _stats
from vbcore.model.elbo import elbo_terms
from vbcore.model.mstep import m_step
from vbcore.model.priors import default_prior
from vbcore.moves.exact import apply_merges, total_elbo
from vbcore.moves.hard import select_hard_merges


def _brute_elbo(x: np.ndarray, lab: np.ndarray, k: int, prior, shift) -> float:
    """The exact ELBO of one-hot labels at their optimal q(theta), from the rows themselves (float64
    statistics of the brute-force reference, the M-step, elbo_terms)."""
    stats = _stats(x, np.eye(k)[lab], "fixed", shift)
    return elbo_terms(stats, m_step(stats, prior, 0.0), prior).total


def _split_classes(a0: float):
    """Three classes in 8 dimensions, labelled as 6 clusters (each class split in two at random)."""
    rng = np.random.default_rng(6)
    cls = rng.integers(0, 3, size=600)
    x = 8.0 * np.eye(3, 8)[cls] + rng.normal(size=(600, 8))
    lab = 2 * cls + rng.integers(0, 2, size=600)
    prior = default_prior(covariance_type="fixed", weight_type="dirichlet_process", n_components=6,
                          data_mean=x.mean(0), data_covariance=x.var(0), weight_concentration=a0,
                          fixed_variance=1.0)
    return x, lab, prior


@pytest.mark.parametrize("a0", [600.0, 1.0, 0.5])
def test_hard_merges_raise_the_exact_elbo_of_all_rows(a0: float) -> None:
    """Each pair's change (no entropy for one-hot labels) and the accepted set's gain equal the
    brute-force ELBO difference of the relabelled rows; the accepted merges are the split classes."""
    from vbcore.moves.exact import merge_gain_bound

    x, lab, prior = _split_classes(a0)
    shift = x.mean(0)
    stats = _stats(x, np.eye(6)[lab], "fixed", shift)
    before = _brute_elbo(x, lab, 6, prior, shift)

    def relabel(pairs):
        out = lab.copy()
        for a, b in pairs:
            out = np.where(out == b, a, out)
        gone = np.sort(np.asarray(pairs)[:, 1])
        return out - np.searchsorted(gone, out), 6 - len(gone)

    pairs = np.array([[a, b] for a in range(6) for b in range(a + 1, 6)])
    gains = merge_gain_bound(stats, pairs, prior, 0.0)
    for pair, g in zip(pairs, gains, strict=True):
        new, k = relabel([pair])
        assert g == pytest.approx(_brute_elbo(x, new, k, prior, shift) - before, abs=1e-9 * abs(before))
    acc, gain = select_hard_merges(stats, pairs, prior)
    assert acc.tolist() == [[0, 1], [2, 3], [4, 5]]  # the split classes, and nothing across classes
    new, k = relabel(acc)
    assert gain > 0 and gain == pytest.approx(_brute_elbo(x, new, k, prior, shift) - before,
                                              abs=1e-9 * abs(before))


def test_hard_merges_use_the_statistics_of_all_rows() -> None:
    """SGA+F's merge rounds judge on one full pass (every row, whatever the minibatch), and every
    accepted round raises the exact ELBO of all rows (brute force from the round's labels; the hard
    judge, ``judge=diag-hard``: the soft one's gain is checked in
    test_the_soft_judge_merges_a_split_class_and_its_gain_is_the_exact_bound_change)."""
    from pipeline.fit.learners.point.moves import HardMoves

    x, lab = _planted(n=2000, d=8, k=4, seed=3)
    seen = []
    orig = HardMoves.select

    def spy(self, stats, means, prior, soft=None):
        acc = orig(self, stats, means, prior, soft)
        seen.append((stats, acc, self.last_round["gain"], prior))
        return acc

    mp = pytest.MonkeyPatch()
    mp.setattr(HardMoves, "select", spy)
    try:
        fit = _hard_fit(x, "sga-f", "merge", n_components=16, learner_options={
            "moves": "merge", "move_every": 2, "minibatch": 200, "prune_threshold": 0.0,
            "judge": "diag-hard"})
    finally:
        mp.undo()
    assert seen and all(st.n_rows == 2000 and st.nk.sum() == pytest.approx(2000) for st, *_ in seen)
    accepted = [(st, acc, g, pr) for st, acc, g, pr in seen if acc.shape[0]]
    assert accepted and fit.n_components_ < 16
    for st, acc, gain, pr in accepted:
        after = apply_merges(st, acc, np.zeros(acc.shape[0]))
        assert gain > 0 and gain == pytest.approx(
            total_elbo(after, pr, 0.0) - total_elbo(st, pr, 0.0), rel=1e-9)


def _hard_fit(x, learner: str, moves: str, **kw):
    from pipeline.estimator import VBMixture

    opts = {"moves": moves, **({"minibatch": 1000} if learner.startswith("sga") else {})}
    args = dict(n_components=50, covariance_type="fixed", max_iter=40, random_state=0, chunk_rows=1000,
                learner=learner, learner_options=opts)
    args.update(kw)
    return VBMixture(**args).fit(x)


@pytest.mark.parametrize("learner", ["mm", "sga-f"])
def test_hard_learners_with_merges_recover_k(learner: str) -> None:
    from sklearn.metrics import normalized_mutual_info_score

    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3.0, size=(10, 16))
    lab = rng.integers(0, 10, size=4000)
    x = centres[lab] + rng.normal(size=(4000, 16))
    mb = {"minibatch": 1000} if learner.startswith("sga") else {}
    # THR of half a row (the threshold before issue 26: empty clusters only): the merges find K
    thr = {"prune_threshold": 0.5 / len(x), **mb}
    merged = _hard_fit(x, learner, "merge", learner_options={"moves": "merge", **thr})
    plain = _hard_fit(x, learner, "none", learner_options={"moves": "none", **thr})
    assert merged.n_components_ == 10 < plain.n_components_
    assert normalized_mutual_info_score(lab, merged.predict(x)) > 0.99
    assert merged.lower_bound_ > plain.lower_bound_


def test_full_data_merge_check_of_the_study() -> None:
    """The study's check of a fit against all rows: merges the full data's exact ELBO accepts at the
    final point, with their gain at least the best single pair's (merge_gain_bound, no entropy)."""
    from pipeline.studies.moves import full_data_merges
    from vbcore.moves.exact import merge_gain_bound
    from vbcore.moves.hard import nearest_pairs

    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3.0, size=(10, 16))
    x = centres[rng.integers(0, 10, size=4000)] + rng.normal(size=(4000, 16))
    plain = _hard_fit(x, "sga-f", "none")
    pred = plain.predict(x)
    got = full_data_merges(plain, x, pred)
    assert got["full-data merges"] >= 1 and got["full-data merge gain/row"] > 0  # it kept split classes
    k = plain.posterior_.means.shape[0]
    stats = _stats(x, np.eye(k)[pred], "fixed", plain.prior_.mean)
    pairs = nearest_pairs(plain.posterior_.means, 8)
    gains = merge_gain_bound(stats, pairs, plain.prior_, 0.0)
    assert got["full-data merge gain/row"] * 4000 >= gains.max() - 1e-9 * abs(gains.max())
    merged = _hard_fit(x, "sga-f", "merge")
    assert full_data_merges(merged, x, merged.predict(x))["full-data merges"] == 0


def test_hard_merges_resume_bitwise(tmp_path) -> None:
    x, _ = _planted(seed=4)
    kw = dict(n_components=30, max_iter=12, tol=0.0)
    opts = {"moves": "merge", "move_every": 3, "minibatch": 500}
    _hard_fit(x, "sga-m", "merge", checkpoint_dir=str(tmp_path), checkpoint_every=5,
              **{**kw, "max_iter": 5, "learner_options": opts})
    resumed = _hard_fit(x, "sga-m", "merge", checkpoint_dir=str(tmp_path), **{**kw, "learner_options": opts})
    assert resumed.resumed_from_.endswith("ckpt-00000005")
    straight = _hard_fit(x, "sga-m", "merge", **{**kw, "learner_options": opts})
    _same_bits(resumed, straight)
    assert straight.n_components_ < 30


def test_hard_learners_have_no_delete_move() -> None:
    from pipeline.fit.learners import learner_class
    from vbcore.errors import ConfigError

    with pytest.raises(ConfigError, match=r"option 'moves' of 'mm' must be 'none' or 'merge'"):
        learner_class("mm").parse_options({"moves": "merge,delete"})


def test_partition_bound_is_the_closed_form_evidence_of_the_diagonal_model() -> None:
    """``judge='diag'`` scores one-hot labels by the diagonal model's exact ELBO at its optimal
    q(theta): the Normal-Gamma evidence of each cluster's rows, per dimension in closed form (the
    exact posterior, so the bound is the log marginal likelihood), plus the DP weight terms."""
    from scipy.special import gammaln

    from pipeline.fit.learners.point.moves import partition_bound
    from vbcore.moves.exact import weight_terms

    rng = np.random.default_rng(0)
    z = rng.integers(0, 3, size=300)
    x = rng.normal(size=(300, 4)) * [1.0, 2.0, 0.5, 3.0] + 4.0 * z[:, None]
    prior = default_prior(covariance_type="diag", weight_type="dirichlet_process", n_components=3,
                          data_mean=x.mean(0), data_covariance=x.var(0), defaults="empirical", n_rows=300.0,
                          weight_concentration=2.0, mean_precision=0.7)
    stats = _stats(x, np.eye(3)[z], "diag", x.mean(0))
    a0, r0, b0, m0 = prior.degrees_of_freedom / 2, prior.covariance / 2, prior.mean_precision, prior.mean
    evidence = 0.0
    for k in range(3):
        rows = x[z == k]
        n, xbar = rows.shape[0], rows.mean(0)
        bn, an = b0 + n, a0 + n / 2
        rn = r0 + ((rows - xbar) ** 2).sum(0) / 2 + b0 * n * (xbar - m0) ** 2 / (2 * bn)
        evidence += float(np.sum(gammaln(an) - gammaln(a0) + a0 * np.log(r0) - an * np.log(rn)
                                 + 0.5 * np.log(b0 / bn) - 0.5 * n * np.log(2 * np.pi)))
    expected = evidence + float(weight_terms(stats.nk, prior).sum())
    assert partition_bound(stats, prior) == pytest.approx(expected, rel=1e-12)


def _elongated_classes(n: int = 3000, d: int = 8, k: int = 3):
    """Three classes far apart (15 along dimension 1), each 20 times wider along dimension 0 than
    along the others: the fixed isotropic variance cuts each class into pieces along its long axis."""
    rng = np.random.default_rng(0)
    z = rng.integers(0, k, size=n)
    scale = np.full(d, 0.3)
    scale[0] = 6.0
    centres = np.zeros((k, d))
    centres[:, 1] = 15.0 * np.arange(k)
    return (centres[z] + rng.normal(size=(n, d)) * scale).astype(np.float32), z


@pytest.mark.parametrize("learner", learner_names(family="point"))
def test_point_learners_judge_merges_on_the_diagonal_model(learner: str) -> None:
    """Where the learner's own isotropic bound keeps a class cut into 7-14 pieces, the default judge
    (the diagonal model's exact ELBO of the partition) merges the pieces back into the 3 classes. For
    ``sga-f`` the soft check of ``judge=diag`` (:func:`pipeline.fit.learners.moves.soft_merges`) refuses
    the merge of the last tail piece (about 200 rows of a class) until its isotropic pieces have moved:
    4 clusters at 200 iterations, 3 at about 380. Since issue 52 the minibatch learners' threshold
    rule leaves the pieces to the merges (no relative threshold prunes them): ``sga-f`` reaches 3
    at about 540 iterations, ``sga`` (5 until then) at about 740."""
    from pipeline.estimator import VBMixture
    from pipeline.fit.spec import estimator_params
    from vbcore.data.metrics import nmi

    x, z = _elongated_classes()
    params = estimator_params("pipeline")
    if learner in ("sga", "sga-f"):  # the soft judge (issue 51) keeps the last tail piece until ~540 / ~740
        params["max_iter"] = 1000
    fits = {j: VBMixture(20, learner=learner, learner_options={"judge": j}, **params).fit(x)
            for j in ("diag", "own")}
    assert fits["diag"].n_effective_ == 3 and nmi(z, fits["diag"].predict(x)) > 0.999
    assert fits["own"].n_effective_ >= 6


def test_the_judge_option_is_checked() -> None:
    from pipeline.fit.learners import learner_class
    from vbcore.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^learner option 'judge' of 'sga-f' must be one of "
                                          r"\('diag', 'diag-hard', 'own'\), got 'full'$"):
        learner_class("sga-f").parse_options({"judge": "full"})


def test_the_judge_tunes_beta0_on_the_partition_it_judges() -> None:
    """Six planted 2-D classes (bench/bench_choosing_k.py's ``planted_set(10000, 2, 6, 6, 15.0)``): at
    ``beta0 = 1`` the diagonal bound of the true labels pays for merging two classes (each mean is
    tied to ``m0`` at its class's own spread); at the ``beta0`` :meth:`Judge.tune` finds for them it
    does not, and ``sga-f`` finds the six classes from one cluster and from three times the truth."""
    from types import SimpleNamespace

    from pipeline.estimator import VBMixture
    from pipeline.fit.learners.point.moves import Judge, partition_prior
    from pipeline.fit.spec import estimator_params
    from vbcore.kernels.estep import prepare_chunk
    from vbcore.kernels.init import moments_kernel

    rng = np.random.default_rng(6)
    centres = rng.normal(scale=15.0, size=(6, 2))
    y = rng.integers(0, 6, size=10000)
    x = (centres[y] + rng.normal(size=(10000, 2))).astype(np.float32)
    chunk = prepare_chunk(x.astype(np.float64), x.mean(0), "fixed")
    own = default_prior(covariance_type="fixed", weight_type="dirichlet_process", n_components=6,
                        data_mean=x.mean(0), data_covariance=x.var(0), weight_concentration=1e4,
                        fixed_variance=1.0)
    ctx = SimpleNamespace(moments=moments_kernel(chunk), prior=own)
    stats = _stats(x.astype(np.float64), np.eye(6)[y], "fixed", x.mean(0))
    pairs = np.array([[a, b] for a in range(6) for b in range(a + 1, 6)])
    assert select_hard_merges(stats, pairs, partition_prior(ctx))[0].shape[0] >= 1
    tuned = Judge({"judge": "diag"}).tune(ctx, stats)
    assert tuned.mean_precision < 0.1 and select_hard_merges(stats, pairs, tuned)[0].shape[0] == 0
    params = {**estimator_params("pipeline"), "covariance_type": "fixed"}
    for k in (1, 18):
        assert VBMixture(k, learner="sga-f", **params).fit(x).n_effective_ == 6


def _soft_case(delta: float, split: bool = False):
    """Two unit-variance classes ``delta`` apart along dimension 0 (2-D, 4,000 rows, float64), labelled
    by the boundary between them -- or, with ``split``, the first class's rows cut in two at random
    (three clusters) -- with a context for :func:`pipeline.fit.learners.moves.soft_merges` (the chunks
    and an in-process engine), the labels' hard statistics and a diagonal judging prior."""
    from functools import reduce
    from types import SimpleNamespace

    from vbcore.kernels.estep import prepare_chunk

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 4000)
    x = rng.normal(size=(4000, 2))
    x[:, 0] += delta * y
    lab = (x[:, 0] > delta / 2).astype(int)
    if split:
        lab = np.where(y == 0, rng.integers(0, 2, 4000), 2)
    k, shift = int(lab.max()) + 1, x.mean(0)
    prior = default_prior(covariance_type="diag", weight_type="dirichlet_process", n_components=k,
                          data_mean=x.mean(0), data_covariance=x.var(0), weight_concentration=1.0,
                          defaults="empirical")
    engine = SimpleNamespace(map_reduce=lambda kern, handles, *a: reduce(
        lambda p, q: p.merge(q), [kern(h, *a) for h in handles]))
    ctx = SimpleNamespace(engine=engine, handles=[prepare_chunk(x[i:i + 1000], shift, "diag")
                                                  for i in range(0, 4000, 1000)], shift=shift)
    return x, ctx, _stats(x, np.eye(k)[lab], "diag", shift), prior


@pytest.mark.parametrize("delta", [2.5, 3.0])
def test_the_soft_judge_keeps_two_overlapping_classes_the_hard_one_merges(delta: float) -> None:
    """Two unit-variance classes 2.5 and 3 deviations apart: at one-hot q(Z) their boundary rows cannot
    be shared, so the hard bound of the true split reads lower than the merged class (gains of 330 and
    54 nats) and the ``diag-hard`` judge merges them; at soft responsibilities the same model's exact
    bound keeps them apart."""
    from pipeline.fit.learners.point.soft_judge import soft_merges

    _, ctx, stats, prior = _soft_case(delta)
    pairs = np.array([[0, 1]])
    assert select_hard_merges(stats, pairs, prior)[0].shape[0] == 1
    acc, gain = soft_merges(ctx, stats, pairs, prior, 8)
    assert acc.shape[0] == 0 and gain == 0.0


def test_the_soft_judge_merges_a_split_class_and_its_gain_is_the_exact_bound_change() -> None:
    """One class cut in two at random (and a second class apart): the soft judge merges the halves, and
    its gain equals the change of the exact ELBO computed by brute force (float64 responsibilities
    of the judge's sweep and pass, their statistics, the M-step), which is positive."""
    from scipy.special import softmax

    from pipeline.fit.learners.point.soft_judge import SOFT_SWEEPS, soft_merges
    from tests._reference import brute_log_rho

    x, ctx, stats, prior = _soft_case(6.0, split=True)
    acc, gain = soft_merges(ctx, stats, np.array([[0, 1], [0, 2], [1, 2]]), prior, 8)
    assert acc.tolist() == [[0, 1]] and gain > 0
    post = m_step(stats, prior, 0.0)
    for _ in range(SOFT_SWEEPS + 1):
        resp = softmax(brute_log_rho(x, post), axis=1)
        post = m_step(_stats(x, resp, "diag", ctx.shift), prior, 0.0)
    merged = np.stack((resp[:, 0] + resp[:, 1], resp[:, 2]), axis=1)
    shrunk = replace(prior, n_components=2)
    brute = (total_elbo(_stats(x, merged, "diag", ctx.shift), shrunk, 0.0)
             - total_elbo(_stats(x, resp, "diag", ctx.shift), prior, 0.0))
    assert gain == pytest.approx(brute, rel=1e-6, abs=1e-6)


def test_sga_f_keeps_planted_classes_the_hard_judge_merged(tmp_path) -> None:
    """Issue 51's case: 120 planted classes of the synthetic store in 64 dimensions (40,000 rows),
    ``sga-f`` from K = 400 with merges: the hard judge ended at 91 (89 in the issue), VB EM's diag fit
    finds 118; judged at soft responsibilities 102-138 (measured 109). Since issue 52 (no relative
    threshold pruning beside the merges, a round an epoch of 10 minibatches) the hard judge ends at
    105 and the soft at 113: the soft judge still keeps more."""
    from pipeline.engine.sources import StoreSource
    from pipeline.estimator import VBMixture
    from pipeline.ingest import ingest

    ingest("synthetic", str(tmp_path / "s.zarr"), chunk_rows=8192, rows=40000, dim=64, classes=120, seed=0)
    src = StoreSource(str(tmp_path / "s.zarr"))
    x = np.concatenate([src.load(i) for i in range(len(src.chunk_slices()))])
    found = {j: VBMixture(400, learner="sga-f", covariance_type="fixed", max_iter=60, random_state=0,
                          learner_options={"moves": "merge", "judge": j}).fit(x).n_effective_
             for j in ("diag", "diag-hard")}
    assert 102 <= found["diag"] <= 138 and found["diag-hard"] < found["diag"]
