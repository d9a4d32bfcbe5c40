"""`vbcluster ingest | fit | assign` end to end on real stores; run directories; a fit through a
real `dask scheduler` + two `dask worker` processes configured by scheduler.yaml."""

import json

import numpy as np
import pytest
import yaml
import zarr
from typer.testing import CliRunner

from pipeline import VBMixture
from pipeline.cli import app
from pipeline.estimator import load_model
from pipeline.runs.directory import assign_store, read_result
from pipeline.store.features import FeatureStore
from tests._dask_procs import dask_scheduler_and_workers
from vbcore.errors import InputError, StoreError

runner = CliRunner()


@pytest.fixture(scope="module")
def digits_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "digits.zarr"
    res = runner.invoke(app, ["ingest", "digits", "--out", str(path), "--chunk-rows", "400"])
    assert res.exit_code == 0, res.output
    return str(path)


def test_fit_writes_result_and_posterior(digits_store, tmp_path):
    run = tmp_path / "run"
    res = runner.invoke(app, ["fit", digits_store, "--run-dir", str(run), "-k", "15", "--quiet",
                              "--max-iter", "60"])
    assert res.exit_code == 0, res.output
    r = read_result(run)
    assert r["learner"] == "vbem" and r["n_rows"] == 1797 and len(r["elbo_history"]) == r["n_iter"]
    # -k is the starting truncation: the fit may grow it (result.json's truncation says how far)
    assert r["elbo"] == r["elbo_history"][-1] and 1 <= r["n_effective"] <= r["truncation"]["final"]
    assert r["truncation"]["start"] == 15 and r["truncation"]["growth"]
    assert 0.5 < r["metrics"]["nmi"] <= 1 and 0 < r["metrics"]["acc"] <= 1
    assert r["store_fingerprint"] == FeatureStore.open(digits_store).fingerprint
    # the saved posterior rebuilds the same model: a VBMixture of the kept model's settings (the default
    # selects it by its bound: result.json's selection) refits it
    kept = {k: r["settings"][k] for k in ("covariance_type", "prior_defaults", "reg_covar")}
    assert r["selection"]["parts"] == "covariance+priors"
    direct = VBMixture(15, max_iter=60, tol=1e-4, random_state=0,  # the CLI's
                       grow=True, init_params="k-means++-projected", **kept)
    direct.fit(digits_store)
    loaded = load_model(run)
    np.testing.assert_array_equal(loaded.means_, direct.means_)
    X = FeatureStore.open(digits_store).read()
    np.testing.assert_array_equal(loaded.predict(X), direct.predict(X))
    np.testing.assert_allclose(loaded.score_samples(X[:50]), direct.score_samples(X[:50]), rtol=1e-12)


def test_assign_writes_labels_next_to_the_store(digits_store, tmp_path):
    run = tmp_path / "run2"
    assert runner.invoke(app, ["fit", digits_store, "--run-dir", str(run), "-k", "12", "-q"]).exit_code == 0
    res = runner.invoke(app, ["assign", str(run)])
    assert res.exit_code == 0, res.output
    g = zarr.open_group(f"{digits_store}/assignments/run2", mode="r")
    labels, prob = g["labels"][:], g["probability"][:]
    model = load_model(run)
    X = FeatureStore.open(digits_store).read()
    np.testing.assert_array_equal(labels, model.predict(X))
    np.testing.assert_allclose(prob, model.predict_proba(X).max(1), rtol=1e-5)
    FeatureStore.open(digits_store)  # the store is still valid
    # a second assign replaces the group whole
    assert runner.invoke(app, ["assign", str(run)]).exit_code == 0
    assert not [p for p in (tmp_path.parent).rglob(".run2.tmp-*")]


def test_assign_refuses_a_changed_store(tmp_path):
    path = tmp_path / "s.zarr"
    s = FeatureStore.create(path, 3, chunk_rows=50)
    rng = np.random.default_rng(0)
    s.append(rng.normal(size=(120, 3)))
    run = tmp_path / "run"
    assert runner.invoke(app, ["fit", str(path), "--run-dir", str(run), "-k", "3", "-q"]).exit_code == 0
    FeatureStore.open(path, "r+").append(rng.normal(size=(5, 3)))
    with pytest.raises(StoreError, match=r"changed since the run .* was fitted"):
        assign_store(run)
    res = runner.invoke(app, ["assign", str(run)])
    assert res.exit_code == 2 and "changed since the run" in res.output


def test_cli_errors_are_one_line(tmp_path):
    res = runner.invoke(app, ["fit", str(tmp_path / "nope.zarr"), "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 2 and "no such feature store" in res.output
    assert not (tmp_path / "r").exists()
    with pytest.raises(InputError, match=r"not a finished vbcluster run directory"):
        load_model(tmp_path)
    res = runner.invoke(app, ["assign", str(tmp_path)])
    assert res.exit_code == 2 and "not a finished vbcluster run directory" in res.output


def test_fit_through_scheduler_yaml_with_cli_started_workers(digits_store, tmp_path):
    """A real `dask scheduler` and two `dask worker` processes on 127.0.0.1, reached through a
    scheduler.yaml config, give the same bits as the in-process engine."""
    kw = dict(n_components=10, covariance_type="diag", max_iter=15, tol=0.0, random_state=0,
              prior_defaults="empirical", grow=True, init_params="k-means++-projected")  # the CLI's defaults
    local = VBMixture(**kw).fit(digits_store)
    with dask_scheduler_and_workers(n_workers=2) as address:
        cfg = tmp_path / "scheduler.yaml"
        cfg.write_text(yaml.safe_dump({"address": address}))
        remote = VBMixture(engine=str(cfg), **kw).fit(digits_store)
        run = tmp_path / "run"
        res = runner.invoke(app, ["fit", digits_store, "--run-dir", str(run), "-k", "10", "-q",
                                  "--cluster", str(cfg), "--max-iter", "15", "--tol", "0",
                                  "--select", "none"])  # (the engine is the subject: the diag model)
        assert res.exit_code == 0, res.output
        assert "Dask cluster: tcp://127.0.0.1" in res.output
    for name in ("means_", "covariances_", "lower_bounds_"):
        assert np.array_equal(getattr(local, name), getattr(remote, name)), name
    assert json.loads((run / "result.json").read_text())["elbo_history"] == list(local.lower_bounds_)


def test_fit_persist_option_reaches_the_engine_and_keeps_the_bits(digits_store, tmp_path, monkeypatch):
    """`vbcluster fit --persist never|always` (docs/operations.md): the engine streams or keeps the
    chunks as told, run.json records it, resume may override it, and the bits do not depend on it."""
    import pipeline.cli as cli
    from pipeline.engine.engines import make_engine
    from pipeline.engine.memory import memory_budget

    made: list[str] = []
    real = cli._engine

    def spy(cluster, persist="auto"):
        engine = real(cluster, persist)
        made.append(engine.persist)
        return engine

    monkeypatch.setattr(cli, "_engine", spy)
    runs = {}
    for mode in ("never", "always"):
        run = tmp_path / mode
        res = runner.invoke(app, ["fit", digits_store, "--run-dir", str(run), "-k", "8", "-q",
                                  "--max-iter", "5", "--persist", mode])
        assert res.exit_code == 0, res.output
        assert json.loads((run / "run.json").read_text())["persist"] == mode
        runs[mode] = load_model(run)
    assert made == ["never", "always"]
    np.testing.assert_array_equal(runs["never"].means_, runs["always"].means_)
    np.testing.assert_array_equal(runs["never"].precisions_, runs["always"].precisions_)
    res = runner.invoke(app, ["resume", str(tmp_path / "never"), "--persist", "always", "-q"])
    assert res.exit_code == 0, res.output
    assert made[-1] == "always"
    res = runner.invoke(app, ["fit", digits_store, "--run-dir", str(tmp_path / "bad"),
                              "--persist", "sometimes"])
    assert res.exit_code == 2 and "persist" in res.output
    # in process, 'auto' keeps the chunks when they take at most half of the machine's memory
    eng = make_engine("local", "auto")
    assert eng.persist == "auto" and eng.memory_limit == memory_budget() > 0
