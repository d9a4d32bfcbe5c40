"""MM: the batch hard-assignment MAP learner of the DP mixture (Lim & Wang 2018, He n.d.).

Each iteration is one pass over all rows: MAP assignments (Lim & Jiang 2024 eq. 19) under the current
point, then the MAP of every factor from their statistics (:func:`vbcore.learners.sga.mm_update`), then
pruning of the clusters left without rows and re-ordering by descending count, the MM update
made in that order (section 4.5).
Both steps maximise ``ln p(x, z, mu, v)``, so :func:`vbcore.learners.sga.map_bound` never decreases.
"""

from __future__ import annotations

import numpy as np

from pipeline.fit.learners import register
from pipeline.fit.learners.moves import POINT_MOVE_OPTIONS
from pipeline.fit.learners.options import declare
from pipeline.fit.learners.point.base import PRUNE_THRESHOLD
from pipeline.fit.learners.point.moves import MergingPointLearner
from pipeline.fit.learners.truncated import MAP_SEARCH_OPTIONS
from vbcore.kernels.sga_stats import take_stats
from vbcore.learners.sga import map_bound, mm_sticks, mm_update
from vbcore.model.elbo import ElboTerms, elbo_terms
from vbcore.model.posterior import Posterior


@register("mm")
class MM(MergingPointLearner):
    """Batch hard-assignment MAP learner (Lim & Wang 2018, He n.d.).

    The reported ELBO is that of (the assignments of this iteration's pass, the distribution around
    the updated point), exact."""

    #: merges: pipeline.fit.learners.moves; ``candidates`` > 0: the MAP labels searched over candidate
    #: clusters (pipeline.fit.learners.truncated.MapSearch)
    options = declare(PRUNE_THRESHOLD, POINT_MOVE_OPTIONS, MAP_SEARCH_OPTIONS)
    passes_per_iteration = 1

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        assert self.point is not None, "start() first"
        self._iteration = iteration
        stats = self.apply_moves(iteration, self.hard_pass(self.point))
        sticks = mm_sticks(stats.nk, self.a0)
        keep = self.prune_kept(sticks, stats.nk, stats.mean)
        # re-order by descending count, then the MM update in that order (section 4.5): the sticks
        # are the MAP of the new order, and the stick part of the bound is largest for it
        order = keep[np.argsort(-stats.nk[keep], kind="stable")]
        if self.search is not None:
            self.search.relabel(order)
        kept = take_stats(stats, order)
        self.point, self.counts = mm_update(kept, self.ctx.prior, self.a0), kept.nk
        #: ln p(x, z, mu, v) at the point (Lim & Jiang 2024 eqs. 23-26), for monitoring
        self.map_bound = map_bound(kept, self.point, self.ctx.prior, self.sigma2, self.a0).total
        self.post = self.posterior()
        if kept.nk.sum() < stats.nk.sum():  # the threshold dropped clusters holding rows: the pass's
            return self.post, self.exact_terms()  # labels are not all rows' any more, one more pass
        return self.post, elbo_terms(kept, self.post, self.ctx.prior)
