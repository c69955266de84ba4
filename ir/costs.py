"""What each primitive costs fusion when it is computed inline: one row per primitive.

`CODE_COST[primitive]` is the rough size, in LLVM instructions, of one element of the primitive
computed inside a loop (the transcendentals are the inline polynomial code of
codegen/templates/math.ll.j2; an inline reduction is a loop of its own). Fusion bounds the code of
an inline expression and of a kernel with it (ir/fusion.py); `TIME_COST` is what it costs in time,
by which a row kernel keeps a value for its row when recomputing it would cost more
(ir/rows.py). A primitive that costs more than one
instruction is EXPENSIVE: fusion stores it rather than recompute it at each element of a
broadcast. Primitives that never run inline (matmul, scatter, the collective, the gradient
markers that the optimizer removes, the host callbacks) cost 1: they are kernels, or nothing, of their own.
tests/test_ir_tables.py fails when a primitive has no row.
"""
from __future__ import annotations

from tracer.ir.primitives import PRIMITIVES

CODE_COST: dict[str, int] = {
    # elementwise, unary
    "neg": 1, "abs": 1, "sign": 1, "logical_not": 1, "sqrt": 2,
    "exp": 50, "log": 60, "tanh": 100, "sin": 150, "cos": 150,
    # elementwise, binary and the rest
    "add": 1, "sub": 1, "mul": 1, "div": 2, "fmod": 20, "pow": 150, "maximum": 1, "minimum": 1,
    "lt": 1, "le": 1, "gt": 1, "ge": 1, "eq": 1, "ne": 1, "logical_and": 1, "logical_or": 1,
    "select": 1, "cast": 1,
    # layout changes and sources: which element is read, not arithmetic
    "broadcast": 1, "reshape": 1, "transpose": 1, "slice": 1, "pad": 1, "constant": 1, "iota": 1,
    # an inline reduction: a loop and an accumulator
    "reduce_sum": 8, "reduce_max": 8, "reduce_min": 8,
    # loads at computed (and checked) indices
    "gather": 1, "check_index": 1,
    # kernels of their own, or removed before codegen
    "matmul": 1, "scatter": 1, "all_reduce": 1, "stop_gradient": 1, "custom_vjp": 1,
    "host_callback": 1,
}
assert set(CODE_COST) == PRIMITIVES, set(CODE_COST) ^ PRIMITIVES

# What one element costs in time, in the same units, where that differs from its code: a division
# or a square root is one instruction, but the divider takes 3.5-5 cycles per vector of 8 floats
# (vdivps, vsqrtps on Zen 2 and Skylake) against 0.5 for an add -- about a third of the inline
# exp. A row kernel keeps a value for its row by this cost (ir/rows.py): layer norm's normalized
# row, divided again in three parts of its backward, took 10.0 ms against 8.4 kept (4096x1024,
# one thread).
TIME_COST: dict[str, int] = {**CODE_COST, "div": 20, "sqrt": 20}

EXPENSIVE = frozenset(name for name, cost in CODE_COST.items() if cost > 1)
