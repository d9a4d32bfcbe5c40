"""Merges for the hard-assignment learners (vbcore.hard_moves, pipeline.learners.moves.HardMoves):
the exact change of the MAP bound against brute force, the minibatch rule, K recovered, resume."""

from __future__ import annotations

import numpy as np
import pytest

from tests._reference import planted_blobs as _planted
from tests._reference import same_fit_bits as _same_bits
from tests._reference import stats_of as _stats
from vbcore.hard_moves import hard_merge_gain
from vbcore.priors import default_prior
from vbcore.sga import map_bound, mm_update
from vbcore.sga_stats import take_stats


@pytest.mark.parametrize("a0", [500.0, 1.0, 0.5])
def test_hard_merge_gain_equals_map_bound_difference(a0: float) -> None:
    rng = np.random.default_rng(6)
    x = rng.normal(size=(500, 4)) + rng.integers(0, 3, size=(500, 1)) * 5.0
    lab = rng.integers(0, 5, size=500)
    resp = np.eye(5)[lab]
    prior = default_prior(covariance_type="fixed", weight_type="dirichlet_process", n_components=5,
                          data_mean=x.mean(0), data_covariance=x.var(0), weight_concentration=a0,
                          fixed_variance=1.0)
    shift = x.mean(0)
    stats = _stats(x, resp, "fixed", shift)

    def bound(s):
        order = np.argsort(-s.nk, kind="stable")
        kept = take_stats(s, order)
        return map_bound(kept, mm_update(kept, prior, a0), prior, 1.0, a0).total

    pairs = np.array([[a, b] for a in range(5) for b in range(a + 1, 5)])
    gains = hard_merge_gain(stats, pairs, prior, 1.0, a0)
    for (a, b), g in zip(pairs, gains, strict=True):
        lab2 = np.where(lab == b, a, lab)
        lab2 = np.where(lab2 > b, lab2 - 1, lab2)
        ref = bound(_stats(x, np.eye(4)[lab2], "fixed", shift)) - bound(stats)
        assert g == pytest.approx(ref, abs=1e-8 * abs(bound(stats)))


def test_minibatch_merges_need_rows_of_both_clusters() -> None:
    """A cluster with no rows in a minibatch reads as free to merge (its scaled statistics are those
    of zero rows); HardMoves merges only clusters the minibatch saw. Three well separated classes,
    cluster 1's rows left out of the "minibatch": with the rule nothing merges, without it 1 joins
    its nearest neighbour although the full data's bound (cluster 1 holds a class) forbids it."""
    from pipeline.learners.moves import HardMoves
    from vbcore.hard_moves import select_hard_merges
    from vbcore.sga_stats import scale_stats

    rng = np.random.default_rng(9)
    centres = 8.0 * np.eye(3, 8)  # in 8 dimensions a mean's prior term outweighs the sticks' ln a0
    lab = np.repeat(np.arange(3), 200)
    x = centres[lab] + rng.normal(size=(600, 8))
    prior = default_prior(covariance_type="fixed", weight_type="dirichlet_process", n_components=3,
                          data_mean=x.mean(0), data_covariance=x.var(0), weight_concentration=2.0,
                          fixed_variance=1.0)
    shift = x.mean(0)
    full = _stats(x, np.eye(3)[lab], "fixed", shift)
    pairs = np.array([[0, 1], [0, 2], [1, 2]])
    assert select_hard_merges(full, pairs, prior, 1.0, 2.0)[0].shape[0] == 0  # the data: no merge
    batch = rng.permutation(np.flatnonzero(lab != 1))[:60]  # a minibatch of 60 rows that misses 1
    mini = _stats(x[batch], np.eye(3)[lab[batch]], "fixed", shift)
    sized = scale_stats(mini, 600 / 60)
    assert mini.nk[1] == 0 and select_hard_merges(sized, pairs, prior, 1.0, 2.0)[0].shape[0] == 1
    moves = HardMoves("sga-f", {"moves": "merge", "move_every": 1, "move_pairs": 8, "move_neighbours": 2})
    assert moves.select(sized, centres, prior, 1.0, 2.0, seen=mini.nk > 0).shape[0] == 0
    assert moves.select(sized, centres, prior, 1.0, 2.0).shape[0] == 1  # the estimate alone merges


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
    merged = _hard_fit(x, learner, "merge")
    plain = _hard_fit(x, learner, "none")
    assert merged.n_components_ == 10 < plain.n_components_
    assert normalized_mutual_info_score(lab, merged.predict(x)) > 0.99
    assert merged.lower_bound_ > plain.lower_bound_


def test_full_data_merge_check_of_the_study() -> None:
    """The study's check of a minibatch fit against all rows: merges the full data's MAP bound accepts
    at the final point, with their gain equal to hard_merge_gain's on the same statistics."""
    from pipeline.studies.moves import full_data_merges
    from vbcore.hard_moves import nearest_pairs

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
    gains = hard_merge_gain(stats, pairs, plain.prior_, float(plain.prior_.fixed_variance),
                            float(plain.prior_.weight_concentration))
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
    from pipeline.learners import learner_class
    from vbcore.errors import ConfigError

    with pytest.raises(ConfigError, match=r"option 'moves' of 'mm' must be 'none' or 'merge'"):
        learner_class("mm").parse_options({"moves": "merge,delete"})
