"""The two products of a diagonal-family chunk block, shaped for what the data make of them.

* :func:`padded_weights` -- the E-step's ``(2D x K)`` weights with zero columns up to a multiple of
  :data:`PAD_COLUMNS`: OpenBLAS's SGEMM runs its narrow-matrix kernels on whole groups of 8 columns
  and takes its slow edge path for the rest (measured on the 2-core machine, one thread, a
  2048 x 2560 block: K = 23 columns 4.84 ms, K = 24 3.89 ms). :func:`log_rho_block` multiplies with
  them and keeps the first K columns.
* :func:`resp_t_dot` -- the statistics' ``R^T F`` (``(K x n) @ (n x 2D)``). After the first few
  iterations on real features almost every responsibility is exactly 0 (:func:`vbcore.kernels.normalise`
  zeroes those below the dtype's smallest normal number): on Fashion-MNIST's EfficientNet features at
  K = 23-50 a row has 1.04 non-zero responsibilities on average. A dense GEMM then multiplies zeros
  for 95% of its flops; when at most :data:`SPARSE_SHARE` of a NumPy block's responsibilities are
  non-zero the product is taken as a sparse one (SciPy's CSR product: for each component, its rows'
  ``r_nk f_n`` added in row order, in the data's dtype, as the GEMM accumulates), 1.7-2.0 ms against
  7.7-10.1 ms for the GEMM on that block.

Both choices depend only on the block's values and K, never on the machine or the engine, so every
engine gives the same bits; the sparse sums differ from the GEMM's in rounding only (tests check
both against float64 brute force).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse

Array = Any

#: E-step weights get zero columns up to a multiple of this
PAD_COLUMNS = 8
#: a NumPy block whose share of non-zero responsibilities is at most this gets the sparse product
SPARSE_SHARE = 1 / 8


def padded_weights(weights: np.ndarray) -> np.ndarray:
    """``weights`` (rows x K, host float64) with zero columns appended up to a multiple of
    :data:`PAD_COLUMNS` (itself when K already is one)."""
    k = weights.shape[1]
    pad = -k % PAD_COLUMNS
    if pad == 0:
        return weights
    return np.concatenate((weights, np.zeros((weights.shape[0], pad), dtype=weights.dtype)), axis=1)


def log_rho_block(f: Array, w_padded: Array, const: Array) -> Array:
    """``f @ w + const`` of one block's features with weights from :func:`padded_weights`: the
    product's first ``K = len(const)`` columns plus ``const``."""
    k = int(const.shape[0])
    prod = f @ w_padded
    return (prod if int(prod.shape[1]) == k else prod[:, :k]) + const


def resp_t_dot(xp: Any, resp: Array, f: Array) -> Array:
    """``resp^T @ f`` in the data's dtype: sparse for a NumPy block with at most
    :data:`SPARSE_SHARE` non-zero responsibilities, a GEMM otherwise."""
    if isinstance(resp, np.ndarray) and isinstance(f, np.ndarray) and resp.size:
        n, k = resp.shape
        if np.count_nonzero(resp) <= SPARSE_SHARE * n * k:
            # CSR of resp^T: component k's row holds its non-zero responsibilities in row order
            out = scipy.sparse.csr_array(resp.T) @ f
            return np.asarray(out, dtype=np.result_type(resp.dtype, f.dtype))
    return xp.matrix_transpose(resp) @ f


__all__ = ["PAD_COLUMNS", "SPARSE_SHARE", "log_rho_block", "padded_weights", "resp_t_dot"]
