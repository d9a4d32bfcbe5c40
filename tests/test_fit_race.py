"""A fit racing an append records the store it fitted (issue 29, medium 5): the row count and the
fingerprint of when the fit opened the store, not of the grown store that save_run used to reopen;
`assign` then refuses the grown store and the scheduled refresh plans a warm start over the new rows.

Real processes: the fit runs in one (a `VBMixture` fit and `save_run`, as `vbcluster fit` does), the
append is `vbcluster ingest --append` in another; the fit's first iteration waits until the append
has committed (a file barrier), so the append lands inside the fit every time."""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from pipeline.ingest import ingest
from pipeline.runs.directory import assign_store, read_result
from pipeline.runs.publish import VERSIONS, plan_refresh, publish
from pipeline.store.features import FeatureStore
from vbcore.errors import StoreError

TIMEOUT = 1200  # a safety bound only: under a load of 50 on 2 cores a start took minutes

_FIT = """
import os, sys, time
from pipeline import VBMixture
from pipeline.runs.directory import save_run
store, run, fitting, appended = sys.argv[1:5]

def wait_for_the_append(info):
    if not os.path.exists(fitting):
        open(fitting, "w").close()
        t0 = time.time()
        while not os.path.exists(appended) and time.time() - t0 < 3000:  # (the parent bounds it)
            time.sleep(0.01)

model = VBMixture(n_components=4, covariance_type="diag", max_iter=4, tol=0, random_state=0)
model.fit(store, callback=wait_for_the_append)
save_run(run, model, store)
"""


def _data(n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    return (rng.normal(size=(n, 6)) + 4 * y[:, None]).astype(np.float32), y.astype(np.int64)


def test_a_fit_racing_an_append_records_the_store_it_fitted(tmp_path):
    store = str(tmp_path / "s.zarr")
    for k, n in ((0, 2000), (1, 500)):
        X, y = _data(n, k)
        np.save(tmp_path / f"x{k}.npy", X)
        np.save(tmp_path / f"y{k}.npy", y)
    ingest(str(tmp_path / "x0.npy"), store, labels=str(tmp_path / "y0.npy"), chunk_rows=500)
    before = FeatureStore.open(store).fingerprint
    run, fitting, appended = tmp_path / "run", tmp_path / "fitting", tmp_path / "appended"
    env = dict(os.environ, PYTHONPATH=os.getcwd(), COLUMNS="500")
    fit = subprocess.Popen([sys.executable, "-c", _FIT, store, str(run), str(fitting), str(appended)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.time() + TIMEOUT
        while not fitting.exists():  # the fit has opened the store and runs its first iteration
            assert fit.poll() is None and time.time() < deadline, fit.stdout.read() if fit.stdout else ""
            time.sleep(0.01)
        add = subprocess.run([sys.executable, "-m", "pipeline.cli", "ingest", str(tmp_path / "x1.npy"),
                              "--out", store, "--append", "--labels", str(tmp_path / "y1.npy")],
                             capture_output=True, text=True, env=env, timeout=TIMEOUT)
        assert add.returncode == 0, add.stdout + add.stderr
        appended.touch()
        out = fit.communicate(timeout=TIMEOUT)[0]
    finally:
        fit.kill()
    assert fit.returncode == 0, out
    grown = FeatureStore.open(store)
    assert grown.n_rows == 2500 and grown.fingerprint != before
    result = read_result(run)
    assert result["n_rows"] == 2000 and result["store_fingerprint"] == before  # what it fitted
    assert result["metrics"]["clusters_used"] >= 1
    with pytest.raises(StoreError, match=r"s\.zarr changed since the run in .*run was fitted \(fingerprint "
                       r"differs\); refit, or pass the store the run was fitted on"):
        assign_store(run)
    out_dir = tmp_path / "out"
    version = out_dir / VERSIONS / "v0001-race"
    version.parent.mkdir(parents=True)
    shutil.copytree(run, version)
    publish(out_dir, version)
    plan = plan_refresh(out_dir, store)
    assert (plan.action, plan.previous_n_rows, plan.n_rows) == ("warm", 2000, 2500), plan
    assert json.loads((version / "result.json").read_text())["n_rows"] == 2000
