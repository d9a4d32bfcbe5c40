"""The model and its bound: priors (:mod:`.priors`), the posterior (:mod:`.posterior`), sufficient
statistics (:mod:`.stats`), the M-step (:mod:`.mstep`), the exact ELBO (:mod:`.elbo`), empirical Bayes
(:mod:`.empirical`) and the posterior predictive (:mod:`.predictive`)."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "Prior": "priors", "default_prior": "priors", "Posterior": "posterior", "SuffStats": "stats",
    "m_step": "mstep", "ElboTerms": "elbo", "elbo_terms": "elbo", "empirical_update": "empirical",
})
