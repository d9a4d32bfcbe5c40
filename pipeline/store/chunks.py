"""Reading one whole chunk file without Zarr's machinery: what a streamed pass does per chunk.

A streamed pass reads every chunk of ``features`` in every iteration. Through Zarr a chunk costs,
besides the decompression itself, an event-loop round trip and a copy of the decoded chunk into the
selection (0.18 s per GB of 8,192 x 256 float32 chunks, a third of lz4's decoding; docs/benchmarks.md,
"Streamed passes"). For the codec chains vbcluster writes -- little-endian bytes, one compressor
(Blosc or zstd), a CRC-32C -- :func:`read_whole_chunk` reads the file, verifies the CRC-32C as Zarr's
``crc32c`` codec does, and decompresses straight into the returned array: the same bytes as Zarr's read.
Any other chain (older stores without checksums, other codecs, remote stores) goes through Zarr.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import zarr


def direct_decoder(arr: zarr.Array) -> Any | None:
    """The numcodecs decompressor of ``arr``'s chunks when its chain is [bytes (little-endian), Blosc or
    zstd, crc32c] and its dtype a little-endian number; None otherwise (read through Zarr)."""
    from numcodecs import Blosc, Zstd
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ZstdCodec

    codecs = getattr(arr.metadata, "codecs", None)
    if codecs is None or len(codecs) != 3 or arr.dtype.kind not in "fiu" or arr.dtype.byteorder == ">":
        return None
    head, comp, tail = codecs
    if not (isinstance(head, BytesCodec) and isinstance(tail, Crc32cCodec)
            and (head.endian is None or getattr(head.endian, "value", head.endian) == "little")):
        return None
    if isinstance(comp, BloscCodec):
        return Blosc()  # Blosc frames carry their own settings
    if isinstance(comp, ZstdCodec):
        return Zstd()
    return None


def read_whole_chunk(path: str, name: str, key: str, arr: zarr.Array, decoder: Any) -> np.ndarray:
    """Chunk file ``path/name/key`` of ``arr`` (its full chunk shape), CRC-32C verified, decoded.

    Raises FileNotFoundError when the file is gone and ValueError when its checksum does not match
    (the caller names the chunk)."""
    import google_crc32c

    with open(os.path.join(path, name, key), "rb") as f:
        data = f.read()
    body = np.frombuffer(data, dtype=np.uint8)[:-4]  # no copy (as Zarr's crc32c codec)
    if np.uint32(google_crc32c.value(body)).tobytes() != data[-4:]:
        raise ValueError("Stored and computed checksum do not match")
    out = np.empty(arr.chunks, dtype=arr.dtype)
    decoder.decode(body, out=out)
    return out


__all__ = ["direct_decoder", "read_whole_chunk"]
