"""The point learners' state beyond the posterior and prior (:mod:`pipeline.fit.learners.state`): one
dataclass for the family, each part filled by the learner that has it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.fit.learners.growth import GrowthState
from pipeline.fit.learners.moves import MovesState
from pipeline.fit.learners.state import LearnerState
from vbcore.learners.sga import Velocity


@dataclass
class HardMovesState(LearnerState):
    """:class:`pipeline.fit.learners.point.moves.HardMoves`' flags: a round since the last accepted
    merge found none (``pending`` false), the next iteration is a round (``force``)."""

    pending: bool
    force: bool


@dataclass
class PointState(LearnerState):
    """MM, SGA, SGA+M, SGA+F: the exact sticks and the estimated counts of the point (the posterior
    describes them, not bit for bit), the prune threshold once set, the momentum (``sga-m``), the
    merges' and births' records; SVI: its threshold and soft merges' record."""

    sticks: np.ndarray | None = None
    counts: np.ndarray | None = None
    prune_threshold: float | None = None
    velocity: Velocity | None = None
    hard_moves: HardMovesState | None = None
    moves: MovesState | None = None
    growth: GrowthState | None = None
