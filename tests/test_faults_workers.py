"""A Dask worker process SIGKILLed in the middle of a fit does not change a single bit of the result.

Every test fits the same multi-chunk feature store on two worker processes, SIGKILLs one of them
while the fit runs, and checks that the fit completes with exactly the posterior of an
uninterrupted in-process fit (``np.array_equal``, not ``allclose``).

* ``LocalCluster`` workers run under nannies: the killed worker process is restarted, and the fit
  goes on over the survivor and the new process.
* CLI-started ``dask worker --no-nanny`` processes: the killed worker stays dead and the survivor
  finishes the fit alone.

With ``persist='always'`` the prepared chunks held by the dead worker are lost with it; Dask
recomputes them from their ``_load_prep`` lineage (each of those tasks carries the store source).
With ``persist='never'`` every pass reads the chunks from the store. Either way, chunk results and
merges lost with the worker are recomputed from the pass's global state, itself a task that Dask
can rerun. One more test kills a worker just as a pass sends its state.

The reference runs with one BLAS thread, as Dask workers do (a nanny sets OPENBLAS_NUM_THREADS=1
and the other ``distributed.nanny.pre-spawn-environ`` variables; ``--no-nanny`` workers get the same
from ``tests/_dask_procs.py``). OpenBLAS with two threads gives other last bits on these 2,000 x 128
GEMMs, with or without a fault, so the in-process default would not be the same computation.

The moment of the kill is drawn from a seed: a pass of the fit (counted by a ``DaskEngine`` that
only observes its passes) and a delay after that pass starts. The kill is sent while the engine's
pass counter is locked, so the test knows how many passes had finished at that instant and asserts
that more passes finished afterwards: the kill landed mid-fit. Should a fit ever end before the
drawn moment, the attempt is repeated with an earlier one; it never passes without a kill mid-fit.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster
from threadpoolctl import threadpool_info, threadpool_limits

from pipeline import VBMixture
from pipeline.engine.engines import DaskEngine
from pipeline.store.features import FeatureStore
from tests._dask_procs import dask_scheduler_and_workers

N_ROWS, N_FEATURES, CHUNK_ROWS = 40_000, 64, 2_000  # 20 chunks of 2,000 rows
FIT = dict(n_components=8, covariance_type="diag", max_iter=30, tol=0.0, random_state=0)
POSTERIOR = ("means_", "covariances_", "weights_", "precisions_cholesky_", "lower_bounds_")
FIT_TIMEOUT_S = 60.0  # an uninterrupted fit takes 2-8 s here
ATTEMPTS = 3


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    """Overlapping blobs: the ELBO still rises at iteration 30, so every pass changes the posterior."""
    rng = np.random.default_rng(7)
    centres = rng.normal(0.0, 0.25, size=(12, N_FEATURES))
    return (centres[rng.integers(0, 12, N_ROWS)] + rng.normal(size=(N_ROWS, N_FEATURES))).astype(np.float32)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, rows: np.ndarray) -> str:
    path = tmp_path_factory.mktemp("faults") / "blobs.zarr"
    FeatureStore.create(path, N_FEATURES, chunk_rows=CHUNK_ROWS, labels=False).append(rows)
    return str(path)


@pytest.fixture(scope="module")
def reference(store: str) -> VBMixture:
    """The uninterrupted fit on the in-process engine, with one BLAS thread like a Dask worker."""
    with threadpool_limits(limits=1, user_api="blas"):
        model = VBMixture(engine="local", **FIT).fit(store)
    assert model.n_iter_ == FIT["max_iter"]
    assert np.all(np.diff(model.lower_bounds_[-5:]) > 0)  # still moving: a wrong pass would show
    return model


def _assert_same_bits(got: VBMixture, want: VBMixture) -> None:
    for name in POSTERIOR:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert got.n_iter_ == want.n_iter_ and got.lower_bound_ == want.lower_bound_


class _ObservedEngine(DaskEngine):
    """``DaskEngine`` (what ``engine=client`` builds) that counts its passes and keeps its handles.

    Nothing is changed: every call goes to DaskEngine. The pass counters, under ``cond``, let the
    test place a kill at a chosen pass and know exactly how far the fit was when it landed.
    """

    def __init__(self, client: Client, persist: str) -> None:
        super().__init__(client, persist=persist)
        self.cond = threading.Condition()
        self.started = 0
        self.finished = 0
        self.handles: list[Any] = []
        self.who_has_at_release: dict[str, Any] = {}
        self.on_state: tuple[int, Callable[[], None]] | None = None  # (pass, call) as it is sent

    def _broadcast(self, args: Any) -> Any:
        """Where a pass sends the global state to the workers: a hook for a kill at that moment."""
        if self.on_state is not None and self.started == self.on_state[0]:
            _, call = self.on_state
            self.on_state = None
            call()
        return super()._broadcast(args)

    def _pass(self, run: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self.cond:
            self.started += 1
            self.cond.notify_all()
        try:
            return run(*args, **kwargs)
        finally:
            with self.cond:
                self.finished += 1
                self.cond.notify_all()

    def prepare(self, *args: Any, **kwargs: Any) -> list[Any]:
        self.handles = super().prepare(*args, **kwargs)
        return self.handles

    def map(self, *args: Any, **kwargs: Any) -> Any:
        return self._pass(super().map, *args, **kwargs)

    def map_reduce(self, *args: Any, **kwargs: Any) -> Any:
        return self._pass(super().map_reduce, *args, **kwargs)

    def map_keep(self, *args: Any, **kwargs: Any) -> Any:
        return self._pass(super().map_keep, *args, **kwargs)

    def release(self, handles: Any) -> None:
        futures = [h for h in handles if hasattr(h, "key")]
        if futures:  # where the persisted chunks are now, recomputed ones included
            self.who_has_at_release = self.client.who_has(futures)
        super().release(handles)

    def persisted_on(self, address: str) -> int:
        """How many persisted chunks ``address`` holds now (0 when streaming)."""
        futures = [h for h in self.handles if hasattr(h, "key")]
        if not futures:
            return 0
        return sum(address in ws for ws in self.client.who_has(futures).values())


@dataclass
class Kill:
    """What happened: when the SIGKILL was sent, relative to the fit's passes."""

    victim_address: str
    victim_pid: int
    kill_pass: int
    delay_s: float
    started_at_kill: int = 0
    finished_at_kill: int = 0
    total_passes: int = 0
    chunks_on_victim: int = 0
    sent: bool = False

    @property
    def mid_fit(self) -> bool:
        return self.finished_at_kill < self.total_passes

    @property
    def mid_pass(self) -> bool:
        return self.started_at_kill > self.finished_at_kill


def _assert_one_blas_thread(client: Client) -> None:
    """The reference's setting: otherwise a mismatch would be BLAS threading, not the fault."""
    per_worker = {addr: [int(i["num_threads"]) for i in info if i["user_api"] == "blas"]
                  for addr, info in client.run(threadpool_info).items()}  # workers can't import this module
    assert all(threads and set(threads) == {1} for threads in per_worker.values()), per_worker


def _worker_pids(client: Client) -> dict[str, int]:
    return {addr: int(pid) for addr, pid in client.run(os.getpid).items()}


def _moments(seed: int) -> list[tuple[int, float]]:
    """The seeded kill moment (pass, delay after its start), then earlier ones for retries."""
    rng = np.random.default_rng(seed)
    first = (int(rng.integers(5, 22)), float(rng.uniform(0.0, 0.08)))
    return [first, (max(first[0] // 2, 4), 0.0), (4, 0.0)][:ATTEMPTS]


def _fit_and_kill(client: Client, store: Any, persist: str, seed: int, kill_pass: int, delay_s: float,
                  at_state: bool = False, **fit: Any) -> tuple[VBMixture, Kill, _ObservedEngine]:
    """Fit ``store`` (a store path, or any ``X``) in a background thread; SIGKILL one worker process
    ``delay_s`` after pass ``kill_pass`` starts, or (``at_state``) from the fit's own thread just as
    that pass sends its state. ``fit`` overrides settings of ``FIT``."""
    pids = _worker_pids(client)
    assert len(pids) == 2, pids
    victim = sorted(pids)[int(np.random.default_rng(seed + 1000).integers(2))]
    kill = Kill(victim, pids[victim], kill_pass, delay_s)
    engine = _ObservedEngine(client, persist)
    model = VBMixture(engine=engine, **dict(FIT, **fit))
    out: dict[str, Any] = {}

    def fit() -> None:
        try:
            out["model"] = model.fit(store)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            out["error"] = exc

    def send_kill() -> None:
        kill.chunks_on_victim = engine.persisted_on(victim)
        with engine.cond:  # the fit cannot start or finish a pass while the kill is being sent
            kill.started_at_kill, kill.finished_at_kill = engine.started, engine.finished
            os.kill(kill.victim_pid, signal.SIGKILL)
            kill.sent = True

    if at_state:
        engine.on_state = (kill_pass, send_kill)
    thread = threading.Thread(target=fit, name="fit-under-fault", daemon=True)
    thread.start()
    if not at_state:
        with engine.cond:
            while engine.started < kill_pass and thread.is_alive():
                engine.cond.wait(0.05)
        time.sleep(delay_s)
        send_kill()
    thread.join(FIT_TIMEOUT_S)
    assert not thread.is_alive(), f"the fit did not finish within {FIT_TIMEOUT_S} s after {kill}"
    if "error" in out:
        raise AssertionError(f"the fit failed after {kill}") from out["error"]
    kill.total_passes = engine.finished
    print(kill, "mid-pass" if kill.mid_pass else "between passes")
    return out["model"], kill, engine


def _wait_for_pids(client: Client, ok: Callable[[dict[str, int]], bool], what: str,
                   timeout: float = 60.0) -> dict[str, int]:
    """The worker pids once ``ok(pids)`` holds (a worker may be leaving or arriving meanwhile)."""
    deadline = time.monotonic() + timeout
    pids: Any = None
    while True:
        try:
            pids = _worker_pids(client)
        except Exception as exc:  # noqa: BLE001 - a worker went away during client.run
            pids = exc
        if isinstance(pids, dict) and ok(pids):
            return pids
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {pids!r}")
        time.sleep(0.1)


def _check_landed(kill: Kill, persist: str) -> None:
    assert kill.sent and kill.mid_fit, kill
    assert kill.started_at_kill >= kill.kill_pass, kill
    if persist == "always":  # the dead worker took persisted chunks with it
        assert kill.chunks_on_victim >= 1, kill


@pytest.fixture
def local_cluster() -> Any:
    # LocalCluster closes a nanny whose worker name has no live worker ``lost-worker-timeout``
    # (15 s) after a worker of that name left: a second kill of the same worker about 15 s after
    # the first (a retry) would find its nanny closed mid-restart. Nannies here must restart.
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address=None, host="127.0.0.1")
        client = Client(cluster)
        try:
            client.wait_for_workers(2, timeout=60)
            _assert_one_blas_thread(client)
            yield client
        finally:
            client.close()
            cluster.close()


@pytest.mark.parametrize("persist", ["always", "never"])
@pytest.mark.parametrize("seed", [11, 12])
def test_nanny_restarted_worker_killed_mid_fit_gives_same_bits(local_cluster, store, reference,
                                                                persist, seed):
    client = local_cluster
    for kill_pass, delay_s in _moments(seed):
        pids_before = _worker_pids(client)
        model, kill, engine = _fit_and_kill(client, store, persist, seed, kill_pass, delay_s)
        # the nanny brings a new worker process back; the killed one is gone
        dead = kill.victim_pid
        pids_after = _wait_for_pids(client, lambda p, dead=dead: len(p) == 2 and dead not in p.values(),
                                    "the nanny to restart the killed worker")
        assert set(pids_after.values()) != set(pids_before.values())
        if kill.sent and kill.mid_fit:
            break
    _check_landed(kill, persist)
    _assert_same_bits(model, reference)
    live = set(pids_after)
    assert all(ws and set(ws) <= live for ws in engine.who_has_at_release.values())


@pytest.mark.parametrize("persist", ["always", "never"])
def test_cli_worker_killed_mid_fit_survivor_finishes_with_same_bits(store, reference, persist):
    seed = 21
    for kill_pass, delay_s in _moments(seed):
        with dask_scheduler_and_workers(n_workers=2, nanny=False) as address, Client(address) as client:
            client.wait_for_workers(2, timeout=60)
            _assert_one_blas_thread(client)
            pids_before = _worker_pids(client)
            model, kill, engine = _fit_and_kill(client, store, persist, seed, kill_pass, delay_s)
            survivor = next(a for a in pids_before if a != kill.victim_address)
            # no nanny: the killed worker stays dead, the survivor is the whole cluster
            pids_after = _wait_for_pids(client, lambda p: len(p) == 1,
                                        "the scheduler to drop the killed worker")
            assert pids_after == {survivor: pids_before[survivor]}
            if kill.mid_fit:
                break
    _check_landed(kill, persist)
    _assert_same_bits(model, reference)
    # every persisted chunk, the dead worker's too, ends up on the survivor
    assert all(set(ws) == {survivor} for ws in engine.who_has_at_release.values())


def test_worker_killed_as_a_pass_sends_its_state_gives_same_bits(local_cluster, store, reference):
    """The kill lands just as the driver sends a pass's global state to the workers: a worker that
    dies while the state is being placed must neither fail nor stall the pass (a broadcast scatter
    waited forever for the dead worker)."""
    client = local_cluster
    kill_pass = int(np.random.default_rng(31).integers(5, 22))
    model, kill, _ = _fit_and_kill(client, store, "always", 31, kill_pass, 0.0, at_state=True)
    assert kill.sent and kill.started_at_kill == kill_pass and kill.mid_pass, kill
    _check_landed(kill, "always")
    _assert_same_bits(model, reference)
    _wait_for_pids(client, lambda p: len(p) == 2 and kill.victim_pid not in p.values(),
                   "the nanny to restart the killed worker")


def _nanny_kill_until_mid_fit(client: Client, X: Any, persist: str, seed: int,
                              **fit: Any) -> tuple[VBMixture, Kill]:
    for kill_pass, delay_s in _moments(seed):
        model, kill, _ = _fit_and_kill(client, X, persist, seed, kill_pass, delay_s, **fit)
        dead = kill.victim_pid
        _wait_for_pids(client, lambda p, dead=dead: len(p) == 2 and dead not in p.values(),
                       "the nanny to restart the killed worker")
        if kill.sent and kill.mid_fit:
            break
    _check_landed(kill, persist)
    return model, kill


@pytest.mark.parametrize(("kind", "persist"),
                         [("array", "always"), ("array", "never"), ("dask-array", "always")])
def test_array_inputs_survive_a_killed_worker_with_same_bits(local_cluster, rows, reference, kind, persist):
    """In-memory and dask-array rows have a lineage on the cluster (their chunks are tasks): a worker
    killed mid-fit loses nothing that Dask cannot rebuild, and the bits are the store fit's.

    (A dask array streamed with ``persist='never'`` sends its graph with every task -- for
    ``da.from_array`` the whole array -- so it has a lineage but is too slow to fit here.)"""
    X = rows if kind == "array" else da.from_array(rows, chunks=(CHUNK_ROWS, N_FEATURES))
    model, _ = _nanny_kill_until_mid_fit(local_cluster, X, persist, 41, chunk_rows=CHUNK_ROWS)
    _assert_same_bits(model, reference)


NCG = dict(learner="ncg", max_iter=12)


@pytest.fixture(scope="module")
def ncg_reference(store: str) -> VBMixture:
    with threadpool_limits(limits=1, user_api="blas"):
        return VBMixture(engine="local", **dict(FIT, **NCG)).fit(store)


def test_ncg_per_chunk_state_survives_a_killed_worker_with_same_bits(local_cluster, store, ncg_reference):
    """NCG keeps per-chunk logits and directions on the workers between passes; those of a killed
    worker are rebuilt by Dask from their lineage (the passes since the fit placed them)."""
    model, _ = _nanny_kill_until_mid_fit(local_cluster, store, "always", 51, **NCG)
    _assert_same_bits(model, ncg_reference)
