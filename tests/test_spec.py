"""One fit specification everywhere (pipeline.fit.spec): the table, its round trip, every learner by its
name alone through the estimator, the CLI, cluster_flow and the scheduled refresh, and refused
commands that change no file."""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipeline import VBMixture
from pipeline.fit.learners import LEARNERS
from pipeline.fit.spec import FitSpec, coerce, defaults
from pipeline.ingest import ingest
from pipeline.service import make_spec, read_spec
from vbcore.errors import ConfigError

LEARNER_NAMES = sorted(LEARNERS)


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=6.0, size=(3, 3))
    return np.concatenate([c + rng.normal(size=(80, 3)) for c in centres])


@pytest.fixture(scope="module")
def store(tmp_path_factory, blobs):
    path = tmp_path_factory.mktemp("spec") / "blobs.zarr"
    np.save(path.with_suffix(".npy"), blobs)
    ingest(str(path.with_suffix(".npy")), path, chunk_rows=64)
    return str(path)


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (and the set of directories), for no-change checks."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


# ---- the table -----------------------------------------------------------------------------------
def test_estimator_defaults_are_the_specs_scikit_learn_defaults():
    """VBMixture's signature defaults are the spec's estimator face, setting by setting."""
    sig = inspect.signature(VBMixture.__init__).parameters
    est = defaults("estimator")
    mapped = {f.metadata["estimator"]: f.name for f in fields(FitSpec) if f.metadata["estimator"]}
    for param, name in mapped.items():
        default = sig[param].default
        assert default == est[name] or (default is None and est[name] in (None, {})), param
    # scikit-learn's own defaults where BayesianGaussianMixture has the parameter
    from sklearn.mixture import BayesianGaussianMixture

    bgm = BayesianGaussianMixture().get_params()
    ours = VBMixture().get_params()
    for k in ("n_components", "tol", "reg_covar", "max_iter", "n_init", "init_params",
              "weight_concentration_prior_type", "random_state", "warm_start", "verbose", "verbose_interval"):
        assert ours[k] == bgm[k], k


@pytest.mark.parametrize("learner", ["vbem", "sga-f"])
def test_estimator_params_give_the_command_lines_model(learner):
    """``VBMixture(K, covariance_type=..., **estimator_params())`` resolves to the spec of
    ``vbcluster fit -k K --learner L``, setting by setting (the store aside); with the estimator's
    face, to VBMixture's own."""
    from pipeline.fit.spec import estimator_params

    cli = FitSpec(store="s.zarr", components=7, learner=learner).resolved("pipeline")
    est = VBMixture(7, learner=learner, covariance_type=cli.covariance, **estimator_params()).spec("s.zarr")
    assert est == cli
    assert estimator_params("estimator") == {}
    assert VBMixture(7, learner=learner, covariance_type=cli.covariance).spec("s.zarr") != cli
    with pytest.raises(ValueError, match="face must be one of"):
        estimator_params("cli")


def test_round_trip_and_unknown_settings():
    spec = make_spec("s.zarr", learner="sga-f", components=7, learner_options={"minibatch": "100"})
    assert spec.covariance == "fixed" and spec.learner_options["minibatch"] == 100
    assert FitSpec.from_dict(json.loads(json.dumps(spec.to_dict()))).resolved() == spec
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) 'componets'.*did you mean 'components'"):
        FitSpec.from_dict({"componets": 3})
    with pytest.raises(ConfigError, match=r"unknown learner 'sgaf'; did you mean 'sga-f'\?"):
        make_spec("s.zarr", learner="sgaf")
    with pytest.raises(ConfigError, match=r"components \(--components/-k\) must be an integer >= 1, got 0"):
        make_spec("s.zarr", components=0)
    with pytest.raises(ConfigError, match=r"learner 'mm' fits covariance 'fixed', not 'diag'"):
        make_spec("s.zarr", learner="mm", covariance="diag")


@pytest.mark.parametrize("value, expected", [("yes", True), ("Off", False), ("1", True), (False, False)])
def test_one_boolean_coercer(value, expected):
    assert coerce("bool", value, "x") is expected


def test_boolean_coercer_refuses_other_words():
    with pytest.raises(ConfigError, match=r"x must be true or false, got 'maybe'"):
        coerce("bool", "maybe", "x")


def test_learner_options_are_checked_before_any_pass():
    with pytest.raises(ConfigError, match=r"learner option 'eta' of 'sga-f' must be in \[0.001, 0.1\]"):
        make_spec("s.zarr", learner="sga-f", learner_options={"eta": "5"})
    with pytest.raises(ConfigError, match=r"learner option 'every' of 'vbem-ps' must be >= 1"):
        VBMixture(learner="vbem-ps", learner_options={"every": 0}).spec()


# ---- every learner by its name alone ----------------------------------------------------------------
@pytest.mark.parametrize("learner", LEARNER_NAMES)
def test_estimator_with_only_the_learner_name(blobs, learner):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning of the slow learners at max_iter
        m = VBMixture(learner=learner).fit(blobs)
    assert np.isfinite(m.lower_bound_) and m.predict(blobs).shape == (len(blobs),)


@pytest.mark.parametrize("learner", LEARNER_NAMES)
def test_cli_fit_and_deploy_dry_run_with_only_the_learner_name(store, tmp_path, learner):
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(run), "--learner", learner, "-q"])
    assert res.exit_code == 0, res.output
    assert read_spec(run).learner == learner and (run / "result.json").is_file()
    res = CliRunner().invoke(app, ["deploy", store, "--learner", learner, "--cron", "0 2 * * *",
                                   "--out", str(tmp_path / "versions"), "--dry-run"])
    assert res.exit_code == 0 and "ok: would refresh" in res.output, res.output


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("learner", LEARNER_NAMES)
def test_refresh_and_its_cluster_flow_with_only_the_learner_name(store, tmp_path, learner):
    """The scheduled refresh (what `vbcluster deploy` serves) runs cluster_flow as a subflow with
    the settings it was given: here only the learner."""
    from flows.schedule import refresh_flow

    out = refresh_flow(store, str(tmp_path / "versions"), learner=learner)
    result = json.loads(Path(out["version"], "result.json").read_text())
    assert out["action"] == "cold" and result["learner"] == learner and np.isfinite(result["elbo"])
    assert read_spec(out["version"]).learner == learner


# ---- refused commands change nothing ---------------------------------------------------------------
@pytest.fixture(scope="module")
def good_run(store, tmp_path_factory):
    run = tmp_path_factory.mktemp("good") / "run"
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(run), "-k", "4", "--max-iter", "5", "-q"])
    assert res.exit_code == 0, res.output
    return run


@pytest.mark.parametrize("args, message", [
    (["-k", "0"], "components (--components/-k) must be an integer >= 1, got 0"),
    (["-k", "5"], "holds another run (components 4 -> 5)"),
    (["--learner", "sgaf"], "did you mean 'sga-f'"),
    (["--learner", "mm", "--covariance", "diag"], "learner 'mm' fits covariance 'fixed'"),
    (["-o", "nope=1"], "has no option 'nope'"),
    (["--covariance", "diagonal"], "did you mean 'diag'"),
])
def test_refused_fit_changes_no_file(store, good_run, args, message):
    before = tree_digest(good_run)
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(good_run), *args])
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert tree_digest(good_run) == before


@pytest.mark.parametrize("args, message", [
    (["--degrees-of-freedom-prior", "-3"], "degrees_of_freedom_prior must be a finite number > 0, got -3.0"),
    (["--covariance", "full", "--degrees-of-freedom-prior", "1"],
     "degrees_of_freedom_prior must be > n_features - 1 ="),
    (["--weight-concentration-prior", "0"], "weight_concentration_prior (--weight-concentration-prior) "
                                             "must be a number > 0"),
    (["--reg-covar", "-1"], "must be a number >= 0"),
])
def test_prior_settings_are_checked_before_anything_is_written(store, tmp_path, args, message):
    """The prior flags are checked against the store's dimension before a file is written."""
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(tmp_path / "new"), "-k", "4", *args])
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert not (tmp_path / "new").exists()


def test_prior_flags_reach_the_fit(store, tmp_path):
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(run), "-k", "4", "--max-iter", "3", "-q",
                                   "--degrees-of-freedom-prior", "7.5", "--mean-precision-prior", "0.5",
                                   "--weight-concentration-prior", "2", "--reg-covar", "1e-5"])
    assert res.exit_code == 0, res.output
    got = json.loads((run / "result.json").read_text())["settings"]
    assert (got["degrees_of_freedom_prior"], got["mean_precision_prior"], got["weight_concentration_prior"],
            got["reg_covar"]) == (7.5, 0.5, 2.0, 1e-5)
    # the learner options as used: defaults filled in, candidates=-1 resolved (K = 4: the exact E-step)
    used = json.loads((run / "result.json").read_text())["learner_options"]
    assert used["candidates"] == 0 and used["neighbours"] == 8
    with np.load(run / "posterior.npz") as z:
        meta = json.loads(str(z["meta"]))
    assert (meta["degrees_of_freedom"], meta["mean_precision"], meta["weight_concentration"]) == (
        7.5, 0.5, 2.0)


def test_refused_fit_into_a_new_directory_leaves_nothing(store, tmp_path):
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(tmp_path / "new"), "-k", "0"])
    assert res.exit_code == 2 and not (tmp_path / "new").exists()
    assert "━" not in res.output and "iter" not in res.output  # no progress bar was drawn


def test_refused_resume_and_deploy_change_no_file(store, good_run, tmp_path):
    import shutil

    before = tree_digest(good_run)
    res = CliRunner().invoke(app, ["resume", str(good_run), "--cluster", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 0 and "nothing to resume" in res.output, res.output  # finished: no cluster used
    unfinished = tmp_path / "unfinished"
    shutil.copytree(good_run, unfinished)
    for name in ("result.json", "posterior.npz"):
        (unfinished / name).unlink()  # as a fit killed after its last checkpoint leaves it
    kept = tree_digest(unfinished)
    res = CliRunner().invoke(app, ["resume", str(unfinished), "--cluster", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2, res.output
    assert tree_digest(unfinished) == kept
    res = CliRunner().invoke(app, ["deploy", store, "--learner", "nope", "--cron", "0 2 * * *",
                                   "--out", str(good_run), "--dry-run"])
    assert res.exit_code == 2 and "unknown learner 'nope'" in res.output
    assert tree_digest(good_run) == before


def test_same_settings_continue_and_restart_starts_over(store, good_run, tmp_path):
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(good_run), "-k", "4", "--max-iter", "5",
                                   "-q"])
    assert res.exit_code == 0 and "continuing it" in res.output, res.output
    run = tmp_path / "r"
    assert CliRunner().invoke(app, ["fit", store, "--run-dir", str(run), "-k", "4", "--max-iter", "3",
                                    "-q"]).exit_code == 0
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(run), "-k", "3", "--max-iter", "3",
                                   "--restart", "-q"])
    assert res.exit_code == 0, res.output
    assert read_spec(run).components == 3
    assert json.loads((run / "result.json").read_text())["n_components"] == 3
