"""CRC-32 throughput of `ckpt`'s record check by thread count, on a file of the given size.

Usage: python bench/ckpt/crc_speed.py [GIB] [--reps N]  (prints one line per thread count: GB/s, median of N)
The record check reads every copied byte once; on a many-core host it runs on up to 8 threads
(`zeropilot.checkpoint.torchzip.file_crc32`).
"""

import argparse
import os
import statistics
import tempfile
import time

from zeropilot.checkpoint.torchzip import file_crc32


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gib", nargs="?", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    size = int(args.gib * (1 << 30)) // (8 << 20) * (8 << 20)
    block = os.urandom(8 << 20)
    with tempfile.NamedTemporaryFile(dir=os.environ.get("TMPDIR", "/tmp")) as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.flush()
        fd = f.fileno()
        file_crc32(fd, 0, size)  # warm the page cache
        for workers in sorted({1, 2, 4, 8, os.cpu_count() or 1}):
            times = []
            for _ in range(args.reps):
                t = time.perf_counter()
                file_crc32(fd, 0, size, workers=workers)
                times.append(time.perf_counter() - t)
            print(f"threads {workers:>2}: {size / statistics.median(times) / 1e9:.2f} GB/s (median of {args.reps})")


if __name__ == "__main__":
    main()
