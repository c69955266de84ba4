"""How the entry runs a kernel (ir/schedule.py): the range it passes, how many threads split that
range and into how many chunks, from a rough count of the kernel's work."""
from __future__ import annotations

import math

import numpy as np

from tracer.ir.fusion import Kernel, matmul_operand
from tracer.ir.loops import LoopKernel
from tracer.ir.types import float32

# A kernel runs on several threads when it does at least this many element operations per thread:
# about 40 us of work at GELU's rate (~0.15 ns an operation), against a launch on the thread pool of
# ~0.6 us (runtime/pool.py; python -m benchmarks.launch_cost), under 2% of the chunk.
PARALLEL_WORK_PER_THREAD = 1 << 18
# Chunks per thread of a split kernel. The threads take chunks from one counter, so when the
# machine deschedules one of them (another process wants the core) the others take its share
# and the launch waits only for the chunk it holds: with one chunk per thread, for half the
# kernel. Measured on the GPT step with another process busy: (runtime/pool.py)
CHUNKS_PER_THREAD = 4
# A gemm is split into blocks of rows of its product, each a gemm of its own (a batch of products
# is shared out whole when it has enough of them). Each block packs the other operand again: where
# that operand is large, one block per thread (with 4 per thread, as loop kernels have, a
# 2048x192x768 product ran at 112 GF/s on two threads, with one per thread at 132 GF/s, numpy's
# threaded OpenBLAS at 134 GF/s; AMD EPYC, idle); where it is small (up to REPACKED_BYTES),
# CHUNKS_PER_THREAD per thread, so that the caller takes the blocks of a worker that wakes late
# (a small GPT's 512x64x256 products: its step took 10.9 ms so, 12.5-13.8 ms with one block per
# thread). OpenBLAS's float32 kernels run down the rows 48 at a time (16, 24 or 48 wide on AVX2
# and AVX-512 machines), so blocks of 48k rows compute every element as one call over all rows
# does, to the bit (measured: blocks of 16, 32 or 64 rows round differently, and so does a split
# of the columns): the results are the same whatever the number of threads. (The project's own
# gemm, which large float32 products call on some CPUs, gives one call's bits for any blocks.)
REPACKED_BYTES = 256 * 1024
GEMM_BLOCK_ROWS = 48
MOST_ROWS_ON_ONE = 0.8
# A single product of few rows (under COLUMN_SPLIT_ROWS: 48-row blocks would leave one thread 3/4
# of a 64- or 128-row product) and much work (COLUMN_SPLIT_WORK multiply-adds, 0.15-0.3 ms at
# 60-125 GF/s) is cut into blocks of columns instead -- a convolution's products, 64 channels by
# 100,352 pixels, ran at 85 GF/s as 48 + 16 rows on two threads. OpenBLAS's rounding of a column
# depends on where its block of columns starts (it tiles the columns from there), so these blocks
# are cut from the shape alone, COLUMN_BLOCKS of them whatever the number of threads: one thread
# computes the blocks two threads compute, to the bit.
COLUMN_SPLIT_ROWS = 4 * GEMM_BLOCK_ROWS
COLUMN_SPLIT_WORK = 1 << 24
COLUMN_BLOCKS = 8
# A large float32 product calls the "large" gemm (codegen/gemm_symbols.py): the project's own
# where the host has one (runtime/own_gemm.py), else OpenBLAS's too. Large: at least
# LARGE_SGEMM_WORK multiply-adds, and columns that fill the own gemm's vectors of
# LARGE_SGEMM_VECTOR floats but for at most 1/8 of them (each panel of 48 columns at C's right
# edge runs the narrowest micro-kernel covering it). Measured against OpenBLAS on one Sapphire
# Rapids thread (benchmarks/own_gemm.py): 0.89-0.91 of its time at 512x128x128 and 512x64x256,
# 0.96 at 256^3, but 1.08-1.6 at 2^19-2^21 multiply-adds (a GPT's attention, 128x32x128).
LARGE_SGEMM_WORK = 1 << 22
LARGE_SGEMM_VECTOR = 16
# The own gemm gives every element the bits of one call whatever blocks a product is cut into, so
# its blocks need not be 48 rows (OpenBLAS's, above): a product whose A it reads in place (not
# transposed) is cut into blocks of whole panels of OWN_GEMM_PANEL columns, each packing only its
# own columns of B (blocks of rows would each pack all of B: the seed step's 64x1000x100 product
# as 48 + 16 rows packed its 400 KB twice and kept one thread for 3/4 of it).
OWN_GEMM_PANEL = 48


def calls_large_sgemm(dtype: np.dtype, m: int, n: int, k: int) -> bool:
    """Whether a product of these sizes calls the large float32 gemm (see LARGE_SGEMM_WORK)."""
    padding = -n % LARGE_SGEMM_VECTOR
    return (dtype == float32 and m * n * k >= LARGE_SGEMM_WORK
            and 8 * padding <= n + padding)


def gemm_blocks(kernel: Kernel, threads: int, own_gemm: bool = False) -> tuple[int, int, int]:
    """(blocks, rows, columns): each of the batch's m x n products of a matmul kernel is cut into
    `blocks` blocks of `rows` rows or `columns` columns (the last one fewer; one of the two is
    the whole product's), so that a product with enough work for threads has a block per thread
    (or a few, see REPACKED_BYTES) even in a small batch: 64 rows as 48 + 16 on two threads, a
    large product of few rows in COLUMN_BLOCKS blocks of columns. Not where the largest block of
    rows would keep over MOST_ROWS_ON_ONE of the rows: 50 rows as 48 + 2 would pack the other
    operand twice to save 4% of the time."""
    (result,) = kernel.results
    m, n = result.shape[-2:]
    matmul = kernel.instructions[-1] if kernel.update is None else kernel.update.matmul
    k = matmul.inputs[1].shape[-2]
    single = math.prod(result.shape[:-2]) == 1  # (a batch shares its products out whole)
    if (own_gemm and single and threads > 1 and calls_large_sgemm(result.dtype, m, n, k)
            and not matmul_operand(matmul.inputs[0])[1]
            and kernel_work(kernel) >= 2 * PARALLEL_WORK_PER_THREAD):
        panels = -(-n // OWN_GEMM_PANEL)
        if panels > 1:  # about two blocks per thread, of whole panels
            columns = OWN_GEMM_PANEL * max(1, panels // (2 * threads))
            return -(-n // columns), m, columns
    if single and m < COLUMN_SPLIT_ROWS and m * n * k >= COLUMN_SPLIT_WORK:
        columns = _block_length(n, COLUMN_BLOCKS)
        return -(-n // columns), m, columns
    if threads <= 1 or kernel_work(kernel) < 2 * PARALLEL_WORK_PER_THREAD:
        return 1, m, n
    per_thread = 1 if k * n * result.dtype.itemsize > REPACKED_BYTES else CHUNKS_PER_THREAD
    rows = _block_length(m, -(-threads * per_thread // max(math.prod(result.shape[:-2]), 1)))
    blocks = -(-m // rows)
    return (blocks, rows, n) if blocks > 1 and rows <= MOST_ROWS_ON_ONE * m else (1, m, n)


def _block_length(extent: int, wanted: int) -> int:
    """The length of `wanted` blocks cutting `extent` rows or columns, rounded up to
    GEMM_BLOCK_ROWS (OpenBLAS's float32 kernels run down the rows 48 at a time), at most the
    extent, and never leaving a last block of one: OpenBLAS computes a product of one row or
    column as a gemv, which rounds otherwise. (An extent of 1 is one block of 1: the loop once
    looked for a length that leaves no remainder of 1 forever, and a 1-row product on two
    threads never compiled.)"""
    per_block = -(-extent // wanted)
    length = min(-(-per_block // GEMM_BLOCK_ROWS) * GEMM_BLOCK_ROWS, extent)
    while length < extent and extent % length == 1:
        length += GEMM_BLOCK_ROWS
    return min(length, extent)


def split_extent(kernel: Kernel, flat: bool) -> int:
    """The range the entry passes a kernel: its outermost loop's, a matmul's batch count (times
    the blocks of each product, ir/schedule.py), a row kernel's chunks (a combine, all_reduce or
    host_callback kernel's is not used)."""
    if kernel.kind == "matmul":
        return math.prod(kernel.results[0].shape[:-2])
    if kernel.kind in ("rows", "combine"):
        return kernel.chunks if kernel.kind == "rows" else 1
    if kernel.kind in ("all_reduce", "host_callback"):
        return 1  # one call of the MPI library, or of Python code
    shape = (kernel.results[0].type.size,) if flat else kernel.shape
    return next((size for size in shape if size != 1), 1)


def kernel_work(kernel: Kernel) -> int:
    """A rough count of a kernel's element operations: its results' elements times its
    instructions; a product's multiply-adds; for a row kernel, each part's largest value's
    elements times its instructions."""
    if kernel.kind == "matmul":
        (result,) = kernel.results
        inner = kernel.instructions[-1] if kernel.update is None else kernel.update.matmul
        return result.type.size * inner.inputs[0].shape[-1]
    if kernel.kind != "rows":
        return max(kernel.results[0].type.size, 1) * max(1, len(kernel.instructions))
    return sum(max((v.type.size for i in part.instructions for v in (*i.inputs, *i.outputs)),
                   default=1) * max(1, len(part.instructions)) for part in kernel.parts)


def thread_count(kernel: LoopKernel, work: int, threads: int) -> int:
    """How many threads a kernel runs on: 1 unless it is splittable and does enough work (a
    rough count of element operations)."""
    if not kernel.splittable or threads <= 1:
        return 1
    return max(1, min(threads, kernel.extent, work // PARALLEL_WORK_PER_THREAD))


def chunk_count(kernel: LoopKernel, work: int) -> int:
    """How many chunks the range of a kernel on kernel.threads threads is cut into: up to
    CHUNKS_PER_THREAD per thread, each of at least half a thread's minimum of work."""
    if kernel.threads <= 1:
        return 1
    return max(kernel.threads, min(kernel.threads * CHUNKS_PER_THREAD, kernel.extent,
                                   2 * work // PARALLEL_WORK_PER_THREAD))
