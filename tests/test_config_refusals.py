"""Configs that would run what they should not, refused in one line before anything starts (issue 29,
medium 6 and 8): a cluster config naming any importable callable (`subprocess.Popen` with `args`), on
`fit --cluster` and on `resume` of a run directory whose run.json names it; a worker class that is not
Dask's; the template placeholders (YOUR_PARTITION ...) left unfilled, on `deploy --dry-run` and on
starting a cluster; `deploy` without a Prefect server (PREFECT_API_URL). Entry points registered under
`vbcluster.clusters` are allowed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipeline.engine.cluster import load_cluster_config
from pipeline.ingest import ingest
from vbcore.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[1] / "cluster_config"
runner = CliRunner()


def _said(res) -> str:
    return " ".join(res.output.split())


def _popen(tmp_path: Path) -> tuple[Path, Path]:
    pwned = tmp_path / "PWNED"
    cfg = tmp_path / "y.yaml"
    cfg.write_text(f"cluster_class: subprocess.Popen\ncluster_kwargs: {{args: [touch, {pwned}]}}\n")
    return cfg, pwned


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cfg") / "d.zarr")
    ingest("digits", path, chunk_rows=900)
    return path


def test_a_cluster_config_cannot_run_any_callable(store, tmp_path):
    cfg, pwned = _popen(tmp_path)
    msg = (rf"{re.escape(str(cfg))}: key 'cluster_class': 'subprocess\.Popen' is not a cluster class "
           r"vbcluster starts")
    with pytest.raises(ConfigError, match=msg):
        load_cluster_config(cfg)
    res = runner.invoke(app, ["fit", store, "--run-dir", str(tmp_path / "run"), "--cluster", str(cfg), "-q"])
    assert res.exit_code == 2 and "'subprocess.Popen' is not a cluster class vbcluster starts" in _said(res)
    assert not pwned.exists() and not (tmp_path / "run").exists()


def test_resume_of_a_run_naming_such_a_config_is_refused(store, tmp_path):
    """A shared run directory whose run.json names the YAML: `vbcluster resume` refuses it too."""
    run = tmp_path / "run"
    res = runner.invoke(app, ["fit", store, "--run-dir", str(run), "-k", "3", "--max-iter", "2", "-q"])
    assert res.exit_code == 0, res.output
    for name in ("result.json", "posterior.npz"):
        (run / name).unlink()  # an unfinished run, as a killed fit leaves it
    cfg, pwned = _popen(tmp_path)
    spec = json.loads((run / "run.json").read_text())
    spec["cluster"] = str(cfg)
    (run / "run.json").write_text(json.dumps(spec))
    res = runner.invoke(app, ["resume", str(run)])
    assert res.exit_code == 2 and "'subprocess.Popen' is not a cluster class vbcluster starts" in _said(res)
    assert not pwned.exists()


def test_the_worker_class_must_be_dasks(tmp_path):
    cfg = tmp_path / "w.yaml"
    cfg.write_text("cluster_class: distributed.LocalCluster\n"
                   "cluster_kwargs: {worker_class: subprocess.Popen}\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(cfg))}: key 'cluster_kwargs\.worker_class': "
                       r"'subprocess\.Popen' is not a Dask worker class; use one of distributed\.Nanny"):
        load_cluster_config(cfg).make_cluster()


def test_registered_entry_points_are_allowed(tmp_path, monkeypatch):
    """A package registers its cluster class under the entry-point group `vbcluster.clusters`."""
    (tmp_path / "vbc_site_clusters.py").write_text(
        "from distributed import LocalCluster\n\nclass SiteCluster(LocalCluster):\n    pass\n")
    info = tmp_path / "vbc_site_clusters-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vbc-site-clusters\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[vbcluster.clusters]\nsite = vbc_site_clusters:SiteCluster\nbroken = vbc_site_clusters:Missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    good = tmp_path / "good.yaml"
    good.write_text("cluster_class: vbc_site_clusters.SiteCluster\n")
    assert load_cluster_config(good).resolve_cluster_class().__name__ == "SiteCluster"
    broken = tmp_path / "broken.yaml"
    broken.write_text("cluster_class: vbc_site_clusters.Missing\n")
    with pytest.raises(ConfigError, match=r"key 'cluster_class': module 'vbc_site_clusters' has no attribute "
                       r"'Missing'"):
        load_cluster_config(broken).make_cluster()
    other = tmp_path / "other.yaml"
    other.write_text("cluster_class: vbc_site_clusters.LocalCluster\n")  # importable, not registered
    with pytest.raises(ConfigError, match=r"'vbc_site_clusters\.LocalCluster' is not a cluster class"):
        load_cluster_config(other)


@pytest.mark.parametrize(("name", "key", "value"), [("slurm.yaml", "cluster_kwargs.queue", "YOUR_PARTITION"),
                                                    ("pbs.yaml", "cluster_kwargs.queue", "YOUR_QUEUE")])
def test_unfilled_placeholders_are_refused_naming_the_key(store, tmp_path, name, key, value):
    path = CONFIG_DIR / name
    config = load_cluster_config(path)  # a template loads (it is read and copied) ...
    msg = (rf"{re.escape(str(path))}: key '{re.escape(key)}': unfilled placeholder '{value}': replace it "
           r"with your")
    with pytest.raises(ConfigError, match=msg):  # ... but starts nothing
        config.make_cluster()
    res = runner.invoke(app, ["deploy", store, "--cron", "0 2 * * *", "--cluster", str(path), "--dry-run",
                              "--out", str(tmp_path / "v")])
    assert res.exit_code == 2, res.output
    assert f"key '{key}': unfilled placeholder '{value}'" in _said(res) and "ok" not in res.output
    filled = tmp_path / name
    filled.write_text(path.read_text().replace("YOUR_", "site_"))
    res = runner.invoke(app, ["deploy", store, "--cron", "0 2 * * *", "--cluster", str(filled), "--dry-run",
                              "--out", str(tmp_path / "v")])
    assert res.exit_code == 0 and "ok: would refresh" in _said(res), res.output


def test_deploy_without_a_prefect_server_is_refused(store, tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: None}):
        res = runner.invoke(app, ["deploy", store, "--interval", "60", "--out", str(tmp_path / "v")])
    assert res.exit_code == 2, res.output
    line = _said(res)
    assert line.startswith("error: PREFECT_API_URL is not set: deploy registers its schedule on a Prefect "
                           "server; start one (prefect server start)"), res.output
    assert not (tmp_path / "v").exists()
