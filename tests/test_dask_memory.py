"""Dask workers with a memory limit (issue 52): cluster_config/memory_limited.yaml's workers, made
small enough that a small store's persisted chunks spill to disk, fit with the in-process engine's
bits; and one of them SIGKILLed mid-fit is restarted by its nanny, with the same bits again.

The kill machinery is tests/test_faults_workers.py's (a DaskEngine that counts its passes, a seeded
kill moment, retries with earlier moments should a fit end before it): see that module. Both tests
ran 20 times in a loop when written, 20/20 passing (46-116 s a run at load 9-13 on 2 cores).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import dask
import pytest
from distributed import Client

import tests.test_faults_workers as faults
from pipeline import VBMixture
from pipeline.engine.cluster import load_cluster_config
from tests.test_faults_workers import (
    FIT,
    _assert_one_blas_thread,
    _assert_same_bits,
    _check_landed,
    _fit_and_kill,
    _moments,
    _wait_for_pids,
)

rows, store, reference = faults.rows, faults.store, faults.reference  # the fault tests' fixtures

CONFIG = Path(__file__).resolve().parents[1] / "cluster_config" / "memory_limited.yaml"
#: the store's prepared chunks ([x*x, x] of 40,000 x 64 float32 rows) take 20 MB; a worker spills
#: its managed data above 1% of 1 GiB (10.7 MB): each of the two holds about half of them, and spills
SPILL = {"distributed.worker.memory.target": 0.01, "distributed.worker.memory.spill": False,
         "distributed.worker.memory.pause": False, "distributed.deploy.lost-worker-timeout": "1h"}


@pytest.fixture
def limited():
    """The example config's cluster, two workers of 1 GiB, spilling above 1% of it."""
    cfg = load_cluster_config(CONFIG)
    assert cfg.cluster_kwargs["memory_limit"] == "3GB" and cfg.cluster_kwargs["n_workers"] == 4
    cfg = replace(cfg, cluster_kwargs={**cfg.cluster_kwargs, "n_workers": 2, "memory_limit": "1GiB",
                                       "dashboard_address": None})
    with dask.config.set(SPILL):
        cluster = cfg.make_cluster()
        client = Client(cluster)
        try:
            client.wait_for_workers(2, timeout=60)
            _assert_one_blas_thread(client)
            yield client
        finally:
            client.close()
            cluster.close()


def _disk(client: Client) -> tuple[int, int]:
    """Keys written to and read from disk by all workers so far (their spill buffers' metrics)."""
    m = client.run(lambda dask_worker: dict(dask_worker.data.cumulative_metrics))
    counts = [(label, v) for d in m.values() for (label, unit), v in d.items() if unit == "count"]
    return (int(sum(v for label, v in counts if label == "disk-write")),
            int(sum(v for label, v in counts if label == "disk-read")))


def test_memory_limited_workers_spill_and_give_the_same_bits(limited, store, reference):
    model = VBMixture(engine=limited, persist="always", **FIT).fit(store)
    writes, reads = _disk(limited)
    assert writes >= 1 and reads >= 1, (writes, reads)  # chunks went to disk and came back
    _assert_same_bits(model, reference)


@pytest.mark.parametrize("seed", [21])
def test_memory_limited_worker_killed_mid_fit_is_replaced_with_the_same_bits(limited, store, reference,
                                                                            seed):
    client = limited
    for kill_pass, delay_s in _moments(seed):
        model, kill, _ = _fit_and_kill(client, store, "always", seed, kill_pass, delay_s)
        dead = kill.victim_pid
        _wait_for_pids(client, lambda p, dead=dead: len(p) == 2 and dead not in p.values(),
                       "the nanny to restart the killed worker")
        if kill.sent and kill.mid_fit:
            break
    _check_landed(kill, "always")
    assert _disk(client)[0] >= 1
    _assert_same_bits(model, reference)
