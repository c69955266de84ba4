"""What shapes the generated code besides the program: the settings read when a signature
compiles (the thread count, BLAS, profiling, bounds checks, numpy's array layout), each part of
the in-memory and disk cache keys."""
from __future__ import annotations

import ctypes
import functools
import os
from typing import NamedTuple

import numpy as np

from tracer.runtime import native, pool
from tracer.runtime.settings import count_setting


def profile_setting() -> bool:
    """TRACER_PROFILE=1: time every kernel. Read at compile time, like the thread count: the
    timing calls are part of the generated code (and so of its cache keys)."""
    return os.environ.get("TRACER_PROFILE", "") not in ("", "0")


def thread_setting() -> int:
    """TRACER_NUM_THREADS, or the number of cores this process may run on. Read at compile time:
    the thread count is part of the generated code (and so of its cache key). 1 where the thread
    pool is not supported."""
    if not pool.SUPPORTED:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return count_setting("TRACER_NUM_THREADS", cores)


def bounds_setting() -> bool:
    """TRACER_CHECK_BOUNDS=1: generate bounds-checked code. Read at compile time, like the thread
    count, and part of both cache keys."""
    return os.environ.get("TRACER_CHECK_BOUNDS") == "1"


class CodeSettings(NamedTuple):
    """What shapes the generated code besides the program, read when a signature compiles (so
    part of both cache keys)."""
    threads: int
    blas: bool
    profile: bool
    checked: bool
    layout: tuple[int, int] | None

    @classmethod
    def current(cls) -> CodeSettings:
        return cls(thread_setting(), native.blas_available(), profile_setting(), bounds_setting(),
                   array_layout())


@functools.cache
def array_layout() -> tuple[int, int] | None:
    """Byte offsets of `data` and `flags` in numpy's PyArrayObject (its public struct: PyObject_HEAD,
    then data, nd, dimensions, strides, base, descr, flags), verified on sample arrays; None (the
    fast entry is not built) if anything does not match."""
    data = object.__basicsize__
    flags = data + 6 * ctypes.sizeof(ctypes.c_void_p)
    try:
        base = np.arange(24.0).reshape(4, 6)
        samples = [base, base.T, base[1:, ::2], np.zeros(3, np.float32),
                   np.lib.stride_tricks.as_strided(base, writeable=False)]
        for array in samples:
            if ctypes.c_void_p.from_address(id(array) + data).value != array.ctypes.data:
                return None
            bits = ctypes.c_int.from_address(id(array) + flags).value
            if (bool(bits & 0x1) != array.flags.c_contiguous
                    or bool(bits & 0x400) != array.flags.writeable):
                return None
    except (ValueError, OverflowError):
        return None
    return data, flags
