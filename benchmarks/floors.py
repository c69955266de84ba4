"""The machine's own floors, timed in the same rounds as the workloads: streaming memory (numpy on
one thread, torch on all threads) moving a given number of bytes, and BLAS sgemm (numpy's
OpenBLAS) at given shapes."""
from __future__ import annotations

from typing import Callable

import numpy as np

from benchmarks.peers import installed

STREAM_ONE_THREAD = "stream, 1 thread"
STREAM_ALL_THREADS = "stream, all threads"
SGEMM = "BLAS sgemm"


def streaming(bytes_moved: int) -> dict[str, Callable[[], object]]:
    """c = a + b over float32 arrays sized so that the bytes read and written equal `bytes_moved`
    (what a fused kernel of the workload must read and write at least)."""
    count = max(1, bytes_moved // 12)
    rng = np.random.default_rng(0)
    a, b = rng.random(count, np.float32), rng.random(count, np.float32)
    c = np.empty_like(a)
    floors = {STREAM_ONE_THREAD: lambda: np.add(a, b, out=c)}
    torch = installed("torch")
    if torch is not None:
        a_, b_, c_ = (torch.from_numpy(array) for array in (a, b, c))
        floors[STREAM_ALL_THREADS] = lambda: torch.add(a_, b_, out=c_)
    return floors


def sgemm(shapes: list[tuple[int, int, int]]) -> dict[str, Callable[[], object]]:
    """One float32 (m, k) @ (k, n) product per shape, in a row."""
    rng = np.random.default_rng(0)
    operands = [(rng.random((m, k), np.float32), rng.random((k, n), np.float32),
                 np.empty((m, n), np.float32)) for m, k, n in shapes]

    def products():
        for a, b, c in operands:
            np.matmul(a, b, out=c)
    return {SGEMM: products}
