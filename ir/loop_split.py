"""An innermost loop that divides its counter by a constant is split by it: an outer loop over the
quotients around an inner loop over the remainders, so that each index is a loop counter and the
inner loop's accesses are unit-stride, with no division or remainder per element.

A concatenation of heads (attention's q, k and v gradients, each [B, heads, T, 32], stored as one
[B*T, 3*192] matrix: ir/schedule.py cuts the row at the pieces' seams) read each piece's element
at column c as head c / 32, position c % 32. LLVM then unrolled each 192-column loop whole to drop
the divisions (see codegen/render_kernel.KernelRenderer.loop_hint), which made the GPT step's
three such kernels the slowest of its modules to compile (66, 49 and 31 ms). Split, each piece is
6 loops of 32 contiguous floats, which LLVM vectorizes as it does any row.

A loop is split when its bounds are fixed, every division and remainder of its counter (or of the
counter minus a constant) is by the same divisor d, and its range and each such offset's start are
whole multiples of d (the offsets never below zero), so that the quotient and the remainder of every element are the outer and
the inner counter (the quotient plus a constant). The divisions and remainders become copies of
them (an `add` LLVM folds), and the old counter a register computed from both, so the rest of the
body is kept as it was."""
from __future__ import annotations

from tracer.ir.loops import IndexOp, Loop, LoopProgram, innermost, rewrite_loops


def split_divided_loops(program: LoopProgram) -> LoopProgram:
    """`program` with every innermost loop that divides its counter by a constant split by it (in
    place; see the module's docstring)."""
    for kernel in program.kernels:
        kernel.body = rewrite_loops(kernel.body,
                                    lambda loop: [_split(loop)] if innermost(loop) else None)
    return program


def _split(loop: Loop) -> Loop:
    """`loop` split by the divisor of its counter, or `loop` itself where it cannot be."""
    if not (isinstance(loop.begin, int) and isinstance(loop.end, int)):
        return loop
    # register -> c where the register holds counter - c
    offsets = {loop.counter: 0}
    for statement in loop.body:
        if isinstance(statement, IndexOp) and statement.op == "sub":
            minuend, subtrahend = statement.operands
            if minuend == loop.counter and isinstance(subtrahend, int):
                offsets[statement.target] = subtrahend
    divisions = [s for s in loop.body if isinstance(s, IndexOp) and s.op in ("div", "rem")
                 and s.operands[0] in offsets and isinstance(s.operands[1], int)]
    divisors = {s.operands[1] for s in divisions}
    if len(divisors) != 1:
        return loop
    (divisor,) = divisors
    # (an offset below zero, a padded position outside its operand, stays as it is)
    if divisor < 2 or (loop.end - loop.begin) % divisor or any(
            loop.begin < offsets[s.operands[0]] or (loop.begin - offsets[s.operands[0]]) % divisor
            for s in divisions):
        return loop
    quotient, remainder = f"{loop.counter}.quotient", f"{loop.counter}.remainder"
    start = f"{loop.counter}.start"
    body = [IndexOp(loop.counter, "add", (start, remainder))]
    for statement in loop.body:
        if statement in divisions:
            # counter - c = (quotient + (begin - c) / d) * d + remainder, 0 <= remainder < d
            shift = (loop.begin - offsets[statement.operands[0]]) // divisor
            statement = (IndexOp(statement.target, "add", (quotient, shift))
                         if statement.op == "div" else IndexOp(statement.target, "add",
                                                               (remainder, 0)))
        body.append(statement)
    starts = [IndexOp(f"{start}.scaled", "mul", (quotient, divisor)),
              IndexOp(start, "add", (f"{start}.scaled", loop.begin))]
    inner = Loop(remainder, 0, divisor, body)
    return Loop(quotient, 0, (loop.end - loop.begin) // divisor, [*starts, inner])
