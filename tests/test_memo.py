"""Memoized statistics (issue 28; Hughes & Sudderth 2013): learner option ``memo`` of VB EM.

The global statistics are every chunk's kept statistics reduced over the engines' fixed tree: the
bits of a full recomputation of the same responsibilities, after any visiting order; the bound never
decreases; a resumed fit and a Dask fit give the bits of the uninterrupted in-process one; a warm
start after an append adopts the unchanged chunks' statistics and visits the new ones first; with
the pipeline's births and moves, a memoized fit finds what the fit without memo finds, its kept
statistics stay a full recomputation's bits, and it resumes bitwise.
"""

import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline import VBMixture
from pipeline.cli import app
from pipeline.engine.blas import one_blas_thread
from pipeline.engine.engines import LocalEngine, tree_reduce
from pipeline.fit.driver import CountingEngine
from pipeline.fit.learners.vbem import memo as memo_module
from pipeline.fit.learners.vbem.learner import VBEM, vbem_pass
from pipeline.fit.learners.vbem.memo import MemoStats, memo_move_kernel, take_memo
from pipeline.fit.setup import open_source, setup
from pipeline.store.features import FeatureStore
from tests._reference import planted_blobs, same_fit_bits
from vbcore.data.metrics import nmi
from vbcore.errors import ConfigError
from vbcore.kernels.estep import EStepParams, KernelResult, estep_params, vbem_kernel
from vbcore.moves.estep_pass import move_kernel

RNG = np.random.default_rng(2013)
CENTRES = RNG.normal(0.0, 4.0, size=(6, 5))
X = (CENTRES[RNG.integers(0, 6, 1200)] + RNG.normal(size=(1200, 5))).astype(np.float32)
KW = dict(n_components=8, covariance_type="diag", random_state=0, chunk_rows=100, tol=0.0)


def _fit(X_, engine="local", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return VBMixture(engine=engine, **{**KW, **kw}).fit(X_)


def _same_stats(a, b):
    for name in ("nk", "mean", "scatter"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.sum_rlogr == b.sum_rlogr and a.n_rows == b.n_rows


@pytest.mark.parametrize("cov", ["diag", "full", "tied"])
def test_memoized_statistics_are_the_exact_sum_after_any_visiting_order(cov):
    model = VBMixture(**{**KW, "covariance_type": cov})
    spec = model.spec()
    ctx = setup(spec, open_source(X, 100), CountingEngine(LocalEngine(threads=2)), 0)
    fitted = _fit(X, covariance_type=cov, max_iter=3)
    posts = [fitted.posterior_, _fit(X, covariance_type=cov, max_iter=1).posterior_]
    memo = MemoStats(ctx, 0.3)
    last = {}  # chunk -> the posterior of its last visit
    order = np.random.default_rng(1)
    memo.run(estep_params(posts[0], ctx.shift), 1, visit=np.arange(len(ctx.handles)))
    last.update(dict.fromkeys(range(len(ctx.handles)), 0))
    for it in range(2, 8):
        visit = np.sort(order.choice(len(ctx.handles), size=int(order.integers(1, 5)), replace=False))
        p = it % 2
        got = memo.run(estep_params(posts[p], ctx.shift), it, visit=visit)
        last.update(dict.fromkeys(visit.tolist(), p))
        with one_blas_thread():  # as the engine runs kernels
            want = tree_reduce([vbem_kernel(h, estep_params(posts[last[i]], ctx.shift))
                                for i, h in enumerate(ctx.handles)])
        _same_stats(got.stats, want.stats)
        assert got.log_norm == want.log_norm
    memo.run(estep_params(posts[0], ctx.shift), 9, visit=np.arange(len(ctx.handles)))
    _same_stats(memo.total().stats, vbem_pass(ctx, posts[0]).stats)  # all visited: a full pass's bits


def test_the_memoized_bound_never_decreases_and_full_visits_change_no_bit():
    memo = _fit(X, max_iter=25, reg_covar=0.0, learner_options={"memo": 0.25})
    assert np.all(np.diff(memo.lower_bounds_) >= -1e-9 * abs(memo.lower_bound_))
    every = _fit(X, max_iter=6, learner_options={"memo": 1.0})
    plain = _fit(X, max_iter=6)
    assert np.array_equal(every.means_, plain.means_) and every.lower_bound_ == plain.lower_bound_


def test_resume_and_the_dask_engine_give_the_same_bits(tmp_path, client):
    opts = {"learner_options": {"memo": 0.3}, "checkpoint_every": 2}
    reference = _fit(X, max_iter=6, **opts)
    _fit(X, max_iter=3, checkpoint_dir=str(tmp_path / "a"), **opts)
    resumed = _fit(X, max_iter=6, checkpoint_dir=str(tmp_path / "a"), **opts)
    assert resumed.resumed_from_.endswith("ckpt-00000003")
    on_dask = _fit(X, client, max_iter=6, **opts)
    for got in (resumed, on_dask):
        assert np.array_equal(got.means_, reference.means_) and got.lower_bound_ == reference.lower_bound_
        assert np.array_equal(got.lower_bounds_, reference.lower_bounds_)


def test_a_warm_start_after_an_append_adopts_the_unchanged_chunks(tmp_path):
    store = str(tmp_path / "s.zarr")
    FeatureStore.create(store, 5, chunk_rows=100).append(X[:1050])
    run = CliRunner().invoke
    common = ["-k", "8", "--covariance", "diag", "--seed", "0", "--tol", "1e-5", "-q",
              "--priors", "sklearn", "--init", "kmeans"]  # VBMixture's model and start
    r = run(app, ["fit", store, "--run-dir", str(tmp_path / "r1"), "-o", "memo=1", *common])
    assert r.exit_code == 0, r.output
    FeatureStore.open(store, "r+").append(X[1050:])  # fills the last chunk and adds one
    r = run(app, ["fit", store, "--run-dir", str(tmp_path / "r2"), "--warm-from", str(tmp_path / "r1"),
                  "-o", "memo=0.2", *common])
    assert r.exit_code == 0, r.output
    import json

    res = json.loads((tmp_path / "r2" / "result.json").read_text())
    assert res["adopted_chunks"] == 10  # chunks 0-9; chunk 10 changed, chunk 11 is new
    full = _fit(X, max_iter=200, tol=1e-5, grow=True)  # the command line's growth and moves
    assert res["elbo"] / 1200 == pytest.approx(full.lower_bound_ / 1200, rel=1e-3)


def test_warm_from_takes_the_settings_not_given_from_the_previous_run(tmp_path):
    """`vbcluster fit GROWN --run-dir R2 --warm-from R1` with nothing else (issue 28's command) continues
    R1's model: its -k, covariance, priors, seed and learner options (not its tol or checkpoint
    settings: the fit's own); options given override theirs;
    a setting given that changes the model is refused in one line, and another learner takes none of
    R1's learner options."""
    import json

    store = str(tmp_path / "s.zarr")
    FeatureStore.create(store, 5, chunk_rows=100).append(X[:1050])
    run = CliRunner().invoke
    r = run(app, ["fit", store, "--run-dir", str(tmp_path / "r1"), "-k", "7", "--covariance", "full",
                  "--seed", "3", "--priors", "sklearn", "-o", "memo=1", "-o", "move_every=3", "--tol", "1e-6",
                  "--checkpoint-every", "2", "-q"])
    assert r.exit_code == 0, r.output
    FeatureStore.open(store, "r+").append(X[1050:])
    r = run(app, ["fit", store, "--run-dir", str(tmp_path / "r2"), "--warm-from", str(tmp_path / "r1"),
                  "-o", "memo=0.5", "-q"])
    assert r.exit_code == 0, r.output
    first = json.loads((tmp_path / "r1" / "run.json").read_text())
    spec = json.loads((tmp_path / "r2" / "run.json").read_text())
    assert (spec["components"], spec["covariance"], spec["seed"], spec["priors"]) == (7, "full", 3, "sklearn")
    assert spec["learner_options"] == {**first["learner_options"], "memo": 0.5}
    assert spec["learner_options"]["move_every"] == 3
    assert (spec["tol"], spec["checkpoint_every"]) != (1e-6, 2)  # this fit's own, not the model's
    assert json.loads((tmp_path / "r2" / "result.json").read_text())["adopted_chunks"] == 10
    r = run(app, ["fit", store, "--run-dir", str(tmp_path / "r3"), "--warm-from", str(tmp_path / "r1"),
                  "-k", "9"])
    assert r.exit_code == 2 and not (tmp_path / "r3").exists()
    assert "cannot warm-start from" in r.output and "n_components 7 -> 9" in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = run(app, ["fit", store, "--run-dir", str(tmp_path / "r4"), "--warm-from", str(tmp_path / "r1"),
                  "--learner", "ncg", "--max-iter", "3", "-q"])
    assert r.exit_code == 0, r.output
    options = json.loads((tmp_path / "r4" / "run.json").read_text())["learner_options"]
    assert "memo" not in options and "move_every" not in options


def test_a_memoized_refresh_ends_at_the_warm_full_pass_fit():
    """After an append that moves the posterior, the memoized refresh (memo=0.2) ends at the bound of
    the warm-started full-pass fit: it converges only when a lap over every chunk, the adopted ones
    included, raised the bound by less than tol per row (before: after re-visiting the new chunks
    alone, 0.15% lower)."""
    kw = {**KW, "tol": 1e-6, "max_iter": 500}
    grown = np.concatenate([X, (CENTRES[:2].mean(0) + np.random.default_rng(5).normal(size=(150, 5)))
                            .astype(np.float32)])
    first = _fit(X[:1000], learner_options={"memo": 1.0}, **kw)

    def refresh(opts):
        m = VBMixture(warm_start=True, learner_options=opts, **kw)
        m.posterior_, m.prior_, m.warm_state_ = first.posterior_, first.prior_, first.warm_state_
        m.n_features_in_, m.lower_bound_ = 5, first.lower_bound_
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return m.fit(grown)

    memo, full = refresh({"memo": 0.2}), refresh({})
    assert memo.adopted_chunks_ == 10 and memo.converged_ and full.converged_
    assert memo.lower_bound_ == pytest.approx(full.lower_bound_, rel=1e-5)


def test_memo_options_are_checked():
    with pytest.raises(ConfigError, match=r"learner option 'memo' of 'vbem' must be in \[0, 1\]"):
        _fit(X, learner_options={"memo": 1.5})
    with pytest.raises(ConfigError, match=r"'memo' of 'vbem' .* cannot be combined with 'candidates' > 0"):
        _fit(X, learner_options={"memo": 0.5, "candidates": 2})


# ---- with the pipeline's growth (births) and merge/delete moves (issue 26's defaults) ---------------
PLANTED, PLANTED_LAB = planted_blobs(n=6000, d=16, k=20, seed=11)
PLANTED = PLANTED.astype(np.float32)
GROW = dict(n_components=5, covariance_type="diag", random_state=0, chunk_rows=500, max_iter=200, tol=1e-3,
            grow=True, prior_defaults="empirical", init_params="k-means++-projected")


def test_a_memoized_fit_grows_and_moves_as_the_fit_without_memo():
    """From 5 components to the 20 planted classes by births, as without memoized statistics (before,
    memo switched births and moves off: the fit kept 5 components)."""
    plain = _fit(PLANTED, **GROW)
    memo = _fit(PLANTED, **GROW, learner_options={"memo": 0.25})
    assert memo.truncation_["grew"] >= 2 and memo.converged_
    assert memo.n_effective_ == plain.n_effective_ == 20
    assert nmi(PLANTED_LAB, memo.predict(PLANTED)) > 0.99
    assert memo.lower_bound_ == pytest.approx(plain.lower_bound_, rel=1e-5)
    same_fit_bits(_fit(PLANTED, **GROW, learner_options={"memo": 1.0}), plain)  # every chunk, every iteration


def test_after_births_and_move_rounds_the_kept_statistics_are_a_full_recomputation(monkeypatch):
    """Every chunk's kept statistics, reduced, are the bits of recomputing each chunk's statistics with
    the posterior of its last visit (then the relabellings since), after every iteration where all
    chunks have them: births keep the statistics of their passes, a move round keeps its regular
    statistics when it accepts nothing and invalidates them when it does (the next iteration visits
    every chunk)."""
    log: dict[int, list] = {}  # chunk -> [the E-step (or move) parameters of its last visit, relabellings]
    seen = {"births": 0, "rounds": 0, "checks": 0, "partial": 0}
    visited: list[int] = []
    run, relabel, invalidate, step = MemoStats.run, MemoStats.relabel, MemoStats.invalidate, VBEM.step
    run_moves = MemoStats.run_moves
    snapshot, restore = MemoStats.snapshot, MemoStats.restore

    def logged_run(self, params, iteration, visit=None):
        visit = self.choose(iteration) if visit is None else np.asarray(visit)
        log.update({i: [params] for i in visit.tolist()})
        return run(self, params, iteration, visit=visit)

    def logged_run_moves(self, params, iteration):  # the chunks the round visits (not all: kept shares)
        visited.clear()
        out = run_moves(self, params, iteration)
        index = {id(h): i for i, h in enumerate(self.ctx.handles)}
        log.update({index[c]: [params] for c in visited})
        seen["partial"] += len(visited) < len(self.ctx.handles)
        return out

    def spied_kernel(chunk, old, params):
        visited.append(id(chunk))
        return memo_move_kernel(chunk, old, params)

    def logged_relabel(self, order):
        if self.have.any():
            for i in log:
                log[i].append(np.asarray(order))
        relabel(self, order)

    def logged_invalidate(self):
        log.clear()
        invalidate(self)

    def logged_snapshot(self):  # a birth proposal: refused, the kept states before it come back
        return {i: list(v) for i, v in log.items()}, snapshot(self)

    def logged_restore(self, snap):
        log.clear()
        log.update(snap[0])
        restore(self, snap[1])

    def checked_step(self, iteration):
        grown, rounds = self.growth.grown, self.moves.due(iteration) and not self.growth.pending
        out = step(self, iteration)
        seen["rounds"] += rounds
        if self.memo.have.all():
            want = []
            with one_blas_thread():  # as the engine runs kernels: the bits of a one-thread BLAS
                for i, h in enumerate(self.ctx.handles):
                    p = log[i][0]
                    res = (vbem_kernel(h, p) if isinstance(p, EStepParams)
                           else KernelResult(move_kernel(h, p).stats, 0.0))
                    for order in log[i][1:]:
                        res = take_memo(res, order)
                    want.append(res)
            _same_stats(self.memo.total().stats, tree_reduce(want).stats)
            seen["checks"] += 1
        # (a birth round whose merge-back merged leaves no kept state: the next iteration is checked)
        seen["births"] += self.growth.grown > grown
        return out

    for name, fn in (("run", logged_run), ("run_moves", logged_run_moves), ("relabel", logged_relabel),
                     ("invalidate", logged_invalidate),
                     ("snapshot", logged_snapshot), ("restore", logged_restore)):
        monkeypatch.setattr(MemoStats, name, fn)
    monkeypatch.setattr(VBEM, "step", checked_step)
    monkeypatch.setattr(memo_module, "memo_move_kernel", spied_kernel)
    # (a move round every 2 iterations: the growth rounds reach the 20 classes in a dozen iterations)
    fitted = _fit(PLANTED, **GROW, learner_options={"memo": 0.25, "move_every": 2})
    assert fitted.n_effective_ == 20 and seen["births"] >= 2 and seen["rounds"] >= 2
    assert seen["checks"] >= fitted.n_iter_ // 2
    assert seen["partial"] >= 1  # rounds served by kept shares (vbem.memo_round) are in it


def test_a_memoized_fit_with_births_resumes_and_runs_on_dask_with_the_same_bits(tmp_path, client):
    """Cut after iteration 7 (between births) and 9 (a birth round whose merge-back merged: its
    checkpoint keeps no statistics), resumed: the bits of the uninterrupted fit, as on Dask."""
    kw = {**GROW, "learner_options": {"memo": 0.3}, "checkpoint_every": 1}
    reference = _fit(PLANTED, **kw)
    assert reference.truncation_["grew"] >= 3 and reference.n_iter_ > 9
    for cut in (7, 9):
        where = str(tmp_path / str(cut))
        stopped = _fit(PLANTED, **{**kw, "max_iter": cut}, checkpoint_dir=where)
        assert cut != 7 or 0 < stopped.truncation_["grew"] < reference.truncation_["grew"]
        with np.load(f"{where}/ckpt-{cut:08d}/state.npz") as ckpt:
            have = next(ckpt[k] for k in ckpt.files if k.endswith("memo.have"))
        assert have.all() == (cut == 7)
        resumed = _fit(PLANTED, **kw, checkpoint_dir=where)
        assert resumed.resumed_from_.endswith(f"ckpt-{cut:08d}")
        same_fit_bits(resumed, reference)
    same_fit_bits(_fit(PLANTED, client, **kw), reference)


def test_a_scheduled_cold_fit_keeps_growth_and_moves(tmp_path):
    """refresh_options puts memoized statistics on every scheduled run, the cold first one included
    (memo=1 there: plain VB EM's bits, statistics kept): the spec's births and moves stay on (the
    fit finds the 20 planted classes from 5), for a warm refresh's memo=0.1 as well."""
    from flows.schedule import REFRESH_MEMO, refresh_options
    from pipeline.service import fit_run, make_spec

    assert refresh_options(None, {"moves": "merge"}) == {"moves": "merge", "memo": REFRESH_MEMO}
    assert refresh_options(None, None, cold=True) == {"memo": 1.0}
    store = str(tmp_path / "s.zarr")
    FeatureStore.create(store, PLANTED.shape[1], chunk_rows=500).append(PLANTED)
    for cold in (True, False):
        opts = refresh_options(None, None, cold)
        spec = make_spec(store, components=5, covariance="diag", learner_options=opts)
        res = fit_run(tmp_path / f"run-{cold}", spec)
        assert spec.grow and res["learner_options"]["memo"] == opts["memo"]
        assert res["learner_options"]["moves"] == "merge,delete"
        assert res["truncation"]["grew"] >= 2 and res["n_effective"] == 20


def test_a_warm_start_from_a_fit_that_grew_continues_with_its_truncation(tmp_path):
    """The command line's fit grows from 5 components; after an append, `--warm-from` it (what a
    scheduled refresh runs) continues with the grown posterior and adopts the unchanged chunks'
    statistics (before: 'warm_start: ... n_components 40 -> 5', exit 2)."""
    import json

    store = str(tmp_path / "s.zarr")
    FeatureStore.create(store, PLANTED.shape[1], chunk_rows=500).append(PLANTED[:5000])
    run, common = CliRunner().invoke, ["-k", "5", "--covariance", "diag", "--seed", "0", "-q"]
    r = run(app, ["fit", store, "--run-dir", str(tmp_path / "r1"), "-o", "memo=1", *common])
    assert r.exit_code == 0, r.output
    first = json.loads((tmp_path / "r1" / "result.json").read_text())
    assert first["truncation"]["grew"] >= 2 and first["n_effective"] == 20
    FeatureStore.open(store, "r+").append(PLANTED[5000:])  # two new chunks
    r = run(app, ["fit", store, "--run-dir", str(tmp_path / "r2"), "--warm-from", str(tmp_path / "r1"),
                  "-o", "memo=0.2", *common])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "r2" / "result.json").read_text())
    assert res["adopted_chunks"] == 10 and res["n_effective"] == 20 and res["converged"]


def _refresh_planted(first, kw, opts):
    """A warm start from ``first`` (a fit of the first 5,500 planted rows) refitting all of them."""
    m = VBMixture(**{**kw, "n_components": first.prior_.n_components}, warm_start=True, learner_options=opts)
    m.posterior_, m.prior_, m.warm_state_ = first.posterior_, first.prior_, first.warm_state_
    m.n_features_in_, m.lower_bound_ = PLANTED.shape[1], first.lower_bound_
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.fit(PLANTED)
    return m


def test_a_memoized_refresh_costs_the_new_rows(monkeypatch):
    """After an append of rows like the old ones, the refresh with ``memo_stop='gain'`` (the default)
    visits the new chunk, then makes its move round (right after the new rows are absorbed:
    Moves.round_next; a full pass, or the new chunks and a regular share where the first fit's last
    round kept shares that serve it), then visits fewer chunks than one lap of the store, and ends at
    the warm full-pass fit's bound and clusters; ``memo_stop='lap'`` visits more than a lap."""
    kw = {**GROW, "n_components": 20, "tol": 1e-4}
    first = _fit(PLANTED[:5500], learner_options={"memo": 1.0}, **kw)
    assert first.n_effective_ == 20 and first.converged_
    visits, rounds = [], []
    choose, run_moves = MemoStats.choose, MemoStats.run_moves
    monkeypatch.setattr(MemoStats, "choose", lambda self, it: visits.append(c := choose(self, it)) or c)
    monkeypatch.setattr(MemoStats, "run_moves", lambda self, *a: rounds.append(1) or run_moves(self, *a))

    def refresh(opts):
        visits.clear()
        rounds.clear()
        m = _refresh_planted(first, kw, opts)
        return m, sum(v.size for v in visits), len(rounds)

    (gain, gain_visits, gain_rounds) = refresh({"memo": 0.25})
    (lap, lap_visits, _) = refresh({"memo": 0.25, "memo_stop": "lap"})
    full = refresh({})[0]
    assert gain.adopted_chunks_ == 11 and gain.converged_ and lap.converged_ and full.converged_
    assert gain_visits < 12 < lap_visits, (gain_visits, lap_visits)  # 12 chunks: under one lap; over one
    assert gain_rounds == 1  # a fit converges only after a round that found nothing
    assert gain.n_effective_ == lap.n_effective_ == full.n_effective_ == 20
    for m in (gain, lap):
        assert m.lower_bound_ == pytest.approx(full.lower_bound_, rel=1e-4)
    assert nmi(PLANTED_LAB, gain.predict(PLANTED)) > 0.99


def test_memo_stop_is_checked():
    with pytest.raises(ConfigError, match=r"learner option 'memo_stop' of 'vbem' must be one of"):
        _fit(X, learner_options={"memo": 0.5, "memo_stop": "sometimes"})


def test_a_memoized_refresh_checks_only_its_new_chunks_for_worst_rows(monkeypatch):
    """The worst-rows birth check (pipeline.fit.learners.outliers) of a memoized refresh reads the
    chunks it started without kept statistics (the appended rows; the fit it refreshes checked the
    others), not every chunk: a full pass would cost the refresh what memo saves. A fit from scratch
    with memo, and a refresh without memo, read every chunk."""
    import pipeline.fit.learners.outliers as outliers

    kw = {**GROW, "n_components": 20, "tol": 1e-4}
    first = _fit(PLANTED[:5500], learner_options={"memo": 1.0}, **kw)
    read = []
    worst_rows = outliers.worst_rows
    monkeypatch.setattr(outliers, "worst_rows",
                        lambda ctx, params, means, chunks=None: read.append(
                            len(ctx.handles) if chunks is None else chunks.size) or worst_rows(
                            ctx, params, means, chunks))

    def refresh(opts):
        read.clear()
        return _refresh_planted(first, kw, opts), list(read)

    memo, memo_reads = refresh({"memo": 0.25})
    full, full_reads = refresh({})
    assert memo.adopted_chunks_ == 11 and memo_reads and set(memo_reads) == {1}  # the one new chunk
    assert full_reads and set(full_reads) == {12}
    read.clear()
    _fit(PLANTED[:5500], learner_options={"memo": 1.0}, **kw)
    assert read and set(read) == {11}


def test_the_gain_test_after_first_visits_stands_for_the_chunks_not_visited_yet():
    """``memo_stop='gain'``: a run that visited only adopted chunks this fit had not visited yet (a
    seeded random sample of them) estimates what a full pass would gain over its own rows and the
    ones still not visited, so its gain per unit weight is weighed by that share of the store; any
    other run (a revisit among them, a full pass) by the whole store, as before."""
    spec = VBMixture(**KW).spec()
    ctx = setup(spec, open_source(X, 100), CountingEngine(LocalEngine(threads=2)), 0)
    params = estep_params(_fit(X, max_iter=3).posterior_, ctx.shift)
    first = MemoStats(ctx, 0.25)
    first.run(params, 1, visit=np.arange(12))
    memo = MemoStats(ctx, 0.25)
    assert memo.adopt(first.state(), params.const.shape[0]) == 12
    tol = 1e-3

    def converged(visit, gain_per_row):
        memo.run(params, memo.visited.max() + 1, visit=np.asarray(visit))
        return memo.converged([0.0, gain_per_row * memo.last_weight], tol, 1200.0, 0)

    # six of twelve first visits stand for the whole store: 1.5 tol per row does not pass
    assert not converged(range(6), 1.5 * tol) and memo.stands_for == 1200
    # three more (three still not visited) stand for half the store: 1.5 tol per row passes, 2.5 not
    assert converged([6, 7, 8], 1.5 * tol) and memo.stands_for == 600
    assert not memo.converged([0.0, 2.5 * tol * memo.last_weight], tol, 1200.0, 0)
    # a run that revisits a chunk: the whole store, as the test without first visits
    assert not converged([0, 9], 1.5 * tol) and memo.stands_for == 1200
    assert converged([10, 11], 0.9 * tol) and not converged([10, 11], 1.1 * tol)
