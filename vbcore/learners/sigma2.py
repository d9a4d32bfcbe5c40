"""A default isotropic variance ``sigma^2`` for ``x | z=k ~ N(mu_k, sigma^2 I)`` that does not depend on K.

**Split-coordinate nearest neighbours** (our choice, issue 6 item 5; docs/algorithms.md "Defaults").
For two rows of one cluster, ``x_i - x_j ~ N(0, 2 sigma^2 I)``, so over any set B of coordinates
``|x_i - x_j|_B^2 / (2 sigma^2) ~ chi^2_|B|``. A row's nearest neighbour is the natural same-cluster
partner, but the minimum over candidates biases its distance low (by a factor that depends on the
dimension and the cluster's size in the sample, both unknown). So the coordinates are split at random
into two disjoint sets: the neighbour ``j(i)`` is chosen with the coordinates in A, and the distance is
measured on the other coordinates B. Under the model the noise is independent across coordinates, so
when ``j(i)`` is in the cluster of ``i`` the B-distance is an exact ``2 sigma^2 chi^2_|B|`` draw,
whatever the selection did; rows whose A-neighbour lies in another cluster (a cluster with one
sample row, overlapping clusters) only add ``|mu_k - mu_l|_B^2`` to theirs. The estimate is

    sigma^2 = median_i |x_i - x_j(i)|_B^2 / (2 median(chi^2_|B|)),

consistent under the model (the median of ``chi^2_|B|`` is exact, from scipy), and robust to a
minority of cross-cluster pairs: they only move the median by a quantile shift of
``chi^2_|B| / |B|``, whose spread is ``sqrt(2 / |B|)`` (1.8% at |B| = 128 with 10% cross pairs).
K does not enter. Cost: one ``n x n`` float32 GEMM over ``|A|`` coordinates in row blocks (n <= a few
thousand), no N x N on the full data.

Limits: in low dimension the neighbour chosen on ``|A| = D/2`` coordinates is often in another
cluster (D = 2: one coordinate), and the estimate is then biased upwards; below 2 coordinates there is
no split and the plain nearest-neighbour distance (biased low) is used.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import chi2

#: at most this many coordinates choose the neighbour (the rest measure the distance)
SELECT_MAX_DIMS = 1024
#: row block of the neighbour search (block x n distances at a time)
BLOCK_ROWS = 256


def nearest_neighbours(x: np.ndarray, block: int = BLOCK_ROWS) -> np.ndarray:
    """Index of every row's nearest other row (squared Euclidean distance, ties to the lowest index).

    Parameters
    ----------
    x : ndarray, shape (n, d), n >= 2
        Rows (float32: float32 GEMMs, float64 norms).

    Returns
    -------
    ndarray of int64, shape (n,)
    """
    n = x.shape[0]
    sq = np.einsum("ij,ij->i", x, x, dtype=np.float64)
    out = np.empty(n, dtype=np.int64)
    for s in range(0, n, block):
        e = min(s + block, n)
        d2 = sq[s:e, None] + sq[None, :] - 2.0 * (x[s:e] @ x.T).astype(np.float64)
        d2[np.arange(e - s), np.arange(s, e)] = np.inf  # not its own neighbour
        out[s:e] = np.argmin(d2, axis=1)
    return out


def split_nn_variance(x: np.ndarray, rng: np.random.Generator) -> float:
    """``sigma^2`` by split-coordinate nearest neighbours (module docstring); 0.0 when undefined.

    Parameters
    ----------
    x : ndarray, shape (n, d)
        Distinct rows (duplicates would pair at distance zero), n >= 2; float32 for float32 GEMMs.
    rng : numpy Generator
        Draws the random split of the coordinates.

    Returns
    -------
    float
        The estimate of the per-coordinate within-cluster variance.
    """
    n, d = x.shape
    if n < 2 or d < 1:
        return 0.0
    if d < 2:  # no split possible: plain nearest neighbour, on the one coordinate
        a = b = np.arange(d)
    else:
        perm = rng.permutation(d)
        a, b = np.sort(perm[:min(d // 2, SELECT_MAX_DIMS)]), np.sort(perm[min(d // 2, SELECT_MAX_DIMS):])
    nn = nearest_neighbours(np.ascontiguousarray(x[:, a]))
    xb = x[:, b]
    diff = (xb - xb[nn]).astype(np.float64)
    half = 0.5 * np.einsum("ij,ij->i", diff, diff)  # |x_i - x_j(i)|_B^2 / 2 ~ sigma^2 chi^2_|B|
    return float(np.median(half) / chi2.median(b.size))
