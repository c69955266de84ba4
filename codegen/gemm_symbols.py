"""Which BLAS-interface gemm a product calls, by name (the runtime registers each name to a
function: runtime/native.py, runtime/own_gemm.py), and their declarations."""
from __future__ import annotations

from tracer.codegen.lowering import LLVM_TYPE
from tracer.ir.loops import Gemm
from tracer.ir.schedule_threads import calls_large_sgemm
from tracer.ir.types import float32, float64

GEMM_SYMBOLS = {float32: "tracer_sgemm", float64: "tracer_dgemm"}
LARGE_SGEMM = "tracer_large_sgemm"  # (which products: ir.schedule_threads.calls_large_sgemm)


def gemm_symbol(gemm: Gemm) -> str | None:
    """The BLAS-interface gemm a product calls, None for an integer one."""
    if calls_large_sgemm(gemm.dtype, gemm.m, gemm.n, gemm.k):
        return LARGE_SGEMM
    return GEMM_SYMBOLS.get(gemm.dtype)


def gemm_declarations() -> list[str]:
    """The declaration of every gemm a product may call."""
    return [f"declare void @{symbol}(i32, i32, i32, i64, i64, i64, {LLVM_TYPE[dtype]}, ptr, i64, "
            f"ptr, i64, {LLVM_TYPE[dtype]}, ptr, i64) nounwind"
            for dtype, symbol in [*GEMM_SYMBOLS.items(), (float32, LARGE_SGEMM)]]
