"""``Posterior.take`` against a component-by-component construction, for every covariance type and
both weight types, and the three selections written with it (VB EM's pruning, growth's children,
SVI's pruning) against the code they replaced, bit for bit."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from pipeline.fit.learners.growth import used_counts, with_children
from pipeline.fit.learners.vbem.learner import kept_components, prune_components
from vbcore.model.mstep import weight_posterior
from vbcore.model.posterior import Posterior, precision_cholesky
from vbcore.model.priors import Prior, default_prior

K, D = 6, 3
COVARIANCES = ("full", "tied", "diag", "spherical", "fixed")
WEIGHTS = ("dirichlet_distribution", "dirichlet_process")
ARRAYS = [f.name for f in fields(Posterior) if f.name not in ("covariance_type", "weight_type")]


def random_posterior(ct: str, wt: str, seed: int = 0, k: int = K) -> Posterior:
    """A posterior of random positive parameters in the layout of ``ct`` and ``wt``."""
    rng = np.random.default_rng(seed)
    wc = rng.uniform(0.5, 50.0, size=(k,) if wt == "dirichlet_distribution" else (2, k))
    nu: np.ndarray | None = rng.uniform(D + 1.0, 100.0, size=k)
    if ct in ("full", "tied"):
        a = rng.normal(size=(k, D, D))
        cov = np.einsum("kij,klj->kil", a, a) + D * np.eye(D)
        if ct == "tied":
            cov, nu = cov[0], np.asarray(rng.uniform(D + 1.0, 100.0))
    elif ct == "diag":
        cov = rng.uniform(0.1, 2.0, size=(k, D))
    else:
        cov = rng.uniform(0.1, 2.0, size=k)
        nu = None if ct == "fixed" else nu
    return Posterior(ct, wt, wc, rng.uniform(1.0, 50.0, size=k), rng.normal(size=(k, D)), nu, cov)


def brute_take(post: Posterior, idx: list[int]) -> dict[str, np.ndarray | None]:
    """The fields of components ``idx``, one component at a time."""
    def per(a: np.ndarray) -> np.ndarray:
        return np.array([a[k] for k in idx], dtype=a.dtype).reshape((len(idx),) + a.shape[1:])

    wc = post.weight_concentration
    out: dict[str, np.ndarray | None] = {
        "weight_concentration": (per(wc) if wc.ndim == 1
                                 else np.array([[wc[0, k] for k in idx], [wc[1, k] for k in idx]])),
        "mean_precision": per(post.mean_precision), "means": per(post.means)}
    if post.covariance_type == "tied":  # shared by all components: as they were
        out |= {"degrees_of_freedom": post.degrees_of_freedom, "covariances": post.covariances,
                "precisions_cholesky": post.precisions_cholesky}
    else:
        nu = post.degrees_of_freedom
        out |= {"degrees_of_freedom": None if nu is None else per(nu), "covariances": per(post.covariances),
                "precisions_cholesky": per(post.precisions_cholesky)}
    return out


def assert_same(got: Posterior, want: dict[str, np.ndarray | None] | Posterior) -> None:
    """Every array field equal bit for bit (shape and dtype included)."""
    for name in ARRAYS:
        a = getattr(got, name)
        b = want.get(name) if isinstance(want, dict) else getattr(want, name)
        if b is None:
            assert a is None, name
            continue
        assert a.shape == np.shape(b) and a.dtype == np.asarray(b).dtype, name
        assert np.array_equal(a, b), name


CASES = [(ct, wt) for ct in COVARIANCES for wt in WEIGHTS]


@pytest.mark.parametrize(("ct", "wt"), CASES)
@pytest.mark.parametrize("idx", [[4, 1, 3], [5, 4, 3, 2, 1, 0], [2], [0, 0, 5, 2, 5], []])
def test_take_is_the_components_one_by_one(ct: str, wt: str, idx: list[int]) -> None:
    post = random_posterior(ct, wt)
    before = {name: np.copy(getattr(post, name)) for name in ARRAYS if getattr(post, name) is not None}
    got = post.take(np.asarray(idx, dtype=np.int64))
    assert (got.covariance_type, got.weight_type, got.n_components) == (ct, wt, len(idx))
    assert_same(got, brute_take(post, idx))
    assert_same(post, before)  # the original is untouched
    assert_same(post.take(idx), brute_take(post, idx))  # a list works as well


@pytest.mark.parametrize(("ct", "wt"), CASES)
def test_take_of_every_component_in_order_is_the_original(ct: str, wt: str) -> None:
    post = random_posterior(ct, wt, seed=1)
    assert_same(post.take(np.arange(K)), post)
    perm = np.random.default_rng(2).permutation(K)
    assert not np.array_equal(perm, np.arange(K))
    assert_same(post.take(perm).take(np.argsort(perm)), post)  # a permutation and back


@pytest.mark.parametrize("ct", COVARIANCES)
def test_take_takes_the_stored_cholesky_factors(ct: str) -> None:
    """The factors are taken as stored, not recomputed from the covariances."""
    post = random_posterior(ct, "dirichlet_process", seed=3)
    marked = Posterior(ct, post.weight_type, post.weight_concentration, post.mean_precision, post.means,
                       post.degrees_of_freedom, post.covariances, post.precisions_cholesky * 1.5)
    got = marked.take([3, 0])
    want = marked.precisions_cholesky if ct == "tied" else marked.precisions_cholesky[[3, 0]]
    assert np.array_equal(got.precisions_cholesky, want)
    assert not np.array_equal(got.precisions_cholesky, precision_cholesky(got.covariances, ct))


@pytest.mark.parametrize("ct", ["full", "diag", "spherical", "fixed"])
def test_taken_expectations_are_the_components_expectations(ct: str) -> None:
    post = random_posterior(ct, "dirichlet_distribution", seed=4)
    idx = [5, 2, 2, 0]
    got = post.take(idx)
    np.testing.assert_allclose(got.expected_log_det_precision(), post.expected_log_det_precision()[idx],
                               rtol=1e-14)
    np.testing.assert_allclose(got.precisions(), post.precisions()[idx], rtol=1e-14)


def test_tied_takes_the_components_and_shares_the_rest() -> None:
    post = random_posterior("tied", "dirichlet_distribution", seed=5)
    got = post.take([2, 4])
    assert got.covariances.shape == (D, D) and got.degrees_of_freedom.shape == ()
    assert np.array_equal(got.expected_log_det_precision(), post.expected_log_det_precision()[:2])
    got.covariances[0, 0] = -1.0  # a copy: the original's shared covariance is not the taken one's
    assert post.covariances[0, 0] > 0


@pytest.mark.parametrize("bad", [np.ones(K, dtype=bool), np.array([[0, 1]]), np.array([0.0, 1.0]), 1])
def test_take_refuses_what_is_not_a_1d_integer_array(bad: object) -> None:
    with pytest.raises(ValueError, match="1-d integer array"):
        random_posterior("full", "dirichlet_process").take(bad)  # type: ignore[arg-type]


# ---- the selections written with take, against the code they replaced (main at 95f82cf) ----------
def old_prune_components(post: Posterior, keep: np.ndarray) -> Posterior:
    if keep.all():
        return post
    idx = kept_components(post, keep)
    nu = None if post.degrees_of_freedom is None else post.degrees_of_freedom[idx]
    return Posterior(post.covariance_type, post.weight_type, post.weight_concentration[..., idx],
                     post.mean_precision[idx], post.means[idx], nu, post.covariances[idx],
                     post.precisions_cholesky[idx])


@pytest.mark.parametrize("ct", ["full", "diag", "spherical", "fixed"])
@pytest.mark.parametrize("mask", [[1, 0, 1, 1, 0, 1], [0] * K, [1] * K])
def test_vbem_pruning_keeps_the_bits(ct: str, mask: list[int]) -> None:
    post = random_posterior(ct, "dirichlet_process", seed=6)
    keep = np.asarray(mask, dtype=bool)
    assert_same(prune_components(post, keep), old_prune_components(post, keep))


def old_with_children(post: Posterior, prior: Prior, shift: np.ndarray, parents: np.ndarray,
                      kept: np.ndarray, children: np.ndarray, nk: np.ndarray) -> Posterior:
    half = nk.copy()
    half[parents] = nk[parents] / 2.0
    nk_new = np.concatenate((half, half[parents]))
    means = np.concatenate((post.means, children + shift))
    means[parents] = kept + shift
    nu = None
    if post.degrees_of_freedom is not None and np.ndim(post.degrees_of_freedom) > 0:
        nu = prior.degrees_of_freedom + nk_new
    return Posterior(post.covariance_type, post.weight_type, weight_posterior(nk_new, prior),
                     prior.mean_precision + nk_new, means, nu,
                     np.concatenate((post.covariances, post.covariances[parents])))


@pytest.mark.parametrize("ct", ["full", "diag", "spherical", "fixed"])
@pytest.mark.parametrize("wt", WEIGHTS)
def test_growth_children_keep_the_bits(ct: str, wt: str) -> None:
    post = random_posterior(ct, wt, seed=7)
    prior = default_prior(covariance_type=ct, weight_type=wt, n_components=K + 2, data_mean=np.zeros(D),
                          data_covariance=np.eye(D), fixed_variance=0.5 if ct == "fixed" else None)
    shift = np.random.default_rng(9).normal(size=D)
    parents = np.array([4, 1], dtype=np.int64)
    kept, children = np.random.default_rng(10).normal(size=(2, 2, D))
    got = with_children(post, prior, shift, parents, kept, children)
    assert got.n_components == K + 2
    assert_same(got, old_with_children(post, prior, shift, parents, kept, children, used_counts(post)))
