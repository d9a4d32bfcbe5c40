"""A learner added in one module outside the package (issue 54, deliver 6): ``examples/toy_learner.py``
(plain VB EM, the example of docs/architecture.md "How to add a learner") fitted through
``VBMixture``, the command line and ``cluster_flow``, with no line of the package naming it. VB EM with
nothing pruned and no growth is the toy's loop, so every face must give VB EM's bits."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.fit.learners import LEARNERS
from pipeline.ingest import ingest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TOY = "toy-vbem"
FLAGS = ["-k", "6", "--covariance", "diag", "--priors", "sklearn", "--no-grow", "--max-iter", "25",
         "--tol", "0", "--seed", "0", "--quiet"]
X = np.random.default_rng(0).normal(size=(1500, 4)).astype(np.float32) + np.repeat(
    [[0.0], [4.0], [9.0]], 500, axis=0).astype(np.float32)


@pytest.fixture
def toy():
    """The example module imported as a user would (its directory on sys.path), removed afterwards."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        module = importlib.import_module("toy_learner")
        yield module
    finally:
        sys.path.remove(str(EXAMPLES))
        sys.modules.pop("toy_learner", None)
        LEARNERS.pop(TOY, None)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("toy") / "digits.zarr"
    ingest("digits", path, chunk_rows=400)
    return str(path)


def _cli(*args: str, plugins: str | None = "toy_learner", pythonpath: str = str(EXAMPLES),
         check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "VBCLUSTER_LEARNERS"}
    env["PYTHONPATH"] = os.pathsep.join([pythonpath, str(ROOT)])
    if plugins is not None:
        env["VBCLUSTER_LEARNERS"] = plugins
    out = subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def _posterior(run: Path) -> dict[str, np.ndarray]:
    """The run's posterior arrays (``meta``, the run's record, names the learner: left out)."""
    with np.load(run / "posterior.npz") as f:
        return {k: f[k] for k in f.files if k != "meta"}


def test_the_toy_learner_gives_vbem_bits_through_vbmixture(toy):
    assert LEARNERS[TOY] is toy.ToyVBEM and TOY not in sys.modules["pipeline.fit.learners"].__dict__.get(
        "__all__", ())
    kw = dict(n_components=6, grow=False, max_iter=25, tol=0.0, random_state=0)
    a = VBMixture(learner=TOY, **kw).fit(X)
    b = VBMixture(learner="vbem", learner_options={"prune_below": 0.0}, **kw).fit(X)
    assert a.n_iter_ == 25 and np.all(np.diff(a.lower_bounds_) >= -1e-9 * abs(a.lower_bounds_[-1]))
    for name in ("lower_bounds_", "weights_", "means_", "covariances_"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(a.predict(X), b.predict(X))


def test_the_toy_learner_fits_through_the_cli_and_is_listed(store, tmp_path):
    _cli("fit", store, "--run-dir", str(tmp_path / "toy"), "--learner", TOY, *FLAGS)
    _cli("fit", store, "--run-dir", str(tmp_path / "vbem"), "--learner", "vbem", "-o", "prune_below=0",
         *FLAGS, plugins=None)
    toy_run, vbem_run = _posterior(tmp_path / "toy"), _posterior(tmp_path / "vbem")
    assert toy_run.keys() == vbem_run.keys() and len(toy_run) >= 5
    assert all(np.array_equal(toy_run[k], vbem_run[k]) for k in toy_run)
    result = json.loads((tmp_path / "toy" / "result.json").read_text())
    assert result["learner"] == TOY and result["n_iter"] == 25
    listed = _cli("learners").stdout
    assert TOY in listed and TOY not in _cli("learners", plugins=None).stdout
    _cli("report", str(tmp_path / "toy"))  # the report's faces read the registry too


def test_an_entry_point_registers_the_toy_learner(tmp_path):
    """An installed package declaring ``[project.entry-points."vbcluster.learners"]`` (its metadata,
    as pip writes it, on the path) registers the learner with no environment variable."""
    dist = tmp_path / "toy_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[vbcluster.learners]\ntoy = toy_learner\n")
    path = os.pathsep.join([str(tmp_path), str(EXAMPLES)])
    assert TOY in _cli("learners", plugins=None, pythonpath=path).stdout


def test_a_learner_module_that_cannot_be_imported_is_one_line(tmp_path):
    out = _cli("learners", plugins="no_such_learner_module", check=False)
    assert out.returncode != 0
    assert ("cannot import learner module 'no_such_learner_module' "
            "(VBCLUSTER_LEARNERS='no_such_learner_module'): No module named") in out.stderr + out.stdout
    assert "Traceback" not in out.stderr + out.stdout


@pytest.mark.usefixtures("prefect_api")
def test_the_toy_learner_fits_through_cluster_flow(toy, store, tmp_path):
    from flows.cluster import cluster_flow

    kw = dict(components=6, covariance="diag", max_iter=25, tol=0.0, seed=0, quiet=True,
              assign_labels=False, write_report=False, settings={"grow": False, "priors": "sklearn"})
    cluster_flow(store, str(tmp_path / "toy"), learner=TOY, **kw)
    cluster_flow(store, str(tmp_path / "vbem"), learner="vbem", learner_options={"prune_below": 0.0}, **kw)
    toy_run, vbem_run = _posterior(tmp_path / "toy"), _posterior(tmp_path / "vbem")
    assert toy_run.keys() == vbem_run.keys()
    assert all(np.array_equal(toy_run[k], vbem_run[k]) for k in toy_run)
