"""A low-rank run read by the faces that read runs (issue 51): `vbcluster assign` writes the fit's own
labels (checked against brute-force float64 responsibilities of the factor-analyser mixture),
`vbcluster report` draws it, `vbcluster resume` sees it finished, and the faces that cannot take it
(VBMixture's load_model, --warm-from, publish) refuse it in one line."""

import json
import shutil

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.engine.sources import StoreSource
from pipeline.estimator import load_model
from pipeline.runs.directory import load_run_model
from pipeline.runs.lowrank_model import NOT_GAUSSIAN, LowRankModel
from pipeline.runs.publish import publish
from pipeline.store.features import FeatureStore
from tests._reference import planted_subspaces
from vbcore.errors import InputError
from vbcore.model.posterior import expected_log_weights


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Four classes, each its own mean and 2-dimensional subspace in 10 dimensions, fitted by the CLI
    with --covariance lowrank (rank 2, K = 6: components to spare)."""
    x, y = planted_subspaces(4, 10, 250, 1.5, 3.0, 0.4, seed=11)
    folder = tmp_path_factory.mktemp("lowrank-run")
    s = FeatureStore.create(folder / "s.zarr", 10, chunk_rows=128, labels=True)
    s.append((x + 50.0).astype(np.float32), labels=y)
    res = CliRunner().invoke(app, ["fit", str(folder / "s.zarr"), "--run-dir", str(folder / "r"),
                                   "--covariance", "lowrank", "--rank", "2", "-k", "6", "--seed", "0", "-q"])
    assert res.exit_code == 0, res.output
    return folder / "r"


def brute_force_log_rho(y, post):
    """``ln rho_nk`` of the variational mixture of factor analysers in float64, term by term: the
    expected weights' log plus max over a Gaussian q(x | k) = N(m, S) of E[ln N(y | L [x; 1], Psi)] +
    E[ln N(x | 0, I)] + H[q(x | k)], at the maximiser S = (I + G_xx)^-1, m = S (M^T Psi^-1 y - G_x1)
    (``G = E[L^T Psi^-1 L]``, ``M`` the factor columns of E[L])."""
    k, d, q1 = post.loadings.shape
    q = q1 - 1
    out = np.empty((len(y), k))
    for j in range(k):
        ml = post.loadings[j]
        g = ml.T @ (ml / post.noise[:, None]) + d * np.linalg.inv(post.precision[j])
        s = np.linalg.inv(np.eye(q) + g[:q, :q])
        for n, row in enumerate(y):
            m = s @ (ml[:, :q].T @ (row / post.noise) - g[:q, q])
            mt = np.append(m, 1.0)
            exx = np.outer(mt, mt)
            exx[:q, :q] += s
            quad = row @ (row / post.noise) - 2.0 * row @ ((ml @ mt) / post.noise) + np.trace(g @ exx)
            like = -0.5 * d * np.log(2 * np.pi) - 0.5 * np.log(post.noise).sum() - 0.5 * quad
            latent = -0.5 * q * np.log(2 * np.pi) - 0.5 * (m @ m + np.trace(s))
            entropy = 0.5 * q * (1.0 + np.log(2 * np.pi)) + 0.5 * np.linalg.slogdet(s)[1]
            out[n, j] = like + latent + entropy
    return out + expected_log_weights(post.weight_concentration, post.weight_type)[None, :]


def test_assign_writes_the_fits_labels(run):
    result = json.loads((run / "result.json").read_text())
    res = CliRunner().invoke(app, ["assign", str(run)])
    assert res.exit_code == 0, res.output
    g = zarr.open_group(f"{result['store']}/assignments/{run.name}", mode="r")
    labels, prob = np.asarray(g["labels"][:]), np.asarray(g["probability"][:])
    with np.load(run / "lowrank.npz") as z:
        fit_labels = z["labels"]
    assert np.array_equal(labels, fit_labels)  # the fit's own assignments, bit for bit
    model = load_run_model(run)
    assert isinstance(model, LowRankModel)
    x = np.concatenate([StoreSource(result["store"]).load(i) for i in range(8)]).astype(np.float64)
    log_rho = brute_force_log_rho(x - model.shift, model.post)
    resp = np.exp(log_rho - log_rho.max(1, keepdims=True))
    resp /= resp.sum(1, keepdims=True)
    assert np.array_equal(labels, resp.argmax(1))
    np.testing.assert_allclose(prob, resp.max(1), rtol=1e-4, atol=1e-6)
    assert g.attrs["posterior_sha256"] == result["posterior_sha256"]
    assert len(np.unique(labels)) == result["metrics"]["clusters_used"]


def test_report_draws_the_run(run, tmp_path):
    res = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "store plots skipped" not in page and "run0-pca.png" in page and "run0-contingency.png" in page
    model = load_run_model(run)
    typical = model.typical_rows(StoreSource(json.loads((run / "result.json").read_text())["store"]), 3)
    with np.load(run / "lowrank.npz") as z:
        assert np.array_equal(typical.labels, z["labels"])
    assert typical.sizes.sum() == 1000 and np.all(np.diff(typical.scores, axis=1)[np.isfinite(
        typical.scores[:, 1:])] <= 0)  # most typical first


def test_resume_sees_it_finished(run):
    res = CliRunner().invoke(app, ["resume", str(run)])
    assert res.exit_code == 0 and "nothing to resume" in res.output, res.output


def test_refusals(run, tmp_path):
    with pytest.raises(InputError, match="VBMixture and load_model hold the Gaussian families only"):
        load_model(run)
    assert "assign" in NOT_GAUSSIAN
    store = json.loads((run / "result.json").read_text())["store"]
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(tmp_path / "w"), "--warm-from", str(run)])
    assert res.exit_code != 0 and "has no warm start yet" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1
    (tmp_path / "out" / "versions").mkdir(parents=True)
    with pytest.raises(InputError, match="lowrank run cannot be published"):
        publish(tmp_path / "out", run)


def test_a_replaced_model_file_is_refused(run, tmp_path):
    copy = tmp_path / "r"
    shutil.copytree(run, copy)
    with np.load(copy / "lowrank.npz") as z:
        arrays = dict(z)
    arrays["noise"] = arrays["noise"] * 2.0
    np.savez(copy / "lowrank.npz", **arrays)
    res = CliRunner().invoke(app, ["assign", str(copy), "--format", "csv"])
    assert res.exit_code != 0 and "does not match the posterior_sha256" in res.output, res.output


def test_a_run_written_before_the_shift_was_recorded(run, tmp_path):
    """lowrank.npz without its shift and result.json without posterior_sha256 (runs of the first
    low-rank fits): the shift is the store's first row again, the labels the fit's."""
    copy = tmp_path / "old"
    shutil.copytree(run, copy)
    with np.load(copy / "lowrank.npz") as z:
        arrays = {k: v for k, v in z.items() if k != "shift"}
        shift = z["shift"]
    np.savez(copy / "lowrank.npz", **arrays)
    result = json.loads((copy / "result.json").read_text())
    del result["posterior_sha256"]
    (copy / "result.json").write_text(json.dumps(result))
    model = load_run_model(copy)
    assert np.array_equal(model.shift, shift)
    res = CliRunner().invoke(app, ["assign", str(copy), "--format", "csv"])
    assert res.exit_code == 0, res.output
    import pandas as pd

    assert np.array_equal(pd.read_csv(copy / "assignments.csv")["label"].to_numpy(), arrays["labels"])


def test_restart_over_a_lowrank_run_removes_its_model(run, tmp_path):
    """`fit --restart` in a low-rank run's directory removes lowrank.npz with the other run files, so
    the new run's posterior is the one assign reads."""
    copy = tmp_path / "again"
    shutil.copytree(run, copy)
    store = json.loads((run / "result.json").read_text())["store"]
    res = CliRunner().invoke(app, ["fit", store, "--run-dir", str(copy), "--restart", "--covariance", "diag",
                                   "-k", "4", "--seed", "0", "-q"])
    assert res.exit_code == 0, res.output
    assert not (copy / "lowrank.npz").exists() and (copy / "posterior.npz").exists()
    assert not isinstance(load_run_model(copy), LowRankModel)
