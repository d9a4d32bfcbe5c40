"""VB EM (seed 000 eqs. 35-41): one E-step pass over the chunks, then the M-step on the driver."""

from __future__ import annotations

from pipeline.learners import register
from pipeline.learners.base import Learner
from vbcore.elbo import ElboTerms, elbo_terms
from vbcore.kernels import KernelResult, estep_params, vbem_kernel
from vbcore.mstep import m_step
from vbcore.posterior import Posterior


def vbem_pass(ctx, post: Posterior) -> KernelResult:  # type: ignore[no-untyped-def]
    """One E-step + statistics pass with responsibilities from ``post``."""
    return ctx.engine.map_reduce(vbem_kernel, ctx.handles, estep_params(post, ctx.shift))


@register("vbem")
class VBEM(Learner):
    """Variational Bayesian EM: q(Z) from the current q(theta), then q(theta) from q(Z).

    The ELBO reported after iteration t is that of (q(Z) from the E-step, q(theta) from the M-step
    that followed), which never decreases for ``reg_covar = 0`` (Bishop 10.2)."""

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        assert self.post is not None, "start() first"
        result = vbem_pass(self.ctx, self.post)
        self.passes += 1
        self.post = m_step(result.stats, self.ctx.prior, self.ctx.reg_covar)
        return self.post, elbo_terms(result.stats, self.post, self.ctx.prior)
