"""Every learner and fit option on a CuPy engine gives the NumPy engine's fit (needs CuPy and a CUDA
device; marked ``gpu``, skipped without one).

``tests/test_gpu.py`` checks the chunk kernels one by one; this module checks what a user with GPU
workers runs: ``VBMixture(engine=LocalEngine(array_backend="cupy"))`` with each learner, the truncated
E-step, the projection, weighted rows, births, ``partial_fit`` and the prediction methods, against the
same estimator on the NumPy engine. Each fit runs every code path of the learner on device chunks
(starts, moves, prunes, minibatch statistics, gathered rows), where a host-only call would fail or a
device array would be mistaken for a host one.

The data are float64 and well separated, so the two fits take the same decisions (moves, prunes) and
differ by the GEMMs' rounding only: the same number of clusters, the same labels and bounds to 1e-6.
:func:`compare` takes the device engine as an argument so that the same checks run on a CPU with
two NumPy engines (the module's dry run: ``python tests/test_gpu_learners.py``).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

from pipeline.engine.engines import LocalEngine
from pipeline.estimator import VBMixture
from vbcore.data.metrics import ari

pytestmark = pytest.mark.gpu

#: the minibatch learners' settings (the point learners fit the 'fixed' covariance)
POINT: dict[str, Any] = {"covariance_type": "fixed", "learner_options": {"minibatch": 1000}}
#: (name, VBMixture keywords, fit keywords)
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("vbem-full", {"covariance_type": "full"}, {}),
    ("vbem-diag", {"covariance_type": "diag"}, {}),
    ("vbem-tied", {"covariance_type": "tied", "ari": 0.6}, {}),  # one covariance: scales differ
    ("vbem-spherical", {"covariance_type": "spherical"}, {}),
    ("vbem-truncated", {"learner_options": {"candidates": 3}}, {}),
    ("vbem-pca", {"pca": 6, "whiten": True}, {}),
    ("vbem-weighted", {}, {"sample_weight": "integers"}),
    ("vbem-grow", {"grow": True, "max_components": 24, "n_components": 4}, {}),
    ("vbem-ps", {"learner": "vbem-ps"}, {}),
    ("ncg", {"learner": "ncg"}, {}),
    ("mm", {"learner": "mm", "covariance_type": "fixed"}, {}),
    ("mm-weighted", {"learner": "mm", "covariance_type": "fixed"}, {"sample_weight": "integers"}),
    ("sga", {"learner": "sga", **POINT}, {}),
    ("sga-f", {"learner": "sga-f", **POINT}, {}),
    ("sga-f-weighted", {"learner": "sga-f", **POINT}, {"sample_weight": "integers"}),
    ("svi", {"learner": "svi", **POINT}, {}),
]


def blobs(n: int = 3000, d: int = 12, classes: int = 6, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Well-separated Gaussian classes of unequal sizes and scales, away from the origin."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=10.0, size=(classes, d)) + 20.0
    y = rng.choice(classes, size=n, p=np.arange(1, classes + 1) / np.sum(np.arange(1, classes + 1)))
    scale = rng.uniform(0.5, 1.5, size=(classes, d))
    return centres[y] + scale[y] * rng.normal(size=(n, d)), y


def estimator(engine: Any, options: dict[str, Any]) -> VBMixture:
    kw: dict[str, Any] = {"n_components": 10, "covariance_type": "diag", "max_iter": 60, "random_state": 0,
                          "chunk_rows": 700}
    return VBMixture(engine=engine, **{**kw, **{k: v for k, v in options.items() if k != "ari"}})


def compare(device: Any, options: dict[str, Any], fit_kw: dict[str, Any]) -> dict[str, float]:
    """Fit the same data on ``device`` and on the NumPy engine; assert that they agree and return the
    figures (bounds, clusters, agreement of labels)."""
    X, y = blobs()
    kw = dict(fit_kw)
    if kw.get("sample_weight") == "integers":
        kw["sample_weight"] = np.random.default_rng(1).integers(0, 4, size=X.shape[0]).astype(float)
    host = estimator(LocalEngine(), options).fit(X, **kw)
    dev = estimator(device, options).fit(X, **kw)
    labels_host, labels_dev = host.predict(X), dev.predict(X)
    figures = {"bound_host": host.lower_bound_, "bound_device": dev.lower_bound_,
               "clusters_host": len(np.unique(labels_host)), "clusters_device": len(np.unique(labels_dev)),
               "agreement": float(np.mean(labels_host == labels_dev)), "ari_classes": ari(y, labels_dev)}
    assert isinstance(labels_dev, np.ndarray) and labels_dev.shape == (X.shape[0],)
    assert figures["clusters_device"] == figures["clusters_host"], figures
    assert figures["agreement"] == 1.0, figures
    assert dev.lower_bound_ == pytest.approx(host.lower_bound_, rel=1e-6, abs=1e-6), figures
    assert dev.n_iter_ == host.n_iter_, (dev.n_iter_, host.n_iter_)
    np.testing.assert_allclose(dev.weights_, host.weights_, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(dev.predict_proba(X[:500]), host.predict_proba(X[:500]), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dev.score_samples(X[:500]), host.score_samples(X[:500]), rtol=1e-7)
    # the data's classes are found (not two equally wrong fits)
    assert figures["ari_classes"] > options.get("ari", 0.95), figures
    return figures


def compare_partial_fit(device: Any) -> None:
    """``partial_fit`` over three batches (with a projection): the same state on both engines."""
    X, _ = blobs()
    fits = []
    for engine in (LocalEngine(), device):
        m = estimator(engine, {"pca": 8})
        for batch in np.array_split(X, 3):
            m.partial_fit(batch)
        fits.append(m)
    host, dev = fits
    assert dev.lower_bound_ == pytest.approx(host.lower_bound_, rel=1e-6)
    np.testing.assert_array_equal(dev.predict(X), host.predict(X))


@pytest.fixture(scope="module")
def cupy_engine() -> LocalEngine:
    pytest.importorskip("cupy")
    return LocalEngine(array_backend="cupy")


@pytest.mark.parametrize(("name", "options", "fit_kw"), CASES, ids=[c[0] for c in CASES])
def test_learner_on_cupy_matches_numpy(cupy_engine, name, options, fit_kw):
    compare(cupy_engine, options, fit_kw)


def test_partial_fit_on_cupy_matches_numpy(cupy_engine):
    compare_partial_fit(cupy_engine)


def test_float32_fit_on_cupy_is_close_to_numpy(cupy_engine):
    """float32 data: the device's GEMMs round differently, so the bound agrees to float32's precision."""
    X, _ = blobs()
    X = X.astype(np.float32)
    host = estimator(LocalEngine(), {}).fit(X)
    dev = estimator(cupy_engine, {}).fit(X)
    assert isinstance(dev.means_, np.ndarray) and dev.means_.dtype == np.float64
    assert dev.lower_bound_ == pytest.approx(host.lower_bound_, rel=1e-5)
    assert ari(host.predict(X), dev.predict(X)) > 0.999


if __name__ == "__main__":  # the dry run: the checks with a second NumPy engine in the device's place
    for name, options, fit_kw in CASES:
        print(name, compare(LocalEngine(), options, fit_kw), flush=True)
    compare_partial_fit(LocalEngine())
    print("partial_fit ok", file=sys.stderr)
