"""The soft check of the DP point learners' merges (learner option ``judge=diag``, issue 51).

A hard-assignment learner's merge proposals are judged on the exact ELBO of the pipeline's diagonal
model (:func:`pipeline.fit.learners.point.moves.partition_prior`). At one-hot q(Z) that bound pays for
merging two overlapping classes (their boundary rows cannot be shared), so :func:`soft_merges` judges
them again at soft responsibilities under the same model and prior.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vbcore.kernels.estep import estep_params, vbem_kernel
from vbcore.model.mstep import m_step
from vbcore.model.priors import Prior
from vbcore.model.stats import SuffStats
from vbcore.moves.estep_pass import MoveParams, move_kernel
from vbcore.moves.exact import select_merges
from vbcore.moves.hard import select_hard_merges

#: VB EM iterations (E-step, M-step) from the hard statistics' q(theta) before :func:`soft_merges`' pass.
#: 120 planted classes (the synthetic store, 40,000 x 64), ``sga-f`` from K = 400, seeds 0-2, before the
#: rule for clusters left under one row: 104 / 101 / 105 clusters with none, 109 / 111 / 106 with one,
#: 111 / 106 (seeds 0, 1) with two; with that rule and one: 112 / 112 / 109
SOFT_SWEEPS = 1


def soft_merges(ctx: Any, stats: SuffStats, pairs: np.ndarray, prior: Prior,
                limit: int) -> tuple[np.ndarray, float]:
    """Merges of hard clusters judged on the exact ELBO of ``prior``'s (diagonal) model at **soft**
    responsibilities: q(theta) from the hard statistics ``stats`` of all rows, ``SOFT_SWEEPS`` VB EM
    iterations from there, then one E-step pass of all rows (:func:`vbcore.moves.estep_pass.move_kernel`:
    the statistics and the pairs' entropy changes) and :func:`vbcore.moves.exact.select_merges` on its
    statistics. Pairs with a cluster that q(Z) leaves under one row (no class of this model; its merge
    changes the soft bound by the weight terms alone) are judged on the hard statistics instead, as
    ``diag-hard`` does. Returns (pairs (M, 2), a < b; the soft bound's exact change of its own pairs,
    > 0, or 0).

    Why: at one-hot q(Z) two overlapping classes cannot share their boundary rows, so the hard bound
    of the pair split is too low by what sharing them would gain (the entropy and the better fit), and
    merging them read as a gain: 120 planted classes, ``sga-f`` from K = 400 ended at 91 (issue 51).
    Both bounds compared here are exact ELBOs of the same rows under the same model (the q(Z) of the
    pass, and that q(Z) with ``r_a + r_b`` for each merged pair), so an accepted set raises the bound."""
    post = m_step(stats, prior, 0.0)
    for _ in range(SOFT_SWEEPS):
        post = m_step(ctx.engine.map_reduce(vbem_kernel, ctx.handles, estep_params(post, ctx.shift)).stats,
                      prior, 0.0)
    params = MoveParams(estep_params(post, ctx.shift), np.asarray(pairs, dtype=np.int64).reshape(-1, 2),
                        None, np.zeros((0, 2), dtype=np.int64))
    res = ctx.engine.map_reduce(move_kernel, ctx.handles, params)
    acc, gain = select_merges(res.stats, params.pairs, res.h, prior, 0.0, limit)
    # a cluster the soft q(Z) leaves under one row is no class of this model: its merges are the hard
    # bound's to judge (at soft responsibilities their change is the weight terms' alone, about 0)
    empty = res.stats.nk < 1.0
    rest = params.pairs[empty[params.pairs].any(axis=1) & ~np.isin(params.pairs, acc).any(axis=1)]
    more, _ = select_hard_merges(stats, rest, prior, limit)
    return np.concatenate((acc, more)).astype(np.int64), gain
