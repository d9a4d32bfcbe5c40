"""The synthetic SUN397-fc7 stand-in: a seeded generator of ReLU features with a low-rank class
signal, chunk by chunk."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from pipeline.ingest.plan import Batch, Plan, as_int, no_more_options, no_side_data
from vbcore.errors import ConfigError

# ---- the synthetic SUN397-fc7 stand-in ----------------------------------------------------------
SYNTHETIC_DEFAULTS = {"rows": 108_754, "dim": 4096, "classes": 397, "seed": 0}
_RANK = 64              # rank of the class signal
_WITHIN = 0.6           # within-class spread in the latent space (class means have unit spread)
_NOISE = 0.6            # per-dimension noise before the ReLU
_ZERO_RANGE = (0.5, 0.8)  # per-dimension target fraction of zeros
_POWER = 0.5            # class sizes: min_rows + share proportional to rank**-_POWER
_MIN_ROWS = 20


def synthetic_class_sizes(rows: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    """Imbalanced class sizes summing to ``rows``: ``min(20, rows // classes)`` each plus the rest
    split in proportion to ``rank ** -0.5`` (largest remainder), ranks in a random class order."""
    base = min(_MIN_ROWS, rows // classes)
    weights = np.arange(1, classes + 1, dtype=np.float64) ** -_POWER
    share = (rows - base * classes) * weights / weights.sum()
    sizes = np.floor(share).astype(np.int64)
    rest = rows - base * classes - int(sizes.sum())
    sizes[np.argsort(-(share - sizes), kind="stable")[:rest]] += 1
    return base + sizes[rng.permutation(classes)]


#: the spawn key of an append's rows: apart from every stream of the store's creation (keys (c,))
_APPEND_KEY = 1 << 20


def _class_model(rows: int, classes: int, dim: int, seed: int) -> tuple[Any, ...]:
    """The class model of a synthetic store of ``rows`` rows made with ``seed`` (its draws replayed
    exactly, so an append rebuilds the model its store was made with): labels, latent class means,
    the low-rank map, the bias and the gain of each dimension."""
    from scipy.special import ndtri

    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])  # the first child: the model
    sizes = synthetic_class_sizes(rows, classes, rng)
    y = rng.permutation(np.repeat(np.arange(classes, dtype=np.int32), sizes))
    rank = min(_RANK, dim)
    Z = rng.standard_normal((classes, rank)).astype(np.float32)             # class means (latent)
    B = (rng.standard_normal((rank, dim)) / np.sqrt(rank)).astype(np.float32)  # the low-rank map
    var = (1.0 + _WITHIN**2) * (B.astype(np.float64) ** 2).sum(axis=0) + _NOISE**2
    zero_frac = rng.uniform(*_ZERO_RANGE, size=dim)
    bias = (-np.sqrt(var) * ndtri(zero_frac)).astype(np.float32)  # P(pre-activation <= 0) = zero_frac
    gain = np.exp(0.5 * rng.standard_normal(dim)).astype(np.float32)        # per-dimension scale
    return y, Z, B, bias, gain, rank


def _continued(cfg: dict[str, int], given: set[str], store: dict[str, Any]) -> dict[str, int]:
    """An append's dim and classes: the store's (recorded in its extractor_params), refusing others."""
    for k in ("dim", "classes"):
        if k in given and cfg[k] != int(store[k]):
            raise ConfigError(f"synthetic --append continues the store's {k} {store[k]} (its class model is "
                              f"reused), got {k}={cfg[k]}; leave {k} out, or ingest into a new store")
        cfg[k] = int(store[k])
    return cfg


def read_synthetic(labels: str | None, ids: str | None, options: dict[str, Any], chunk_rows: int,
                   store: dict[str, Any] | None = None) -> Plan:
    """The SUN397-fc7-shaped generator (options ``rows``, ``dim``, ``classes``, ``seed``), chunk by chunk.

    ``store``: the extractor_params of the synthetic store appended to: the new rows are drawn from its
    class model (its seed's and rows' class means, map, bias and gain), so a label means the same
    class in the appended rows; ``seed`` then draws the new rows' labels and noise, on streams apart
    from the store's own."""
    given = set(options)
    cfg = {k: as_int(k, options.pop(k, v), minimum=0 if k == "seed" else 1)
           for k, v in SYNTHETIC_DEFAULTS.items()}
    no_more_options("synthetic", options)
    no_side_data("synthetic", labels, ids)
    if store is not None:
        cfg = _continued(cfg, given, store)
    rows, dim, classes, seed = cfg["rows"], cfg["dim"], cfg["classes"], cfg["seed"]
    if rows < classes and store is None:
        raise ConfigError(f"synthetic: rows ({rows}) must be at least classes ({classes})")
    n_chunks = math.ceil(rows / chunk_rows)
    if store is None:
        seeds = np.random.SeedSequence(seed).spawn(1 + n_chunks)  # [0]: the model, [1 + c]: chunk c
        y, Z, B, bias, gain, rank = _class_model(rows, classes, dim, seed)
    else:
        _, Z, B, bias, gain, rank = _class_model(int(store["rows"]), classes, dim, int(store["seed"]))
        seeds = np.random.SeedSequence(seed, spawn_key=(_APPEND_KEY,)).spawn(1 + n_chunks)
        rng = np.random.default_rng(seeds[0])  # [0]: the new rows' labels, [1 + c]: chunk c
        y = rng.permutation(np.repeat(np.arange(classes, dtype=np.int32),
                                      synthetic_class_sizes(rows, classes, rng)))

    def chunk(c: int) -> Batch:
        s, e = c * chunk_rows, min((c + 1) * chunk_rows, rows)
        r = np.random.default_rng(seeds[1 + c])
        lab = y[s:e].astype(np.int64)
        H = Z[lab] + _WITHIN * r.standard_normal((e - s, rank), dtype=np.float32)
        X = r.standard_normal((e - s, dim), dtype=np.float32)
        X *= _NOISE
        for i in range(0, e - s, 1024):  # the GEMM in row blocks: no second chunk-sized temporary
            X[i:i + 1024] += H[i:i + 1024] @ B
        X += bias
        np.maximum(X, 0.0, out=X)
        X *= gain
        return X, lab, None

    def blocks(first: int, size: int) -> Iterator[Batch]:
        for c in range(n_chunks):  # generated on the chunk_rows grid whatever the store layout
            yield chunk(c)

    if store is not None:  # (an append keeps the store's attributes)
        return Plan(dim, True, None, blocks, extractor="synthetic", extractor_params=dict(store))
    params = {**cfg, "chunk_rows": chunk_rows, "generator": "relu-low-rank-v1", "rank": rank,
              "within_class_std": _WITHIN, "noise_std": _NOISE, "zero_fraction_range": list(_ZERO_RANGE),
              "class_size_power": _POWER, "min_class_rows": min(_MIN_ROWS, rows // classes),
              "stands_in_for": "SUN397 VGG16 fc7 features (108,754 x 4096, 397 classes)"}
    return Plan(dim, True, None, blocks, extractor="synthetic", extractor_params=params)

