"""A reduction of one marked element without its loop: a loop whose only effect is

    acc = maximum(acc, select(eq(cast(%i), k), value, -inf))

with `k` the same at every position (the row's argmax, computed before the loop or loaded in it
from where it was stored) picks the one element at %i == k and adds the reduction's identity for
every other: the loop runs its body once, at %i = k if k is in the loop's range, else at its first
position (where eq fails, so the identity is what it adds), after the statements that make k.

`max(dim)`'s values are such a reduction (tracer/derivatives.py's _Selected: the element its
index marks, exactly, -0.0 and nan included): softmax cross-entropy written with `max(dim=1)`
read each row once more for it, 1000 compares and selects a row for one element.

The rewrite is exact. The identity leaves the accumulator as it is (maximum with -inf, minimum with
+inf, add of 0, once or many times); the body runs at a position of the loop's range, so every
load reads what the loop read there; and where k is out of the range the marked element is none,
as in the loop. It applies to loops over constant bounds, not empty, whose body computes,
loads and updates that one accumulator (no store, check, nested loop or other update).
"""
from __future__ import annotations

import math

import numpy as np

from tracer.ir.loops import Accumulate, Compute, IndexOp, Load, Loop, LoopProgram, Store

_PURE = (Compute, IndexOp, Load)


def shortcut_one_hot_reductions(program: LoopProgram) -> LoopProgram:
    """`program` with every such loop of its kernels replaced by its body at the marked position
    (in place)."""
    for kernel in program.kernels:
        kernel.body = _shortcut_block(kernel.body)
    return program


def _shortcut_block(statements: list) -> list:
    result: list = []
    for statement in statements:
        if isinstance(statement, Loop):
            statement.body = _shortcut_block(statement.body)
            shortcut = _shortcut(statement)
            if shortcut is not None:
                result += shortcut
                continue
        result.append(statement)
    return result


def _shortcut(loop: Loop) -> list | None:
    """The statements that replace `loop`: those of its body that make the mark k, the index
    operations that set its counter to the marked position (k if in range, else the first
    position), and the rest of its body; or None if `loop` is not a one-hot reduction."""
    if not (isinstance(loop.begin, int) and isinstance(loop.end, int) and loop.begin < loop.end):
        return None
    if not all(isinstance(s, (*_PURE, Accumulate)) for s in loop.body):
        return None
    updates = [s for s in loop.body if isinstance(s, Accumulate)]
    if len(updates) != 1:
        return None
    defined = {s.target: s for s in loop.body if isinstance(s, _PURE)}
    marked = _marked_operand(updates[0], defined, loop.counter)
    if marked is None or marked == loop.counter or marked in _varying(loop):
        return None
    making = statements_making([marked], defined)
    return [*(s for s in loop.body if s in making), *marked_position(loop.counter, marked, loop),
            *(s for s in loop.body if s not in making)]


def marked_position(counter: str, marked: str, loop: Loop) -> list[IndexOp]:
    """The index operations that set `counter` to `marked` if it is in `loop`'s range (constant
    bounds, not empty), else to the range's first position."""
    return [IndexOp(f"{counter}.from", "sub", (marked, loop.begin)),
            IndexOp(f"{counter}.inside", "lt", (f"{counter}.from", loop.end - loop.begin)),
            IndexOp(counter, "select", (f"{counter}.inside", marked, loop.begin))]


def operands_of(statement) -> tuple:
    """The registers and literals a pure statement or a store reads."""
    if isinstance(statement, Load):
        return (statement.offset,)
    if isinstance(statement, Store):
        return (statement.offset, statement.operand)
    return statement.operands


def _varying(loop: Loop) -> set[str]:
    """The registers of `loop`'s body that depend on its counter (the body stores nothing, so a
    load at an offset that does not is the same at every position)."""
    varying = {loop.counter}
    for statement in loop.body:
        if isinstance(statement, _PURE) and any(o in varying for o in operands_of(statement)):
            varying.add(statement.target)
    return varying


def statements_making(registers: list, defined: dict) -> set:
    """The statements of a body (`defined`, by target) that `registers` are computed from."""
    making, waiting = set(), [r for r in registers if isinstance(r, str)]
    while waiting:
        statement = defined.get(waiting.pop())
        if statement is not None and statement not in making:
            making.add(statement)
            waiting += [o for o in operands_of(statement) if isinstance(o, str)]
    return making


def _marked_operand(update: Accumulate, defined: dict, counter: str):
    """k, if `update` adds select(eq(cast(counter), k), value, identity) (or eq(k, ...)): the
    register the loop's position is compared with."""
    select = defined.get(update.operand)
    if not (isinstance(select, Compute) and select.primitive == "select"
            and is_identity(select.operands[2], update.primitive, update.dtype)):
        return None
    return mark_of(select, defined, counter)


def mark_of(select: Compute, defined: dict, counter: str):
    """k, if `select` chooses by eq(cast(counter), k) or eq(k, cast(counter)), k a register."""
    compare = defined.get(select.operands[0])
    if not (isinstance(compare, Compute) and compare.primitive == "eq"):
        return None
    for position, other in (compare.operands, reversed(compare.operands)):
        cast = defined.get(position)
        if (isinstance(cast, Compute) and cast.primitive == "cast" and cast.operands == (counter,)
                and cast.dtype == np.dtype(np.int64) and isinstance(other, str)
                and compare.in_dtypes == (np.dtype(np.int64),) * 2):
            return other
    return None


def is_identity(operand, primitive: str, dtype: np.dtype) -> bool:
    """Whether the literal `operand` leaves an accumulator of `primitive` and `dtype` unchanged."""
    if isinstance(operand, str) or isinstance(operand, bool):
        return False
    if primitive == "add":
        return operand == 0
    if np.issubdtype(dtype, np.floating):
        return operand == (-math.inf if primitive == "maximum" else math.inf)
    limits = np.iinfo(dtype)
    return operand == (limits.min if primitive == "maximum" else limits.max)
