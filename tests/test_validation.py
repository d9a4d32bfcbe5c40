"""vbcore.data.validation: the one row validator (estimator arrays, ingest files and batches, store
chunks)."""

import numpy as np
import pytest
from scipy import sparse

from vbcore.data.validation import as_rows, check_finite, check_layout, row_is_finite
from vbcore.errors import InputError, InputTypeError


@pytest.mark.parametrize(
    "shape, dtype, kwargs, pattern",
    [
        ((10,), "f8", {}, r"^f\.npy must be 2-D \(n_samples, n_features\), got 1-D of shape \(10,\)$"),
        ((2, 3, 4), "f4", {"reshape_hint": True}, r"got 3-D of shape \(2, 3, 4\)\. Reshape your data"),
        ((0, 3), "f4", {}, r"^f\.npy has n_samples=0: .*minimum of 1 is required\.$"),
        ((5, 0), "f4", {"min_rows": 0}, r"^f\.npy has n_features=0"),
        ((5, 3), "U3", {}, r"^f\.npy must be numeric, got dtype <U3$"),
        ((5, 3), "c16", {}, r"^Complex data not supported: f\.npy has dtype complex128$"),
    ],
)
def test_layout_messages_name_the_data(shape, dtype, kwargs, pattern):
    with pytest.raises(InputError, match=pattern):
        check_layout(shape, np.dtype(dtype), "f.npy", **kwargs)


def test_layout_accepts_numeric_2d_and_empty_batches_when_asked():
    for dtype in ("?", "i1", "u8", "f2", "f4", "f8"):
        check_layout((3, 2), np.dtype(dtype), "x")
    check_layout((0, 2), np.dtype("f4"), "batch", min_rows=0)


def test_finite_points_at_the_row_of_the_whole_source():
    x = np.ones((6, 3), dtype=np.float32)
    x[4, 1], x[5, 0] = np.inf, np.nan
    assert row_is_finite(x).tolist() == [True] * 4 + [False] * 2
    with pytest.raises(InputError, match=r"^chunk 2: non-finite value at row 1004, column 1: inf "
                                         r"\(NaN and inf are not allowed\); clean it$"):
        check_finite(x, "chunk 2", first_row=1000, hint="clean it")
    check_finite(x[:4], "chunk 2")  # finite rows pass


def test_as_rows_converts_like_the_estimator():
    assert as_rows(np.ones((2, 2), np.float32)).dtype == np.float32
    out = as_rows([[1, 2], [3, 4]])
    assert out.dtype == np.float64 and out.flags.c_contiguous
    assert as_rows(np.array([[1, 2.5]], dtype=object)).tolist() == [[1.0, 2.5]]
    assert as_rows(np.asfortranarray(np.ones((3, 2)))).flags.c_contiguous
    with pytest.raises(InputTypeError, match=r"^Y must be numeric; its dtype object holds a non-number"):
        as_rows(np.array([[1.0, "a"]], dtype=object), "Y")
    with pytest.raises(InputError, match=r"^X is a scipy sparse matrix.*X\.toarray\(\)"):
        as_rows(sparse.csr_matrix(np.eye(2)))
    with pytest.raises(InputError, match=r"^X: non-finite value at row 0, column 1: nan"):
        as_rows([[0.0, np.nan]])
