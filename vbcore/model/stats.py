"""Additive sufficient statistics of a mixture, in centred form (Kuusela et al. 2009 eqs. 30-32).

A chunk of rows with responsibilities ``r`` summarises to ``N_k = sum_n r_nk`` (eq. 30), the weighted
mean ``xbar_k`` (eq. 31) and the centred scatter ``N_k S_k = sum_n r_nk (x_n - xbar_k)(x_n - xbar_k)^T``
(eq. 32; only its diagonal for the diagonal families; for 'tied' only the pooled within-component
scatter ``sum_k N_k S_k``, one D x D matrix, which is all its M-step and ELBO read), plus
``sum_n sum_k r_nk ln r_nk`` for the entropy of q(Z). Two summaries merge exactly with the pairwise
formula of Chan, Golub and LeVeque, which stays accurate where raw moments ``sum r x x^T`` would
cancel. Means are stored relative to a ``shift`` (the same for every chunk of a fit, usually the prior
mean) to keep float32 GEMMs accurate.
The arrays are float64 NumPy arrays, except on a device engine's way to its reduction: the diagonal
statistics of a pass (:func:`diag_stats`, :meth:`SuffStats.merge`) are made and merged in their
arrays' namespace (CuPy: on the device) with the same elementwise operations, so the same bits, and
cross to the host once a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vbcore.arrays import array_namespace


@dataclass(frozen=True)
class SuffStats:
    """Sufficient statistics of some rows of the data.

    Attributes
    ----------
    nk : array of shape (n_components,)
        ``N_k``, summed responsibilities.
    mean : array of shape (n_components, n_features)
        Weighted mean of ``x - shift``; zero where ``N_k == 0``.
    scatter : array of shape (n_components, n_features, n_features), (n_components, n_features)
        or (n_features, n_features)
        Centred scatter ``N_k S_k`` (full), its diagonal (diag, spherical, fixed), or the pooled
        ``sum_k N_k S_k`` (tied, ``pooled=True``).
    sum_rlogr : float
        ``sum_nk r_nk ln r_nk`` (minus the entropy of q(Z)).
    n_rows : int
        Number of rows summarised.
    shift : array of shape (n_features,)
        The offset subtracted from the rows before summarising.
    pooled : bool
        ``scatter`` is the pooled within-component scatter (tied).
    weight : float or None
        ``sum_n w_n``, the total weight of the rows summarised (weighted rows enter every sum with
        their responsibilities multiplied by the row's weight ``w_n``); None: unweighted rows, whose
        total weight is ``n_rows`` (:attr:`total_weight`).
    """

    nk: np.ndarray
    mean: np.ndarray
    scatter: np.ndarray
    sum_rlogr: float
    n_rows: int
    shift: np.ndarray
    pooled: bool = False
    weight: float | None = None

    @property
    def total_weight(self) -> float:
        """``sum_n w_n`` of the rows summarised (``n_rows`` for unweighted rows)."""
        return float(self.n_rows) if self.weight is None else float(self.weight)

    @property
    def n_components(self) -> int:
        return int(self.nk.shape[0])

    @property
    def full(self) -> bool:
        return self.scatter.ndim == 3

    def merge(self, other: SuffStats) -> SuffStats:
        """Combine two summaries of disjoint rows (Chan et al. pairwise update).

        The result does not depend on which side holds which rows beyond floating-point rounding;
        engines merge in a fixed (chunk) order so that results are bitwise reproducible.
        """
        self._check_mergeable(other)
        xp = array_namespace(self.nk)
        na, nb = self.nk, other.nk
        n = na + nb
        safe = xp.where(n > 0, n, xp.ones_like(n))
        delta = other.mean - self.mean
        mean = self.mean + delta * (nb / safe)[:, None]
        weight = na * nb / safe
        if self.pooled:  # sum_k w_k delta_k delta_k^T as one (D x K) @ (K x D) product
            correction = (weight[:, None] * delta).T @ delta
            correction = 0.5 * (correction + correction.T)
        elif self.full:  # symmetrised: (w d_i) d_j and (w d_j) d_i round differently
            correction = weight[:, None, None] * delta[:, :, None] * delta[:, None, :]
            correction = 0.5 * (correction + correction.transpose(0, 2, 1))
        else:
            correction = weight[:, None] * delta * delta
        return self._union(other, n, mean, self.scatter + other.scatter + correction)

    def merge_owned(self, other: SuffStats) -> SuffStats:
        """:meth:`merge`, computed into this summary's arrays (the same bits; ``self`` is spent): an
        engine's in-process reduction of fresh chunk results. Diagonal NumPy statistics only (the
        others merge as :meth:`merge`): two K x D temporaries instead of six."""
        if self.pooled or self.full or not isinstance(self.nk, np.ndarray):
            return self.merge(other)
        self._check_mergeable(other)
        xp = array_namespace(self.nk)
        na, nb = self.nk, other.nk
        n = na + nb
        safe = xp.where(n > 0, n, xp.ones_like(n))
        delta = other.mean - self.mean
        part = (na * nb / safe)[:, None] * delta
        part *= delta
        scatter = self.scatter
        scatter += other.scatter
        scatter += part
        mean = self.mean
        mean += np.multiply(delta, (nb / safe)[:, None], out=part)
        return self._union(other, n, mean, scatter)

    def _check_mergeable(self, other: SuffStats) -> None:
        if (self.nk.shape != other.nk.shape or self.scatter.shape != other.scatter.shape
                or self.pooled != other.pooled):
            raise ValueError(
                f"cannot merge statistics of shapes {self.scatter.shape} and {other.scatter.shape}"
            )
        if not np.array_equal(self.shift, other.shift):
            raise ValueError("cannot merge statistics computed with different shifts")

    def _union(self, other: SuffStats, nk: np.ndarray, mean: np.ndarray, scatter: np.ndarray) -> SuffStats:
        """The merged summary of ``self``'s and ``other``'s rows with the merged arrays given."""
        return SuffStats(nk=nk, mean=mean, scatter=scatter, sum_rlogr=self.sum_rlogr + other.sum_rlogr,
                         n_rows=self.n_rows + other.n_rows, shift=self.shift, pooled=self.pooled,
                         weight=add_weights(self, other))

    def __add__(self, other: SuffStats) -> SuffStats:
        return self.merge(other)

    def take(self, order: np.ndarray) -> SuffStats:
        """Statistics of the components ``order`` (an index array): re-ordering, or dropping
        components that hold no rows (a pooled scatter stays as it is)."""
        scatter = self.scatter if self.pooled else self.scatter[order]
        return SuffStats(nk=self.nk[order], mean=self.mean[order], scatter=scatter,
                         sum_rlogr=self.sum_rlogr, n_rows=self.n_rows, shift=self.shift,
                         pooled=self.pooled, weight=self.weight)

    def raw_mean(self) -> np.ndarray:
        """Weighted means in the data's own coordinates (``mean + shift``)."""
        return self.mean + self.shift

    def data_covariance(self) -> np.ndarray:
        """The unbiased covariance of the rows (their per-dimension variances for the diagonal
        families) of a one-component summary of the data (the fit's moments); weighted rows: their
        total weight is the data's N."""
        return self.scatter[0] / max(self.total_weight - 1, 1)


def add_weights(a: SuffStats, b: SuffStats) -> float | None:
    """The ``weight`` of the union of two summaries: None when both are unweighted."""
    if a.weight is None and b.weight is None:
        return None
    return a.total_weight + b.total_weight


def diag_stats(nk: np.ndarray, g: np.ndarray, sum_rlogr: float, n_rows: int, shift: np.ndarray,
               weight: float | None = None, owned: bool = False) -> SuffStats:
    """Centred statistics from ``g = [sum r x^2, sum r x]`` (K, 2D) of ``n_rows`` rows shifted by
    ``shift``: ``mean = sum r x / N_k``, ``scatter = sum r x^2 - N_k mean^2`` (0 where N_k = 0).
    ``owned``: ``g`` is the caller's to give away, and the two are computed into its halves (the
    same bits, with one K x D temporary instead of four: a chunk's host time at K = 1000, D = 4096).
    Arrays of another namespace (a device's) give arrays of that namespace, the same values."""
    d = g.shape[1] // 2
    if not isinstance(nk, np.ndarray):
        return _diag_stats_xp(nk, g, d, sum_rlogr, n_rows, shift, weight)
    safe = np.where(nk > 0, nk, 1.0)
    if owned:
        mean = np.divide(g[:, d:], safe[:, None], out=g[:, d:])
        product = nk[:, None] * mean
        product *= mean
        scatter = np.maximum(np.subtract(g[:, :d], product, out=g[:, :d]), 0.0, out=g[:, :d])
    else:
        mean = g[:, d:] / safe[:, None]
        scatter = np.maximum(g[:, :d] - nk[:, None] * mean * mean, 0.0)
    mean[nk <= 0] = 0.0
    scatter[nk <= 0] = 0.0
    return SuffStats(nk=nk, mean=mean, scatter=scatter, sum_rlogr=sum_rlogr, n_rows=n_rows, shift=shift,
                     weight=weight)


def _diag_stats_xp(nk: Any, g: Any, d: int, sum_rlogr: float, n_rows: int, shift: np.ndarray,
                   weight: float | None) -> SuffStats:
    """:func:`diag_stats` in the namespace of ``nk`` and ``g`` with array-API operations only: the
    same elementwise operations in the same order, so the same values."""
    xp = array_namespace(nk)
    zero = xp.asarray(0.0, dtype=xp.float64)
    safe = xp.where(nk > 0, nk, xp.ones_like(nk))
    empty = xp.reshape(nk <= 0, (-1, 1))
    mean = g[:, d:] / xp.reshape(safe, (-1, 1))
    scatter = xp.maximum(g[:, :d] - xp.reshape(nk, (-1, 1)) * mean * mean, zero)
    return SuffStats(nk=nk, mean=xp.where(empty, zero, mean), scatter=xp.where(empty, zero, scatter),
                     sum_rlogr=sum_rlogr, n_rows=n_rows, shift=shift, weight=weight)
