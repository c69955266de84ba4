"""What shapes the generated code besides the program: the settings read when a signature
compiles (the thread count, BLAS, profiling, bounds checks, numpy's array layout), each part of
the in-memory and disk cache keys."""
from __future__ import annotations

import ctypes
import functools
import os
from typing import NamedTuple

import numpy as np

from tracer.runtime import native, own_gemm, pool
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
    own_gemm: bool  # large float32 products call the project's own gemm (runtime/own_gemm.py)
    profile: bool
    checked: bool
    layout: ObjectLayout | None

    @classmethod
    def current(cls) -> CodeSettings:
        return cls(thread_setting(), native.blas_available(), own_gemm.host_parameters() is not None,
                   profile_setting(), bounds_setting(), array_layout())


class ObjectLayout(NamedTuple):
    """Byte offsets in CPython's and numpy's public object structs, which the fast entry reads
    (codegen.module.fast_entry): an object's type; an ndarray's data pointer,
    rank, dimensions, dtype and flags; a list's size and items pointer, a tuple's first item."""
    type: int
    data: int
    rank: int
    dimensions: int
    dtype: int
    flags: int
    size: int
    list_items: int
    tuple_items: int


@functools.cache
def array_layout() -> ObjectLayout | None:
    """The offsets of ObjectLayout (PyObject_HEAD; numpy's PyArrayObject: the head, then data, nd,
    dimensions, strides, base, descr, flags; PyVarObject's size after the head; a list's items
    pointer after that, a tuple's items in place), verified on sample objects; None (the fast
    entry is not built) if anything does not match."""
    pointer = ctypes.sizeof(ctypes.c_void_p)
    data = object.__basicsize__
    layout = ObjectLayout(type=pointer, data=data, rank=data + pointer,
                          dimensions=data + 2 * pointer, dtype=data + 5 * pointer,
                          flags=data + 6 * pointer, size=data, list_items=data + pointer,
                          tuple_items=tuple.__basicsize__)

    def read(kind, address: int, offset: int):
        return kind.from_address(address + offset).value

    try:
        base = np.arange(24.0).reshape(4, 6)
        samples = [base, base.T, base[1:, ::2], np.zeros(3, np.float32), np.zeros((), np.int64),
                   np.lib.stride_tricks.as_strided(base, writeable=False)]
        for array in samples:
            address = id(array)
            bits = read(ctypes.c_int, address, layout.flags)
            dimensions = read(ctypes.c_void_p, address, layout.dimensions) or 0
            if (read(ctypes.c_void_p, address, layout.data) != array.ctypes.data
                    or read(ctypes.c_void_p, address, layout.type) != id(np.ndarray)
                    or read(ctypes.c_void_p, address, layout.dtype) != id(array.dtype)
                    or read(ctypes.c_int, address, layout.rank) != array.ndim
                    or [read(ctypes.c_ssize_t, dimensions, pointer * k)
                        for k in range(array.ndim)] != list(array.shape)
                    or bool(bits & 0x1) != array.flags.c_contiguous
                    or bool(bits & 0x400) != array.flags.writeable):
                return None
        items = [base, samples[3], "third"]
        known = tuple(items)
        listed = read(ctypes.c_void_p, id(items), layout.list_items)
        if (read(ctypes.c_ssize_t, id(items), layout.size) != len(items)
                or [read(ctypes.c_void_p, listed, pointer * k) for k in range(3)]
                != [id(item) for item in items]
                or [read(ctypes.c_void_p, id(known), layout.tuple_items + pointer * k)
                    for k in range(3)] != [id(item) for item in items]):
            return None
    except (ValueError, OverflowError):
        return None
    return layout
