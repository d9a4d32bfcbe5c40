"""VB EM (seed 000 eqs. 35-41): one E-step pass over the chunks, then the M-step on the driver."""

from __future__ import annotations

import numpy as np

from pipeline.learners import register
from pipeline.learners.truncated import TRUNCATED_OPTIONS, TruncatedLearner
from vbcore.elbo import ElboTerms, elbo_terms
from vbcore.kernels import KernelResult, estep_params, vbem_kernel
from vbcore.mstep import m_step
from vbcore.posterior import Posterior
from vbcore.sga import take_stats


def vbem_pass(ctx, post: Posterior) -> KernelResult:  # type: ignore[no-untyped-def]
    """One E-step + statistics pass with responsibilities from ``post``."""
    return ctx.engine.map_reduce(vbem_kernel, ctx.handles, estep_params(post, ctx.shift))


@register("vbem")
class VBEM(TruncatedLearner):
    """Variational Bayesian EM: q(Z) from the current q(theta), then q(theta) from q(Z).

    The ELBO reported after iteration t is that of (q(Z) from the E-step, q(theta) from the M-step
    that followed), which never decreases for ``reg_covar = 0`` (Bishop 10.2)."""

    #: DP pruning (issue 6): components whose expected count N_k falls under ``prune_below`` rows are
    #: dropped after the M-step (the bound moves by about N_k nats); ``reorder`` sorts the sticks by
    #: descending N_k before the M-step (which never lowers the bound, seed 003 section 4.5; off by
    #: default, so the trajectory stays scikit-learn's).
    #: ``candidates`` > 0: the truncated E-step over that many clusters per row (issue 15, see
    #: pipeline/learners/truncated.py)
    options = {"prune_below": 1e-6, "reorder": False, **TRUNCATED_OPTIONS}

    def step(self, iteration: int) -> tuple[Posterior, ElboTerms]:
        assert self.post is not None, "start() first"
        trunc = self.truncated
        result = trunc.run(self.post, iteration) if trunc else vbem_pass(self.ctx, self.post)
        self.passes += 1
        stats = result.stats
        dp = self.ctx.weight_type == "dirichlet_process"
        if dp and self.opts["reorder"]:
            order = np.argsort(-stats.nk, kind="stable")
            stats = take_stats(stats, order)
            self.relabel_components(order)
        self.post = m_step(stats, self.ctx.prior, self.ctx.reg_covar)
        terms = elbo_terms(stats, self.post, self.ctx.prior)
        if dp:
            keep = stats.nk >= float(self.opts["prune_below"])
            self.relabel_components(kept_components(self.post, keep))
            self.post = prune_components(self.post, keep)
        return self.post, terms


def prune_components(post: Posterior, keep: np.ndarray) -> Posterior:
    """The posterior of the components ``keep`` (a mask; the largest is kept if none is)."""
    if keep.all():
        return post
    idx = kept_components(post, keep)
    nu = None if post.degrees_of_freedom is None else post.degrees_of_freedom[idx]
    return Posterior(post.covariance_type, post.weight_type, post.weight_concentration[..., idx],
                     post.mean_precision[idx], post.means[idx], nu, post.covariances[idx],
                     post.precisions_cholesky[idx])


def kept_components(post: Posterior, keep: np.ndarray) -> np.ndarray:
    """The indices :func:`prune_components` keeps."""
    return np.flatnonzero(keep) if keep.any() else np.array([int(np.argmax(post.weight_concentration[0]))])
