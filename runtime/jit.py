"""The compile side of the runtime: runtime/object_code.py makes object code from LLVM IR text
(loaded alone by the compile worker, it knows nothing of the tracer package), runtime/native.py
links it into memory without llvmlite. The names of both that the compiling modules use are
re-exported here -- the counters, the host, BLAS, JitModule -- with `llvm_host`, the host as
LLVM sees it (which native.host remembers in the disk cache).
"""
from __future__ import annotations

from tracer.runtime import object_code
from tracer.runtime.native import (LOG, STATISTICS, Host, JitModule,  # noqa: F401 (re-exported)
                                   blas_available, blas_library, count, host)
from tracer.runtime.object_code import (assembly, compile_object,  # noqa: F401 (re-exported)
                                        initialize, optimized_ir)


def llvm_host() -> Host:
    """The host as LLVM sees it, asked (runtime/native.host remembers it)."""
    return Host(*object_code.llvm_host())
