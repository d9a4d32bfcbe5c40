"""Ingest: every source round-trips into a real Zarr store on disk, streaming, atomically."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from pipeline.extract.extractors import ColorHogExtractor, FeatureExtractor, TorchExtractor
from pipeline.ingest import IngestReport, bundled_images, ingest
from pipeline.store.features import FeatureStore
from vbcore.errors import ConfigError, InputError, StoreError


def _X(n=300, d=6, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def _leftovers(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or "journal" in p.name
                  or ".old-" in p.name)


def _check(path, X, labels=None, ids=None, chunk_rows=None):
    s = FeatureStore.open(path)
    np.testing.assert_array_equal(s.read(), np.asarray(X, dtype=np.float32))
    if labels is None:
        assert not s.has_labels
    else:
        np.testing.assert_array_equal(s.read_labels(), labels)
    if ids is None:
        assert not s.has_ids
    else:
        np.testing.assert_array_equal(s.read_ids(), ids)
    if chunk_rows is not None:
        assert s.features.chunks[0] == chunk_rows
    return s


# ---- file sources -------------------------------------------------------------------------------
def test_npy_round_trip_many_batches(tmp_path):
    X, y = _X(1000).astype(np.float64), np.arange(1000) % 7
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "ids.npy", np.arange(1000) * 10)
    rep = ingest(str(tmp_path / "x.npy"), tmp_path / "s", chunk_rows=64, labels=str(tmp_path / "y.npy"),
                 ids=str(tmp_path / "ids.npy"))
    assert isinstance(rep, IngestReport)
    assert (rep.rows_written, rep.rows_dropped, rep.n_features, rep.n_rows) == (1000, 0, 6, 1000)
    s = _check(tmp_path / "s", X, y, np.arange(1000) * 10, chunk_rows=64)
    assert s.attrs["source"] == str(tmp_path / "x.npy") and len(s.attrs["appends"]) == 1
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_round_trip(tmp_path, compressed):
    X, y = _X(500, 4), np.arange(500) % 3
    names = np.array([f"row-{i}" for i in range(500)])
    save = np.savez_compressed if compressed else np.savez
    save(tmp_path / "d.npz", X=X, y=y, names=names, other=np.zeros((3, 3)))
    ingest(str(tmp_path / "d.npz"), tmp_path / "s", chunk_rows=50, labels="y", ids="names")
    _check(tmp_path / "s", X, y, names)
    save(tmp_path / "e.npz", emb=X.T.copy(order="F").T)  # Fortran order, the only 2-D array
    ingest(str(tmp_path / "e.npz"), tmp_path / "t", chunk_rows=64)
    _check(tmp_path / "t", X)


def test_hdf5_round_trip(tmp_path):
    h5py = pytest.importorskip("h5py")
    X, y = _X(400, 5), np.arange(400) % 4
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["grp/feats"] = X.astype(np.float16).astype(np.float64)
        f["grp/y"] = y
        f["names"] = np.array([f"n{i}" for i in range(400)], dtype=object).astype("S")
        f["meta"] = np.arange(3)
    ingest(str(tmp_path / "d.h5"), tmp_path / "s", chunk_rows=64, labels="grp/y", ids="names")
    _check(tmp_path / "s", X.astype(np.float16), y, np.array([f"n{i}" for i in range(400)]))


def test_hdf5_integer_ids(tmp_path):
    h5py = pytest.importorskip("h5py")
    X = _X(100, 3)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["X"] = X
        f["ids"] = np.arange(1000, 1100)
    ingest(str(tmp_path / "d.h5"), tmp_path / "s", chunk_rows=32, dataset="X", ids="ids")
    s = _check(tmp_path / "s", X, ids=np.arange(1000, 1100))
    assert s.read_ids().dtype == np.int64


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    X, y = _X(700, 3), np.arange(700) % 5
    table = pa.table({"a": X[:, 0], "b": X[:, 1].astype(np.float64), "c": X[:, 2], "y": y,
                      "id": [f"r{i}" for i in range(700)], "note": ["x"] * 700,
                      "flag": np.arange(700) % 2 == 0})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=100)
    ingest(str(tmp_path / "d.parquet"), tmp_path / "s", chunk_rows=64, labels="y", ids="id",
           ignore_columns="note")
    expect = np.column_stack([X, (np.arange(700) % 2 == 0)]).astype(np.float32)
    s = _check(tmp_path / "s", expect, y, np.array([f"r{i}" for i in range(700)]))
    assert s.attrs["extractor_params"]["columns"] == ["a", "b", "c", "flag"]


def test_csv_round_trip_streams_and_fixes_types(tmp_path):
    n = 3000
    X = np.round(_X(n, 3), 3)
    X[:1000, 1] = np.round(X[:1000, 1])  # integers in the first blocks, floats later
    y = np.arange(n) % 4
    lines = ["id,f1,label,f2,f3,comment"]
    for i in range(n):
        f2 = f"{int(X[i, 1])}" if i < 1000 else f"{X[i, 1]:.3f}"
        lines.append(f"{1000 + i},{X[i, 0]:.3f},{y[i]},{f2},{X[i, 2]:.3f},c{i}")
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    rep = ingest(str(tmp_path / "d.csv"), tmp_path / "s", chunk_rows=256, labels="label", ids="id",
                 ignore_columns=["comment"], block_bytes=4096)
    assert rep.rows_written == n
    _check(tmp_path / "s", X, y, 1000 + np.arange(n))


# ---- image folders ------------------------------------------------------------------------------
class MeanColour:
    """A tiny plug-in extractor: mean R, G, B and the image height."""

    name = "mean-colour"
    params = {"what": "mean rgb + height"}
    n_features = 4

    def __call__(self, images):
        return np.array([[*im.reshape(-1, 3).mean(axis=0), im.shape[0]] for im in images])


def _image_folder(root, bad=False):
    from PIL import Image

    rng = np.random.default_rng(0)
    made = {}
    for cls, sub, ext in (("cats", "", ".png"), ("cats", "deep/er", ".jpg"), ("dogs", "", ".bmp"),
                          ("dogs", "", ".tif"), ("birds", "", ".PNG")):
        for k in range(2):
            d = root / cls / sub
            d.mkdir(parents=True, exist_ok=True)
            arr = rng.integers(0, 256, size=(8 + k, 10, 3), dtype=np.uint8)
            rel = (d / f"im{k}{ext}").relative_to(root).as_posix()
            Image.fromarray(arr).save(root / rel)
            made[rel] = arr if ext.lower() != ".jpg" else np.asarray(Image.open(root / rel).convert("RGB"))
    (root / "dogs" / "notes.txt").write_text("not an image")
    if bad:
        (root / "dogs" / "broken.png").write_bytes(b"\x89PNG garbage")
    return dict(sorted(made.items()))


def test_image_folder_with_plugin_extractor(tmp_path):
    made = _image_folder(tmp_path / "imgs")
    assert isinstance(MeanColour(), FeatureExtractor)
    rep = ingest(str(tmp_path / "imgs"), tmp_path / "s", chunk_rows=4, labels="folders",
                 extractor=MeanColour(), batch_images=3)
    assert rep.rows_written == len(made) == 10
    s = FeatureStore.open(tmp_path / "s")
    assert list(s.read_ids()) == list(made)
    expect = np.array([[*a.reshape(-1, 3).mean(axis=0), a.shape[0]] for a in made.values()], np.float32)
    np.testing.assert_allclose(s.read(), expect, rtol=1e-6)
    classes = ["birds", "cats", "dogs"]
    assert s.attrs["extractor"] == "mean-colour"
    assert s.attrs["extractor_params"] == {"what": "mean rgb + height", "classes": classes}
    np.testing.assert_array_equal(s.read_labels(), [classes.index(p.split("/")[0]) for p in made])


def test_image_folder_colorhog_default(tmp_path):
    made = _image_folder(tmp_path / "imgs")
    ingest(str(tmp_path / "imgs"), tmp_path / "s")
    s = FeatureStore.open(tmp_path / "s")
    assert s.n_features == ColorHogExtractor().n_features == 3 * 16 + 9 * 4 * 7 * 7
    assert s.attrs["extractor"] == "color-hog" and not s.has_labels
    again = ColorHogExtractor()(list(made.values()))
    np.testing.assert_array_equal(s.read(), again)  # deterministic, bit for bit
    hist = s.read()[:, :48].reshape(-1, 3, 16).sum(axis=2)
    np.testing.assert_allclose(hist, 1.0, rtol=1e-5)


def test_unreadable_image_fails_whole_or_is_skipped(tmp_path):
    _image_folder(tmp_path / "imgs", bad=True)
    with pytest.raises(InputError, match=r"broken\.png: cannot read the image"):
        ingest(str(tmp_path / "imgs"), tmp_path / "s", chunk_rows=2, extractor=MeanColour())
    assert not (tmp_path / "s").exists() and _leftovers(tmp_path) == []
    rep = ingest(str(tmp_path / "imgs"), tmp_path / "s", extractor=MeanColour(), skip_unreadable=True)
    assert rep.skipped_files == ("dogs/broken.png",) and rep.rows_written == 10


def test_torch_extractor_needs_torch():
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="needs torch and torchvision"):
            TorchExtractor("weights.pt")
    else:
        pytest.skip("torch is installed")


# ---- built-ins ----------------------------------------------------------------------------------
def test_digits(tmp_path):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    ingest("digits", tmp_path / "s", chunk_rows=500)
    _check(tmp_path / "s", X, y, np.arange(len(X)))


def test_image_name_pixels(tmp_path):
    assert {"astronaut", "coffee", "chelsea"} <= set(bundled_images())
    rep = ingest("image:coffee", tmp_path / "s", chunk_rows=5000)
    s = FeatureStore.open(tmp_path / "s")
    p = s.attrs["extractor_params"]
    h, w = p["shape"]
    assert p["original_shape"] == [400, 600] and p["downsample"] == 3 and (h, w) == (134, 200)
    assert rep.n_features == 5 and s.n_rows == h * w <= 40_000
    F = s.read()
    assert F.min() == -1.0 and F.max() == 1.0
    np.testing.assert_array_equal(s.read_ids(), np.arange(h * w))
    grid = F.reshape(h, w, 5)
    np.testing.assert_allclose(grid[:, 0, 3], np.linspace(-1, 1, h), atol=1e-6)
    np.testing.assert_allclose(grid[0, :, 4], np.linspace(-1, 1, w), atol=1e-6)
    import skimage.data

    np.testing.assert_allclose(grid[..., :3], skimage.data.coffee()[::3, ::3] / 127.5 - 1, atol=1e-6)
    ingest("image:astronaut", tmp_path / "t", downsample=8)
    assert FeatureStore.open(tmp_path / "t").n_rows == 64 * 64


def test_synthetic_shape_sparsity_classes(tmp_path):
    rep = ingest("synthetic", tmp_path / "s", chunk_rows=1024, rows=5000, dim=256, classes=40, seed=3)
    s = FeatureStore.open(tmp_path / "s")
    F, y = s.read(), s.read_labels()
    assert F.shape == (5000, 256) and rep.rows_written == 5000 and not s.has_ids
    assert F.min() == 0.0 and 0.5 <= (F == 0).mean() <= 0.8
    sizes = np.bincount(y, minlength=40)
    assert len(sizes) == 40 and sizes.min() >= 20 and sizes.max() > 3 * sizes.min()
    assert s.attrs["extractor"] == "synthetic" and s.attrs["extractor_params"]["seed"] == 3


def test_synthetic_is_reproducible(tmp_path):
    kw = dict(chunk_rows=700, rows=2000, dim=64, classes=10)
    fps = [FeatureStore.open(ingest("synthetic", tmp_path / f"s{i}", seed=seed, **kw).path).fingerprint
           for i, seed in enumerate((7, 7, 8))]
    assert fps[0] == fps[1] != fps[2]


# ---- streaming, memory, atomicity ---------------------------------------------------------------
def test_memory_stays_within_a_few_chunks(tmp_path):
    n, d, chunk = 102_400, 512, 4096  # 200 MiB of float32, 8 MiB chunks
    mm = np.lib.format.open_memmap(tmp_path / "big.npy", mode="w+", dtype=np.float32, shape=(n, d))
    rng = np.random.default_rng(0)
    for s in range(0, n, 6400):
        mm[s:s + 6400] = rng.random((6400, d), dtype=np.float32)
    mm.flush()
    del mm
    tracemalloc.start()
    try:
        rep = ingest(str(tmp_path / "big.npy"), tmp_path / "s", chunk_rows=chunk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rep.rows_written == n
    assert peak < 6 * chunk * d * 4, f"peak {peak / 2**20:.0f} MiB for {chunk * d * 4 / 2**20:.0f} MiB chunks"


def test_a_chunk_larger_than_the_source_is_capped(tmp_path):
    """--chunk-rows 50000000 on 10 rows (issue 29): the store's chunk is capped (the default chunk,
    room for appends), so writing 10 rows does not build a 50,000,000-row chunk (1.8 GB) in memory."""
    np.save(tmp_path / "ten.npy", np.arange(90, dtype=np.float32).reshape(10, 9))
    tracemalloc.start()
    try:
        rep = ingest(str(tmp_path / "ten.npy"), tmp_path / "s", chunk_rows=50_000_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    store = FeatureStore.open(tmp_path / "s")
    assert rep.rows_written == 10 and store.chunk_rows == 8192
    np.testing.assert_array_equal(store.read(), np.arange(90, dtype=np.float32).reshape(10, 9))
    assert peak < 20 * 2**20, f"peak {peak / 2**20:.0f} MiB for 10 rows"
    big = np.zeros((9000, 2), dtype=np.float32)  # a source of more rows than the default: its own size
    np.save(tmp_path / "big.npy", big)
    ingest(str(tmp_path / "big.npy"), tmp_path / "b", chunk_rows=50_000_000)
    assert FeatureStore.open(tmp_path / "b").chunk_rows == 9000


def test_nonfinite_rejected_with_row_and_nothing_written(tmp_path):
    X = _X(1000)
    X[777, 2] = np.nan
    np.save(tmp_path / "x.npy", X)
    with pytest.raises(InputError, match=r"non-finite value at row 777, column 2"):
        ingest(str(tmp_path / "x.npy"), tmp_path / "s", chunk_rows=100)
    assert not (tmp_path / "s").exists() and _leftovers(tmp_path) == []
    rep = ingest(str(tmp_path / "x.npy"), tmp_path / "s", chunk_rows=100, drop_nonfinite=True)
    assert (rep.rows_written, rep.rows_dropped) == (999, 1)
    _check(tmp_path / "s", np.delete(X, 777, axis=0))


def test_append_adds_rows_across_a_partial_chunk(tmp_path):
    X1, X2 = _X(100, 4, seed=1), _X(250, 4, seed=2)
    np.savez(tmp_path / "a.npz", X=X1, y=np.zeros(100, int))
    np.savez(tmp_path / "b.npz", X=X2, y=np.ones(250, int))
    ingest(str(tmp_path / "a.npz"), tmp_path / "s", chunk_rows=64, labels="y")
    rep = ingest(str(tmp_path / "b.npz"), tmp_path / "s", chunk_rows=10, labels="y", append=True)
    assert (rep.rows_written, rep.n_rows) == (250, 350)
    s = _check(tmp_path / "s", np.vstack([X1, X2]), np.r_[np.zeros(100), np.ones(250)], chunk_rows=64)
    assert [a["rows"] for a in s.attrs["appends"]] == [100, 250]


def test_append_other_dimension_leaves_store_unchanged(tmp_path):
    np.save(tmp_path / "a.npy", _X(100, 4))
    np.save(tmp_path / "b.npy", _X(100, 5))
    ingest(str(tmp_path / "a.npy"), tmp_path / "s", chunk_rows=64)
    before = FeatureStore.open(tmp_path / "s").fingerprint
    with pytest.raises(InputError, match="rows have 5 features but the store has 4"):
        ingest(str(tmp_path / "b.npy"), tmp_path / "s", append=True)
    s = FeatureStore.open(tmp_path / "s")
    assert s.fingerprint == before and s.n_rows == 100 and _leftovers(tmp_path) == []


def test_overwrite_replaces_only_when_complete(tmp_path):
    np.save(tmp_path / "a.npy", _X(100, 4))
    bad = _X(200, 3)
    bad[150, 0] = np.inf
    np.save(tmp_path / "bad.npy", bad)
    ingest(str(tmp_path / "a.npy"), tmp_path / "s")
    before = FeatureStore.open(tmp_path / "s").fingerprint
    with pytest.raises(InputError, match="row 150"):
        ingest(str(tmp_path / "bad.npy"), tmp_path / "s", chunk_rows=64, overwrite=True)
    assert FeatureStore.open(tmp_path / "s").fingerprint == before and _leftovers(tmp_path) == []
    ingest(str(tmp_path / "bad.npy"), tmp_path / "s", overwrite=True, drop_nonfinite=True)
    assert FeatureStore.open(tmp_path / "s").n_features == 3 and _leftovers(tmp_path) == []
    (tmp_path / "notastore").mkdir()
    (tmp_path / "notastore" / "precious.txt").write_text("keep me")
    with pytest.raises(StoreError, match="not a vbcluster feature store; refusing to replace it"):
        ingest(str(tmp_path / "a.npy"), tmp_path / "notastore", overwrite=True)
    assert (tmp_path / "notastore" / "precious.txt").exists()


# ---- clear errors -------------------------------------------------------------------------------
def test_clear_errors(tmp_path):
    np.save(tmp_path / "a.npy", _X(10, 2))
    with pytest.raises(ConfigError, match="unknown source 'nope.txt'"):
        ingest("nope.txt", tmp_path / "s")
    with pytest.raises(InputError, match="missing.npy: no such file"):
        ingest(str(tmp_path / "missing.npy"), tmp_path / "s")
    np.savez(tmp_path / "amb.npz", a=np.zeros((3, 2)), b=np.ones((3, 2)))
    with pytest.raises(InputError, match=r"cannot tell which array.*a \(3, 2\), b \(3, 2\).*key=NAME"):
        ingest(str(tmp_path / "amb.npz"), tmp_path / "s")
    with pytest.raises(InputError, match="no array 'c'"):
        ingest(str(tmp_path / "amb.npz"), tmp_path / "s", key="c")
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"] = np.zeros((3, 2))
    with pytest.raises(InputError, match=r"no dataset 'feats' \(datasets: x \(3, 2\)\)"):
        ingest(str(tmp_path / "d.h5"), tmp_path / "s", dataset="feats")
    (tmp_path / "d.csv").write_text("a,b,name\n1,2,x\n3,4,y\n")
    with pytest.raises(InputError, match=r"non-numeric column\(s\) name \(string\)"):
        ingest(str(tmp_path / "d.csv"), tmp_path / "s")
    with pytest.raises(ConfigError, match="unknown image 'mona_lisa'.*astronaut"):
        ingest("image:mona_lisa", tmp_path / "s")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['bogus'\]"):
        ingest(str(tmp_path / "a.npy"), tmp_path / "s", bogus=1)
    ingest(str(tmp_path / "a.npy"), tmp_path / "s")
    with pytest.raises(StoreError, match=r"already exists; pass --append \(append=True\) .* or --overwrite"):
        ingest(str(tmp_path / "a.npy"), tmp_path / "s")
    with pytest.raises(StoreError, match="no feature store to append to"):
        ingest(str(tmp_path / "a.npy"), tmp_path / "t", append=True)
    with pytest.raises(ConfigError, match="contradict"):
        ingest(str(tmp_path / "a.npy"), tmp_path / "s", append=True, overwrite=True)
