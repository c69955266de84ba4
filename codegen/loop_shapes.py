"""What the loop hints of codegen/render_kernel.py read of a loop's shape."""
from __future__ import annotations

from tracer.ir.loops import IndexOp, Loop


def divides_counter(loop: Loop) -> bool:
    """Whether an index in `loop`'s body divides, or takes the remainder of, its counter (or an
    offset from it)."""
    varying = {loop.counter}
    for statement in loop.body:
        if isinstance(statement, IndexOp) and varying.intersection(statement.operands):
            if statement.op in ("div", "rem"):
                return True
            varying.add(statement.target)
    return False


def unrolled_copies(statements: list) -> float:
    """How many copies of their bodies fully unrolling the loops in `statements` would make: 0
    without loops, infinite if a bound is not fixed."""
    copies = 0.0
    for statement in statements:
        if isinstance(statement, Loop):
            if not (isinstance(statement.begin, int) and isinstance(statement.end, int)):
                return float("inf")
            copies += (statement.end - statement.begin) * max(1.0,
                                                              unrolled_copies(statement.body))
    return copies
