"""Merge and delete moves (vbcore.moves.exact, pipeline.fit.learners.moves): exact ELBO changes against
brute-force recomputation, acceptance only when the exact ELBO rises, and the learner integration."""

from __future__ import annotations

import numpy as np
import pytest

from tests._reference import planted_blobs as _planted
from tests._reference import same_fit_bits as _same_bits
from tests._reference import stats_of as _stats
from vbcore.kernels.estep import estep_params, log_rho, normalise, prepare_chunk, vbem_kernel
from vbcore.model.elbo import elbo_terms
from vbcore.model.mstep import m_step
from vbcore.model.priors import default_prior
from vbcore.moves.estep_pass import MoveParams, move_kernel, pair_entropy
from vbcore.moves.exact import (
    apply_merges,
    component_terms,
    delete_candidates,
    merge_gain_bound,
    propose_pairs,
    reindex_pairs,
    removes_components,
    select_merges,
    total_elbo,
    weight_terms,
)

COV_TYPES = ["full", "diag", "spherical", "fixed"]
WEIGHT_TYPES = ["dirichlet_process", "dirichlet_distribution"]


def _data(seed: int = 0, n: int = 400, d: int = 3, k: int = 6):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(k, d))
    x = centres[rng.integers(0, k, size=n)] + rng.normal(size=(n, d))
    logits = rng.normal(scale=2.0, size=(n, k))
    resp = np.exp(logits - logits.max(1, keepdims=True))
    resp /= resp.sum(1, keepdims=True)
    return x, resp


def _prior(x: np.ndarray, ct: str, wt: str, k: int):
    return default_prior(covariance_type=ct, weight_type=wt, n_components=k, data_mean=x.mean(0),
                         data_covariance=np.cov(x.T), weight_concentration=0.5)


def _brute(x, resp, ct, prior, shift, reg=0.0):
    stats = _stats(x, resp, ct, shift)
    return elbo_terms(stats, m_step(stats, prior, reg), prior).total


@pytest.mark.parametrize("wt", WEIGHT_TYPES)
@pytest.mark.parametrize("ct", COV_TYPES)
def test_split_terms_sum_to_the_elbo(ct: str, wt: str) -> None:
    x, resp = _data()
    prior = _prior(x, ct, wt, resp.shape[1])
    stats = _stats(x, resp, ct, x.mean(0))
    post = m_step(stats, prior, 1e-6)
    ref = elbo_terms(stats, post, prior).total
    got = component_terms(stats, post, prior).sum() + weight_terms(stats.nk, prior) - stats.sum_rlogr
    assert got == pytest.approx(ref, rel=1e-12, abs=1e-9)
    assert total_elbo(stats, prior, 1e-6) == pytest.approx(ref, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("wt", WEIGHT_TYPES)
@pytest.mark.parametrize("ct", [*COV_TYPES, "tied"])
def test_merge_change_equals_brute_force(ct: str, wt: str) -> None:
    x, resp = _data(1, n=250, k=5)
    k = resp.shape[1]
    prior = _prior(x, ct, wt, k)
    shift = x.mean(0)
    stats = _stats(x, resp, ct, shift)
    base = _brute(x, resp, ct, prior, shift)
    if ct == "tied":
        assert total_elbo(stats, prior, 0.0) == pytest.approx(base, rel=1e-12)
    pairs = np.array([[a, b] for a in range(k) for b in range(a + 1, k)])
    h = pair_entropy(resp, pairs)
    bound = merge_gain_bound(stats, pairs, prior, 0.0)
    # DP: b leaves the truncation; finite (and 'tied', whose q(Lambda) depends on K): b stays, empty
    remove = removes_components(prior)
    assert remove == (wt == "dirichlet_process" and ct != "tied")
    for (a, b), hab, gab in zip(pairs, h, bound, strict=True):
        merged = resp.copy()
        merged[:, a] += resp[:, b]
        merged[:, b] = 0.0
        if remove:
            merged = np.delete(merged, b, axis=1)
        ref = _brute(x, merged, ct, prior, shift)
        assert gab - hab == pytest.approx(ref - base, abs=1e-9 * max(1.0, abs(base)))
        assert hab >= 0 and gab >= ref - base  # the bound without the entropy change is an upper bound
        got = total_elbo(apply_merges(stats, np.array([[a, b]]), np.array([hab]), remove), prior, 0.0)
        assert got == pytest.approx(ref, abs=1e-9 * max(1.0, abs(base)))


@pytest.mark.parametrize("ct", ["full", "diag", "tied"])
def test_selected_merges_raise_the_exact_elbo_and_only_then(ct: str) -> None:
    # two components sit on one blob: merging them must be accepted; well-separated pairs must not
    rng = np.random.default_rng(2)
    centres = np.array([[0.0, 0.0], [12.0, 0.0], [0.0, 12.0]])
    lab = rng.integers(0, 3, size=600)
    x = centres[lab] + rng.normal(size=(600, 2))
    comp = np.where((lab == 0) & (rng.random(600) < 0.5), 3, lab)  # blob 0 split over components 0, 3
    resp = np.full((600, 4), 0.01)
    resp[np.arange(600), comp] = 0.97
    for wt in WEIGHT_TYPES:
        prior = _prior(x, ct, wt, 4)
        shift = x.mean(0)
        stats = _stats(x, resp, ct, shift)
        pairs = np.array([[a, b] for a in range(4) for b in range(a + 1, 4)])
        h = pair_entropy(resp, pairs)
        accepted, gain = select_merges(stats, pairs, h, prior, 0.0)
        assert accepted.tolist() == [[0, 3]]
        base = _brute(x, resp, ct, prior, shift)
        merged = resp.copy()
        merged[:, 0] += resp[:, 3]
        merged[:, 3] = 0.0
        if removes_components(prior):
            merged = merged[:, :3]
        assert gain > 0
        assert gain == pytest.approx(_brute(x, merged, ct, prior, shift) - base, abs=1e-8)
        # every rejected pair lowers the exact ELBO when merged alone
        for a, b in pairs.tolist():
            if [a, b] == [0, 3]:
                continue
            m = resp.copy()
            m[:, a] += resp[:, b]
            m[:, b] = 0.0
            if removes_components(prior):
                m = np.delete(m, b, axis=1)
            assert _brute(x, m, ct, prior, shift) < base


def test_set_of_merges_is_exact_and_disjoint() -> None:
    rng = np.random.default_rng(3)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    lab = rng.integers(0, 4, size=800)
    x = centres[lab] + rng.normal(size=(800, 2))
    comp = lab * 2 + rng.integers(0, 2, size=800)  # every blob split over two components
    resp = np.full((800, 8), 0.01)
    resp[np.arange(800), comp] = 1.0
    resp /= resp.sum(1, keepdims=True)
    prior = _prior(x, "diag", "dirichlet_process", 8)
    shift = x.mean(0)
    stats = _stats(x, resp, "diag", shift)
    pairs = propose_pairs(stats, m_step(stats, prior), prior, 0.0, neighbours=3, max_pairs=50)
    accepted, gain = select_merges(stats, pairs, pair_entropy(resp, pairs), prior, 0.0)
    assert sorted(map(tuple, accepted.tolist())) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    merged = resp[:, 0::2] + resp[:, 1::2]
    ref = _brute(x, merged, "diag", prior, shift) - _brute(x, resp, "diag", prior, shift)
    assert gain == pytest.approx(ref, abs=1e-8)


@pytest.mark.parametrize("ct", COV_TYPES)
def test_move_kernel_matches_brute_force(ct: str) -> None:
    x, _ = _data(4, n=5000)  # more than one block of rows
    k = 6
    prior = _prior(x, ct, "dirichlet_process", k)
    shift = x.mean(0)
    rng = np.random.default_rng(5)
    resp0 = rng.dirichlet(np.ones(k), size=x.shape[0])
    post = m_step(_stats(x, resp0, ct, shift), prior)
    params = estep_params(post, shift)
    chunk = prepare_chunk(x, shift, ct)
    keep = np.array([0, 2, 3, 5])
    pairs = np.array([[0, 1], [2, 5], [3, 4]])
    kp = reindex_pairs(pairs, keep, k)
    assert kp.tolist() == [[1, 3]]
    res = move_kernel(chunk, MoveParams(params, pairs, keep, kp))
    ref = vbem_kernel(chunk, params)
    np.testing.assert_allclose(res.stats.nk, ref.stats.nk, rtol=1e-12)
    np.testing.assert_allclose(res.stats.scatter, ref.stats.scatter, rtol=1e-9, atol=1e-9)
    assert res.log_norm == pytest.approx(ref.log_norm, rel=1e-12)
    assert res.stats.sum_rlogr == pytest.approx(ref.stats.sum_rlogr, rel=1e-10)
    lr = log_rho(chunk, params)
    resp = normalise(lr)[0]
    np.testing.assert_allclose(res.h, pair_entropy(resp, pairs), rtol=1e-10)
    # the delete proposal: responsibilities re-normalised over the kept components
    renorm = resp[:, keep] / resp[:, keep].sum(1, keepdims=True)
    alt = _stats(x, renorm, ct, shift)
    assert res.alt is not None
    np.testing.assert_allclose(res.alt.nk, alt.nk, rtol=1e-10)
    assert res.alt.sum_rlogr == pytest.approx(alt.sum_rlogr, rel=1e-9)
    np.testing.assert_allclose(res.alt_h, pair_entropy(renorm, kp), rtol=1e-9)


def test_delete_candidates() -> None:
    nk = np.array([100.0, 1.0, 50.0, 0.5, 3.0])
    assert delete_candidates(nk, 0.1, 8).tolist() == [1, 3, 4]
    assert delete_candidates(nk, 0.1, 2).tolist() == [1, 3]
    assert delete_candidates(np.array([1.0, 1.0]), 10.0, 8).tolist() == [0]  # never all
    # components under the floor (emptied by earlier merges, kept by 'tied') are not proposed
    assert delete_candidates(np.array([500.0, 0.0, 3.0, 1e-9, 400.0]), 0.1, 8, floor=1e-6).tolist() == [2]


# ---- the learner option ---------------------------------------------------------------------------
def _fit(x, **kw):
    from pipeline.estimator import VBMixture

    args = dict(n_components=40, covariance_type="diag", max_iter=60, random_state=0, chunk_rows=700,
                weight_concentration_prior=1.0, learner_options={"moves": "merge,delete"})
    args.update(kw)
    return VBMixture(**args).fit(x)


def _occupied(m) -> int:
    """Components holding at least one row's worth of responsibility."""
    return int(np.sum(m.posterior_.mean_precision - m.prior_.mean_precision >= 1.0))


@pytest.mark.parametrize("ct", ["full", "diag", "spherical", "tied"])
def test_vbem_with_moves_recovers_k_and_stays_monotone(ct: str) -> None:
    x, lab = _planted()
    # full: one Cholesky per component and M-step; tied: one M-step per proposed pair (a loaded machine)
    k = 16 if ct in ("full", "tied") else 40
    with_moves = _fit(x, covariance_type=ct, n_components=k)
    h = with_moves.lower_bounds_
    assert np.all(np.diff(h) >= -1e-9 * abs(h[-1]))
    assert with_moves.converged_
    assert _occupied(with_moves) == 8
    if ct in ("full", "tied"):
        return
    without = _fit(x, covariance_type=ct, n_components=k, learner_options={"moves": "none"},
                   max_iter=with_moves.n_iter_)
    assert _occupied(without) > 8  # coordinate ascent alone keeps split classes
    assert with_moves.lower_bound_ > without.lower_bound_


def test_finite_dirichlet_merges_keep_k_components() -> None:
    x, _ = _planted(seed=1)
    m = _fit(x, weight_concentration_prior_type="dirichlet_distribution", weight_concentration_prior=0.1)
    assert m.n_components_ == 40 and _occupied(m) == 8
    assert np.all(np.diff(m.lower_bounds_) >= -1e-9 * abs(m.lower_bound_))


@pytest.mark.parametrize("ct", ["diag", "tied"])
def test_moves_resume_bitwise(tmp_path, ct) -> None:
    x, _ = _planted(seed=2)
    kw = dict(tol=0.0, covariance_type=ct, learner_options={"moves": "merge,delete", "move_every": 4})
    _fit(x, max_iter=7, checkpoint_dir=str(tmp_path), checkpoint_every=7, **kw)  # pairs pending for 8
    resumed = _fit(x, max_iter=14, checkpoint_dir=str(tmp_path), **kw)
    assert resumed.resumed_from_.endswith("ckpt-00000007")
    straight = _fit(x, max_iter=14, **kw)
    _same_bits(resumed, straight)
    # 'tied' keeps all K (merged components stay, empty): moves were accepted if fewer are occupied
    assert (straight.n_components_ if ct != "tied" else _occupied(straight)) < 40


@pytest.mark.parametrize("ct", ["diag", "tied"])
def test_moves_same_bits_on_dask(client, ct) -> None:
    x, _ = _planted(seed=3)
    kw = dict(max_iter=7, covariance_type=ct, learner_options={"moves": "merge,delete", "move_every": 3})
    local = _fit(x, **kw)
    assert (local.n_components_ if ct != "tied" else _occupied(local)) < 40
    _same_bits(_fit(x, engine=client, **kw), local)


@pytest.mark.parametrize(("opts", "match"), [
    ({"moves": "split"}, r"option 'moves' of 'vbem' must be 'none' or a comma-separated subset"),
    ({"moves": "merge", "move_every": 0}, r"option 'move_every' of 'vbem' must be an integer >= 1"),
    ({"moves": "delete", "delete_share": 2}, r"option 'delete_share' of 'vbem' must be in \(0, 1\]"),
])
def test_bad_move_options(opts, match) -> None:
    from pipeline.estimator import VBMixture
    from vbcore.errors import ConfigError

    model = VBMixture(3, learner_options=opts)
    with pytest.raises(ConfigError, match=match):
        model.fit(np.zeros((5, 2)))
    assert not hasattr(model, "posterior_")


def test_quick_study_writes_its_tables(tmp_path) -> None:
    from pipeline.studies import read_table, run_study

    folder = run_study("moves", tmp_path, quick=True)
    columns, rows = read_table(folder / "results")
    assert columns[:5] == ["data", "classes", "truncation", "learner", "moves"] and len(rows) == 4
    cost_columns, cost = read_table(folder / "cost")
    assert cost_columns[-1] == "ratio" and len(cost) == 2 and all(float(r[-1]) > 0 for r in cost)
    assert (folder / "README.md").read_text().count("| digits |") == 6 and (folder / "elbo.png").exists()


@pytest.mark.parametrize("ct", ["full", "diag"])
def test_move_kernel_on_strict_arrays_matches_numpy(ct: str) -> None:
    xps = pytest.importorskip("array_api_strict")
    x, _ = _data(7, n=600)
    prior = _prior(x, ct, "dirichlet_process", 6)
    shift = x.mean(0)
    post = m_step(_stats(x, np.random.default_rng(8).dirichlet(np.ones(6), size=600), ct, shift), prior)
    pairs = np.array([[0, 1], [2, 5]])
    keep = np.array([0, 1, 3, 4])
    params = MoveParams(estep_params(post, shift), pairs, keep, reindex_pairs(pairs, keep, 6))
    ref = move_kernel(prepare_chunk(x, shift, ct), params)
    flags = {"boolean_indexing": False, "data_dependent_shapes": False, "enabled_extensions": ()}
    with xps.ArrayAPIStrictFlags(**flags):
        got = move_kernel(prepare_chunk(xps.asarray(x), shift, ct), params)
    assert got.alt is not None and ref.alt is not None
    for a, b in ((got.stats, ref.stats), (got.alt, ref.alt)):
        np.testing.assert_allclose(a.nk, b.nk, rtol=1e-12)
        np.testing.assert_allclose(a.scatter, b.scatter, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got.h, ref.h, rtol=1e-10)
    np.testing.assert_allclose(got.alt_h, ref.alt_h, rtol=1e-10)


def test_cli_fit_with_moves(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from pipeline.cli import app

    runner = CliRunner()
    store = tmp_path / "d.zarr"
    assert runner.invoke(app, ["ingest", "digits", "--out", str(store)]).exit_code == 0
    bad_run = str(tmp_path / "bad")
    bad = runner.invoke(app, ["fit", str(store), "--run-dir", bad_run, "-o", "moves=split", "-q"])
    assert bad.exit_code == 2 and "option 'moves' of 'vbem' must be 'none' or a comma-separated" in bad.output
    run = tmp_path / "run"
    args = ["fit", str(store), "--run-dir", str(run), "-k", "30", "--covariance", "diag", "--max-iter", "12",
            "-o", "moves=merge,delete", "-o", "move_every=3", "-q"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    result = json.loads((run / "result.json").read_text())
    assert result["n_components_kept"] < 30


@pytest.mark.parametrize("kinds", ["merge", "delete", "merge,delete"])
def test_a_round_keeps_the_best_exact_elbo(kinds: str) -> None:
    """A move round on real chunks: its statistics are the brute-force statistics of the chosen
    q(Z), and their exact ELBO is at least that of the regular E-step (strictly higher when a move
    is kept)."""
    from types import SimpleNamespace

    from pipeline.engine.engines import LocalEngine
    from pipeline.fit.learners import learner_class
    from pipeline.fit.learners.moves import Moves

    rng = np.random.default_rng(9)
    centres = np.array([[0.0, 0.0], [9.0, 0.0], [0.0, 9.0]])
    lab = rng.integers(0, 3, size=900)
    x = centres[lab] + rng.normal(size=(900, 2))
    comp = np.where((lab == 0) & (rng.random(900) < 0.5), 3, lab)  # blob 0 split over 0 and 3
    comp = np.where(rng.random(900) < 0.01, 4, comp)  # a few stray rows in component 4
    resp = np.full((900, 5), 1e-3)
    resp[np.arange(900), comp] = 1.0
    resp /= resp.sum(1, keepdims=True)
    prior = _prior(x, "diag", "dirichlet_process", 5)
    shift = x.mean(0)
    post = m_step(_stats(x, resp, "diag", shift), prior)
    ctx = SimpleNamespace(engine=LocalEngine(), shift=shift, prior=prior, reg_covar=0.0,
                          handles=[prepare_chunk(x[i:i + 300], shift, "diag") for i in range(0, 900, 300)])
    moves = Moves("vbem", learner_class("vbem").parse_options({"moves": kinds}))
    moves.observe(3, _stats(x, resp, "diag", shift), None, post, prior, 0.0)  # round 4 is due: proposals
    assert ("merge" not in kinds or moves.pairs.tolist()) and ("delete" not in kinds or moves.deletes.size)
    chosen = moves.run(ctx, post)
    regular = ctx.engine.map_reduce(vbem_kernel, ctx.handles, estep_params(post, shift)).stats
    base = total_elbo(regular, prior, 0.0)
    info = moves.last_round
    assert info["merges"] + info["deleted"] > 0 and info["gain"] > 0
    assert total_elbo(chosen, prior, 0.0) == pytest.approx(base + info["gain"], abs=1e-8 * abs(base))
    # brute force: the E-step responsibilities, moved as the round says, give the same statistics
    r = normalise(log_rho(prepare_chunk(x, shift, "diag"), estep_params(post, shift)))[0]
    if info["deleted"]:
        keep = np.setdiff1d(np.arange(5), moves.deletes)
        r = r[:, keep] / r[:, keep].sum(1, keepdims=True)
    for a, b in moves.accepted.tolist():
        r[:, a] += r[:, b]
    r = np.delete(r, moves.accepted[:, 1], axis=1)
    ref = _stats(x, r, "diag", shift)
    np.testing.assert_allclose(chosen.nk, ref.nk, rtol=1e-10)
    np.testing.assert_allclose(chosen.mean, ref.mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(chosen.scatter, ref.scatter, rtol=1e-8, atol=1e-8)
    assert chosen.sum_rlogr == pytest.approx(ref.sum_rlogr, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("wt", WEIGHT_TYPES)
def test_tied_low_rank_gain_equals_full_recomputation_with_reg_covar(wt: str) -> None:
    """'tied' merges are evaluated by a rank-2 update of the shared scale matrix; with reg_covar > 0
    its Tr W term counts too. Against the ELBO of the merged statistics' own M-step."""
    x, resp = _data(10, n=300, d=4, k=6)
    prior = _prior(x, "tied", wt, 6)
    stats = _stats(x, resp, "tied", x.mean(0))
    pairs = np.array([[a, b] for a in range(6) for b in range(a + 1, 6)])
    for reg in (0.0, 0.05):
        base = total_elbo(stats, prior, reg)
        ref = [total_elbo(apply_merges(stats, p[None], np.zeros(1), False), prior, reg) - base for p in pairs]
        np.testing.assert_allclose(merge_gain_bound(stats, pairs, prior, reg), ref, rtol=1e-9,
                                   atol=1e-9 * abs(base))
