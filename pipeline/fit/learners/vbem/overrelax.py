"""Adaptive over-relaxed VB EM (Salakhutdinov & Roweis 2003), VB EM's learner option ``accelerate``.

A plain iteration sets q(theta) to the M-step of the statistics ``s_t`` of the last pass. Near a slow
optimum (overlapping components of the full family: issue 51's Fashion-MNIST fit ran 200 iterations
with the bound still creeping) consecutive steps point the same way, so the next pass is tried from the
M-step of the statistics extrapolated along that way: raw moments ``s_{t-1} + eta (s_t - s_{t-1})``
(``N_k``, ``sum r x``, ``sum r x x^T``: q(theta)'s natural parameters are linear in them, so this is a
step of ``eta`` times the plain one in those parameters). The pass from it is kept when the exact bound
of its q(Z) at its own M-step beats the last reported bound, and ``eta`` grows by ``GROW``; otherwise
it is discarded, the plain pass (from the M-step of ``s_t``, which the learner holds throughout) runs
and ``eta`` starts again at ``GROW``. The reported bound therefore never falls (a kept pass beats the
last one; a plain pass is VB EM's own), and a refused try costs one pass.

Only plain passes are extrapolated: a move round, a birth, a pruned component, the truncated E-step or
memoized statistics start it over (:meth:`OverRelax.reset`). The two statistics and ``eta`` are
checkpointed, so a resumed fit makes the same tries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from vbcore.model.mstep import m_step
from vbcore.model.posterior import Posterior
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats

#: ``eta`` after a kept try is ``GROW`` times the last (at most ``MAX_ETA``); after a refused one,
#: ``GROW``
GROW = 1.5
MAX_ETA = 8.0
_KEYS = ("nk", "mean", "scatter")


def extrapolate(prev: SuffStats, last: SuffStats, eta: float) -> SuffStats | None:
    """The statistics ``prev + eta (last - prev)`` in raw moments (None: another shape, or a count or
    scatter that is no longer a valid one)."""
    if prev.nk.shape != last.nk.shape or prev.scatter.shape != last.scatter.shape or last.pooled:
        return None

    def raw(s: SuffStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m1 = s.nk[:, None] * s.mean
        outer = (np.einsum("kd,ke->kde", s.mean, m1) if s.full else s.mean * m1)
        return s.nk, m1, s.scatter + outer

    (n0, a0, b0), (n1, a1, b1) = raw(prev), raw(last)
    nk = n0 + eta * (n1 - n0)
    if not np.all(nk > 0):
        return None
    m1 = a0 + eta * (a1 - a0)
    mean = m1 / nk[:, None]
    outer = np.einsum("kd,ke->kde", mean, m1) if last.full else mean * m1
    scatter = b0 + eta * (b1 - b0) - outer
    if last.full:
        scatter = 0.5 * (scatter + np.swapaxes(scatter, 1, 2))
        if not np.all(np.linalg.eigvalsh(scatter)[:, 0] > 0):
            return None
    elif not np.all(scatter > 0):
        return None
    rlogr = last.sum_rlogr + (eta - 1.0) * (last.sum_rlogr - prev.sum_rlogr)
    return replace(last, nk=nk, mean=mean, scatter=scatter, sum_rlogr=float(rlogr))


class OverRelax:
    """The extrapolation state of one VB EM fit: the statistics of the last two plain passes, ``eta``."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.eta = GROW
        self.prev: SuffStats | None = None
        self.last: SuffStats | None = None
        self.tries = self.kept = 0

    def reset(self) -> None:
        self.prev = self.last = None

    def proposal(self, prior: Prior, reg_covar: float) -> Posterior | None:
        """q(theta) for the next pass to try, or None (off, no two passes yet, or not valid)."""
        if not self.on or self.prev is None or self.last is None:
            return None
        stats = extrapolate(self.prev, self.last, self.eta)
        while stats is None and self.eta > 1.01:  # halved towards 1 while not a valid step
            self.eta = 1.0 + 0.5 * (self.eta - 1.0)
            stats = extrapolate(self.prev, self.last, self.eta)
        if stats is None:
            return None
        try:
            post = m_step(stats, prior, reg_covar)
        except (np.linalg.LinAlgError, ValueError, FloatingPointError):
            return None
        self.tries += 1
        return post

    def push(self, stats: SuffStats, kept_try: bool | None) -> None:
        """Record a plain or kept pass's statistics; ``kept_try``: True (a try kept), False (refused,
        then the plain pass), None (no try)."""
        if not self.on:
            return
        if kept_try:
            self.kept += 1
            self.eta = min(MAX_ETA, self.eta * GROW)
        elif kept_try is False:
            self.eta = GROW
        self.prev, self.last = self.last, stats

    # -- checkpoints ---------------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        if not self.on:
            return {}
        out = {"relax.eta": np.asarray([self.eta, self.tries, self.kept], dtype=np.float64)}
        for tag, s in (("prev", self.prev), ("last", self.last)):
            if s is not None:
                out.update({f"relax.{tag}.{k}": np.asarray(getattr(s, k)) for k in _KEYS})
                out[f"relax.{tag}.rest"] = np.asarray(
                    [s.sum_rlogr, s.n_rows, np.nan if s.weight is None else s.weight], dtype=np.float64)
        return out

    def load_state(self, state: Mapping[str, Any], shift: np.ndarray) -> None:
        if not self.on or "relax.eta" not in state:
            return
        eta, tries, kept = (float(v) for v in np.asarray(state["relax.eta"]))
        self.eta, self.tries, self.kept = eta, int(tries), int(kept)
        got: dict[str, SuffStats | None] = {}
        for tag in ("prev", "last"):
            if f"relax.{tag}.rest" not in state:
                got[tag] = None
                continue
            rlogr, rows, weight = (float(v) for v in np.asarray(state[f"relax.{tag}.rest"]))
            nk, mean, scatter = (np.asarray(state[f"relax.{tag}.{k}"], dtype=np.float64) for k in _KEYS)
            got[tag] = SuffStats(nk=nk, mean=mean, scatter=scatter, sum_rlogr=rlogr, n_rows=int(rows),
                                 shift=np.asarray(shift, dtype=np.float64),
                                 weight=None if np.isnan(weight) else weight)
        self.prev, self.last = got["prev"], got["last"]
