"""The most typical rows of every cluster, found next to the data in one pass.

A row's cluster is its MAP component (the argmax of q(z), as ``vbcluster assign`` writes it); its
**typicality** is ``ln rho_nk`` of that component (Kuusela et al. 2009, eq. 36): the expected log
density of the row under the cluster's Gaussian plus the cluster's expected log weight, which is the
same for every row of one cluster, so within a cluster rows rank by their expected log density. The
``m`` most typical rows of cluster k are its rows of highest typicality; equal scores go to the
lower row index, so the answer does not depend on how ties fall.

:func:`typical_rows` maps :func:`typical_kernel` over the chunks (on a Dask engine, on the workers
next to the rows): each chunk returns its rows' MAP labels and, per cluster, its own top ``m``
(a K x m table of chunk-local rows and scores), never an N x K array and nothing of size D. The
driver shifts the local rows by the chunk's first row and reduces the tables in chunk order, so the
result depends only on the data, the posterior and the chunking. Rows of weight 0 (a store's
``weights``) keep their label but are no cluster's row: neither counted in its size nor shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vbcore.kernels.estep import (
    Chunk,
    EStepParams,
    array_namespace,
    estep_params,
    log_rho,
    normalise,
    prepare_chunk,
    to_host,
)

__all__ = ["TypicalRows", "reduce_typical", "top_per_cluster", "typical_kernel", "typical_rows"]


@dataclass(frozen=True)
class TypicalRows:
    """Per cluster (the posterior's components, in its order):

    rows : int64 array of shape (K, m)
        The most typical rows, most typical first; -1 pads clusters with fewer than m rows.
    scores : float64 array of shape (K, m)
        Their ``ln rho_nk``; -inf where ``rows`` is -1.
    sizes : int64 array of shape (K,)
        Rows whose MAP cluster it is (rows of positive weight).
    labels : int32 array of shape (N,)
        Every row's MAP cluster.
    """

    rows: np.ndarray
    scores: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray


def top_per_cluster(cluster: np.ndarray, score: np.ndarray, row: np.ndarray, k: int,
                    m: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``m`` candidates of highest ``score`` per cluster (ties: the lower ``row``), as (K, m)
    tables of rows (-1 padded) and scores (-inf padded). ``cluster``, ``score`` and ``row`` hold one
    candidate each (1-D, same length)."""
    order = np.lexsort((row, -score, cluster))  # by cluster, then score descending, then row
    c = cluster[order]
    first = np.searchsorted(c, np.arange(k))  # where each cluster's candidates start
    rank = np.arange(len(c)) - first[c]
    keep = rank < m
    rows = np.full((k, m), -1, dtype=np.int64)
    scores = np.full((k, m), -np.inf, dtype=np.float64)
    rows[c[keep], rank[keep]] = row[order][keep]
    scores[c[keep], rank[keep]] = score[order][keep]
    return rows, scores


def typical_kernel(chunk: Chunk, params: EStepParams,
                   m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One chunk's MAP labels (int32, (n,)), its top ``m`` rows per cluster (chunk-local rows and
    scores, (K, m) each) and its rows per cluster (K,), rows of weight 0 left out of the last two.
    The n x K log responsibilities stay where the chunk lives."""
    lr = log_rho(chunk, params)
    xp = array_namespace(lr)
    resp = normalise(lr)[0]
    lab = xp.argmax(resp, axis=1)  # the label assign writes (argmax of the normalised responsibilities)
    k = int(params.const.shape[0])
    own = xp.reshape(lab, (-1, 1)) == xp.reshape(xp.arange(k, dtype=lab.dtype), (1, -1))  # (n, K) bool
    score = xp.max(xp.where(own, lr, xp.asarray(-np.inf, dtype=lr.dtype)), axis=1)  # ln rho at the label
    labels = to_host(lab).astype(np.int64)
    scores = to_host(score).astype(np.float64)
    held = np.arange(len(labels), dtype=np.int64)
    if chunk.w is not None:  # a row of weight 0 is no row of its cluster
        held = held[to_host(chunk.w) > 0]
    rows, top = top_per_cluster(labels[held], scores[held], held, k, m)
    return labels.astype(np.int32), rows, top, np.bincount(labels[held], minlength=k).astype(np.int64)


def typical_rows(model: Any, source: Any, m: int = 8, engine: Any = None) -> TypicalRows:
    """The ``m`` most typical rows of every cluster of the fitted ``model`` (a VBMixture) over the
    rows of ``source``, with every row's MAP label; see the module docstring."""
    from pipeline.engine.engines import LocalEngine

    if m < 1:
        raise ValueError(f"m must be at least 1, got {m}")
    eng = engine or LocalEngine(persist="never")
    shift = model.prior_.mean
    handles = eng.prepare(source, prepare_chunk, shift, model.posterior_.covariance_type, None,
                          model.projection_)
    try:
        parts = eng.map(typical_kernel, handles, estep_params(model.posterior_, shift), int(m))
    finally:
        eng.release(handles)
    return reduce_typical(parts, source, int(model.posterior_.n_components), int(m))


def reduce_typical(parts: list[Any], source: Any, k: int, m: int) -> TypicalRows:
    """The chunks' :func:`typical_kernel` results (in chunk order) reduced: their local rows shifted by
    each chunk's first row, the top ``m`` per cluster of all, the labels concatenated, the sizes summed."""
    starts = [s.start for s in source.chunk_slices()]
    cand_rows = np.concatenate([np.where(p[1] >= 0, p[1] + first, -1)
                                for p, first in zip(parts, starts, strict=True)], axis=1)
    cand_scores = np.concatenate([p[2] for p in parts], axis=1)
    valid = cand_rows >= 0
    cluster = np.broadcast_to(np.arange(k)[:, None], cand_rows.shape)[valid]
    rows, scores = top_per_cluster(cluster, cand_scores[valid], cand_rows[valid], k, int(m))
    labels = np.concatenate([p[0] for p in parts])
    return TypicalRows(rows, scores, np.sum([p[3] for p in parts], axis=0, dtype=np.int64), labels)
