"""The machine's own floors, timed in the same rounds as the workloads: streaming memory (numpy,
on one thread and split across all threads) moving a given number of bytes, and BLAS sgemm
(numpy's OpenBLAS) at given shapes."""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from benchmarks.peers import THREADS

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
    bounds = np.linspace(0, count, THREADS + 1).astype(int)
    chunks = [slice(low, high) for low, high in zip(bounds[:-1], bounds[1:])]

    def add(chunk: slice):
        np.add(a[chunk], b[chunk], out=c[chunk])  # numpy releases the GIL

    return {STREAM_ONE_THREAD: lambda: add(slice(None)),
            STREAM_ALL_THREADS: lambda: list(thread_pool().map(add, chunks))}


@functools.cache
def thread_pool() -> ThreadPoolExecutor:
    """The threads of the all-threads floor, started once. (Not torch.add on all threads: on the
    loaded 2-core development machine it took 10x as long as one numpy thread.)"""
    return ThreadPoolExecutor(THREADS)


def sgemm(shapes: list[tuple[int, ...]]) -> dict[str, Callable[[], object]]:
    """One float32 (m, k) @ (k, n) product per shape (m, k, n), or a batch of them per shape
    (batch, m, k, n), in a row. (Not `np.matmul(a, b, out=c)`: numpy 2.4 took 6x longer with
    `out` at 64x1000x100.)"""
    rng = np.random.default_rng(0)
    operands = [(rng.random((*batch, m, k), np.float32), rng.random((*batch, k, n), np.float32))
                for *batch, m, k, n in shapes]

    def products():
        for a, b in operands:
            a @ b
    return {SGEMM: products}
