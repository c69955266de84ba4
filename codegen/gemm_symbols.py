"""Which BLAS-interface gemm a product calls, by name (the runtime registers each name to a
function: runtime/native.py, runtime/own_gemm.py), and their declarations."""
from __future__ import annotations

from tracer.codegen.lowering import LLVM_TYPE
from tracer.ir.loops import Gemm
from tracer.ir.types import float32, float64

GEMM_SYMBOLS = {float32: "tracer_sgemm", float64: "tracer_dgemm"}
# A large float32 product calls tracer_large_sgemm instead: the project's own gemm where the
# runtime has one for this CPU (runtime/own_gemm.py), else OpenBLAS's too. Large: at least
# LARGE_SGEMM_WORK multiply-adds, and columns that fill the own gemm's tiles of LARGE_SGEMM_TILE
# columns but for at most 1/8 of the tiles' columns. Measured against OpenBLAS on one Sapphire
# Rapids thread (benchmarks/own_gemm.py): 0.89-0.91 of its time at 512x128x128 and 512x64x256
# (11% padding), 0.96 at 256^3, but 1.08-1.6 at 2^19-2^21 multiply-adds (a GPT's attention,
# 128x32x128), 1.1 at 512x256x64 (64 columns: 33% padding). The whole product decides: the
# blocks threads split it into all call the same gemm (each gemm's sums run in an order of its
# own).
LARGE_SGEMM = "tracer_large_sgemm"
LARGE_SGEMM_WORK = 1 << 22
LARGE_SGEMM_TILE = 48


def gemm_symbol(gemm: Gemm) -> str | None:
    """The BLAS-interface gemm a product calls (see LARGE_SGEMM), None for an integer one."""
    padding = -gemm.n % LARGE_SGEMM_TILE
    if (gemm.dtype == float32 and gemm.m * gemm.n * gemm.k >= LARGE_SGEMM_WORK
            and 8 * padding <= gemm.n + padding):
        return LARGE_SGEMM
    return GEMM_SYMBOLS.get(gemm.dtype)


def gemm_declarations() -> list[str]:
    """The declaration of every gemm a product may call."""
    return [f"declare void @{symbol}(i32, i32, i32, i64, i64, i64, {LLVM_TYPE[dtype]}, ptr, i64, "
            f"ptr, i64, {LLVM_TYPE[dtype]}, ptr, i64) nounwind"
            for dtype, symbol in [*GEMM_SYMBOLS.items(), (float32, LARGE_SGEMM)]]
