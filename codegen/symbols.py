"""The names by which compiled code calls into the runtime, registered with `add_symbol`
(runtime/loader.py)
(so no address is in the IR or in cached object code). The runtime imports them from here, not
from the renderer, whose import (the loop IR, the templates' lowering) a disk-cache hit does not
need."""

# An all_reduce calls MPI_Allreduce, which the runtime registers as ALL_REDUCE_SYMBOL, with the
# MPI library's handles read at run time from the table it registers as MPI_HANDLES_SYMBOL (so
# object code holds no handle values): the handles of MPI_HANDLES' names, in order, each widened
# to 64 bits (an int handle, as MPICH's, or a pointer, as Open MPI's, passed the same way on x86-64).
ALL_REDUCE_SYMBOL, MPI_HANDLES_SYMBOL = "tracer_mpi_allreduce", "tracer_mpi_handles"
MPI_HANDLES = ("comm_world", "float32", "float64", "int64", "sum", "max", "min")
# A host callback calls the dispatcher the runtime registers as HOST_CALLBACK_SYMBOL with the
# callback's number and an array of its buffers' pointers (operands, then results); a status other
# than 0 means the Python code raised (runtime/callbacks.py keeps the exception).
HOST_CALLBACK_SYMBOL = "tracer_host_callback"
# The first line of a kernel module whose work is all in the calls it makes (BLAS gemm, MPI, a
# host callback): runtime/kernels.py compiles it as the entry, without LLVM's optimizer and with
# its quick code generator (the GPT step's 18 gemm modules took 262 ms of LLVM at O3, 51 so).
LIBRARY_CALLS_MARK = "; tracer: the work is in the library calls"
# The first line of a kernel module whose work is a negligible part of its program's
# (codegen/module.py `quick_kernels`): runtime/kernels.py compiles it with LLVM's quick pipeline.
QUICK_MARK = "; tracer: a negligible part of the work"
