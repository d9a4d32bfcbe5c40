"""The projection stage of a fit (``--pca P [--whiten]``): engine passes, then every chunk projected.

:func:`projection_pass` with the exact solver (the default) reads every chunk once (streamed, never
persisted: the store is not copied), reduces the rows' mean and centred scatter over the engine's
fixed-order tree (:mod:`vbcore.kernels.projection`; both engines give the same bits) and takes the
eigendecomposition on the driver; the randomized solver (``--pca-solver randomized``) makes three
passes of ``N x D x (P + 32)`` products instead (:mod:`vbcore.kernels.sketch`). The fit then
passes the :class:`~vbcore.kernels.projection.Projection` to
:func:`vbcore.kernels.estep.prepare_chunk`, the one place where chunks are made: every learner, the
initialisation, ``predict``, ``assign``, warm starts and scheduled refreshes see projected rows.
:class:`ProjectedSource` gives the driver's own reads (the shift, the k-means sample) the same rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pipeline.engine.blas import one_blas_thread
from pipeline.engine.sources import ArraySource
from pipeline.fit.spec import PCA_SOLVERS
from vbcore.data.normalize import normalize_chunk
from vbcore.errors import ConfigError
from vbcore.kernels.projection import Projection, RowMoments, Rows, check_pca, fit_projection, moments_kernel
from vbcore.kernels.sketch import PASSES, SketchPart, centred_rows, randomized_projection, sketch_kernel

#: a progress display's stage hook: ``stage(text, step)``, ``step`` ``(i, n)`` for pass i of n or None
Stage = Callable[[str, "tuple[int, int] | None"], None]

#: the ``SeedSequence`` spawn key of the randomized solver's starting basis (under the fit's seed)
PROJECTION_SEED_KEY = (0, 5)


def _rows(x: Any, normalize: str = "none") -> Rows:
    """A chunk's rows as they are, or normalised by ``normalize`` (the engine adds the rows' weights)."""
    return Rows(normalize_chunk(x, normalize))


def _normalized_centred(x: Any, shift: np.ndarray, normalize: str) -> Any:
    """:func:`vbcore.kernels.sketch.centred_rows` of the normalised rows."""
    return centred_rows(normalize_chunk(x, normalize), shift)


def data_moments(engine: Any, source: Any, normalize: str = "none") -> RowMoments:
    """Row count (weighted rows: their total weight), mean and centred scatter of the whole source (its
    rows normalised by ``normalize``): one streamed pass on ``engine``."""
    handles = engine.prepare(source, _rows, normalize, persist="never")
    try:
        where = None if isinstance(source, ArraySource) else source.describe()
        shift = np.asarray(normalize_chunk(source.load(0)[:1], normalize)[0], dtype=np.float64)
        return engine.map_reduce(moments_kernel, handles, shift, where,
                                 per_chunk=[s.start for s in source.chunk_slices()])
    finally:
        engine.release(handles)


def projection_pass(engine: Any, source: Any, n_components: int, whiten: bool, solver: str = "exact",
                    seed: int | None = None, stage: Stage | None = None,
                    normalize: str = "none") -> Projection:
    """The projection of ``source`` (its rows normalised by ``normalize`` first: the projection keeps
    it, :class:`~vbcore.kernels.projection.Projection`) onto its ``n_components`` leading principal
    components:
    ``solver`` 'exact' (the D x D scatter, one streamed pass) or 'randomized' (subspace iteration,
    :mod:`vbcore.kernels.sketch`, its start drawn from ``seed``). ``stage(text, step)`` is told each
    pass over the chunks before it starts (``step``: ``(i, n)`` of several) and the driver's
    eigendecomposition (a progress display's :meth:`~pipeline.fit.progress.FitProgress.stage`)."""
    check_pca(int(n_components), source.n_features, source.n_rows)
    single = np.dtype(source.dtype) == np.float32
    eps = float(np.finfo(np.float32 if single else np.float64).eps)
    say = stage or _silent
    shape = f"{source.n_rows:,} rows x {source.n_features}"
    if solver == "randomized":
        return replace(_randomized(engine, source, int(n_components), bool(whiten), seed, single, eps, say,
                                   shape, normalize), normalize=normalize)
    if solver != "exact":
        raise ConfigError(f"pca_solver must be one of {', '.join(PCA_SOLVERS)}, got {solver!r}")
    say(f"projection pass (exact, P = {int(n_components)}): mean and scatter of {shape}", None)
    moments = data_moments(engine, source, normalize)
    say(f"projection: eigendecomposition of the {source.n_features} x {source.n_features} scatter", None)
    # one BLAS thread, as the chunk kernels: eigenvectors whose bits do not depend on the driver's
    # cores (and on a busy 2-core machine LAPACK's eigh at D = 4096 took 7 CPU s on one thread,
    # 20 on two)
    with one_blas_thread():
        return replace(fit_projection(moments, int(n_components), bool(whiten), eps=eps), normalize=normalize)


def _silent(text: str, step: tuple[int, int] | None) -> None:
    """No progress display."""


def _randomized(engine: Any, source: Any, n_components: int, whiten: bool, seed: int | None,
                single: bool, eps: float, say: Stage, shape: str, normalize: str = "none") -> Projection:
    """:func:`vbcore.kernels.sketch.randomized_projection` with its passes on ``engine``: the chunks
    kept in (worker) memory for all of them when the engine's ``persist`` allows (so the store is
    read once), else streamed in each; released afterwards."""
    shift = np.asarray(normalize_chunk(source.load(0)[:1], normalize)[0], dtype=np.float64)
    handles = engine.prepare(source, _normalized_centred, shift, normalize)
    try:
        where = None if isinstance(source, ArraySource) else source.describe()
        starts = [s.start for s in source.chunk_slices()]
        done = [0]

        def apply(basis: np.ndarray, first: bool) -> SketchPart:
            done[0] += 1
            say(f"projection pass {done[0]}/{PASSES} (randomized, P = {n_components}): {shape}",
                (done[0], PASSES))
            return engine.map_reduce(sketch_kernel, handles, basis, where if first else None,
                                     per_chunk=starts)

        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=PROJECTION_SEED_KEY))
        with one_blas_thread():  # the driver's QR and eigh: the same bits on any number of cores
            return randomized_projection(apply, shift, n_components, whiten, rng,
                                         np.float32 if single else np.float64, eps)
    finally:
        engine.release(handles)


def check_projection(projection: Projection, n_features: int, pca: int | None, whiten: bool,
                     what: str, normalize: str = "none") -> None:
    """A given projection (a warm start's, a checkpoint's) against the data and the settings."""
    have = (projection.n_features_in, projection.n_components, projection.whiten, projection.normalize)
    want = (n_features, pca, bool(whiten), normalize)
    if have != want:
        names = ("n_features", "pca", "whiten", "normalize")
        diff = "; ".join(f"{n} {a!r} -> {b!r}" for n, a, b in zip(names, have, want, strict=True) if a != b)
        raise ConfigError(f"{what}: its projection does not match the data or settings ({diff})")


@dataclass
class ProjectedSource:
    """A row source seen through a projection: ``load(i)`` gives projected rows (the driver's
    reads: the shift, the k-means sample); everything else is the inner source's."""

    inner: Any
    projection: Projection

    @property
    def n_rows(self) -> int:
        return int(self.inner.n_rows)

    @property
    def n_features(self) -> int:
        return self.projection.n_components

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.inner.dtype)

    def chunk_slices(self) -> list[slice]:
        return list(self.inner.chunk_slices())

    def load(self, i: int) -> np.ndarray:
        with one_blas_thread():  # the bits of the engines' prepared chunks
            return np.asarray(self.projection.apply(self.inner.load(i)))

    def describe(self) -> str:
        return f"{self.inner.describe()} projected to {self.n_features} principal components"

    def __getattr__(self, name: str) -> Any:  # fingerprint, labels, path, ...
        if name in ("inner", "projection"):
            raise AttributeError(name)
        return getattr(self.inner, name)
