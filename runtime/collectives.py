"""The MPI library under compiled collectives. A compiled `all_reduce` calls `tracer_mpi_allreduce`
with handles read from the table `tracer_mpi_handles` (codegen/render_kernel.py); both are registered
here, by name (runtime/loader.py), from the libmpi that mpi4py loaded into this process, so neither a
library path nor a handle value is in the IR or in cached object code."""
from __future__ import annotations

import ctypes
import functools
import os
import sys

from tracer.codegen.symbols import ALL_REDUCE_SYMBOL, MPI_HANDLES, MPI_HANDLES_SYMBOL
from tracer.runtime import loader

_keep: list = []  # the library and the handle table live as long as the process


def needed_by(code: str | bytes) -> bool:
    """Whether LLVM IR text or object code calls the MPI library."""
    return (ALL_REDUCE_SYMBOL if isinstance(code, str) else ALL_REDUCE_SYMBOL.encode()) in code


def _loaded_libmpi() -> str:
    """The path of the libmpi shared library mapped into this process (by mpi4py)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libmpi" in line}
    found = sorted(p for p in paths if os.path.basename(p).startswith(("libmpi.so", "libmpi_")))
    if not found:
        raise RuntimeError("compiled code calls MPI, but no libmpi is loaded in this process")
    return found[0]


@functools.cache
def register() -> None:
    """Register MPI_Allreduce and the handle table (once per process)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized():
        raise RuntimeError("compiled code calls MPI before tracer.distributed.init_process_group()")
    library = ctypes.CDLL(_loaded_libmpi())
    handles = {"comm_world": mpi.COMM_WORLD, "float32": mpi.FLOAT, "float64": mpi.DOUBLE,
               "int64": mpi.INT64_T, "sum": mpi.SUM, "max": mpi.MAX, "min": mpi.MIN}
    table = (ctypes.c_uint64 * len(MPI_HANDLES))(*(handles[name].handle for name in MPI_HANDLES))
    _keep.extend([library, table])
    loader.add_symbol(ALL_REDUCE_SYMBOL, ctypes.cast(library.MPI_Allreduce, ctypes.c_void_p).value)
    loader.add_symbol(MPI_HANDLES_SYMBOL, ctypes.addressof(table))
