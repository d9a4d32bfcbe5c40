"""A warm start without memoized statistics knows the chunks the previous fit did not have (issue 52,
deliver 6): VB EM keeps a store's chunk keys (its CRC-32Cs) in its state, a warm start compares them
with its own, and its worst-rows birth check (:mod:`pipeline.fit.learners.outliers`) reads only the new
chunks, as the memoized refresh does (the fit it refreshes checked the others): at the SUN397 shape
that check is an exact E-step over every row, a large share of a truncated refresh. The mask goes
through checkpoints, so a refresh resumed from any of them ends with the uninterrupted one's bits.
"""

import json
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.fit.learners.vbem.learner import CHUNK_KEYS, FRESH
from pipeline.service import fit_run, read_spec
from pipeline.store.features import FeatureStore
from tests._reference import planted_blobs

X, _ = planted_blobs(n=3000, d=8, k=12, seed=5)
X = X.astype(np.float32)
KW = dict(n_components=20, covariance_type="diag", random_state=0, chunk_rows=250, tol=1e-4, max_iter=200,
          grow=True, prior_defaults="empirical", init_params="k-means++-projected")


def _fit(model, data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.fit(data)


def test_a_warm_start_on_a_grown_store_checks_only_the_new_chunks_for_worst_rows(monkeypatch, tmp_path):
    import pipeline.fit.learners.outliers as outliers

    store = tmp_path / "s.zarr"
    FeatureStore.create(store, X.shape[1], chunk_rows=250).append(X[:2750])
    first = _fit(VBMixture(**KW), str(store))
    assert first.warm_state_ is not None and first.warm_state_[CHUNK_KEYS].size == 11
    FeatureStore.open(store, "r+").append(X[2750:])
    read = []
    worst_rows = outliers.worst_rows
    monkeypatch.setattr(outliers, "worst_rows", lambda ctx, params, means, chunks=None: read.append(
        len(ctx.handles) if chunks is None else chunks.size) or worst_rows(ctx, params, means, chunks))

    def refresh(data, state):
        read.clear()
        m = VBMixture(**{**KW, "n_components": first.prior_.n_components}, warm_start=True)
        m.posterior_, m.prior_, m.warm_state_ = first.posterior_, first.prior_, state
        m.n_features_in_, m.lower_bound_ = X.shape[1], first.lower_bound_
        return _fit(m, data), list(read)

    warm, reads = refresh(str(store), first.warm_state_)
    assert reads and set(reads) == {1}  # the one new chunk
    plain, plain_reads = refresh(str(store), None)  # no keys: every chunk, as before
    assert plain_reads and set(plain_reads) == {12}
    assert warm.n_effective_ == plain.n_effective_
    assert abs(warm.lower_bound_ - plain.lower_bound_) <= 1e-6 * abs(plain.lower_bound_)
    _, array_reads = refresh(X, first.warm_state_)  # in-memory rows: no store keys, every chunk
    assert array_reads and set(array_reads) == {12}


def test_a_truncated_warm_start_takes_the_candidate_sets_of_its_unchanged_chunks(tmp_path):
    """With the truncated E-step, the warm start's first pass searches from the previous fit's
    candidate sets on the unchanged chunks (only the new rows score every cluster): fewer evaluations
    than the exact first pass of a warm start without them, the same clusters and bound."""
    from pipeline.fit.learners.truncated import TruncatedEStep

    store = tmp_path / "s.zarr"
    FeatureStore.create(store, X.shape[1], chunk_rows=250).append(X[:2750])
    kw = {**KW, "learner_options": {"candidates": 3}}
    first = _fit(VBMixture(**kw), str(store))
    assert first.warm_state_["trunc_idx"].shape == (2750, 3)
    FeatureStore.open(store, "r+").append(X[2750:])
    first_pass = []
    run = TruncatedEStep.run

    def spied(self, post, iteration, hook=None):
        out = run(self, post, iteration, hook)
        first_pass.append((post.n_components, out.evaluations))
        return out

    def refresh(state):
        first_pass.clear()
        m = VBMixture(**{**kw, "n_components": first.prior_.n_components}, warm_start=True)
        m.posterior_, m.prior_, m.warm_state_ = first.posterior_, first.prior_, state
        m.n_features_in_, m.lower_bound_ = X.shape[1], first.lower_bound_
        return _fit(m, str(store)), first_pass[0]

    mp = pytest.MonkeyPatch()
    mp.setattr(TruncatedEStep, "run", spied)
    try:
        warm, (_, evals) = refresh(first.warm_state_)
        plain, (_, evals0) = refresh(None)
    finally:
        mp.undo()
    assert evals < 0.6 * evals0  # the old rows search from their candidate sets, not every cluster
    assert warm.n_effective_ == plain.n_effective_
    assert abs(warm.lower_bound_ - plain.lower_bound_) <= 1e-5 * abs(plain.lower_bound_)


def _run(*args):
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def _posterior(run):
    with np.load(run / "posterior.npz") as z:
        return {k: z[k] for k in z.files if k != "meta"}


@pytest.mark.parametrize("opts", [[], ["-o", "candidates=3"]])
def test_a_warm_refresh_without_memo_resumed_from_each_checkpoint_ends_as_the_uninterrupted_one(tmp_path, opts):
    """The new-chunk mask (and the adopted candidate sets) are learner state: each checkpoint of the
    refresh, alone in a run directory, resumed, gives the uninterrupted refresh's posterior bits (and
    result.json's iterations)."""
    store = tmp_path / "s.zarr"
    FeatureStore.create(store, X.shape[1], chunk_rows=250).append(X[:2750])
    first = ["-k", "20", "--covariance", "diag", "--seed", "0", "-q", *opts]
    _run("fit", str(store), "--run-dir", str(tmp_path / "r1"), *first)
    FeatureStore.open(store, "r+").append(X[2750:])
    full = tmp_path / "full"
    _run("fit", str(store), "--run-dir", str(full), "--warm-from", str(tmp_path / "r1"), "--tol", "1e-6",
         "--checkpoint-every", "1", "--keep", "1000", "-q")
    checkpoints = sorted((full / "checkpoints").glob("ckpt-*"))
    n_iter = json.loads((full / "result.json").read_text())["n_iter"]
    assert len(checkpoints) == n_iter >= 2
    with np.load(checkpoints[0] / "state.npz") if (checkpoints[0] / "state.npz").exists() else \
            np.load(next(checkpoints[0].glob("*.npz"))) as z:
        assert np.asarray(z["learner." + FRESH]).tolist() == [False] * 11 + [True]
    want = _posterior(full)
    for ckpt in checkpoints[:-1]:
        run = tmp_path / ckpt.name
        shutil.copytree(full / "warm_start", run / "warm_start")
        shutil.copy(full / "run.json", run / "run.json")
        shutil.copytree(ckpt, run / "checkpoints" / ckpt.name)
        fit_run(run, read_spec(run))  # `vbcluster resume RUN` in process
        got = _posterior(run)
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
        assert json.loads((run / "result.json").read_text())["n_iter"] == n_iter
