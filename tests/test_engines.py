"""LocalEngine and DaskEngine give the same bits; fits from arrays, dask arrays and stores."""

import dask.array as da
import numpy as np
import pytest

from pipeline import VBMixture
from pipeline.engine.engines import DaskEngine, LocalEngine, make_engine, tree_pairs, tree_reduce
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError, InputError


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(c, 1.0, size=(700, 6)) for c in (-4.0, 0.0, 5.0)]).astype(np.float32)
    return X[rng.permutation(len(X))]


@pytest.fixture(scope="module")
def store(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("stores") / "blobs.zarr"
    s = FeatureStore.create(path, data.shape[1], chunk_rows=256, labels=False)
    s.append(data)
    return str(path)


def _same_bits(a, b):
    for name in ("means_", "covariances_", "weights_", "precisions_cholesky_", "lower_bounds_"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.lower_bound_ == b.lower_bound_ and a.n_iter_ == b.n_iter_


def test_tree_is_fixed_and_complete():
    assert tree_pairs(5) == [[(0, 1), (2, 3), 4], [(0, 1), 2], [(0, 1)]]
    assert tree_reduce(list("abcde"), lambda a, b: f"({a}{b})") == "(((ab)(cd))e)"


def test_the_streaming_fold_is_the_fixed_tree():
    """TreeFold (results merged as they come, in order) builds tree_reduce's tree, operand for
    operand, for every count of chunks up to 600."""
    from pipeline.engine.tree import TreeFold

    def merge(a, b):
        return f"({a},{b})"

    for n in range(1, 601):
        items = [str(i) for i in range(n)]
        fold = TreeFold(merge)
        for item in items:
            fold.push(item)
        assert fold.result() == tree_reduce(items, merge), n
        assert len(fold.stack) == 0
    with pytest.raises(ValueError, match="no chunks"):
        TreeFold(merge).result()


class _Part:
    """A chunk result that counts how many results are alive at once."""

    alive = 0
    most = 0

    def __init__(self, ids):
        self.ids = ids
        _Part.alive += 1
        _Part.most = max(_Part.most, _Part.alive)

    def __del__(self):
        _Part.alive -= 1

    def merge(self, other):
        return _Part(self.ids + other.ids)


@pytest.mark.parametrize("first_alone", [False, True])
def test_the_in_process_reduction_holds_few_results_at_once(first_alone):
    """LocalEngine.map_reduce merges each chunk's result as the fixed tree allows while the pool runs
    at most 2 x threads chunks ahead: 200 chunks on 4 threads never hold more than 2 x 4 + log2(200)
    + 2 results (it held all 200), and the result is tree_reduce's."""
    import time

    engine = LocalEngine(threads=4)
    engine.array_backend = "cupy" if first_alone else "numpy"  # the schedule only; no array is made

    def kernel(i):
        time.sleep(0.001 * (i % 3))  # results complete out of order
        return _Part([i])

    _Part.alive = _Part.most = 0
    got = engine.map_reduce(kernel, list(range(200)))
    assert got.ids == list(range(200))
    assert _Part.most <= 2 * 4 + 8 + 2, _Part.most
    assert engine.map_reduce(kernel, [7]).ids == [7]


@pytest.mark.parametrize("ct", ["diag", "full"])
def test_local_and_dask_engines_are_bitwise_identical(client, store, ct):
    kw = dict(n_components=8, covariance_type=ct, max_iter=25, tol=0.0, random_state=0)
    local = VBMixture(**kw).fit(store)
    dask_fit = VBMixture(engine=client, **kw).fit(store)
    assert local.n_iter_ == 25
    _same_bits(local, dask_fit)


def test_streaming_equals_persisted(client, store):
    kw = dict(n_components=6, covariance_type="diag", max_iter=10, tol=0.0, random_state=1)
    persisted = VBMixture(engine=client, persist="always", **kw).fit(store)
    streamed = VBMixture(engine=client, persist="never", **kw).fit(store)
    local_streamed = VBMixture(persist="never", **kw).fit(store)
    _same_bits(persisted, streamed)
    _same_bits(persisted, local_streamed)


def test_array_dask_array_and_store_inputs_agree(client, store, data):
    kw = dict(n_components=5, covariance_type="diag", max_iter=8, tol=0.0, random_state=2,
              init_params="random")
    from_store = VBMixture(**kw).fit(store)
    from_array = VBMixture(chunk_rows=256, **kw).fit(data)
    from_dask = VBMixture(engine=client, **kw).fit(da.from_array(data, chunks=(256, 6)))
    _same_bits(from_store, from_array)
    _same_bits(from_store, from_dask)


def test_fit_through_scheduler_address(client, store):
    kw = dict(n_components=4, covariance_type="spherical", max_iter=5, tol=0.0, random_state=0)
    _same_bits(VBMixture(engine=client.scheduler.address, **kw).fit(store), VBMixture(**kw).fit(store))


def _deps(dask_scheduler, keys):
    if not all(k in dask_scheduler.tasks for k in keys):
        return None  # the submission has not reached the scheduler yet
    return {k: sorted(str(d.key) for d in dask_scheduler.tasks[k].dependencies) for k in keys}


def _kernel(chunk, params):
    import time

    time.sleep(0.5)  # keep the tasks pending while the scheduler is inspected
    return float(params.sum()) + chunk.n_rows


def test_state_is_scattered_once_per_pass(client, store):
    """Every chunk task of a pass depends on the same single scattered copy of the global state."""
    from pipeline.engine.sources import StoreSource
    from vbcore.kernels.estep import prepare_chunk

    engine = DaskEngine(client, persist="always")
    source = StoreSource(store)
    handles = engine.prepare(source, prepare_chunk, np.zeros(6), "diag")
    params = np.arange(1e5)
    futures = engine._submit(_kernel, handles, (params,), None)
    deps = None
    for _ in range(200):
        deps = client.run_on_scheduler(_deps, keys=[f.key for f in futures])
        if deps is not None:
            break
    assert client.gather(futures) == [params.sum() + (s.stop - s.start) for s in source.chunk_slices()]
    handle_keys = {str(h.key) for h in handles}
    state_keys = {d for ds in deps.values() for d in ds if d not in handle_keys}
    assert len(futures) == len(source.chunk_slices()) > 1
    assert len(state_keys) == 1  # one scatter, shared by all tasks
    assert all(len(ds) == 2 for ds in deps.values())  # its chunk + the state
    engine.release(handles)


def test_engine_errors(store):
    with pytest.raises(ConfigError, match=r"engine must be 'local'"):
        make_engine(42)
    with pytest.raises(ConfigError, match=r"persist must be one of"):
        LocalEngine(persist="sometimes")
    with pytest.raises(ConfigError, match=r"persist must be one of"):
        VBMixture(persist="x").fit(store)


def test_empty_store_and_nonfinite_dask_rows(tmp_path, client):
    FeatureStore.create(tmp_path / "empty.zarr", 3)
    with pytest.raises(InputError, match=r"empty.zarr: the store is empty"):
        VBMixture().fit(str(tmp_path / "empty.zarr"))
    X = np.ones((40, 3), dtype=np.float32)
    X[33, 1] = np.nan
    with pytest.raises(InputError, match=r"non-finite value at row 33, column 1"):
        VBMixture(2).fit(da.from_array(X, chunks=(10, 3)))


def test_cupy_backend_needs_cupy_here():
    with pytest.raises(ConfigError, match=r"array_backend must be one of"):
        LocalEngine(array_backend="jax")
    try:
        import cupy  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or CUDA libraries failing to load
        pass
    else:
        pytest.skip("CuPy imports here (a GPU machine): the refusal is for machines without it")
    with pytest.raises(ConfigError, match=r"array_backend 'cupy' needs CuPy.*vbcluster\[gpu\]"):
        LocalEngine(array_backend="cupy")


@pytest.mark.gpu
@pytest.mark.parametrize("ct", ["diag", "full"])
def test_cupy_backend_fit_matches_numpy(store, ct):
    kw = dict(n_components=6, covariance_type=ct, max_iter=10, tol=0.0, random_state=0)
    cpu = VBMixture(**kw).fit(store)
    gpu = VBMixture(engine=LocalEngine(array_backend="cupy"), **kw).fit(store)
    np.testing.assert_allclose(gpu.means_, cpu.means_, rtol=1e-4, atol=1e-4)
    assert gpu.lower_bound_ == pytest.approx(cpu.lower_bound_, rel=1e-5)


def _spans_of(key):
    """A call that takes 50 ms and records its (start, end) under ``key(argument)``, with the spans."""
    import threading
    import time

    spans: dict[int, tuple[float, float]] = {}
    lock = threading.Lock()

    def call(arg):
        start = time.monotonic()
        time.sleep(0.05)
        with lock:
            spans[key(arg)] = (start, time.monotonic())
        return arg

    return call, spans


def test_a_device_pass_runs_its_first_chunk_alone():
    """On a device backend the in-process pool starts the other chunks only once the first is done
    (it compiles the pass's CuPy kernels once; see pipeline.engine.backends.first_chunk_alone); the
    results stay in chunk order. The engine here is NumPy's with its backend name set to 'cupy' (the
    map does not touch the arrays), so that the schedule is checked on any machine."""
    from pipeline.engine.backends import first_chunk_alone

    assert first_chunk_alone("cupy") and not first_chunk_alone("numpy")
    kernel, spans = _spans_of(int)
    engine = LocalEngine(threads=4)
    engine.array_backend = "cupy"
    assert engine.map(kernel, list(range(6))) == list(range(6))
    first_end = spans[0][1]
    assert all(spans[i][0] >= first_end for i in range(1, 6))


def test_a_device_engine_prepares_its_first_chunk_alone(monkeypatch):
    """The same for loading and preparing the chunks (CuPy compiles the shift's and the squares'
    kernels there): the rule is switched on for a NumPy engine, whose preparation needs no device."""
    import pipeline.engine.engines as engines
    from pipeline.engine.sources import ArraySource

    prep, spans = _spans_of(lambda rows: int(rows[0, 0]))
    X = np.repeat(np.arange(6.0), 10)[:, None] * np.ones((1, 2))  # chunk i holds rows of value i
    monkeypatch.setattr(engines, "first_chunk_alone", lambda backend: True)
    chunks = LocalEngine(persist="always").prepare(ArraySource(X, chunk_rows=10), prep)
    assert [int(c[0, 0]) for c in chunks] == list(range(6))
    assert all(spans[i][0] >= spans[0][1] for i in range(1, 6))
