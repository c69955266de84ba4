"""How the entry runs a kernel (ir/schedule.py): the range it passes, and how many threads split
that range, from a rough count of the kernel's work."""
from __future__ import annotations

import math

from tracer.ir.fusion import Kernel
from tracer.ir.loops import LoopKernel

# A kernel runs on several threads when it does at least this many element operations per thread:
# about 40 us of work at GELU's rate (~0.15 ns an operation), against a launch on the thread pool of
# ~0.6 us (runtime/pool.py; python -m benchmarks.launch_cost), under 2% of the chunk.
PARALLEL_WORK_PER_THREAD = 1 << 18


def split_extent(kernel: Kernel, flat: bool) -> int:
    """The range the entry passes a kernel: its outermost loop's, a matmul's batch count, a row
    kernel's chunks (a combine or all_reduce kernel's is not used)."""
    if kernel.kind == "matmul":
        return math.prod(kernel.results[0].shape[:-2])
    if kernel.kind in ("rows", "combine"):
        return kernel.chunks if kernel.kind == "rows" else 1
    if kernel.kind == "all_reduce":
        return 1  # one call of the MPI library
    shape = (kernel.results[0].type.size,) if flat else kernel.shape
    return next((size for size in shape if size != 1), 1)


def kernel_work(kernel: Kernel) -> int:
    """A rough count of a kernel's element operations: its results' elements times its
    instructions; for a row kernel, each part's largest value's elements times its
    instructions."""
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
