"""Chunk kernels of the fit setup: data moments, the finiteness check of sources not validated on
the driver, and the statistics of the initialisations (given, uniform random or nearest-centre
responsibilities). Module level, so engines can ship them to workers."""

from __future__ import annotations

from typing import Any

import numpy as np

from vbcore.data.validation import check_finite
from vbcore.kernels.estep import Chunk, array_namespace, chunk_statistics, to_numpy
from vbcore.model.stats import SuffStats


def moments_kernel(chunk: Chunk) -> SuffStats:
    """Data mean and scatter (one component with r = 1)."""
    return chunk_statistics(chunk, on_device(chunk, np.ones((chunk.n_rows, 1))))


def check_kernel(chunk: Chunk, offset: int, where: str) -> None:
    """Reject non-finite rows of sources that were not validated on the driver (stores, dask). Device
    chunks are checked where they are; only a chunk holding a non-finite value is copied to the host
    to name its row and column."""
    xp = array_namespace(chunk.x)
    if xp is not np and bool(xp.all(xp.isfinite(chunk.x))):
        return
    check_finite(to_numpy(chunk.x), where, first_row=offset,
                 hint="clean the data (vbcluster ingest rejects or drops such rows)")


def on_device(chunk: Chunk, host: np.ndarray) -> Any:
    """Host responsibilities in the chunk's array namespace and dtype."""
    return array_namespace(chunk.x).asarray(host.astype(chunk.x.dtype))


def resp_stats_kernel(chunk: Chunk, resp: np.ndarray) -> SuffStats:
    """Statistics of given responsibilities, shape (n_rows, K)."""
    return chunk_statistics(chunk, on_device(chunk, resp))


def random_stats_kernel(chunk: Chunk, seed: np.random.SeedSequence, k: int) -> SuffStats:
    """Uniform random responsibilities, from a per-chunk seed (the same on every engine)."""
    r = np.random.default_rng(seed).uniform(size=(chunk.n_rows, k))
    return chunk_statistics(chunk, on_device(chunk, r / r.sum(1, keepdims=True)))


def nearest_stats_kernel(chunk: Chunk, centres: np.ndarray, k: int) -> SuffStats:
    """Hard responsibilities: each row to its nearest centre (k-means style initialisation)."""
    labels = np.argmin(sq_dists(to_numpy(chunk.x), centres - chunk.shift), axis=1)
    r = np.zeros((chunk.n_rows, k))
    r[np.arange(chunk.n_rows), labels] = 1.0
    return chunk_statistics(chunk, on_device(chunk, r))


def sq_dists(X: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances, shape (n_rows, n_centres), in float64."""
    x = X.astype(np.float64)
    return (x * x).sum(1)[:, None] - 2.0 * x @ centres.T + (centres * centres).sum(1)[None]


def projected_nearest_kernel(chunk: Chunk, proj: np.ndarray, centres: np.ndarray, k: int) -> SuffStats:
    """Hard responsibilities by nearest centre in a random projection (``proj``, D x p float32, and
    the projected, shifted ``centres``, K x p): one float32 GEMM of ``p`` columns per row instead of
    K x D. The statistics are the exact ones of those labels: per-label sums (O(N D), float64 across
    blocks) for the diagonal families, the one-hot GEMM for 'full' and 'tied'; weighted rows count
    their weight in both."""
    from vbcore.kernels.sga_stats import label_sums

    x = to_numpy(chunk.x)
    y = x.astype(np.float32, copy=False) @ proj
    c = centres.astype(np.float32)
    d2 = (c * c).sum(1)[None, :] - 2.0 * (y @ c.T)  # |y|^2 is the same for every centre
    labels = np.argmin(d2, axis=1)
    if chunk.is_diagonal and not chunk.pooled:
        feats = None if chunk.feats is None else to_numpy(chunk.feats)
        w = None if chunk.w is None else to_numpy(chunk.w)
        return label_sums(x, feats, labels, k, chunk.shift, w=w).to_stats()
    r = np.zeros((chunk.n_rows, k))
    r[np.arange(chunk.n_rows), labels] = 1.0
    return chunk_statistics(chunk, on_device(chunk, r))
