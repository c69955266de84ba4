"""llvmlite JIT for the host CPU: object code (runtime/object_code.py makes it from LLVM IR text)
linked in memory (MCJIT).

`JitModule.link` runs object codes (an engine over an empty module, the objects added, each resolving the others' symbols);
`JitModule.compile` does both for one module and hands its object code to
`tracer.runtime.cache.ObjectCache`; `JitModule.load` runs object code from the disk cache. BLAS
is not linked: JIT code calls `tracer_sgemm`/`tracer_dgemm`, registered by name with
`llvmlite.binding.add_symbol` to the gemm of the OpenBLAS that numpy ships (no raw address ever
appears in the IR or in cached objects).
"""
from __future__ import annotations

import ctypes
import functools
import glob
import logging
import os
import threading
from pathlib import Path
from typing import Sequence

import llvmlite.binding as llvm
import numpy as np

from tracer.runtime import callbacks, collectives
from tracer.runtime.cache import ObjectCache
from tracer.runtime.object_code import compile_object, initialize, new_target_machine

# Counters the tests read: how many programs (or modules: the thread pool) were compiled to machine
# code in this process and how many were loaded from the disk cache instead; and of the kernels
# those compiled programs are made of, how many were compiled, and how many found compiled (in
# this process or on disk) for another program or an earlier signature.
STATISTICS = {"compiled": 0, "disk_hits": 0, "kernels_compiled": 0, "kernel_hits": 0}
_lock = threading.Lock()
LOG = logging.getLogger("tracer.cache")


def count(statistic: str) -> None:
    with _lock:
        STATISTICS[statistic] += 1


# BLAS -------------------------------------------------------------------------------------------

_GEMM_NAMES = {  # our symbol -> candidate exported names (64-bit integer interfaces first)
    "tracer_sgemm": ("scipy_cblas_sgemm64_", "cblas_sgemm64_"),
    "tracer_dgemm": ("scipy_cblas_dgemm64_", "cblas_dgemm64_"),
}


def _blas_libraries() -> list[str]:
    directory = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    return sorted(glob.glob(os.path.join(directory, "*openblas*.so*")))


@functools.cache
def blas_available() -> bool:
    """Find numpy's OpenBLAS and register its 64-bit-int gemm under our names; False if absent
    (codegen then emits loop nests). TRACER_DISABLE_BLAS=1 forces the fallback."""
    if os.environ.get("TRACER_DISABLE_BLAS") == "1":
        return False
    initialize()
    for path in _blas_libraries():
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        addresses = {}
        for symbol, candidates in _GEMM_NAMES.items():
            for candidate in candidates:
                function = getattr(library, candidate, None)
                if function is not None:
                    addresses[symbol] = ctypes.cast(function, ctypes.c_void_p).value
                    break
        if len(addresses) == len(_GEMM_NAMES):
            _blas_library.append(library)  # keep it loaded
            for symbol, address in addresses.items():
                llvm.add_symbol(symbol, address)
            return True
    return False


_blas_library: list = []


def blas_library() -> ctypes.CDLL | None:
    """The OpenBLAS library whose gemm compiled code calls, or None."""
    return _blas_library[0] if blas_available() and _blas_library else None


class JitModule:
    """Object code linked into memory, and the engine that owns it. The native code lives exactly
    as long as this object: nothing else refers to the engine, so releasing the last
    CompiledFunction that holds a JitModule disposes the engine and unmaps the code."""

    def __init__(self, engine: llvm.ExecutionEngine):
        self.engine = engine

    @classmethod
    def link(cls, objects: Sequence[bytes]) -> JitModule:
        """Link `objects` into a new engine (an empty module's): each resolves the others'
        exported symbols and those registered with `llvm.add_symbol`."""
        initialize()
        if any(collectives.needed_by(object_code) for object_code in objects):
            collectives.register()  # MPI_Allreduce and its handles, which the objects call
        if any(callbacks.needed_by(object_code) for object_code in objects):
            callbacks.register()  # the dispatcher of host callbacks
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine())
        for object_code in objects:
            engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
        engine.finalize_object()
        return cls(engine)

    @classmethod
    def compile(cls, text: str, cache: ObjectCache | None) -> JitModule:
        """Compile the module `text`; its object code goes into `cache`."""
        object_code = compile_object(text)
        count("compiled")
        if cache is not None:
            cache.store(object_code)
            LOG.debug("disk cache miss: compiled to machine code, stored as %s", cache.path)
        else:
            LOG.debug("disk cache off: compiled to machine code")
        return cls.link([object_code])

    @classmethod
    def load(cls, object_code: bytes, path: Path | None = None) -> JitModule:
        """Link `object_code` (authenticated by the disk cache) into a new engine."""
        module = cls.link([object_code])
        count("disk_hits")
        LOG.debug("disk cache hit: %s", path)
        return module

    def address(self, name: str) -> int:
        address = self.engine.get_function_address(name)
        if not address:
            raise RuntimeError(f"JIT module has no function {name}")
        return address

    def global_address(self, name: str) -> int:
        address = self.engine.get_global_value_address(name)
        if not address:
            raise RuntimeError(f"JIT module has no global {name}")
        return address
