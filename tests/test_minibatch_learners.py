"""Minibatch learners of the DP mixture (Lim & Jiang 2024): the math against float64 references and
finite differences (the learners end to end are in tests/test_minibatch_fits.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as st

from vbcore.kernels.estep import prepare_chunk
from vbcore.kernels.sga_stats import (
    DPPoint,
    HardStats,
    hard_kernel,
    log_stick_weights,
    map_labels,
    map_params,
)
from vbcore.learners.sga import (
    Velocity,
    gradients,
    map_bound,
    minibatch_objective,
    mm_update,
    point_posterior,
    prune_order,
    reorder,
    separated,
    sga_step,
)
from vbcore.model.elbo import elbo_terms
from vbcore.model.priors import Prior

F64_TOL = 1e-10


def _prior(d, m0=None, lam0=0.7, sigma2=0.8, a0=3.0):
    return Prior(covariance_type="fixed", weight_type="dirichlet_process", n_components=4,
                 weight_concentration=a0, mean_precision=lam0,
                 mean=np.zeros(d) if m0 is None else m0, degrees_of_freedom=float(d), covariance=None,
                 fixed_variance=sigma2)


@pytest.fixture
def problem():
    rng = np.random.default_rng(1)
    d, k = 3, 4
    centres = rng.normal(scale=3.0, size=(k, d))
    x = np.concatenate([c + rng.normal(size=(15, d)) for c in centres]) + 5.0
    point = DPPoint(means=centres + 5.0 + rng.normal(scale=0.3, size=(k, d)),
                    sticks=np.array([0.3, 0.25, 0.4, 0.2]))
    prior = _prior(d, m0=np.full(d, 4.0))
    return x, point, prior


def _brute_labels(x, point, sigma2):
    score = (-((x[:, None, :] - point.means[None]) ** 2).sum(-1) / (2 * sigma2)
             + log_stick_weights(point.sticks)[None])
    return score.argmax(1)


def _hard(x, point, prior, rows=None, dtype=np.float64):
    shift = np.asarray(x[0], dtype=np.float64)
    chunk = prepare_chunk(np.asarray(x, dtype=dtype), shift, "fixed")
    return hard_kernel(chunk, rows, map_params(point, prior.fixed_variance, shift)).to_stats()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_hard_kernel_matches_bruteforce_assignments_and_statistics(problem, dtype):
    x, point, prior = problem
    rows = np.array([0, 3, 7, 8, 20, 21, 40, 59, 33])
    stats = _hard(x, point, prior, rows, dtype)
    xb = x[rows]
    lab = _brute_labels(xb, point, prior.fixed_variance)
    k = point.n_components
    tol = F64_TOL if dtype == np.float64 else 1e-5
    nk = np.bincount(lab, minlength=k)
    assert np.array_equal(stats.nk, nk) and stats.n_rows == len(rows) and stats.sum_rlogr == 0.0
    for j in range(k):
        if nk[j]:
            members = xb[lab == j]
            assert stats.raw_mean()[j] == pytest.approx(members.mean(0), rel=tol, abs=tol)
            assert stats.scatter[j] == pytest.approx(((members - members.mean(0)) ** 2).sum(0),
                                                     rel=tol, abs=tol)
    chunk = prepare_chunk(xb, xb[0], "fixed")
    assert np.array_equal(map_labels(chunk, map_params(point, prior.fixed_variance, xb[0])), lab)


def test_hard_statistics_merge_across_blocks_and_chunks(problem):
    """Rows in two chunks (and in blocks of BLOCK_ROWS inside a chunk) merge to the whole."""
    import vbcore.kernels.sga_stats as sga_mod

    x, point, prior = problem
    shift = x[0].astype(np.float64)
    params = map_params(point, prior.fixed_variance, shift)
    whole = hard_kernel(prepare_chunk(x, shift, "fixed"), None, params).to_stats()
    parts = [hard_kernel(prepare_chunk(x[s], shift, "fixed"), None, params) for s in (slice(0, 23),
                                                                                      slice(23, None))]
    merged = parts[0].merge(parts[1]).to_stats()
    mp = pytest.MonkeyPatch()
    mp.setattr(sga_mod, "BLOCK_ROWS", 7)
    try:
        blocked = hard_kernel(prepare_chunk(x, shift, "fixed"), None, params).to_stats()
    finally:
        mp.undo()
    for other in (merged, blocked):
        assert np.array_equal(other.nk, whole.nk)
        assert other.mean == pytest.approx(whole.mean, rel=1e-12, abs=1e-12)
        assert other.scatter == pytest.approx(whole.scatter, rel=1e-10, abs=1e-10)


def test_sparse_hard_statistics_combine_like_dense_sums(problem):
    """Per-chunk results hold only the clusters with rows; combining minibatch parts once (in chunk
    order) gives the bits of merging them one after another, and the dense float64 sums."""
    x, point, prior = problem
    shift = x[0].astype(np.float64)
    params = map_params(point, prior.fixed_variance, shift)
    chunk = prepare_chunk(x, shift, "fixed", squares=False)
    assert chunk.feats is None and chunk.is_diagonal
    rng = np.random.default_rng(5)
    rows = [np.sort(rng.choice(x.shape[0], size=m, replace=False)) for m in (3, 17, 1, 40)]
    parts = [hard_kernel(chunk, r, params) for r in rows]
    for p, r in zip(parts, rows, strict=True):
        assert np.array_equal(p.idx, np.flatnonzero(p.nk)) and p.s1.shape == (p.idx.size, x.shape[1])
        assert p.nk.sum() == len(r)
    one = HardStats.combine(parts)
    folded = parts[0]
    for p in parts[1:]:
        folded = folded.merge(p)
    for a, b in ((one.s1, folded.s1), (one.s2, folded.s2), (one.nk, folded.nk), (one.idx, folded.idx)):
        assert np.array_equal(a, b)
    # the dense reference: float64 sums of the rows by label
    lab = np.concatenate([map_labels(prepare_chunk(x[r], shift, "fixed"), params) for r in rows])
    xs = np.concatenate([x[r] for r in rows]).astype(np.float64) - shift
    dense1 = np.zeros((point.n_components, x.shape[1]))
    np.add.at(dense1, lab, xs)
    assert one.to_stats().mean * one.nk[:, None] == pytest.approx(dense1, rel=1e-5, abs=1e-5)
    with pytest.raises(ValueError, match="no chunks"):
        HardStats.combine([])


def test_gradients_match_finite_differences(problem):
    x, point, prior = problem
    sigma2, n_total, a0 = prior.fixed_variance, 500, 3.0
    rows = np.arange(0, 60, 2)
    stats = _hard(x, point, prior, rows)
    lab = _brute_labels(x[rows], point, sigma2)
    g = gradients(stats, point, prior, sigma2, n_total, a0)

    def J(p):
        return minibatch_objective(x[rows], lab, p, prior, sigma2, n_total, a0)

    h = 1e-6
    for k in range(point.n_components):
        for d in range(x.shape[1]):
            e = np.zeros_like(point.means)
            e[k, d] = h
            fd = (J(DPPoint(point.means + e, point.sticks))
                  - J(DPPoint(point.means - e, point.sticks))) / (2 * h)
            assert g.mu[k, d] == pytest.approx(fd, rel=1e-6, abs=1e-8)
            # eq. 20: the curvature is the (negated) second derivative
            e2 = e * 100  # h = 1e-4 for the second difference
            fd2 = (J(DPPoint(point.means + e2, point.sticks)) - 2 * J(point)
                   + J(DPPoint(point.means - e2, point.sticks))) / 1e-8
            assert g.curv_mu[k] == pytest.approx(-fd2, rel=1e-3)
        ev = np.zeros(point.n_components)
        ev[k] = h
        fd = (J(DPPoint(point.means, point.sticks + ev))
              - J(DPPoint(point.means, point.sticks - ev))) / (2 * h)
        assert g.v[k] == pytest.approx(fd, rel=1e-6, abs=1e-8)
        ev2 = ev * 100
        fd2 = (J(DPPoint(point.means, point.sticks + ev2)) - 2 * J(point)
               + J(DPPoint(point.means, point.sticks - ev2))) / 1e-8
        assert g.curv_v[k] == pytest.approx(-fd2, rel=1e-3)


def test_empirical_fisher_is_the_mean_square_of_per_row_gradients(problem):
    x, point, prior = problem
    sigma2, n_total, a0 = prior.fixed_variance, 300, 5.0
    rows = np.arange(1, 60, 3)
    stats = _hard(x, point, prior, rows)
    xb = x[rows]
    lab = _brute_labels(xb, point, sigma2)
    g = gradients(stats, point, prior, sigma2, n_total, a0)
    k = point.n_components
    z = np.eye(k)[lab]
    t = np.cumsum(z[:, ::-1], axis=1)[:, ::-1] - z
    per_mu = (z[:, :, None] * (xb[:, None, :] - point.means[None]) / sigma2
              - prior.mean_precision * (point.means - prior.mean)[None] / (n_total * sigma2))
    e = (a0 - 1) / n_total
    per_v = z / point.sticks[None] - (t + e) / (1 - point.sticks[None])
    assert g.mu == pytest.approx(per_mu.mean(0), rel=1e-10, abs=1e-12)
    assert g.fisher_mu == pytest.approx((per_mu**2).mean(0), rel=1e-10, abs=1e-12)
    assert g.v == pytest.approx(per_v.mean(0), rel=1e-10)
    assert g.fisher_v == pytest.approx((per_v**2).mean(0), rel=1e-10)


def test_mm_point_is_stationary_for_the_full_batch_gradient(problem):
    """With all rows in the 'minibatch' (M = N), the MM update zeroes g(mu) and g(v): it is the
    maximiser of J for the current assignments."""
    x, point, prior = problem
    a0 = 4.0
    stats = _hard(x, point, prior)
    mm = mm_update(stats, prior, a0)
    g = gradients(stats, mm, prior, prior.fixed_variance, x.shape[0], a0)
    assert np.abs(g.mu).max() < 1e-12
    assert np.abs(g.v).max() < 1e-12


def test_map_bound_matches_bruteforce_log_joint(problem):
    x, point, prior = problem
    sigma2, a0 = prior.fixed_variance, 3.0
    stats = _hard(x, point, prior)
    lab = _brute_labels(x, point, sigma2)
    b = map_bound(stats, point, prior, sigma2, a0)
    d = x.shape[1]
    log_lik = sum(st.multivariate_normal(point.means[lab[n]], sigma2 * np.eye(d)).logpdf(x[n])
                  for n in range(x.shape[0]))
    log_mu = sum(st.multivariate_normal(prior.mean, sigma2 / prior.mean_precision * np.eye(d)).logpdf(m)
                 for m in point.means)
    v = point.sticks
    pi = v * np.concatenate(([1.0], np.cumprod(1 - v[:-1])))
    log_z = np.log(pi[lab]).sum()
    log_v = st.beta(1.0, a0).logpdf(v).sum()
    assert b.log_lik == pytest.approx(log_lik, rel=F64_TOL)
    assert b.log_prior_mu == pytest.approx(log_mu, rel=F64_TOL)
    assert b.log_p_z == pytest.approx(log_z, rel=F64_TOL)
    assert b.log_prior_v == pytest.approx(log_v, rel=F64_TOL)
    assert b.total == pytest.approx(log_lik + log_mu + log_z + log_v, rel=F64_TOL)


def test_point_posterior_elbo_matches_monte_carlo(problem):
    """The exact ELBO of q(z) one-hot x q(mu) Gaussian x q(v) Beta around the point estimates
    against a float64 Monte Carlo evaluation of E_q[ln p(x, z, mu, v) - ln q(mu, v)]."""
    x, point, prior = problem
    sigma2, a0 = prior.fixed_variance, 3.0
    p2 = Prior(**{**prior.__dict__, "weight_concentration": a0})
    stats = _hard(x, point, p2)
    post = point_posterior(point, stats.nk, p2, sigma2, a0)
    elbo = elbo_terms(stats, post, p2).total
    lab = _brute_labels(x, point, sigma2)
    rng = np.random.default_rng(0)
    s, k, d = 100_000, point.n_components, x.shape[1]
    sd = np.sqrt(sigma2 / post.mean_precision)
    mu = post.means[None] + sd[None, :, None] * rng.standard_normal((s, k, d))
    a, b = post.weight_concentration
    v = rng.beta(a, b, size=(s, k))
    log_pi = np.log(v) + np.concatenate((np.zeros((s, 1)), np.cumsum(np.log1p(-v[:, :-1]), 1)), 1)
    counts = np.bincount(lab, minlength=k)
    xsum = np.stack([x[lab == j].sum(0) for j in range(k)])
    xsq = np.array([(x[lab == j] ** 2).sum() for j in range(k)])
    # sum_n |x_n - mu_{z_n}|^2 per sample, from per-cluster sums
    sq = (xsq[None] - 2 * np.einsum("skd,kd->sk", mu, xsum) + counts[None] * (mu**2).sum(-1)).sum(1)
    log_lik = -0.5 * x.shape[0] * d * np.log(2 * np.pi * sigma2) - 0.5 * sq / sigma2
    log_pz = (counts[None] * log_pi).sum(1)
    lam0 = prior.mean_precision
    log_pmu = (-0.5 * d * np.log(2 * np.pi * sigma2 / lam0)
               - 0.5 * lam0 * ((mu - prior.mean) ** 2).sum(-1) / sigma2).sum(1)
    log_pv = st.beta(1.0, a0).logpdf(v).sum(1)
    log_qmu = (-0.5 * d * np.log(2 * np.pi * sd**2)[None] - 0.5 * ((mu - post.means[None]) ** 2).sum(-1)
               / sd[None] ** 2).sum(1)
    log_qv = st.beta(a, b).logpdf(v).sum(1)
    samples = log_lik + log_pz + log_pmu + log_pv - log_qmu - log_qv
    se = samples.std() / np.sqrt(s)
    assert abs(samples.mean() - elbo) < 5 * se + 1e-9


def test_sga_steps_and_pruning(problem):
    x, point, prior = problem
    sigma2, a0 = prior.fixed_variance, 3.0
    stats = _hard(x, point, prior)
    g = gradients(stats, point, prior, sigma2, x.shape[0], a0)
    new, vel = sga_step(point, g, method="sga", eta=0.1, sigma2=sigma2)
    assert new.means == pytest.approx(point.means + 0.1 * sigma2 * g.mu, rel=1e-12)
    assert np.all(vel.mu == 0)
    m1, v1 = sga_step(point, g, method="sga-m", eta=0.1, sigma2=sigma2, velocity=Velocity.zeros(4, 3))
    m2, v2 = sga_step(m1, g, method="sga-m", eta=0.1, sigma2=sigma2, velocity=v1, alpha=0.9)
    assert v2.mu == pytest.approx(0.9 * v1.mu + 0.1 * sigma2 * g.mu, rel=1e-12)  # eq. 8
    f, _ = sga_step(point, g, method="sga-f", eta=0.05, sigma2=sigma2)
    expect = point.means + 0.05 * g.mu / np.maximum(g.fisher_mu, g.curv_mu[:, None])
    assert f.means == pytest.approx(expect, rel=1e-12)
    assert np.all((f.sticks > 0) & (f.sticks < 1))
    # a stick step past 0 goes half-way instead
    huge = type(g)(g.mu, g.fisher_mu, g.curv_mu, np.full(4, -100.0), g.fisher_v, g.curv_v)
    s, _ = sga_step(point, huge, method="sga", eta=0.1, sigma2=sigma2)
    assert s.sticks == pytest.approx(point.sticks / 2, rel=1e-12)
    order = prune_order(np.array([0.1, 1e-9, 0.3, 0.2]), 1e-6)
    assert list(order) == [2, 3, 0]
    assert list(prune_order(np.array([1e-9, 1e-8]), 1e-6)) == [1]


def test_reorder_keeps_the_mixture_weights():
    """Re-ordering (section 4.5) moves clusters, not weight: the sticks are re-derived so that every
    kept cluster keeps its pi_k; a stick of 1 (MM's last cluster with a0 = 1) moved first would
    otherwise take all the weight."""
    rng = np.random.default_rng(3)
    sticks = np.concatenate((rng.uniform(0.01, 0.6, size=6), [1.0 - 1e-12]))
    point = DPPoint(rng.normal(size=(7, 3)), sticks)
    pi = np.exp(log_stick_weights(sticks))
    order = prune_order(sticks, 0.0)
    assert np.all(np.diff(pi[order]) <= 0)  # descending weight
    moved = reorder(point, order)
    assert np.exp(log_stick_weights(moved.sticks)) == pytest.approx(pi[order], rel=1e-9)
    assert np.array_equal(moved.means, point.means[order])
    kept = order[:4]  # dropping clusters leaves the others' weights alone
    assert np.exp(log_stick_weights(reorder(point, kept).sticks)) == pytest.approx(pi[kept], rel=1e-9)


def test_sga_f_on_the_full_batch_climbs_to_the_mm_point(problem):
    """Repeated SGA+F steps with the assignments fixed (full batch) converge to the MM point."""
    x, point, prior = problem
    sigma2, a0 = prior.fixed_variance, 3.0
    stats = _hard(x, point, prior)
    target = mm_update(stats, prior, a0)
    p = point
    for _ in range(400):
        p, _ = sga_step(p, gradients(stats, p, prior, sigma2, x.shape[0], a0), method="sga-f",
                        eta=0.1, sigma2=sigma2)
    assert p.means == pytest.approx(target.means, abs=1e-6)
    assert p.sticks == pytest.approx(target.sticks, abs=1e-6)


def test_threshold_rule_prunes_exactly_the_sticks_under_thr():
    """Section 4.5: with THR set, the clusters with E[v_k] < THR are discarded, no other. MM's sticks in
    closed form, ``v_k = n_k / (n_k + n_{>k} + a0 - 1)``, give the weights ``pi_k = n_k / (N + a0 - 1)``:
    the default rule (a tenth of the largest weight) keeps the clusters with at least a tenth of the
    largest count whatever a0 (a tenth of the largest *stick* pruned all but one cluster at a0 = 1)."""
    from vbcore.learners.sga import PRUNE_RELATIVE, default_threshold, mm_sticks

    nk = np.array([5000.0, 2600.0, 900.0, 700.0, 260.0, 120.0, 40.0, 3.0, 0.0])
    for a0 in (nk.sum(), 1.5, 50.0):  # (a0 = 1 with an empty last cluster is 0/0 in closed form)
        v = [nk[k] / (nk[k] + nk[k + 1:].sum() + a0 - 1.0) for k in range(nk.size)]
        assert mm_sticks(nk, a0) == pytest.approx(v, rel=1e-12)
        pi = nk / (nk.sum() + a0 - 1.0)
        assert np.exp(log_stick_weights(mm_sticks(nk, a0))) == pytest.approx(pi, rel=1e-9, abs=1e-9)
        thr = default_threshold(mm_sticks(nk, a0))
        assert PRUNE_RELATIVE == 0.1 and thr == pytest.approx(0.1 * pi.max(), rel=1e-9)
        kept = prune_order(mm_sticks(nk, a0), thr, on="weights")
        assert sorted(kept.tolist()) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="on must be"):
        prune_order(mm_sticks(nk, 1.0), 0.1, on="counts")
    # the data's support keeps a cluster whose stick a step threw under the threshold, no other
    sticks = mm_sticks(nk, nk.sum())
    thrown = sticks.copy()
    thrown[2] = 1e-6  # 900 rows, its stick stepped to almost 0
    thr = default_threshold(sticks)
    assert 2 not in prune_order(thrown, thr, on="weights").tolist()
    share = nk / (nk.sum() + nk.sum())
    kept = prune_order(thrown, thr, on="weights", support=share)
    assert sorted(kept.tolist()) == [0, 1, 2, 3]
    rng = np.random.default_rng(2)
    for _ in range(20):  # any THR: exactly the sticks at or above it survive, by descending weight
        sticks = rng.uniform(0.0, 0.5, size=30) ** 3
        t = float(rng.choice(sticks))
        kept = prune_order(sticks, t)
        assert set(kept.tolist()) == set(np.flatnonzero(sticks >= t).tolist())
        assert np.all(np.diff(log_stick_weights(sticks)[kept]) <= 0)


def test_separated_closed_forms_and_spare():
    """``separated``: the nearest other mean at least SEPARATE_NEAREST sigma^2 per dimension away,
    checked on means placed at known distances on either side of the limit; ``spare`` keeps clusters
    the threshold prunes, and nothing else changes."""
    from vbcore.learners.sga import SEPARATE_NEAREST

    d, sigma2 = 8, 0.5
    limit = SEPARATE_NEAREST * d * sigma2  # squared distance
    means = np.zeros((4, d))
    means[1, 0] = np.sqrt(limit * 1.001)  # just beyond the limit from cluster 0
    means[2, 0] = -np.sqrt(limit * 0.999)  # just inside it from cluster 0
    means[3, 1] = 100.0  # far from all
    assert separated(means, np.arange(4), sigma2).tolist() == [False, True, False, True]
    assert separated(means, np.array([3, 1]), sigma2).tolist() == [True, True]
    assert separated(means, np.array([], dtype=np.int64), sigma2).size == 0
    assert separated(means[:1], np.array([0]), sigma2).tolist() == [False]  # no other cluster
    sticks = np.array([0.5, 0.4, 0.01, 0.01, 0.9])
    plain = prune_order(sticks, 0.05, on="weights")
    spare = np.zeros(5, dtype=bool)
    spare[3] = True
    kept = prune_order(sticks, 0.05, on="weights", spare=spare)
    assert set(kept.tolist()) == set(plain.tolist()) | {3}
    assert np.all(np.diff(log_stick_weights(sticks)[kept]) <= 0)
