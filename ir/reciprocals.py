"""Division by a value that an innermost loop does not change becomes multiplication by its
reciprocal, computed once before the loop.

A row kernel divides whole rows by a value per row: layer norm's centred row by its standard
deviation (three times over in its backward), a softmax's exponentials by their sum. Each
division occupies the divider: 3.5-5 cycles per vector of 8 floats on Zen 3 and Skylake
(vdivps), against 0.5 for a multiplication, so that three divisions per element made a third of
a layer norm's arithmetic. `x * (1 / d)` is rounded twice instead of once: at most about one ulp
more than `x / d` (numpy's and PyTorch's own layer norms multiply by the reciprocal of the
standard deviation too), with the same special values (d = 0 or inf, x = inf or nan; 1 / d is
subnormal only for |d| > 2^126 in float32, where it keeps 22 of its 24 bits). Divisions by a
literal stay as they are: LLVM already multiplies where that is exact (a power of two).
"""
from __future__ import annotations

from tracer.ir.loops import Compute, Loop, LoopProgram, innermost, rewrite_loops
from tracer.ir.types import is_float


def multiply_by_reciprocals(program: LoopProgram) -> LoopProgram:
    """`program` with the divisions of its innermost loops by a register defined outside the
    loop replaced by multiplications (in place; see the module's docstring)."""
    for kernel in program.kernels:
        kernel.body = rewrite_loops(
            kernel.body, lambda loop: [*_reciprocals(loop), loop] if innermost(loop) else None)
    return program


def _reciprocals(loop: Loop) -> list[Compute]:
    """The reciprocals `loop` divides by, to compute before it, each division of its body by one
    rewritten into a multiplication."""
    # what the body defines or updates (an accumulator of a row of one element is declared,
    # updated and read in the body itself)
    defined = {loop.counter} | {getattr(s, "target", None) or getattr(s, "name", None)
                                for s in loop.body}
    reciprocals: dict[str, Compute] = {}
    for position, statement in enumerate(loop.body):
        if not (isinstance(statement, Compute) and statement.primitive == "div"
                and is_float(statement.dtype)):
            continue
        dividend, divisor = statement.operands
        if not isinstance(divisor, str) or divisor in defined:
            continue
        if divisor not in reciprocals:
            reciprocals[divisor] = Compute(
                f"{divisor}.reciprocal.{loop.counter.lstrip('%')}", "div", (1.0, divisor),
                statement.in_dtypes, statement.dtype, line=statement.line)
        loop.body[position] = Compute(statement.target, "mul",
                                      (dividend, reciprocals[divisor].target),
                                      statement.in_dtypes, statement.dtype,
                                      statement.attributes, statement.line)
    return list(reciprocals.values())
