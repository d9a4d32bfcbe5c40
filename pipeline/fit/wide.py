"""``vbcluster fit``'s default on wide stores of non-negative rows (issue 51): a rule, then the bound.

Where a fit gives none of ``--select``, ``--covariance``, ``--pca``, ``--normalize`` (nor another
learner than vbem), and the store has more than ``FULL_MAX_FEATURES`` dimensions whose every value is
>= 0 -- pooled CNN activations (post-ReLU), histograms, counts -- :func:`wide_default` fills in:

* **a rule** (not a choice of the bound): the rows power- and L2-normalised (``sign(x)|x|^0.5``, then
  unit length: ``normalize='power-l2'``, Perronnin et al. 2010), unless the store was
  power-normalised at ingest; the fit keeps it with its projection, so ``assign``, ``report`` and
  refreshes apply it too (:class:`vbcore.kernels.projection.Projection`). The rows' exact bound
  cannot make this choice: it compares models of the same rows, and the normalisation changes the
  rows;
* **the bound within one space**: the covariance family (diag, full, tied, spherical) chosen by the
  exact bound of the normalised rows' :data:`WIDE_SPACE` (128; ``--select-pca`` given: that) leading
  principal components, whitened
  (``select='covariance'``, :func:`pipeline.fit.select.wide_space`; Jegou & Chum 2012 for PCA-whitening
  of such descriptors), under the 'empirical' prior, which the bound does not choose: on these
  features the bound ranks the prior's strength against NMI (it prefers the lightest prior, which
  over-splits: docs/decisions.md);
* **over-relaxed passes** (``accelerate=true``): full covariances' VB EM tail halves (deliver 5).

Stores with a negative value anywhere, or of at most ``FULL_MAX_FEATURES`` dimensions, keep the fit
as before, bit for bit. ``--select none`` (or any of the settings above given by hand) restores the
plain default on a wide store; :data:`WIDE_DEFAULT` switches the rule (on since 2026-12-05). The rule
was measured on Fashion-MNIST's EfficientNet-Lite0 features and the synthetic stores only
(docs/decisions.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.fit import select

#: whether ``vbcluster fit`` applies :func:`wide_default` where no ``--select`` is given. On: in its
#: space of 128 it meets Fashion-MNIST's target (24 clusters, NMI 0.596) and keeps the 100-class
#: 512-dimensional store's (100 clusters, NMI 1.000); on the SUN397-shaped store with ``-k 1000`` it
#: finds the 397 classes too, at about three times the plain fit's time (the screen and the 4096-d
#: projection; a target missed, said in docs/decisions.md)
WIDE_DEFAULT = True
#: P of the whitened space the rule's candidates are compared in (``--select-pca`` given: that one).
#: 128, not ``FitSpec.select_pca``'s 64: in 64 components full covariances win the screen on the
#: 100-class synthetic store and merge its classes in the full fit (74 clusters); in 128 the screen's
#: 16,384 rows no longer carry full covariances for 100 classes and the bound keeps diag (100
#: clusters), while Fashion-MNIST's 10 classes keep full (24 clusters, NMI 0.596). Chosen on those two
#: stores between 64 and 128 (256 not measured; docs/decisions.md); the spectrum's own count (Minka
#: 2000, the Marchenko-Pastur edge) is above 256 on all three wide stores measured, so it does not
#: choose (bench/bench_wide_dimension.py)
WIDE_SPACE = 128
#: settings that, given by hand, leave the fit as the user asked (the rule does not apply)
BY_HAND = ("select", "covariance", "pca", "whiten", "normalize", "pca_solver")


def nonnegative(source: Any) -> bool:
    """Whether every value of ``source``'s rows is >= 0 (chunk by chunk; stops at the first negative)."""
    return all(not bool(np.any(source.load(i) < 0)) for i in range(len(source.chunk_slices())))


def applies(values: dict[str, Any], n_features: int) -> bool:
    """Whether the rule may apply to a fit given ``values`` (the settings given) on a store of
    ``n_features`` dimensions, before its rows are read."""
    if not WIDE_DEFAULT or n_features <= select.FULL_MAX_FEATURES:
        return False
    return not any(values.get(k) is not None for k in BY_HAND) and values.get("learner", "vbem") == "vbem"


def wide_default(source: Any, store_normalize: str, values: dict[str, Any]) -> dict[str, Any]:
    """The settings the rule adds to ``values`` for ``source`` (a store of ``store_normalize``
    normalisation at ingest), or {} where it does not apply (see the module docstring)."""
    if not applies(values, int(source.n_features)) or not nonnegative(source):
        return {}
    options = {"accelerate": "true", **dict(values.get("learner_options") or {})}
    space = {} if values.get("select_pca") is not None else {"select_pca": WIDE_SPACE}
    return {"normalize": "none" if store_normalize == "power-l2" else "power-l2", "select": "covariance",
            "learner_options": options, **space}


def wide_settings(store: str, values: dict[str, Any]) -> dict[str, Any]:
    """:func:`wide_default` for the store at ``store`` (opened only where the rule may apply by the
    settings given; a store that cannot be opened gets {}: the fit's own checks report it)."""
    from pipeline.engine.sources import StoreSource
    from pipeline.store.features import FeatureStore
    from vbcore.errors import VBClusterError

    if not applies(values, select.FULL_MAX_FEATURES + 1):
        return {}
    try:
        source = StoreSource(store)
        return wide_default(source, FeatureStore.open(store).normalize, values)
    except (VBClusterError, OSError):
        return {}
