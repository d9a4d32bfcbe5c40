"""The lowrank family end to end: `vbcluster fit --covariance lowrank`, the same bits on the in-process
and the Dask engine, refused where it does not fit yet (in model selection: tests/test_lowrank_select.py)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.engine.engines import DaskEngine, LocalEngine
from pipeline.engine.sources import StoreSource
from pipeline.fit.lowrank import run_lowrank
from pipeline.service import make_spec
from pipeline.store.features import FeatureStore
from tests._reference import planted_subspaces
from vbcore.errors import ConfigError


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Three classes, each its own mean and 2-dimensional subspace in 12 dimensions."""
    x, y = planted_subspaces(3, 12, 300, 2.0, 4.0, 0.3, seed=3)
    path = tmp_path_factory.mktemp("stores") / "planes.zarr"
    s = FeatureStore.create(path, 12, chunk_rows=128, labels=True)
    s.append(x.astype(np.float32), labels=y)
    return str(path)


def test_cli_fit_lowrank_writes_result(store, tmp_path):
    run = tmp_path / "r"
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(run), "--covariance", "lowrank",
                                   "--rank", "2", "-k", "3", "--seed", "0", "-q"])
    assert res.exit_code == 0, res.output
    result = json.loads((run / "result.json").read_text())
    assert result["covariance"] == "lowrank" and result["rank"] == 2
    assert result["elbo"] == pytest.approx(result["elbo_history"][-1])
    assert np.all(np.diff(result["elbo_history"]) >= -1e-6 * abs(result["elbo"]))
    assert result["metrics"]["nmi"] > 0.95
    assert (run / "lowrank.npz").exists() and "lowrank.npz" in res.output
    # (assign, report and the refusals of the faces that cannot read it: tests/test_lowrank_run.py)


def _fit(store, engine):
    spec = make_spec(store, covariance="lowrank", rank=2, components=5, seed=1, max_iter=15, tol=0.0)
    return run_lowrank(spec, StoreSource(store), engine)


def test_same_bits_in_process_and_on_dask(store, client):
    local = _fit(store, LocalEngine())
    dask = _fit(store, DaskEngine(client, persist="always"))
    assert local.history == dask.history
    assert np.array_equal(local.post.loadings, dask.post.loadings)
    assert np.array_equal(local.labels, dask.labels)


@pytest.mark.parametrize("moves", ["auto", "none"])
def test_merges_find_the_planted_classes(store, moves):
    """From K = 8: merge rounds (judged by the exact bound) leave the 3 planted classes; without them
    the bound is lower and the classes stay split. The history never decreases either way."""
    from vbcore.data.metrics import nmi

    spec = make_spec(store, covariance="lowrank", rank=2, components=8, seed=0,
                     learner_options={"moves": moves})
    out = run_lowrank(spec, StoreSource(store), LocalEngine())
    assert np.all(np.diff(out.history) >= 0.0)
    truth = StoreSource(store).labels()
    if moves == "auto":
        assert out.post.n_components == 3 and nmi(truth, out.labels) > 0.99
    else:
        assert out.post.n_components == 8 and nmi(truth, out.labels) < 0.9


def test_resume_from_a_checkpoint_keeps_the_bits(store, tmp_path):
    """A fit stopped after 5 iterations (checkpoint every 2) and resumed ends as the uninterrupted
    one, merges included, on another thread count; a checkpoint of other settings is refused."""
    spec = make_spec(store, covariance="lowrank", rank=2, components=8, seed=0, tol=1e-6, max_iter=40,
                     checkpoint_every=2)
    ref = run_lowrank(spec, StoreSource(store), LocalEngine(threads=1))
    ck = str(tmp_path / "ck")
    from dataclasses import replace

    part = run_lowrank(replace(spec, max_iter=5), StoreSource(store), LocalEngine(threads=1),
                       checkpoint_dir=ck)
    assert len(part.history) == 5 and part.resumed_from is None
    resumed = run_lowrank(spec, StoreSource(store), LocalEngine(threads=2), checkpoint_dir=ck)
    assert resumed.resumed_from is not None
    assert resumed.history == ref.history and np.array_equal(resumed.post.loadings, ref.post.loadings)
    assert np.array_equal(resumed.labels, ref.labels)
    with pytest.raises(ConfigError, match="settings differ"):
        run_lowrank(replace(spec, rank=3), StoreSource(store), LocalEngine(), checkpoint_dir=ck)


def test_stop_request_checkpoints_and_resumes(store, tmp_path):
    """A stop request (what SIGINT/SIGTERM set: pipeline.fit.driver.StopRequest) after iteration 3 writes a
    checkpoint and raises FitInterrupted; the resumed fit ends with the uninterrupted one's bits."""
    from pipeline.fit.driver import StopRequest
    from vbcore.errors import FitInterrupted

    spec = make_spec(store, covariance="lowrank", rank=2, components=8, seed=0, max_iter=12, tol=0.0)
    ref = run_lowrank(spec, StoreSource(store), LocalEngine())
    ck = str(tmp_path / "ck")

    stop = StopRequest()

    def stop_at_three(info):
        if info["iteration"] == 3:
            stop.signum = 15

    with pytest.raises(FitInterrupted, match="interrupted after iteration 3; checkpoint"):
        run_lowrank(spec, StoreSource(store), LocalEngine(), checkpoint_dir=ck, callback=stop_at_three,
                    stop=stop)
    resumed = run_lowrank(spec, StoreSource(store), LocalEngine(), checkpoint_dir=ck)
    assert resumed.resumed_from is not None and resumed.history == ref.history


def test_same_bits_on_repeat(store):
    a, b = _fit(store, LocalEngine()), _fit(store, LocalEngine())
    assert a.history == b.history and np.array_equal(a.post.noise, b.post.noise)


@pytest.mark.parametrize(("settings", "match"), [
    ({"learner": "sga"}, "fitted by vbem"),
    ({"pca": 4}, "drop --pca"),
    ({"n_init": 2}, "one start"),
])
def test_refusals(store, settings, match):
    with pytest.raises(ConfigError, match=match):
        make_spec(store, covariance="lowrank", **settings)


def test_estimator_refuses_lowrank():
    from pipeline import VBMixture

    with pytest.raises(ConfigError, match="vbcluster fit --covariance lowrank"):
        VBMixture(3, covariance_type="lowrank").fit(np.random.default_rng(0).normal(size=(50, 3)))
