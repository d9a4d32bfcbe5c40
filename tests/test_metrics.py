"""vbcore.data.metrics against scikit-learn."""

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from vbcore.data.metrics import acc, ari, contingency, nmi


@pytest.mark.parametrize("seed", range(5))
def test_nmi_ari_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 7, 500)
    p = np.where(rng.random(500) < 0.6, t, rng.integers(0, 12, 500)) * 3 + 1  # arbitrary label values
    assert nmi(t, p) == pytest.approx(normalized_mutual_info_score(t, p), abs=1e-12)
    assert ari(t, p) == pytest.approx(adjusted_rand_score(t, p), abs=1e-12)


def test_acc_uses_the_best_matching():
    t = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    p = np.array([5, 5, 1, 1, 1, 9, 9, 9, 5])  # 5->0, 1->1, 9->2: 2 + 2 + 3 = 7 right
    assert acc(t, p) == pytest.approx(7 / 9)
    assert acc(t, t + 10) == 1.0 and nmi(t, t + 10) == pytest.approx(1.0)


def test_brute_force_acc_on_small_case():
    from itertools import permutations

    rng = np.random.default_rng(3)
    t, p = rng.integers(0, 4, 60), rng.integers(0, 4, 60)
    c = contingency(t, p)
    best = max(sum(c[i, perm[i]] for i in range(4)) for perm in permutations(range(4)))
    assert acc(t, p) == pytest.approx(best / 60)


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="different lengths: 3 and 2"):
        nmi([0, 1, 1], [0, 1])


@pytest.mark.parametrize("seed", range(3))
def test_weighted_metrics_are_those_of_repeated_and_dropped_rows(seed):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 5, 300)
    p = np.where(rng.random(300) < 0.7, t, rng.integers(0, 6, 300))
    w = rng.integers(0, 4, 300)  # 0: dropped; 1-3: repeated
    tr, pr = np.repeat(t, w), np.repeat(p, w)
    assert nmi(t, p, w) == pytest.approx(normalized_mutual_info_score(tr, pr), abs=1e-12)
    assert ari(t, p, w) == pytest.approx(adjusted_rand_score(tr, pr), abs=1e-12)
    assert acc(t, p, w) == pytest.approx(acc(tr, pr), abs=1e-12)
    assert np.array_equal(contingency(t, p, w), contingency(tr, pr))  # (classes of dropped rows gone)
    with pytest.raises(ValueError, match="2 weights for 300 labels"):
        nmi(t, p, [1.0, 2.0])
