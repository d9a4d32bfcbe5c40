"""The learner interface, state in and state out (issue 54): the state a step returns is frozen, the
same state gives the same step, every learner's state round-trips through a checkpoint's arrays,
the driver knows no learner, and the stop request belongs to the run."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.engine.engines import LocalEngine
from pipeline.fit import driver
from pipeline.fit.checkpoint import MANIFEST, MANIFEST_SHA, manifest_digest
from pipeline.fit.driver import CountingEngine, StopRequest, stop_on_signals
from pipeline.fit.learners import learner_class, learner_names, make_learner
from pipeline.fit.learners.state import FitState
from pipeline.fit.setup import initial_posterior, open_source, setup
from vbcore.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
rng = np.random.default_rng(0)
X = np.concatenate([rng.normal(c, 1.0, size=(150, 3)) for c in (0.0, 5.0, 10.0, -5.0)])


def _options(name: str, **more: object) -> dict[str, object]:
    cls = learner_class(name)
    return {**({"minibatch": 200} if "minibatch" in cls.options else {}), **more}


def _begun(name: str, **opts: object):
    """A learner on X and its first state (as the driver builds them), and the fit's prior."""
    cls = learner_class(name)
    cov = None if cls.default_covariance is not None else "diag"
    model = VBMixture(6, covariance_type=cov, tol=0.0, random_state=0, learner=name,
                      learner_options=_options(name, **opts))
    spec = model.spec()
    ctx = setup(spec, open_source(X, 100), CountingEngine(LocalEngine(threads=1)), 0)
    prior = ctx.prior
    learner = make_learner(spec.learner, ctx, spec.learner_options)
    own = learner.initialise()
    own = initial_posterior(spec, ctx, None, 0) if own is None else own
    return learner, learner.begin(own), prior


def _same(a: FitState, b: FitState) -> bool:
    x, y = a.to_arrays(), b.to_arrays()
    return x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("name", ["vbem", "sga-f"])
def test_the_state_a_step_returns_is_frozen(name):
    learner, state, _ = _begun(name)
    new = learner.advance(state).state
    assert new.iteration == 1 and new is not state and new.learner.frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.iteration = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.learner.growth = None
    if name == "vbem":  # nested states too
        with pytest.raises(dataclasses.FrozenInstanceError):
            new.learner.growth.truncation = 99
    else:  # and their arrays
        assert not new.learner.sticks.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            new.learner.sticks[0] = 0.5
    learner.close()


@pytest.mark.parametrize("name, opts", [("vbem", {}), ("vbem", {"accelerate": True}), ("sga-f", {}),
                                        ("sga-m", {}), ("mm", {}), ("svi", {})])
def test_a_step_from_the_same_state_gives_the_same_bits(name, opts):
    """The learner's objects moved on after the first step from ``s``; the second is handed ``s``
    again and restores it first: the same new state and bound, bit for bit."""
    learner, state, _ = _begun(name, **opts)
    for _ in range(3):
        state = learner.advance(state).state
    first = learner.advance(state)
    learner.advance(first.state)  # the objects move further on
    again = learner.advance(state)
    assert again.terms == first.terms and again.se == first.se
    assert _same(again.state, first.state)
    learner.close()


@pytest.mark.parametrize("name", learner_names())
def test_every_learners_state_round_trips_through_arrays(name):
    learner, state, prior = _begun(name)
    for _ in range(3):
        state = learner.advance(state).state
    arrays = state.to_arrays()
    back = FitState.from_arrays(arrays, prior, state.iteration, learner.state_type)
    assert type(back.learner) is type(state.learner) and back.learner.frozen
    assert back.iteration == state.iteration and back.prior.n_components == state.prior.n_components
    assert _same(back, state)
    assert all(a.dtype == np.float64 for k, a in arrays.items() if k.startswith("state.")
               and a.dtype.kind == "f")  # (no float32 copy on the way)
    learner.close()


def test_a_checkpoint_of_the_old_state_format_is_refused_in_one_line(tmp_path):
    kw = dict(covariance_type="diag", tol=0.0, random_state=0, checkpoint_dir=str(tmp_path))
    VBMixture(4, max_iter=3, **kw).fit(X)
    manifest_path = sorted(tmp_path.glob("ckpt-*"))[-1] / MANIFEST
    body = json.loads(manifest_path.read_text())
    del body["state_format"]  # what vbcluster wrote before the learners' state became named fields
    body[MANIFEST_SHA] = manifest_digest(body)
    manifest_path.write_text(json.dumps(body))
    with pytest.raises(ConfigError) as err:
        VBMixture(4, max_iter=6, **kw).fit(X)
    text = str(err.value)
    assert "\n" not in text and str(manifest_path.parent) in text and "state format 2" in text


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports (``from package import module`` counts the module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names
                       if importlib.util.find_spec(node.module) is not None
                       and importlib.util.find_spec(node.module).submodule_search_locations is not None
                       and importlib.util.find_spec(f"{node.module}.{a.name}") is not None)
    return out


def test_the_driver_imports_no_learner_module():
    """The registry, the interface (base) and the state module are all the driver knows."""
    allowed = {"pipeline.fit.learners", "pipeline.fit.learners.base", "pipeline.fit.learners.state"}
    names = _imported(ROOT / "pipeline" / "fit" / "driver.py")
    learners = {n for n in names if n == "pipeline.fit.learners" or n.startswith("pipeline.fit.learners.")}
    assert "pipeline.fit.learners" in learners and learners <= allowed, sorted(learners - allowed)
    # the check sees a learner module imported from the package
    assert "pipeline.fit.learners.vbem" in _imported_source("from pipeline.fit.learners import vbem\n")


def _imported_source(text: str) -> set[str]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(text)
    try:
        return _imported(Path(f.name))
    finally:
        Path(f.name).unlink()


def test_the_stop_request_is_the_runs_own():
    """No module-level stop request: each ``stop_on_signals`` block makes its own, and a fit reads
    the one it is handed."""
    assert not [k for k, v in vars(driver).items() if isinstance(v, StopRequest)]
    with stop_on_signals() as one, stop_on_signals() as two:
        assert isinstance(one, StopRequest) and one is not two
        one(15)
        assert one.signum == 15 and two.signum is None
    stop = StopRequest()
    seen = []

    def at_two(info):
        seen.append(info["iteration"])
        if info["iteration"] == 2:
            stop.signum = 15

    from vbcore.errors import FitInterrupted

    with pytest.raises(FitInterrupted, match="interrupted after iteration 2"):
        VBMixture(4, covariance_type="diag", tol=0.0, max_iter=10, random_state=0).fit(X, callback=at_two,
                                                                                        stop=stop)
    assert seen == [1, 2]
    model = VBMixture(4, covariance_type="diag", tol=0.0, max_iter=4, random_state=0).fit(X)
    assert model.n_iter_ == 4  # another fit, not handed that request, runs on
