"""Gradient learners (gd, cg, ng, ncg) and pattern-search VB EM (vbem-ps): monotone exact ELBO, the
VB EM fixed point, learner switches, LocalEngine == DaskEngine bit for bit, bitwise resume."""

import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.fit.learners import LEARNERS
from pipeline.fit.learners.gradient.learners import NCG, quadratic_line_search, seed000_converged
from pipeline.fit.learners.vbem.pattern import PatternSearchVBEM, parabola_peak
from tests._memory import peak_fit_bytes
from vbcore.errors import ConfigError
from vbcore.kernels.estep import chunk_statistics, estep_params
from vbcore.learners.gradients import conditional_update, logit_gradient_kernel
from vbcore.model.elbo import elbo_terms
from vbcore.model.mstep import m_step

GRADIENT = ["gd", "cg", "ng", "ncg"]


def cluster_data(r=0.3, n=500, seed=0, dtype=np.float64):
    """Seed 000 sec. V-A cluster data: 5 spherical Gaussians at (0,0) and (+-R, +-R)."""
    rng = np.random.default_rng(seed)
    centres = np.array([[0, 0], [r, r], [r, -r], [-r, r], [-r, -r]])
    X = centres[rng.integers(0, 5, n)] + rng.normal(0, 0.1, size=(n, 2))
    return X.astype(dtype)


KW = dict(n_components=6, weight_concentration_prior_type="dirichlet_distribution", reg_covar=0.0,
          random_state=0, chunk_rows=128)


@pytest.fixture(scope="module")
def X():
    return cluster_data()



def _same_bits(a, b):
    for name in ("means_", "covariances_", "weights_", "precisions_cholesky_", "lower_bounds_"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.n_iter_ == b.n_iter_ and a.converged_ == b.converged_


def test_registered():
    for name in [*GRADIENT, "vbem-ps"]:
        assert name in LEARNERS
    assert LEARNERS["ncg"].natural and LEARNERS["ncg"].conjugate
    assert not LEARNERS["gd"].natural and not LEARNERS["gd"].conjugate


# ---- line searches (exact rules of docs/algorithms.md) ------------------------------------------
def test_quadratic_line_search_is_exact_on_a_parabola_and_never_accepts_an_increase():
    calls = []

    def phi(lam):
        calls.append(lam)
        return 3.0 - 4.0 * lam + 0.5 * lam * lam  # minimum at 4, phi'(0) = -4

    res = quadratic_line_search(phi, 3.0, -4.0, 1.0, 6)
    assert res.step == pytest.approx(4.0) and calls == [1.0, pytest.approx(4.0)]
    calls.clear()
    res = quadratic_line_search(phi, 3.0, -4.0, 4.2, 6)  # the parabola agrees: no second evaluation
    assert res.step == 4.2 and calls == [4.2]
    # a trial far too long: shrinks by the parabola until a decrease
    res = quadratic_line_search(lambda lam: 3.0 - 4.0 * lam + 50.0 * lam**4, 3.0, -4.0, 10.0, 6)
    assert 0 < res.step < 10.0 and res.cost < 3.0 and len(res.tried) >= 2
    # no decrease anywhere (a wrong slope): step 0 after max_evals evaluations
    res = quadratic_line_search(lambda lam: 3.0 + lam, 3.0, -1.0, 1.0, 4)
    assert res.step == 0.0 and res.cost == 3.0 and len(res.tried) == 4


def test_parabola_peak():
    # L(lam) = -(lam - 2)^2: through -1, 0, 1 -> peak at 2
    assert parabola_peak(1.0, -9.0, -4.0, -1.0, 64.0) == pytest.approx(2.0)
    assert parabola_peak(1.0, 0.0, 1.0, 2.0, 64.0) == 4.0  # straight line up: 4 lam1
    assert parabola_peak(1.0, 0.0, 1.0, 2.0, 3.0) == 3.0  # capped by max_step
    assert parabola_peak(2.0, 5.0, 1.0, 0.0, 64.0) == 0.5  # convex, no gain: shorter


def test_seed000_rule():
    n = 100
    assert not seed000_converged([0.0, 1.0, 1.0 + 1e-7], 1e-8, n)  # only two iterations
    assert seed000_converged([0.0, 1.0, 1.0 + 1e-7, 1.0 + 2e-7], 1e-8, n)
    assert not seed000_converged([0.0, 1.0, 1.0 + 1e-5, 1.0 + 1e-5 + 1e-7], 1e-8, n)


def test_bad_options_are_clear_errors(X):
    with pytest.raises(ConfigError, match=r"learner option 'convergence' of 'ncg' must be one of \('tol', "
                                          r"'seed000'\), got 'often'"):
        VBMixture(3, learner="ncg", learner_options={"convergence": "often"}).fit(X)
    with pytest.raises(ConfigError, match=r"learner option 'line_search_evals' of 'cg' must be >= 1, got 0"):
        VBMixture(3, learner="cg", learner_options={"line_search_evals": 0}).fit(X)
    with pytest.raises(ConfigError, match=r"learner option 'every' of 'vbem-ps' must be >= 1, got 0"):
        VBMixture(3, learner="vbem-ps", learner_options={"every": 0}).fit(X)
    with pytest.raises(ConfigError, match=r"need 0 < step <= max_step, got step=100.0, max_step=64.0"):
        VBMixture(3, learner="vbem-ps", learner_options={"step": 100}).fit(X)


# ---- the optimisation ------------------------------------------------------------------------------
@pytest.mark.parametrize("ct", ["full", "diag", "spherical", "fixed"])
@pytest.mark.parametrize("learner", GRADIENT)
def test_gradient_learners_never_decrease_the_elbo(X, ct, learner):
    kw = dict(KW, weight_concentration_prior_type="dirichlet_process") if ct == "diag" else KW
    m = VBMixture(covariance_type=ct, learner=learner, max_iter=15, tol=0.0, **kw).fit(X)
    h = m.lower_bounds_
    assert len(h) == 15 and np.all(np.isfinite(h))
    assert np.all(np.diff(h) >= 0.0)  # the line search accepts only decreases of C, exactly
    assert h[-1] > h[0]


@pytest.mark.parametrize("ct", ["full", "diag"])
@pytest.mark.parametrize("wt", ["dirichlet_distribution", "dirichlet_process"])
def test_vbem_ps_is_monotone_and_uses_pattern_steps(X, ct, wt):
    seen = {}

    class Spy(PatternSearchVBEM):
        def close(self):
            seen.update(accepted=self.s.accepted, tried=self.s.tried)

    LEARNERS["vbem-ps-spy-test"] = Spy
    try:
        kw = dict(KW, weight_concentration_prior_type=wt, covariance_type=ct, max_iter=40, tol=0.0)
        m = VBMixture(learner="vbem-ps-spy-test", **kw).fit(X)
    finally:
        del LEARNERS["vbem-ps-spy-test"]
    h = m.lower_bounds_
    assert np.all(np.diff(h) >= -1e-12 * np.abs(h[-1]))
    # iterations 3, 6, ..., 39 search (1 E-step + 2 trial passes), the others are 1 pass
    assert seen["tried"] == 13 and m.n_passes_ == 40 + 2 * 13
    assert seen["accepted"] >= 1
    vbem = VBMixture(**kw).fit(X)
    assert h[-1] >= vbem.lower_bounds_[-1] - 1e-9 * abs(h[-1])


def test_ncg_reaches_a_vb_em_fixed_point_and_learners_switch(X):
    """NCG to convergence, then set_params(learner='vbem', warm_start=True): one VB EM step changes
    the ELBO by a negligible amount (and does not lower it)."""
    m = VBMixture(covariance_type="full", learner="ncg", max_iter=500, tol=1e-12, **KW).fit(X)
    assert m.converged_ and m.n_iter_ < 500
    ncg_elbo, means = m.lower_bound_, m.means_.copy()
    m.set_params(learner="vbem", warm_start=True, max_iter=1)
    m.fit(X)
    assert m.n_iter_ == 1
    change = (m.lower_bound_ - ncg_elbo) / X.shape[0]
    assert -1e-9 < change < 1e-7
    np.testing.assert_allclose(m.means_, means, atol=1e-4)
    # and back: NCG warm-started from the VB EM posterior continues from it (a bound no lower)
    m.set_params(learner="ncg", max_iter=3)
    before = m.lower_bound_
    m.fit(X)
    assert m.lower_bounds_[0] >= before - 1e-9 * abs(before)


def test_reported_elbo_is_vbcore_elbo_of_the_learners_own_q(X):
    """The ELBO NCG reports is vbcore.model.elbo.elbo_terms of its own q(Z) (the per-chunk logits, summarised
    again here in float64) and q(theta); with the means of eq. 40 it is VB EM's bound."""
    grabbed = {}

    class Spy(NCG):
        def step(self, iteration):
            post, terms = super().step(iteration)
            if iteration == 7:  # apply the accepted step to the logits now (the next pass would)
                states, _ = self.ctx.engine.map_keep(
                    logit_gradient_kernel, self.ctx.handles, self.states, estep_params(post, self.ctx.shift),
                    self.s.lam_acc, self.s.beta_acc, self.natural)
                grabbed.update(states=states, ctx=self.ctx, post=post, terms=terms)
            return post, terms

    LEARNERS["ncg-spy-test"] = Spy
    try:
        m = VBMixture(covariance_type="full", learner="ncg-spy-test", max_iter=7, tol=0.0, **KW).fit(X)
    finally:
        del LEARNERS["ncg-spy-test"]
    ctx, post = grabbed["ctx"], grabbed["post"]
    assert grabbed["terms"].total == m.lower_bound_
    stats = None
    for chunk, st in zip(ctx.handles, grabbed["states"], strict=True):
        r = np.exp(st.log_r)
        s = chunk_statistics(chunk, r, np.sum(r * st.log_r, axis=1))
        stats = s if stats is None else stats.merge(s)
    again = elbo_terms(stats, conditional_update(stats, ctx.prior, post.means), ctx.prior)
    assert again.total == pytest.approx(m.lower_bound_, rel=1e-12, abs=0)
    for name in ("means", "covariances", "weight_concentration"):
        np.testing.assert_allclose(getattr(conditional_update(stats, ctx.prior, post.means), name),
                                   getattr(post, name), rtol=1e-10)
    vb = m_step(stats, ctx.prior)
    at_eq40 = conditional_update(stats, ctx.prior, vb.means)
    vb_elbo = elbo_terms(stats, vb, ctx.prior).total
    assert elbo_terms(stats, at_eq40, ctx.prior).total == pytest.approx(vb_elbo, rel=1e-13)
    assert elbo_terms(stats, vb, ctx.prior).total >= m.lower_bound_  # eq. 40 is the best means for q(Z)


# ---- engines and per-chunk state ---------------------------------------------------------------------
class _Sum:
    def __init__(self, v):
        self.v = v

    def merge(self, other):
        return _Sum(self.v + other.v)


def _count_kernel(chunk, state, inc):
    state = (np.zeros(chunk.n_rows) if state is None else state) + inc
    return state, _Sum(float(state.sum()))


def test_map_keep_keeps_state_with_the_chunks(client, X):
    from pipeline.engine.engines import DaskEngine, LocalEngine
    from pipeline.engine.sources import ArraySource

    source = ArraySource(X, 128)
    for engine in (LocalEngine(), DaskEngine(client)):
        handles = engine.prepare(source, prepare_chunk_, np.zeros(2), "diag")
        states, total = engine.map_keep(_count_kernel, handles, [None] * len(handles), 1.0)
        states, total = engine.map_keep(_count_kernel, handles, states, 2.0)
        assert total.v == 3.0 * len(X)
        if isinstance(engine, DaskEngine):
            assert all(type(s).__name__ == "Future" for s in states)  # nothing came to the driver
        fetched = engine.fetch_states(states, lambda s: s * 10)
        assert [len(f) for f in fetched] == [sl.stop - sl.start for sl in source.chunk_slices()]
        assert all(np.all(f == 30.0) for f in fetched)
        placed = engine.place_states([np.ones(len(f)) for f in fetched], handles)
        _, total = engine.map_keep(_count_kernel, handles, placed, 0.5)
        assert total.v == 1.5 * len(X)
        engine.release(handles)


def prepare_chunk_(x, shift, ct):
    from vbcore.kernels.estep import prepare_chunk

    return prepare_chunk(x, shift, ct)


@pytest.mark.parametrize("ct, learner", [("full", "ncg"), ("diag", "ncg"), ("diag", "vbem-ps")])
def test_local_and_dask_engines_are_bitwise_identical(client, ct, learner):
    X32 = cluster_data(n=700, seed=3, dtype=np.float32)
    kw = dict(KW, covariance_type=ct, learner=learner, max_iter=10, tol=0.0, chunk_rows=256)
    local = VBMixture(**kw).fit(X32)
    dask_fit = VBMixture(engine=client, **kw).fit(X32)
    _same_bits(local, dask_fit)
    assert local.n_passes_ == dask_fit.n_passes_
    if ct == "diag" and learner == "ncg":  # chunks loaded in every pass: the same bits again
        _same_bits(VBMixture(engine=client, persist="never", **kw).fit(X32), local)


@pytest.mark.parametrize("learner", ["ncg", "cg", "vbem-ps"])
def test_resume_is_bitwise(tmp_path, X, learner):
    kw = dict(KW, covariance_type="full", learner=learner, tol=0.0)
    VBMixture(max_iter=10, checkpoint_dir=str(tmp_path), checkpoint_every=3, **kw).fit(X)
    resumed = VBMixture(max_iter=25, checkpoint_dir=str(tmp_path), checkpoint_every=3, **kw).fit(X)
    assert resumed.resumed_from_.endswith("ckpt-00000010")
    _same_bits(resumed, VBMixture(max_iter=25, **kw).fit(X))


def test_resume_on_dask_from_a_local_checkpoint_is_bitwise(tmp_path, client):
    X32 = cluster_data(n=700, seed=4, dtype=np.float32)
    kw = dict(KW, covariance_type="diag", learner="ncg", tol=0.0)
    VBMixture(max_iter=8, checkpoint_dir=str(tmp_path), checkpoint_every=4, **kw).fit(X32)
    with np.load(tmp_path / "ckpt-00000008" / "state.npz") as z:
        assert z["learner.chunk_log_r"].shape == (700, 6) and z["learner.chunk_log_r"].dtype == np.float32
    resumed = VBMixture(max_iter=20, checkpoint_dir=str(tmp_path), engine=client, **kw).fit(X32)
    assert resumed.resumed_from_.endswith("ckpt-00000008")
    _same_bits(resumed, VBMixture(max_iter=20, **kw).fit(X32))


@pytest.mark.parametrize("ct", ["diag", "full"])
def test_ncg_builds_no_n_k_d_temporary(ct):
    n, d, k = (20_000, 48, 40) if ct == "diag" else (10_000, 48, 20)  # full: K D x D GEMMs per chunk
    X = np.random.default_rng(0).random((n, d), dtype=np.float32)
    R = np.random.default_rng(1).dirichlet(np.ones(k), size=n)
    model = VBMixture(k, covariance_type=ct, learner="ncg", max_iter=2, tol=0.0, chunk_rows=4096)
    peak = peak_fit_bytes(model, X, R)
    nkd_float32 = n * k * d * 4  # 154 MB (diag), 38 MB (full)
    # allowed: a few copies of the data, the per-chunk state (3 float32 N x K arrays) and a few
    # N x K float64 arrays (resp_init and its statistics)
    assert peak < 4 * X.nbytes + 3 * n * k * 4 + 3 * n * k * 8 + 16 * 2**20, peak
    # a third of one N x K x D float32 array (the fit keeps ~0.7 MB more alive since the fit
    # setup/driver split, 9.8 MB here against 9.1 MB before; an N x K x D temporary is 38-154 MB)
    assert peak < nkd_float32 / 3


def test_vbem_ps_skips_invalid_trial_posteriors():
    """Regression (found by the seed 000 study, R = 0.1, initialisation 6): a long pattern step
    underflowed exp(xi) so that nu_k = D - 1 exactly, and the Wishart KL raised. Such trial points are
    now rejected without a pass, and the fit continues monotonically."""
    from pipeline.fit.learners.vbem.pattern import _valid
    from pipeline.studies.data import cluster_data as study_data
    from pipeline.studies.seed000 import _rng, paper_prior, paper_resp_init

    X = study_data(0.1, 1000, seed=_rng(0, 2, 100))[0]
    resp0 = paper_resp_init(X, 8, np.random.default_rng(np.random.SeedSequence(0, spawn_key=(6,))))
    m = VBMixture(8, learner="vbem-ps", max_iter=60, tol=0.0, chunk_rows=len(X), random_state=0,
                  **paper_prior(2)).fit(X, resp_init=resp0)
    assert m.n_iter_ == 60 and np.all(np.diff(m.lower_bounds_) >= -1e-12 * abs(m.lower_bound_))
    post = m.posterior_
    assert _valid(post)
    bad = type(post)(post.covariance_type, post.weight_type, post.weight_concentration, post.mean_precision,
                     post.means, np.full_like(post.degrees_of_freedom, 1.0), post.covariances)  # nu = D - 1
    assert not _valid(bad)
