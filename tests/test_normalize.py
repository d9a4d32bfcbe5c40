"""Row normalisation (vbcore.data.normalize): the transform against a float64 brute force, zero rows, and
the feature store's ``normalize`` (ingest --normalize): recorded, applied by every source and every
append, a conflicting append refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.ingest import ingest
from pipeline.store.features import FeatureStore
from pipeline.store.integrity import check
from vbcore.data.normalize import normalize_rows
from vbcore.errors import ConfigError, StoreError


def _brute(X: np.ndarray, method: str) -> np.ndarray:
    """Row by row, value by value, in Python floats (float64)."""
    out = np.zeros(X.shape, dtype=np.float64)
    for i, row in enumerate(X.tolist()):
        if method == "power-l2":
            row = [math.copysign(math.sqrt(abs(v)), v) for v in row]
        norm = math.sqrt(math.fsum(v * v for v in row))
        out[i] = [v / norm if norm > 0 else v for v in row]
    return out


def _relu_rows(n: int = 300, d: int = 7, seed: int = 0, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = np.maximum(rng.standard_normal((n, d)) * rng.uniform(0.1, 50, d), 0).astype(dtype)
    X[3] = 0.0  # an all-zero row
    X[7, :] = -X[8, :] - 0.5  # a row with negative values (power-l2 keeps the sign)
    return X


@pytest.mark.parametrize("method", ["l2", "power-l2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transform_against_float64_brute_force(method, dtype):
    X = _relu_rows(5000, 5, dtype=dtype)  # more rows than one block of the transform
    before = X.copy()
    got = normalize_rows(X, method)
    assert got.dtype == dtype
    np.testing.assert_array_equal(X, before)  # the input is not modified
    ref = _brute(X, method)
    np.testing.assert_allclose(got, ref.astype(dtype), rtol=0, atol=4 * np.finfo(dtype).eps)
    norms = np.linalg.norm(got.astype(np.float64), axis=1)
    zero = ~X.any(axis=1)
    np.testing.assert_allclose(norms[~zero], 1.0, rtol=4 * np.finfo(dtype).eps)
    if method == "power-l2":
        assert (got[7] < 0).all() and np.isclose(got[7] @ got[7], 1.0)


def test_zero_rows_stay_zero_and_no_nan():
    X = np.zeros((4, 3), dtype=np.float32)
    X[1] = [3.0, 0.0, 4.0]
    for method in ("l2", "power-l2"):
        got = normalize_rows(X, method)
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got[[0, 2, 3]], 0.0)
    np.testing.assert_allclose(normalize_rows(X, "l2")[1], [0.6, 0.0, 0.8], rtol=1e-7)
    np.testing.assert_array_equal(normalize_rows(X, "none"), X)
    assert normalize_rows(np.array([[1, 0], [0, 0]]), "l2").dtype == np.float64  # integers: float64
    import vbcore

    assert vbcore.normalize_rows is normalize_rows  # the package's public name


def test_bad_method_and_shape_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"method must be one of none, l2, power-l2, got 'sqrt'"):
        normalize_rows(np.ones((2, 2)), "sqrt")
    with pytest.raises(ConfigError, match=r"normalize_rows: X must be 2-D .*got shape \(3,\)"):
        normalize_rows(np.ones(3), "l2")


# ---- the store: every source, recorded, applied by appends ------------------------------------
def _sources(tmp_path, X, y):
    """(source, kwargs, the rows it yields) for each kind of array/table source."""
    import h5py
    import pandas as pd

    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", y)
    np.savez(tmp_path / "x.npz", X=X, y=y)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["X"], f["y"] = X, y
    df = pd.DataFrame(X, columns=[f"f{j}" for j in range(X.shape[1])]).assign(y=y)
    df.to_parquet(tmp_path / "x.parquet")
    df.to_csv(tmp_path / "x.csv", index=False)
    return {"npy": (str(tmp_path / "x.npy"), {"labels": str(tmp_path / "y.npy")}),
            "npz": (str(tmp_path / "x.npz"), {"key": "X", "labels": "y"}),
            "h5": (str(tmp_path / "x.h5"), {"dataset": "X", "labels": "y"}),
            "parquet": (str(tmp_path / "x.parquet"), {"labels": "y"}),
            "csv": (str(tmp_path / "x.csv"), {"labels": "y"})}


@pytest.mark.parametrize("kind", ["npy", "npz", "h5", "parquet", "csv"])
def test_every_file_source_is_normalised_and_recorded(tmp_path, kind):
    X = _relu_rows(300, 6, dtype=np.float64)  # float64 source: normalised before the float32 cast
    y = np.arange(300) % 3
    source, kw = _sources(tmp_path, X, y)[kind]
    ingest(source, tmp_path / "s", chunk_rows=64, normalize="power-l2", **kw)
    s = FeatureStore.open(tmp_path / "s")
    assert s.normalize == "power-l2" == s.attrs["normalize"]
    seen = X.astype(np.float32) if kind in ("parquet", "csv") else X  # tables: float32 batches
    np.testing.assert_array_equal(s.read(), _brute(seen, "power-l2").astype(np.float32))
    np.testing.assert_array_equal(s.read_labels(), y)
    assert check(str(tmp_path / "s")).nonfinite_rows == 0  # the integrity check reads it whole


@pytest.mark.parametrize("source", ["digits", "synthetic"])
def test_bundled_and_synthetic_sources(tmp_path, source):
    opts = {"rows": 500, "dim": 16, "classes": 5} if source == "synthetic" else {}
    ingest(source, tmp_path / "raw", **opts)
    ingest(source, tmp_path / "l2", normalize="l2", **opts)
    raw, l2 = FeatureStore.open(tmp_path / "raw"), FeatureStore.open(tmp_path / "l2")
    assert (raw.normalize, l2.normalize) == ("none", "l2")
    np.testing.assert_array_equal(l2.read(), _brute(raw.read(), "l2").astype(np.float32))
    np.testing.assert_array_equal(l2.read_labels(), raw.read_labels())


def test_image_folder_through_an_extractor(tmp_path):
    from PIL import Image

    from pipeline.extract.extractors import ColorHogExtractor

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, size=(12, 10, 3), dtype=np.uint8) for _ in range(5)]
    (tmp_path / "imgs").mkdir()
    for i, a in enumerate(images):
        Image.fromarray(a).save(tmp_path / "imgs" / f"im{i}.png")
    ingest(str(tmp_path / "imgs"), tmp_path / "s", normalize="power-l2")
    s = FeatureStore.open(tmp_path / "s")
    assert s.normalize == "power-l2"
    feats = ColorHogExtractor()(images)
    np.testing.assert_array_equal(s.read(), normalize_rows(feats, "power-l2", dtype=np.float32))
    with pytest.raises(StoreError, match=r"normalised 'power-l2' .*--normalize 'none'"):
        ingest(str(tmp_path / "imgs"), tmp_path / "s", append=True, normalize="none")


def test_append_applies_the_recorded_normalisation(tmp_path):
    X = _relu_rows(200, 5)
    np.save(tmp_path / "x.npy", X)
    ingest(str(tmp_path / "x.npy"), tmp_path / "s", chunk_rows=64, normalize="l2")
    fp = FeatureStore.open(tmp_path / "s").fingerprint
    ingest(str(tmp_path / "x.npy"), tmp_path / "s", append=True, allow_duplicate=True)  # no normalize
    ingest(str(tmp_path / "x.npy"), tmp_path / "s", append=True, allow_duplicate=True, normalize="l2")
    s = FeatureStore.open(tmp_path / "s")
    assert s.n_rows == 600 and s.normalize == "l2" and s.fingerprint != fp
    want = _brute(X, "l2").astype(np.float32)
    np.testing.assert_array_equal(s.read(), np.vstack([want, want, want]))
    s = FeatureStore.open(tmp_path / "s", "r+")  # the Python API appends through the same path
    s.append(X[:10] * 4.0)  # a power of two: the same unit rows, bit for bit
    np.testing.assert_array_equal(s.read(slice(600, 610)), want[:10])
    assert check(str(tmp_path / "s")).n_rows == 610


def test_conflicting_append_is_refused_and_writes_nothing(tmp_path):
    X = _relu_rows(100, 4)
    np.save(tmp_path / "x.npy", X)
    out = tmp_path / "s.zarr"
    ingest(str(tmp_path / "x.npy"), out, normalize="power-l2")
    msg = (r"s\.zarr: the store's rows are normalised 'power-l2' \(recorded when it was created\), but "
           r"this append asks for --normalize 'l2'; leave --normalize out to apply 'power-l2'")
    with pytest.raises(StoreError, match=msg):
        ingest(str(tmp_path / "x.npy"), out, append=True, allow_duplicate=True, normalize="l2")
    assert FeatureStore.open(out).n_rows == 100
    res = CliRunner().invoke(app, ["ingest", str(tmp_path / "x.npy"), "--out", str(out), "--append",
                                   "--allow-duplicate", "--normalize", "none", "-q"])
    assert res.exit_code == 2  # bad input
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and "--normalize 'none'" in lines[0], res.output
    with pytest.raises(ConfigError, match=r"--normalize \(normalize=\) must be one of none, l2, power-l2"):
        ingest(str(tmp_path / "x.npy"), tmp_path / "t", normalize="L2")
    assert not (tmp_path / "t").exists()


def test_cli_records_it_and_nonfinite_rows_are_dropped_first(tmp_path):
    X = _relu_rows(50, 4)
    X[10, 2] = np.nan
    np.save(tmp_path / "x.npy", X)
    res = CliRunner().invoke(app, ["ingest", str(tmp_path / "x.npy"), "--out", str(tmp_path / "s"),
                                   "--normalize", "power-l2", "--drop-nonfinite", "-q"])
    assert res.exit_code == 0, res.output
    s = FeatureStore.open(tmp_path / "s")
    assert s.normalize == "power-l2" and s.n_rows == 49
    assert s.attrs["appends"][0]["dropped_nonfinite"] == 1
    np.testing.assert_array_equal(s.read(), _brute(np.delete(X, 10, axis=0), "power-l2").astype(np.float32))


def test_stores_without_the_attribute_read_as_none(tmp_path):
    s = FeatureStore.create(tmp_path / "old", 3)
    s.group.attrs.pop("normalize")  # a store written before the attribute existed
    s = FeatureStore.open(tmp_path / "old", "r+")
    assert s.normalize == "none"
    s.append(np.array([[3.0, 0.0, 4.0]]))
    np.testing.assert_array_equal(s.read(), [[3.0, 0.0, 4.0]])
    s.group.attrs["normalize"] = "cube"
    with pytest.raises(StoreError, match=r"old: attribute 'normalize' must be one of .*got 'cube'; restore"):
        _ = FeatureStore.open(tmp_path / "old").normalize
