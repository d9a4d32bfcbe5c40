"""The model chosen by its exact bound at ``vbcluster fit``'s defaults (issue 51, deliver 1): a store of
at most 256 dimensions whose model is left to the defaults selects it (``--select auto`` without the
low-rank candidates); ``--select none`` and a model named by hand fit exactly what they name; a run
directory written before the change resumes with the spec it recorded; the default's selection keeps
the bits across resume and engines; wide stores keep their default."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.ingest import ingest
from pipeline.runs.directory import read_result
from pipeline.service import make_spec
from tests._reference import planted_small_classes

runner = CliRunner()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """Four planted classes in 3 dimensions (a narrow store)."""
    root = tmp_path_factory.mktemp("default_select")
    x, _ = planted_small_classes(n_classes=4, d=3, lo=40, hi=70, seed=5)
    np.save(root / "x.npy", x)
    ingest(str(root / "x.npy"), str(root / "s.zarr"))
    return str(root / "s.zarr")


def _fit(store: str, run, *args: str) -> dict:
    res = runner.invoke(app, ["fit", store, "--run-dir", str(run), "-k", "6", "-q", *args])
    assert res.exit_code == 0, res.output
    return {"output": res.output, **read_result(run)}


def _posterior(run) -> dict[str, np.ndarray]:
    with np.load(run / "posterior.npz") as z:
        return {k: z[k] for k in z.files if k != "meta"}


def test_the_default_selects_where_the_model_is_left_to_it(store, tmp_path) -> None:
    spec = make_spec(store)
    assert (spec.select, spec.select_lowrank) == ("covariance+priors", False)
    assert make_spec(store, select="auto").select_lowrank  # --select auto keeps the low-rank family
    assert make_spec(store, select_lowrank=True).select == "covariance+priors"
    for named in ({"covariance": "full"}, {"priors": "bound"}, {"pca": 2}, {"learner": "sga-f"},
                  {"select": "none"}, {"degrees_of_freedom_prior": 7.5}, {"reg_covar": 1e-5}):
        assert make_spec(store, **named).select == "none", named
    assert make_spec(store, learner="vbem").select == "covariance+priors"
    assert make_spec(store, select="auto", covariance="full").select == "priors"  # as before
    np.save(tmp_path / "w.npy", np.random.default_rng(0).normal(size=(40, 257)).astype(np.float32))
    ingest(str(tmp_path / "w.npy"), str(tmp_path / "w.zarr"))
    wide = make_spec(str(tmp_path / "w.zarr"))  # wide stores: today's default, the same identity
    assert wide == make_spec(str(tmp_path / "w.zarr"), select="none")
    assert wide.select == "none" and not {"select", "select_lowrank"} & set(wide.identity())


def test_a_default_fit_records_its_candidates_and_keeps_the_best(store, tmp_path) -> None:
    r = _fit(store, tmp_path / "d")
    sel = r["selection"]
    assert sel["parts"] == "covariance+priors"
    assert len(sel["candidates"]) == 10  # 4 families x 3 priors less 'bound' of full and tied
    assert all(c["rank"] is None and c["pca"] is None for c in sel["candidates"])  # no low-rank, D < 64
    screen = [c["screen_bound"] for c in sel["candidates"]]
    assert screen == sorted(screen, reverse=True)
    fitted = [c for c in sel["candidates"] if c["full_bound"] is not None]
    assert fitted == [sel["candidates"][0]] and fitted[0]["chosen"]  # select_fits 1: the best screened
    assert r["settings"]["covariance_type"] == fitted[0]["covariance"]
    assert "model selection: covariance+priors" in r["output"] and "<- kept" in r["output"]
    assert "--select-lowrank true screens the low-rank family too" in " ".join(r["output"].split())
    run_json = json.loads((tmp_path / "d" / "run.json").read_text())
    assert (run_json["select"], run_json["select_lowrank"]) == ("covariance+priors", False)


def test_a_warm_start_from_a_default_run_continues_the_model_it_kept(store, tmp_path) -> None:
    first = _fit(store, tmp_path / "first")
    kept = next(c for c in first["selection"]["candidates"] if c["chosen"])
    warm = _fit(store, tmp_path / "warm", "--warm-from", str(tmp_path / "first"))
    assert "selection" not in warm and warm["warm_start_from"] is not None
    assert (warm["settings"]["covariance_type"], warm["settings"]["prior_defaults"],
            warm["settings"]["reg_covar"]) == (kept["covariance"], kept["priors"], kept["reg_covar"])


def test_select_none_and_a_model_named_by_hand_fit_todays_model(store, tmp_path) -> None:
    none = _fit(store, tmp_path / "n", "--select", "none")
    named = _fit(store, tmp_path / "h", "--covariance", "diag", "--priors", "empirical")
    assert "selection" not in none and "selection" not in named and "model selection" not in none["output"]
    a, b = _posterior(tmp_path / "n"), _posterior(tmp_path / "h")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert none["elbo"] == named["elbo"] and none["settings"]["covariance_type"] == "diag"


def _interrupted(store: str, run, *args: str) -> None:
    """``run`` as a fit killed after its second checkpoint leaves it: checkpoints, no result."""
    _fit(store, run, "--max-iter", "2", "--tol", "0", "--checkpoint-every", "1", *args)
    (run / "result.json").unlink()
    (run / "posterior.npz").unlink()
    values = json.loads((run / "run.json").read_text())
    values["max_iter"] = 6
    (run / "run.json").write_text(json.dumps(values))


def test_a_run_written_before_the_default_changed_resumes_as_recorded(store, tmp_path) -> None:
    """A run.json of the old default (select 'none', no select_lowrank) resumes without selecting, to
    the bits of an uninterrupted fit of that model."""
    old = tmp_path / "old"
    _interrupted(store, old, "--select", "none")
    values = json.loads((old / "run.json").read_text())
    del values["select_lowrank"]  # (written before the setting existed)
    (old / "run.json").write_text(json.dumps(values))
    res = runner.invoke(app, ["resume", str(old), "-q"])
    assert res.exit_code == 0, res.output
    resumed, ref = read_result(old), _fit(store, tmp_path / "ref", "--select", "none", "--max-iter", "6",
                                           "--tol", "0")
    assert resumed["resumed_from"] is not None and "selection" not in resumed
    assert resumed["elbo"] == ref["elbo"] and resumed["elbo_history"] == ref["elbo_history"]
    a, b = _posterior(old), _posterior(tmp_path / "ref")
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_the_default_selection_resumes_to_the_same_bits(store, tmp_path) -> None:
    run = tmp_path / "run"
    _interrupted(store, run)
    res = runner.invoke(app, ["resume", str(run), "-q"])
    assert res.exit_code == 0, res.output
    resumed, ref = read_result(run), _fit(store, tmp_path / "ref", "--max-iter", "6", "--tol", "0")
    assert resumed["resumed_from"] is not None
    strip = [[{k: v for k, v in c.items() if k != "screen_seconds"} for c in r["selection"]["candidates"]]
             for r in (resumed, ref)]
    model = ("covariance_type", "prior_defaults", "reg_covar")
    assert strip[0] == strip[1]
    assert [resumed["settings"][k] for k in model] == [ref["settings"][k] for k in model]
    assert resumed["elbo"] == ref["elbo"] and resumed["elbo_history"] == ref["elbo_history"]
    a, b = _posterior(run), _posterior(tmp_path / "ref")
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_the_default_selection_is_the_same_on_dask(store, client) -> None:
    from dataclasses import replace

    from threadpoolctl import threadpool_limits

    from pipeline.engine.engines import DaskEngine, LocalEngine
    from pipeline.engine.sources import StoreSource
    from pipeline.service import fit

    spec = replace(make_spec(store), components=6, max_iter=8, tol=0.0)
    with threadpool_limits(limits=1, user_api="blas"):
        local = fit(spec, StoreSource(store), LocalEngine(threads=1), random_state=0)
    dask = fit(spec, StoreSource(store), DaskEngine(client), random_state=0)
    strip = [[{k: v for k, v in c.items() if k != "screen_seconds"} for c in o.selection["candidates"]]
             for o in (local, dask)]
    assert strip[0] == strip[1] and len(strip[0]) == 10
    assert dask.terms.total == local.terms.total and dask.history == local.history
    assert np.array_equal(dask.post.means, local.post.means)
