"""NCG's per-chunk state on a Dask cluster: rebuilt from the last checkpoint when its worker dies.

Between passes NCG keeps per-chunk logits and directions on the workers, each the end of a chain of
tasks (one per gradient pass) that Dask keeps to rebuild a dead worker's states. A checkpoint puts the
states it gathered back as new tasks, so the chain (and what the scheduler holds for it) only covers
the passes since the last checkpoint, and a worker SIGKILLed after a checkpoint is rebuilt from it.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest
from distributed import Client, LocalCluster

from pipeline import VBMixture

N_ROWS, N_FEATURES, CHUNK_ROWS = 8_000, 16, 2_000  # 4 chunks, 2 per worker
FIT = dict(n_components=6, learner="ncg", covariance_type="diag", max_iter=8, tol=0.0, random_state=0,
           chunk_rows=CHUNK_ROWS)
POSTERIOR = ("means_", "covariances_", "weights_", "precisions_cholesky_", "lower_bounds_")


@pytest.fixture(scope="module")
def X() -> np.ndarray:
    rng = np.random.default_rng(3)
    centres = rng.normal(0.0, 0.6, size=(8, N_FEATURES))
    return (centres[rng.integers(0, 8, N_ROWS)] + rng.normal(size=(N_ROWS, N_FEATURES))).astype(np.float32)


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


def _tasks(dask_scheduler: Any) -> int:
    return len(dask_scheduler.tasks)


def _same_bits(got: VBMixture, want: VBMixture) -> None:
    for name in POSTERIOR:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert got.n_iter_ == want.n_iter_


def _fit(X: np.ndarray, client: Client, checkpoint_dir: str | None, on_iteration: Any = None,
         fit: dict[str, Any] | None = None) -> VBMixture:
    return VBMixture(engine=client, checkpoint_dir=checkpoint_dir, checkpoint_every=2, **(fit or FIT)).fit(
        X, callback=on_iteration)


@pytest.fixture(scope="module")
def plain(X, client) -> tuple[VBMixture, list[int]]:
    """The fit without checkpoints, and the scheduler's task count after every iteration."""
    seen: list[int] = []
    return _fit(X, client, None, lambda info: seen.append(client.run_on_scheduler(_tasks))), seen


@pytest.mark.parametrize("which", ["ncg", "truncated"])
def test_checkpoints_bound_the_states_lineage(tmp_path, X, client, request, which):
    """Without checkpoints the scheduler's graph grows with every pass that updates the states (the
    lineage); with a checkpoint every 2 iterations it stays at its size after the first ones. Same
    bits either way. NCG's logits and the truncated E-step's candidate sets alike."""
    model, grows = request.getfixturevalue("plain" if which == "ncg" else "plain_truncated")
    bounded: list[int] = []
    checkpointed = _fit(X, client, str(tmp_path),
                        lambda info: bounded.append(client.run_on_scheduler(_tasks)),
                        FIT if which == "ncg" else TRUNCATED)
    assert len(grows) == len(bounded) == FIT["max_iter"]
    growth = grows[-1] - grows[1]
    assert growth > 30, grows  # the chain: NCG ~10 tasks per gradient pass, the truncated E-step ~8
    # with checkpoints the count only fluctuates by the tasks in flight (released asynchronously, so
    # a count taken after an iteration may still hold a pass's worth): far less than the chain's growth
    assert max(bounded[2:]) - bounded[1] < growth / 2, (bounded, grows)
    _same_bits(checkpointed, model)


def test_a_killed_worker_rebuilds_ncg_states_from_the_last_checkpoint(tmp_path, X, client, plain):
    """SIGKILL the worker process holding the most chunk states right after iteration 5 (the last
    checkpoint: iteration 4): the nanny restarts it, Dask rebuilds its states from the checkpoint's
    tasks and the passes since, and the fit ends with the bits of an uninterrupted one."""
    _kill_after_5_gives_the_same_bits(tmp_path, X, client, FIT, plain[0])


#: VB EM with the truncated E-step: its per-chunk candidate sets live on the workers like NCG's state
TRUNCATED = dict(FIT, learner="vbem", learner_options={"candidates": 2, "neighbours": 3})


@pytest.fixture(scope="module")
def plain_truncated(X, client) -> tuple[VBMixture, list[int]]:
    """As ``plain``, for the truncated E-step."""
    seen: list[int] = []
    return _fit(X, client, None, lambda info: seen.append(client.run_on_scheduler(_tasks)), TRUNCATED), seen


def test_a_killed_worker_rebuilds_candidate_sets_from_the_last_checkpoint(tmp_path, X, client,
                                                                         plain_truncated):
    """As for NCG: the truncated E-step's candidate sets of the killed worker's chunks are rebuilt
    from the checkpoint of iteration 4 (put back as tasks when it was written) and the pass since."""
    _kill_after_5_gives_the_same_bits(tmp_path, X, client, TRUNCATED, plain_truncated[0])


def _kill_after_5_gives_the_same_bits(tmp_path, X, client, fit: dict[str, Any], reference: VBMixture) -> None:
    """Kill the worker that holds the most chunk states after iteration 5 (Dask decides where tasks
    run, and may run them all on one worker: the victim is chosen from where the states are)."""
    pids = client.run(os.getpid)
    killed: list[int] = []

    def kill_after_5(info: dict[str, Any]) -> None:
        if info["iteration"] == 5:
            held = client.run_on_scheduler(_states_per_worker)
            victim = max(sorted(held), key=lambda a: held[a])
            assert held[victim] > 0, f"no worker holds chunk state: {held}"
            os.kill(pids[victim], signal.SIGKILL)
            killed.append(pids[victim])

    model = _fit(X, client, str(tmp_path), kill_after_5, fit=fit)
    assert killed, "the kill did not happen"
    _same_bits(model, reference)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # leave two live workers for the next test in this session
        now = client.run(os.getpid)
        if len(now) == 2 and killed[0] not in now.values():
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the nanny did not restart the killed worker: {client.run(os.getpid)}")


def _states_per_worker(dask_scheduler: Any = None) -> dict[str, int]:
    """Per worker address: keys in memory that hold placed states or their descendants."""
    return {addr: sum(1 for ts in ws.has_what if str(ts.key).startswith(("_identity", "getitem")))
            for addr, ws in dask_scheduler.workers.items()}
