"""The learner interface: registry, options, the per-iteration callback, checkpointed learner state."""

from dataclasses import dataclass

import numpy as np
import pytest
from sklearn.datasets import load_iris
from typer.testing import CliRunner

from pipeline import VBMixture
from pipeline.cli import app
from pipeline.fit.learners import LEARNERS, FitContext, Learner, learner_class, register
from pipeline.fit.learners.vbem.learner import VBEM, VBEMState
from vbcore.errors import ConfigError

X, _ = load_iris(return_X_y=True)


class _Opts(Learner):
    name = "opts-test"
    options = {"eta": 0.1, "batch": 100, "momentum": True, "kind": "a"}


def test_vbem_is_registered():
    assert LEARNERS["vbem"] is VBEM and learner_class("vbem") is VBEM


def test_unknown_learner_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"unknown learner 'nope' \(known: .*vbem"):
        VBMixture(3, learner="nope").fit(X)


def test_register_twice_is_refused():
    with pytest.raises(ValueError, match="learner 'vbem' is registered twice"):
        register("vbem")(_Opts)


def test_options_take_the_type_of_their_default():
    opts = _Opts.parse_options({"eta": "0.5", "batch": "4000", "momentum": "false", "kind": 3})
    assert opts == {"eta": 0.5, "batch": 4000, "momentum": False, "kind": "3"}
    assert _Opts.parse_options({}) == _Opts.options


@pytest.mark.parametrize("options, message", [
    ({"etaa": 1}, r"learner 'opts-test' has no option 'etaa'; its options: batch, eta, kind, momentum"),
    ({"eta": "fast"}, r"learner option 'eta' of 'opts-test' must be a number, got 'fast'"),
    ({"eta": float("nan")}, r"learner option 'eta' of 'opts-test' must be a finite number"),
    ({"batch": 2.5}, r"learner option 'batch' of 'opts-test' must be an integer, got 2.5"),
    ({"momentum": "maybe"}, r"learner option 'momentum' of 'opts-test' must be true or false"),
])
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        _Opts.parse_options(options)


def test_vbem_rejects_options_before_fitting():
    model = VBMixture(3, learner_options={"eta": 1})
    with pytest.raises(ConfigError, match="learner 'vbem' has no option 'eta'; its options: accelerate, "
                                          "block_rows, candidates, delete_max, .*, prune_below, random_clusters, "
                                          "reorder, search"):
        model.fit(X)
    assert not hasattr(model, "posterior_")
    with pytest.raises(ConfigError, match="learner_options must be a dict, got 'eta=1'"):
        VBMixture(3, learner_options="eta=1").fit(X)


def test_callback_sees_every_iteration():
    seen = []
    model = VBMixture(4, covariance_type="diag", max_iter=15, tol=0, random_state=0)
    model.fit(X, callback=seen.append)
    assert [s["iteration"] for s in seen] == list(range(1, 16))
    assert [s["elbo"] for s in seen] == list(model.lower_bounds_)
    assert all(s["learner"] == "vbem" and s["seconds"] >= 0 and 1 <= s["n_effective"] <= 4 for s in seen)
    assert [s["passes"] for s in seen] == list(range(1, 16)) and model.n_passes_ == 15
    assert seen[-1]["n_effective"] == model.n_effective_


def test_context_rng_depends_on_seed_and_key_only():
    ctx = FitContext(None, [], None, None, np.zeros(1), 0.0, 1, 1, "diag", "dirichlet_process", seed=7)
    a, b = ctx.rng(3).integers(0, 2**31, 5), ctx.rng(3).integers(0, 2**31, 5)
    assert np.array_equal(a, b) and not np.array_equal(a, ctx.rng(4).integers(0, 2**31, 5))


@dataclass
class _CountingState(VBEMState):
    count: np.ndarray | None = None


class _Counting(VBEM):
    """VB EM that also keeps an iteration counter as learner state (exercises own_state/load)."""

    state_type = _CountingState

    def start(self, post):
        super().start(post)
        self.count = np.zeros(1)

    def step(self, iteration):
        self.count = self.count + 1
        return super().step(iteration)

    def own_state(self):
        return _CountingState(**vars(super().own_state()), count=self.count)

    def load(self, post, state):
        super().load(post, state)
        self.count = np.asarray(state.count)


def test_learner_state_goes_through_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setitem(LEARNERS, "counting-test", _Counting)
    kw = dict(covariance_type="diag", tol=0, random_state=0, learner="counting-test",
              checkpoint_dir=str(tmp_path), checkpoint_every=2)
    VBMixture(4, max_iter=6, **kw).fit(X)
    resumed = VBMixture(4, max_iter=10, **kw)
    loaded = {}
    orig = _Counting.load

    def spy(self, post, state):
        loaded.update(count=state.count)
        orig(self, post, state)

    monkeypatch.setattr(_Counting, "load", spy)
    resumed.fit(X)
    assert loaded["count"].tolist() == [6.0] and resumed.n_iter_ == 10
    full = VBMixture(4, max_iter=10, **{**kw, "checkpoint_dir": None}).fit(X)
    assert np.array_equal(full.means_, resumed.means_)
    assert np.array_equal(full.lower_bounds_, resumed.lower_bounds_)


def test_cli_lists_learners_and_rejects_bad_options(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["learners"])
    assert res.exit_code == 0 and "vbem" in res.output
    store = tmp_path / "d.zarr"
    assert runner.invoke(app, ["ingest", "digits", "--out", str(store)]).exit_code == 0
    run = tmp_path / "run"
    res = runner.invoke(app, ["fit", str(store), "--run-dir", str(run), "-o", "eta=1", "-q"])
    assert res.exit_code == 2 and "learner 'vbem' has no option 'eta'" in res.output
    assert not run.exists()  # nothing written
    res = runner.invoke(app, ["fit", str(store), "--run-dir", str(run), "--learner", "nope", "-q"])
    assert res.exit_code == 2 and "unknown learner" in res.output and not run.exists()
