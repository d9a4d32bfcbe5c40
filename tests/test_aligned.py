"""Arrays at any byte offset (pipeline.engine.aligned): a chunk or a pass's parameters that reach a
kernel unaligned -- rebuilt on a message's bytes after crossing the network -- give the bits of
aligned ones. Before, NumPy's matmul computed an unaligned float32 chunk in a loop of its own (not
BLAS): the randomized projection's bits on Dask with chunks kept on the workers depended on which
worker ran a task (tests/test_projection_randomized.py's engine test was an xfail)."""

import numpy as np
import pytest

from pipeline.engine.aligned import aligned
from pipeline.engine.engines import LocalEngine
from vbcore.kernels.estep import prepare_chunk
from vbcore.kernels.projection import Rows
from vbcore.kernels.sketch import sketch_kernel

RNG = np.random.default_rng(5)


def _at_offset(a, offset):
    """A copy of ``a`` starting ``offset`` bytes past a 64-byte boundary (unaligned unless a multiple
    of the item size), as a message's bytes may hold it."""
    buf = np.zeros(a.nbytes + 128, dtype=np.uint8)
    start = (64 - buf.ctypes.data % 64) % 64 + offset
    out = np.frombuffer(buf[start:start + a.nbytes], dtype=a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("offset", [1, 2, 3, 5])
def test_an_unaligned_chunk_gives_the_bits_of_an_aligned_one(offset):
    x = (RNG.normal(size=(400, 60)) * 3).astype(np.float32)  # (a chunk of the engine test's store)
    q = RNG.normal(size=(60, 36)).astype(np.float32)
    odd = _at_offset(x, offset)
    assert not odd.flags.aligned and np.array_equal(odd, x)
    engine = LocalEngine(threads=1)
    ours = engine.map_reduce(sketch_kernel, [Rows(odd)], _at_offset(q, offset), None, per_chunk=[0])
    theirs = engine.map_reduce(sketch_kernel, [Rows(x)], q, None, per_chunk=[0])
    assert np.array_equal(ours.y, theirs.y) and np.array_equal(ours.total, theirs.total)


def test_aligned_copies_only_unaligned_arrays_in_dataclasses_and_tuples():
    x = RNG.normal(size=(50, 4))
    chunk = prepare_chunk(x, x[0], "diag")
    assert aligned(chunk) is chunk and aligned((1, chunk))[1] is chunk
    odd = Rows(_at_offset(x.astype(np.float32), 2))
    fixed = aligned((odd, "where"))
    assert fixed[0].x.flags.aligned and np.array_equal(fixed[0].x, odd.x) and fixed[1] == "where"
    assert aligned(odd.x).flags.aligned and aligned(3) == 3
