"""Ingest throughput: a ~1 GB float32 .npy into a feature store, against a plain ``np.save``.

    .venv/bin/python bench/bench_ingest.py [--gb 1.0] [--dim 1024] [--data relu|normal] [--dir DIR]

Writes the source .npy in a temporary folder (deleted afterwards), then measures, in the same run:
``np.save`` of the same array (the reference write), and ``ingest`` at zstd levels 1 and 3 with one
and two chunks per batch. MB/s is source bytes (MB = 1e6 bytes) over wall time. The default data are
ReLU-like (about 65% zeros, like CNN fc7 features); ``--data normal`` is dense and barely compressible.
Also prints the single-thread speed of the per-chunk steps (zstd, sha256) that bound a serial write.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def _make_source(path: Path, rows: int, dim: int, data: str) -> None:
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
    rng = np.random.default_rng(0)
    bias = rng.uniform(0.1, 0.9, size=dim).astype(np.float32)
    for s in range(0, rows, 16384):
        block = rng.standard_normal((min(16384, rows - s), dim), dtype=np.float32)
        if data == "relu":
            block -= bias
            np.maximum(block, 0.0, out=block)
        mm[s:s + len(block)] = block
    mm.flush()
    del mm


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0, help="source size in GB (1e9 bytes)")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--chunk-rows", type=int, default=8192)
    ap.add_argument("--data", choices=("relu", "normal"), default="relu")
    ap.add_argument("--dir", default=None, help="where to write (default: the system temp folder)")
    args = ap.parse_args()

    from numcodecs import Zstd

    from pipeline.ingest import ingest

    rows = int(args.gb * 1e9) // (4 * args.dim)
    work = Path(tempfile.mkdtemp(prefix="vbc-bench-ingest-", dir=args.dir))
    try:
        src = work / "source.npy"
        t = time.perf_counter()
        _make_source(src, rows, args.dim, args.data)
        nbytes = rows * args.dim * 4
        mb = nbytes / 1e6
        print(f"source: {rows:,} x {args.dim} float32 ({args.data}), {mb:,.0f} MB, made in "
              f"{time.perf_counter() - t:.1f} s; chunks of {args.chunk_rows} rows "
              f"({args.chunk_rows * args.dim * 4 / 1e6:.0f} MB)")

        X = np.load(src, mmap_mode="r")
        np.asarray(X[:]).sum()  # warm the page cache: every run below reads from memory
        t = time.perf_counter()
        np.save(work / "copy.npy", X)
        save_s = time.perf_counter() - t
        (work / "copy.npy").unlink()
        print(f"np.save of the same array: {save_s:.2f} s, {mb / save_s:,.0f} MB/s")

        chunk = np.array(X[: args.chunk_rows])
        for level in (1, 3):
            z = Zstd(level=level)
            t = time.perf_counter()
            enc = z.encode(chunk)
            dt = time.perf_counter() - t
            print(f"  one chunk, zstd {level}: {chunk.nbytes / 1e6 / dt:,.0f} MB/s, ratio "
                  f"{len(enc) / chunk.nbytes:.2f} (single thread)")
        t = time.perf_counter()
        hashlib.sha256(chunk.tobytes()).hexdigest()
        print(f"  one chunk, sha256 fingerprint: {chunk.nbytes / 1e6 / (time.perf_counter() - t):,.0f} MB/s")

        head = ("zstd", "chunks/batch", "seconds", "MB/s", "vs np.save", "store MB")
        print(" ".join(f"{h:>{w}}" for h, w in zip(head, (4, 12, 8, 7, 10, 9), strict=True)))
        for level in (1, 3):
            for batch_chunks in (1, 2):
                out = work / f"store-{level}-{batch_chunks}"
                rep = ingest(str(src), out, chunk_rows=args.chunk_rows, compression_level=level,
                             batch_chunks=batch_chunks)
                assert rep.rows_written == rows
                rate = mb / rep.elapsed_s
                print(f"{level:>4} {batch_chunks:>12} {rep.elapsed_s:>8.2f} {rate:>7,.0f} "
                      f"{rate / (mb / save_s):>9.2f}x {_du(out) / 1e6:>9,.0f}")
                shutil.rmtree(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
