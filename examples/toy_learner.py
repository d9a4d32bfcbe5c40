"""A learner outside the package, in one module: plain VB EM in a dozen lines.

The example of docs/architecture.md, "How to add a learner". Make it known to every face by importing
it (``import toy_learner`` before ``VBMixture(learner="toy-vbem")``), or for the command line and the
flows with ``VBCLUSTER_LEARNERS=toy_learner`` (the module on ``PYTHONPATH``), or from an installed
package through an entry point::

    [project.entry-points."vbcluster.learners"]
    toy = "toy_learner"

then ``vbcluster fit STORE --run-dir R --learner toy-vbem``. ``tests/test_toy_learner.py`` fits it
through the CLI, ``VBMixture`` and ``cluster_flow``, and checks that it gives VB EM's bits (VB EM with
nothing pruned and no growth is this loop: Bishop 2006 section 10.2).
"""

from __future__ import annotations

from pipeline.fit.learners import Learner, register
from vbcore.kernels.estep import estep_params, vbem_pass_kernel
from vbcore.model.elbo import ElboTerms, elbo_terms
from vbcore.model.mstep import m_step
from vbcore.model.posterior import Posterior


@register("toy-vbem")
class ToyVBEM(Learner):
    """VB EM: q(Z) from q(theta) in one pass over the chunks (on the workers), then q(theta) from the
    pass's statistics on the driver; the exact bound of the pair."""

    family = "vbem"
    passes_per_iteration = 1

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        ctx = self.ctx
        assert self.post is not None, "start() first"
        params = estep_params(self.post, ctx.shift)
        stats = ctx.engine.map_reduce(vbem_pass_kernel, ctx.handles, params).stats
        self.post = m_step(stats, ctx.prior, ctx.reg_covar)
        return self.post, elbo_terms(stats, self.post, ctx.prior)
