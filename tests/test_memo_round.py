"""A move round on memoized statistics (issue 28): each chunk's share of the last round is kept, and a
later round whose proposal it serves visits only the chunks without one and a regular iteration's
share (:mod:`pipeline.fit.learners.vbem.memo_round`).

The round is exact for the kept q(Z): its regular statistics, pair entropies and delete proposal's
statistics are the bits of recomputing each chunk with the parameters of the round (or visit) that
made its share, relabellings applied; a proposal the shares do not serve takes a full pass; the kept
shares go through checkpoints and warm starts, so a refresh resumed from a checkpoint and one on Dask
give the bits of the uninterrupted in-process one.
"""

import warnings

import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.engine.engines import LocalEngine, tree_reduce
from pipeline.fit.driver import CountingEngine
from pipeline.fit.learners.vbem import memo as memo_module
from pipeline.fit.learners.vbem.memo import MemoStats, memo_move_kernel
from pipeline.fit.setup import open_source, setup
from tests._reference import planted_blobs, same_fit_bits
from vbcore.kernels.estep import estep_params
from vbcore.model.mstep import m_step
from vbcore.moves.estep_pass import MoveParams, move_kernel
from vbcore.moves.exact import reindex_pairs

X, _ = planted_blobs(n=1600, d=6, k=6, seed=7)
X = X.astype(np.float32)
KW = dict(n_components=8, covariance_type="diag", random_state=0, chunk_rows=100, tol=0.0)


def _fit(X_, engine="local", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return VBMixture(engine=engine, **{**KW, **kw}).fit(X_)


def _params(post, shift, deletes, pairs, k):
    keep = None if deletes is None else np.setdiff1d(np.arange(k), deletes)
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    kp = np.zeros((0, 2), np.int64) if keep is None else reindex_pairs(pairs, keep, k)
    return MoveParams(estep_params(post, shift), pairs, keep, kp)


def _same(a, b):
    for name in ("nk", "mean", "scatter"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.sum_rlogr == b.sum_rlogr and a.n_rows == b.n_rows


def _same_round(got, want):
    _same(got.stats, want.stats)
    _same(got.alt, want.alt)
    assert np.array_equal(got.h, want.h) and np.array_equal(got.alt_h, want.alt_h)


def _context(cov):
    model = VBMixture(**{**KW, "covariance_type": cov})
    ctx = setup(model.spec(), open_source(X, 100), CountingEngine(LocalEngine(threads=2)), 0)
    posts = [_fit(X, covariance_type=cov, max_iter=m).posterior_ for m in (1, 2, 4)]
    return ctx, posts


def _visited(memo, iteration):
    return set(np.flatnonzero(memo.visited == iteration).tolist())


@pytest.mark.parametrize("cov", ["diag", "full", "tied", "spherical"])
def test_a_round_on_kept_shares_is_the_recomputation_of_each_chunk_with_its_own_parameters(cov):
    """Round 1 (a full pass) at posterior A; regular visits of some chunks at B; round 2 at C with the
    same delete set and a subset of the pairs: the chunks visited since and a regular iteration's
    share take C, the others keep A's shares. Then a permutation of the components, and round 3 in
    the new indexing. Each result: the bits of per-chunk recomputation reduced over the fixed tree."""
    ctx, (a, b, c) = _context(cov)
    n, k = len(ctx.handles), a.n_components
    memo = MemoStats(ctx, 1 / n)  # a regular iteration visits one chunk
    memo.run(estep_params(a, ctx.shift), 1, visit=np.arange(n))
    deletes, pairs = np.array([1, 5]), np.array([[0, 2], [3, 4], [2, 6], [0, 7]])
    pa = _params(a, ctx.shift, deletes, pairs, k)
    got = memo.run_moves(pa, 2)
    assert _visited(memo, 2) == set(range(n))  # nothing kept yet: a full pass
    _same_round(got, tree_reduce([move_kernel(h, pa) for h in ctx.handles]))

    memo.run(estep_params(b, ctx.shift), 3, visit=np.array([0, 5, 9]))
    pc = _params(c, ctx.shift, deletes, pairs[[3, 0]], k)  # a subset of the pairs, in another order
    got = memo.run_moves(pc, 4)
    fresh = _visited(memo, 4)
    assert fresh == {0, 5, 9}  # the chunks changed since (one of them is also the regular share)
    # a kept share is the round's own result for its chunk, the rows of the pairs asked for picked out
    # (no pair touches a deleted component, so the kept pairs' rows are the pairs' rows)
    kept_a = [_rows(move_kernel(h, pa), [3, 0]) for h in ctx.handles]
    _same_round(got, tree_reduce([move_kernel(h, pc) if i in fresh else kept_a[i]
                                  for i, h in enumerate(ctx.handles)]))

    # a permutation of the components: the kept shares follow (the delete proposal's statistics too)
    order = np.random.default_rng(3).permutation(k)
    memo.relabel(order)
    inv = np.argsort(order)
    perm = m_step(got.stats.take(order), ctx.prior, ctx.reg_covar)  # any posterior in the new indexing
    pp = _params(perm, ctx.shift, np.sort(inv[deletes]), inv[pairs[[0]]], k)
    got = memo.run_moves(pp, 5)
    again = _visited(memo, 5)
    assert len(again) == 1
    keep_old, keep_new = np.setdiff1d(np.arange(k), deletes), pp.keep
    pos = np.full(k, -1)
    pos[keep_old] = np.arange(keep_old.size)
    want = []
    for i, h in enumerate(ctx.handles):
        if i in again:
            want.append(move_kernel(h, pp))
            continue
        src = _rows(move_kernel(h, pc), [1]) if i in fresh else _rows(kept_a[i], [1])
        want.append(type(src)(src.stats.take(order), src.log_norm, src.h, src.alt.take(pos[order[keep_new]]),
                              src.alt_h))
    _same_round(got, tree_reduce(want))


def _rows(res, rows):
    """A round's result with the pairs' rows ``rows`` only."""
    return type(res)(res.stats, res.log_norm, res.h[rows], res.alt, res.alt_h[rows])


def test_a_proposal_the_kept_shares_do_not_serve_takes_a_full_pass():
    ctx, (a, b, c) = _context("diag")
    n, k = len(ctx.handles), a.n_components
    memo = MemoStats(ctx, 0.25)
    memo.run(estep_params(a, ctx.shift), 1, visit=np.arange(n))
    memo.run_moves(_params(a, ctx.shift, np.array([1, 5]), [[0, 2]], k), 2)
    for it, (deletes, pairs) in enumerate([(np.array([1]), [[0, 2]]),  # another delete set
                                           (np.array([1]), [[0, 3]])], start=3):  # a pair not kept
        pc = _params(c, ctx.shift, deletes, pairs, k)
        _same_round(memo.run_moves(pc, it), tree_reduce([move_kernel(h, pc) for h in ctx.handles]))
        assert _visited(memo, it) == set(range(n))
    memo.relabel(np.arange(k - 1))  # not a permutation (a pruned component): the shares are gone
    assert memo.rounds.k == -1 and all(p is None for p in memo.rounds.parts)


def _refresh(first, grown, engine="local", **kw):
    m = VBMixture(engine=engine, warm_start=True, **{**KW, "n_components": first.prior_.n_components, **kw})
    m.posterior_, m.prior_, m.warm_state_ = first.posterior_, first.prior_, first.warm_state_
    m.n_features_in_ = grown.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return m.fit(grown)


def _grown():
    """12 planted classes and 15 far, tight rows: a component the delete proposal always names (it holds
    under a tenth of the mean count) and the bound always keeps (its rows are far from every other)."""
    x, _ = planted_blobs(n=3985, d=8, k=12, seed=19)
    rng = np.random.default_rng(4)
    far = x.mean(0) + 40 * x.std() + rng.normal(scale=0.5, size=(15, 8))
    x = np.concatenate([x, far])
    return x[rng.permutation(len(x))].astype(np.float32)


GROWN = _grown()
MOVES = dict(grow=True, max_iter=200, tol=1e-4, chunk_rows=250, n_components=24,
             weight_concentration_prior_type="dirichlet_process")


def test_a_refresh_round_on_the_first_fits_shares_resumes_and_runs_on_dask_with_the_same_bits(
        tmp_path, client, monkeypatch):
    """The first fit ends on a round whose delete proposal (the far component) was refused; after an
    append the refresh's round proposes it again and is served by that round's kept shares (it visits
    fewer chunks than the store has), and the refresh cut after its first iteration and resumed, or
    run on Dask, gives the uninterrupted one's bits."""
    first = _fit(GROWN[:3700], learner_options={"memo": 1.0}, **MOVES)
    assert first.converged_
    visited: list[int] = []

    def spied(chunk, old, params):
        visited.append(-1 if params.keep is None else len(params.keep))
        return memo_move_kernel(chunk, old, params)

    monkeypatch.setattr(memo_module, "memo_move_kernel", spied)
    kw = {**MOVES, "learner_options": {"memo": 0.25}}
    reference = _refresh(first, GROWN, **kw)
    assert reference.converged_ and reference.adopted_chunks_ == 14  # chunk 14 filled, 15 is new
    assert first.n_effective_ == reference.n_effective_ == 13
    k = reference.posterior_.n_components  # one round, with a delete proposal of one component
    assert visited == [k - 1] * len(visited) and 0 < len(visited) < 16, visited  # not a full pass
    where = str(tmp_path / "ckpt")
    _refresh(first, GROWN, **{**kw, "max_iter": 1, "checkpoint_dir": where, "checkpoint_every": 1})
    resumed = _refresh(first, GROWN, **kw, checkpoint_dir=where, checkpoint_every=1)
    assert resumed.resumed_from_.endswith("ckpt-00000001")
    same_fit_bits(resumed, reference)
    same_fit_bits(_refresh(first, GROWN, client, **kw), reference)


@pytest.mark.parametrize("cov", ["diag", "full"])
def test_a_round_that_accepts_moves_keeps_each_chunks_statistics_of_the_accepted_q_z(monkeypatch, cov):
    """A round that accepts merges or a deletion applies its choice to each chunk's regular statistics
    and share (:meth:`pipeline.fit.learners.moves.Moves.replay`): the chunks' kept statistics then sum
    to the round's chosen ones (to rounding), so the next iteration visits a regular share, not every
    chunk; the bound stays monotone and the fit ends where memo=1 (full passes) ends."""
    from pipeline.fit.learners.moves import Moves

    seen = {"replays": 0, "after": []}
    choose, replay, run = Moves.choose, MemoStats.replay, MemoStats.run
    chosen = {}

    def spied_choose(self, *args, **kw):
        chosen["stats"] = choose(self, *args, **kw)
        return chosen["stats"]

    def checked_replay(self, apply):
        replay(self, apply)
        total = self.total().stats
        for name in ("nk", "mean", "scatter"):
            np.testing.assert_allclose(getattr(total, name), getattr(chosen["stats"], name), rtol=1e-9,
                                       atol=1e-9 * float(np.abs(getattr(total, name)).max()))
        assert total.sum_rlogr == pytest.approx(chosen["stats"].sum_rlogr, rel=1e-12)
        seen["replays"] += 1
        seen["next"] = True

    def spied_run(self, params, iteration, visit=None):
        if seen.pop("next", False):
            seen["after"].append(int(self.choose(iteration).size if visit is None else len(visit)))
        return run(self, params, iteration, visit=visit)

    monkeypatch.setattr(Moves, "choose", spied_choose)
    monkeypatch.setattr(MemoStats, "replay", checked_replay)
    monkeypatch.setattr(MemoStats, "run", spied_run)
    opts = dict(KW, n_components=14, covariance_type=cov, grow=True, prior_defaults="empirical", tol=1e-4,
                max_iter=300)
    fit = _fit(X, **opts, learner_options={"memo": 0.25, "move_every": 2})
    assert seen["replays"] >= 1 and min(seen["after"]) < 16  # 16 chunks: no full pass after the round
    lb = np.asarray(fit.lower_bounds_)
    assert np.all(np.diff(lb) >= -1e-9 * np.abs(lb[1:]))
    monkeypatch.undo()
    full = _fit(X, **opts, learner_options={"memo": 1.0, "move_every": 2})
    assert fit.n_effective_ == full.n_effective_
    assert fit.lower_bound_ == pytest.approx(full.lower_bound_, rel=1e-4)
