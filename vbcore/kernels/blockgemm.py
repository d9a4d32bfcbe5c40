"""The two products of a diagonal-family chunk block, shaped for what the data make of them.

* :func:`padded_weights` -- the E-step's ``(2D x K)`` weights with zero columns up to a multiple of
  :data:`PAD_COLUMNS`: OpenBLAS's SGEMM runs its narrow-matrix kernels on whole groups of 8 columns
  and takes its slow edge path for the rest (measured on the 2-core machine, one thread, a
  2048 x 2560 block: K = 23 columns 4.84 ms, K = 24 3.89 ms). :func:`log_rho_block` multiplies with
  them and keeps the first K columns.
* :func:`resp_t_dot` -- the statistics' ``R^T F`` (``(K x n) @ (n x 2D)``). After the first few
  iterations on real features almost every responsibility is exactly 0 (:func:`vbcore.kernels.estep.normalise`
  zeroes those below the dtype's smallest normal number): on Fashion-MNIST's EfficientNet features at
  K = 23-50 a row has 1.04 non-zero responsibilities on average, so a dense GEMM multiplies zeros for
  95% of its flops. A NumPy block whose sparse product is cheaper by :func:`sparse_is_cheaper`'s cost
  model is multiplied as a sparse one (SciPy's CSR product: for each component, its rows'
  ``r_nk f_n`` added in row order, in the data's dtype, as the GEMM accumulates): 1.4-1.7 ms
  against 7.5-9.9 ms for the GEMM on such a block at 2D = 2,560, while at 2D = 256 the GEMM
  (1.2 ms for K = 110) wins unless about one responsibility a row is non-zero.

Both choices depend only on the block's shape and values, never on the machine or the engine, so every
engine gives the same bits; the sparse sums differ from the GEMM's in rounding only (tests check
both against float64 brute force).
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from typing import Any

import numpy as np
import scipy.sparse

Array = Any

#: E-step weights get zero columns up to a multiple of this
PAD_COLUMNS = 8
#: the cost model of :func:`sparse_is_cheaper`, in the dense GEMM's multiply-adds (measured with one
#: thread on the 2-core machine, blocks of 2,048 rows: the GEMM does 5e10 multiply-adds a second at
#: K = 110, 2D = 256; the sparse product 5e9; finding the non-zero entries costs 3.9 ns an entry)
SPARSE_MULTIPLY = 10.0
SPARSE_SCAN = 200.0


@functools.cache
def exp_floor(bits: int) -> float:
    """The least ``z`` of the float type of ``bits`` (32 or 64; ``xp.finfo(dtype).bits`` in any
    namespace) whose NumPy ``exp`` is a normal number: :func:`vbcore.kernels.estep.normalise` leaves ``exp``
    of anything below it out (an input whose result is subnormal takes the slow path: 2.2 ms against
    0.58 ms for a 2,048 x 110 float32 block)."""
    floating = {32: np.float32, 64: np.float64}[int(bits)]
    tiny = np.finfo(floating).smallest_normal
    z = floating(math.log(float(tiny)))
    while np.exp(z) < tiny:  # float32: exp(ln(tiny) rounded) is just below tiny
        z = np.nextafter(z, floating(0))
    return float(z)


def padded_weights(weights: np.ndarray) -> np.ndarray:
    """``weights`` (rows x K, host float64) with zero columns appended up to a multiple of
    :data:`PAD_COLUMNS` (itself when K already is one)."""
    k = weights.shape[1]
    pad = -k % PAD_COLUMNS
    if pad == 0:
        return weights
    return np.concatenate((weights, np.zeros((weights.shape[0], pad), dtype=weights.dtype)), axis=1)


_OPERANDS: dict[tuple[int, int, str, Any], tuple[Any, Array, Array]] = {}
_OPERANDS_LOCK = threading.Lock()


def gemm_operands(params: Any, xp: Any, dtype: Any) -> tuple[Array, Array]:
    """``(padded weights, const)`` of diagonal-family E-step parameters (``vbcore.kernels.estep.EStepParams``)
    in namespace ``xp`` and ``dtype``, made once per parameters object, namespace, dtype and device,
    and shared by every chunk of the pass (each chunk used to pad, cast and, on a GPU, upload the
    2D x K weights again: 67 MB a chunk at D = 4096, K = 1000, and 5.7 ms of one core's time on the
    2-core machine). The same values, so the same bits. Kept while ``params`` lives (a pass's)."""
    device = getattr(getattr(xp, "cuda", None), "Device", None)
    try:
        kind = np.dtype(dtype).str  # NumPy and CuPy dtypes, or their scalar types
    except TypeError:
        kind = str(dtype)  # another namespace's dtype object
    key = (id(params), id(xp), kind, device().id if device else None)
    with _OPERANDS_LOCK:
        hit = _OPERANDS.get(key)
        if hit is not None and hit[0]() is params:
            return hit[1], hit[2]
        for old in [k for k, v in _OPERANDS.items() if v[0]() is None]:  # parameters gone: drop theirs
            del _OPERANDS[old]
        w = xp.asarray(padded_weights(params.weights), dtype=dtype)
        const = xp.asarray(params.const, dtype=dtype)
        _OPERANDS[key] = (weakref.ref(params), w, const)
        return w, const


def log_rho_block(f: Array, w_padded: Array, const: Array) -> Array:
    """``f @ w + const`` of one block's features with weights from :func:`padded_weights`: the
    product's first ``K = len(const)`` columns plus ``const``."""
    k = int(const.shape[0])
    prod = f @ w_padded
    return (prod if int(prod.shape[1]) == k else prod[:, :k]) + const


def sparse_is_cheaper(n_rows: int, k: int, columns: int, nnz: int) -> bool:
    """Whether the sparse ``R^T F`` of ``nnz`` non-zero responsibilities costs less than the GEMM:
    ``nnz * columns * SPARSE_MULTIPLY + n_rows * k * SPARSE_SCAN < n_rows * k * columns`` (a
    function of the shapes and the count only, never of the machine)."""
    dense = n_rows * k * columns
    return nnz * columns * SPARSE_MULTIPLY + n_rows * k * SPARSE_SCAN < dense


def resp_t_dot(xp: Any, resp: Array, f: Array) -> Array:
    """``resp^T @ f`` in the data's dtype: sparse for a NumPy block where :func:`sparse_is_cheaper`,
    a GEMM otherwise."""
    if isinstance(resp, np.ndarray) and isinstance(f, np.ndarray) and resp.size:
        n, k = resp.shape
        if sparse_is_cheaper(n, k, int(f.shape[1]), int(np.count_nonzero(resp))):
            idx = np.flatnonzero(resp)  # row-major: row n's non-zero components in ascending order
            indptr = np.searchsorted(idx, np.arange(0, (n + 1) * k, k))
            rows = scipy.sparse.csr_array((resp.ravel()[idx], idx % k, indptr), shape=(n, k))
            # rows.T is CSC: for each component, its rows' r_nk f_n added in row order
            return np.asarray(rows.T @ f, dtype=np.result_type(resp.dtype, f.dtype))
    return xp.matrix_transpose(resp) @ f


__all__ = ["PAD_COLUMNS", "SPARSE_MULTIPLY", "SPARSE_SCAN", "exp_floor", "gemm_operands", "log_rho_block",
           "padded_weights", "resp_t_dot", "sparse_is_cheaper"]
