"""A low-rank run's model as the faces that read a run use it (``vbcluster assign``, ``vbcluster report``).

A ``--covariance lowrank`` run (:mod:`pipeline.runs.lowrank_run`) holds q(L), the shared noise and the
weights' posterior in ``lowrank.npz``, and the shift its rows were taken relative to (the store's first
row: :func:`pipeline.fit.lowrank.run_lowrank`). :class:`LowRankModel` labels rows with the fit's own
E-step (:func:`pipeline.fit.lowrank.labels_kernel`: the rows shifted and cast as the fit prepared them,
the same operand), so ``assign`` writes, on the store the run was fitted on, the labels the fit ended
with, bit for bit; the probability is the MAP component's responsibility. The report's typical rows rank
a cluster's rows by ``ln rho_nk`` of their MAP component, as :mod:`pipeline.runs.typical` does for the
Gaussian families (here the factor-analyser's ``ln rho_nk`` of :func:`vbcore.model.mfa.estep`).

What still refuses a low-rank run, in one line each: ``VBMixture`` / :func:`pipeline.estimator.load_model`
(the estimator does not offer the family), ``--warm-from`` (the family's fit has no warm start) and
``publish`` (a refresh warm-starts from the published run).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.engine.engines import LocalEngine
from pipeline.runs.typical import TypicalRows, reduce_typical, top_per_cluster
from vbcore.errors import InputError
from vbcore.kernels.estep import Chunk, prepare_chunk
from vbcore.model import mfa

#: the model file of a low-rank run (pipeline.runs.lowrank_run writes it)
LOWRANK_FILE = "lowrank.npz"
#: what refuses a low-rank run where a Gaussian mixture's posterior is needed
NOT_GAUSSIAN = ("a --covariance lowrank run (lowrank.npz): VBMixture and load_model hold the Gaussian "
                "families only; `vbcluster assign` and `vbcluster report` read this run")


def is_lowrank_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a low-rank run's model file (and no Gaussian posterior)."""
    return (Path(run_dir) / LOWRANK_FILE).is_file() and not (Path(run_dir) / "posterior.npz").is_file()


@dataclass(frozen=True)
class LowRankModel:
    """A fitted low-rank mixture: its posterior, the shift of its rows, and result.json's numbers."""

    post: mfa.MfaPosterior
    shift: np.ndarray
    n_effective_: int
    settings: dict[str, Any]

    #: no projection (the family is fitted on the rows: ``--pca`` is refused with it)
    projection_ = None

    @property
    def means_(self) -> np.ndarray:
        """The components' means in the store's space (K, D)."""
        return self.post.means + self.shift[None, :]

    def _handles(self, source: Any, engine: Any) -> tuple[Any, Any]:
        eng = engine or LocalEngine(persist="never")
        return eng, eng.prepare(source, prepare_chunk, self.shift, "diag", False, None)

    def assign_rows(self, source: Any, engine: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """MAP component (int32) and its responsibility (float32) of every row of ``source``."""
        eng, handles = self._handles(source, engine)
        try:
            parts = eng.map(_assign_kernel, handles, self.post, mfa.stacked_operand(self.post))
        finally:
            eng.release(handles)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def typical_rows(self, source: Any, m: int, engine: Any = None) -> TypicalRows:
        """Every row's MAP label and each cluster's ``m`` most typical rows (:mod:`pipeline.runs.typical`)."""
        if m < 1:
            raise ValueError(f"m must be at least 1, got {m}")
        eng, handles = self._handles(source, engine)
        try:
            parts = eng.map(_typical_kernel, handles, self.post, mfa.stacked_operand(self.post), int(m))
        finally:
            eng.release(handles)
        return reduce_typical(parts, source, self.post.n_components, int(m))


def _assign_kernel(chunk: Chunk, post: mfa.MfaPosterior,
                   operand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fit's labels of a chunk (the argmax of :func:`pipeline.fit.lowrank.labels_kernel`'s
    responsibilities) and their responsibility."""
    resp = mfa.estep(np.asarray(chunk.x), post, None, operand)[1]
    return resp.argmax(1).astype(np.int32), resp.max(1).astype(np.float32)


def _typical_kernel(chunk: Chunk, post: mfa.MfaPosterior, operand: np.ndarray,
                    m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`pipeline.runs.typical.typical_kernel` for the low-rank family: ``ln rho_nk`` at the MAP
    component is ``ln r_nk + ln sum_l rho_nl``."""
    _, resp, log_norm = mfa.estep(np.asarray(chunk.x), post, None, operand)
    labels = resp.argmax(1).astype(np.int64)
    r = resp[np.arange(len(labels)), labels]
    with np.errstate(divide="ignore"):
        scores = np.log(r) + log_norm
    held = np.arange(len(labels), dtype=np.int64)
    if chunk.w is not None:  # a row of weight 0 is no row of its cluster
        held = held[np.asarray(chunk.w) > 0]
    k = post.n_components
    rows, top = top_per_cluster(labels[held], scores[held], held, k, m)
    return labels.astype(np.int32), rows, top, np.bincount(labels[held], minlength=k).astype(np.int64)


def load_lowrank(run_dir: str | Path, result: dict[str, Any]) -> LowRankModel:
    """The model of a low-rank run (its ``lowrank.npz`` verified against result.json by the caller).
    A run written before the shift was recorded takes the store's first row (the fit's shift; the
    callers check the store's fingerprint before they read rows)."""
    path = Path(run_dir) / LOWRANK_FILE
    try:
        with np.load(path, allow_pickle=False) as z:
            post = mfa.MfaPosterior(np.asarray(z["weight_concentration"]),
                                    str(result["settings"]["weight_concentration_prior_type"]),
                                    np.asarray(z["loadings"]), np.asarray(z["precision"]),
                                    np.asarray(z["noise"]), np.asarray(z["ard"]), float(z["mean_precision"]))
            shift = np.asarray(z["shift"], dtype=np.float64) if "shift" in z else None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: unreadable low-rank model ({type(exc).__name__}); refit the run") from None
    if shift is None:
        from pipeline.engine.sources import StoreSource

        shift = np.asarray(StoreSource(str(result["store"])).load(0)[0], dtype=np.float64)
    return LowRankModel(post, shift, int(result.get("n_effective", 0)), dict(result.get("settings", {})))
