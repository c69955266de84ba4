"""One-hot selections out of their loops: loops that pick the element at %i == k of a row, k the
same at every position (max(dim)'s argmax, computed before the loop or loaded in it from where it
was stored), done once at the marked position instead of at every one.

A reduction of one marked element (`shortcut_one_hot_reductions`): a loop whose only effect is

    acc = maximum(acc, select(eq(cast(%i), k), value, -inf))

adds the reduction's identity at every position but k: it runs its body once, at %i = k if k is in
the loop's range, else at its first position (where eq fails, so the identity is what it adds),
after the statements that make k. `max(dim)`'s values are such a reduction (tracer/
derivatives.py's _Selected: the element its index marks, exactly, -0.0 and nan included).

A one-hot term (`move_one_hot_terms`): a loop that stores

    out[base + %i] = p(%i) + select(eq(cast(%i), k), s, z)

with s made before it (max(dim)'s gradient sent to its argmax: gradient_to) stores p + z instead,
and after it stores once more at the marked position, the body's store computed there with the
term (or, k outside the range, at the first position, where eq fails: the value the loop stored
there, again). The loop then no longer reads s, a sum the loop before it makes, and
ir/loop_fusion.py merges the two. Softmax cross-entropy written with max(dim=1) read each row 6
times; now 4.

Both are exact in the loop IR: an identity leaves an accumulator as it is (maximum with -inf,
minimum with +inf, add of -0.0, once or many times); a body run at a position of the loop's range
loads what the loop loaded there; a store made again computes what the loop stored at that element,
which no other position stores (its offset is base + %i). (Compiled, a merged loop's sums may be
added in another order by LLVM, as any merge's: their accumulators are reassociable.) They apply to
loops over constant bounds, not empty, whose body only computes, loads, stores and accumulates,
where k is a register (not the counter, not an accumulator: the mark is index arithmetic, which
reads registers) that does not vary with the position.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from tracer.ir.loop_fusion import PURE_STATEMENTS, statement_reads
from tracer.ir.loops import (Accumulate, Accumulator, Compute, IndexOp, Load, Loop, LoopProgram,
                             Store, nested_statements, rewrite_loops)

_BODY = (*PURE_STATEMENTS, Store, Accumulate)  # what a rewritten loop's body may hold


def shortcut_one_hot_reductions(program: LoopProgram) -> LoopProgram:
    """`program` with every loop that reduces one marked element replaced by its body at the
    marked position (in place)."""
    for kernel in program.kernels:
        kernel.body = rewrite_loops(kernel.body, _rewriting(_shortcut, kernel.body))
    return program


def move_one_hot_terms(program: LoopProgram) -> LoopProgram:
    """`program` with the one-hot term of every such loop stored after it (in place)."""
    for kernel in program.kernels:
        kernel.body = rewrite_loops(kernel.body, _rewriting(_move_term, kernel.body))
    return program


def _rewriting(rewrite, statements: list):
    """`rewrite` of a loop where its body allows it, told the registers a mark may not be:
    accumulators (index arithmetic reads registers) and those that vary with the position (the
    counter among them)."""
    accumulators = {s.name for s in nested_statements(statements) if isinstance(s, Accumulator)}
    return lambda loop: (rewrite(loop, accumulators | _varying(loop)) if _rewritable(loop)
                         else None)


def _rewritable(loop: Loop) -> bool:
    return (isinstance(loop.begin, int) and isinstance(loop.end, int) and loop.begin < loop.end
            and all(isinstance(statement, _BODY) for statement in loop.body))


def _shortcut(loop: Loop, unusable: set[str]) -> list | None:
    """The statements that replace a one-hot reduction `loop`: those of its body that make the
    mark, the marked position, the rest of its body."""
    if any(isinstance(statement, Store) for statement in loop.body):
        return None
    updates = [s for s in loop.body if isinstance(s, Accumulate)]
    if len(updates) != 1:
        return None
    (update,) = updates
    defined = _defined(loop)
    select = defined.get(update.operand)
    if not (_is_select(select) and _is_identity(select.operands[2], update.primitive,
                                                 update.dtype)):
        return None
    mark = _mark(select, defined, loop.counter, unusable)
    if mark is None:
        return None
    making = _making([mark], defined)
    return [*(s for s in loop.body if s in making), *_marked_position(loop.counter, mark, loop),
            *(s for s in loop.body if s not in making)]


def _move_term(loop: Loop, unusable: set[str]) -> list | None:
    """`loop` with its one-hot term's operand rewritten to z, then the store made again at the
    marked position; None if it stores no such term."""
    defined = _defined(loop)
    stores = [s for s in loop.body if isinstance(s, Store)]
    stored = {s.buffer for s in stores}
    loaded = {s.buffer for s in loop.body if isinstance(s, Load)}
    uses: dict = {}
    for statement in loop.body:
        for operand in statement_reads(statement):
            uses[operand] = uses.get(operand, 0) + 1
    for store in stores:
        if store.buffer in loaded or sum(s.buffer == store.buffer for s in stores) > 1:
            continue
        found = _term(store, defined, loop.counter, uses, unusable)
        if found is None or not _distinct_elements(store.offset, defined, loop.counter, unusable):
            continue
        add, position, mark = found
        making = _making([store.offset, store.operand], defined)
        if any(isinstance(s, Load) and s.buffer in stored for s in making):
            continue
        again = _at_marked_position(loop, [s for s in loop.body if s in making] + [store], mark)
        select = defined[add.operands[position]]
        add.operands = tuple(select.operands[2] if index == position else operand
                             for index, operand in enumerate(add.operands))
        loop.body = _without_unused(loop.body, select)
        return [loop, *again]
    return None


def _term(store: Store, defined: dict, counter: str, uses: dict, unusable: set[str]):
    """(the add, the position of its one-hot operand, k) if `store` stores p + select(eq(cast(
    counter), k), s, z), s made before the loop, the add and the select used once; else None."""
    add = defined.get(store.operand)
    if not (isinstance(add, Compute) and add.primitive == "add" and uses[add.target] == 1):
        return None
    for position, operand in enumerate(add.operands):
        select = defined.get(operand)
        if not (_is_select(select) and uses[select.target] == 1
                and not isinstance(select.operands[2], str)):
            continue
        mark, term = _mark(select, defined, counter, unusable), select.operands[1]
        if mark is not None and term not in defined and term != counter:
            return add, position, mark
    return None


def _distinct_elements(offset, defined: dict, counter: str, unusable: set[str]) -> bool:
    """Whether `offset` is base + counter, base the same at every position: each position stores
    an element of its own."""
    statement = defined.get(offset)
    if not (isinstance(statement, IndexOp) and statement.op == "add"
            and counter in statement.operands):
        return False
    (base,) = [o for o in statement.operands if o != counter] or [counter]
    return base not in unusable


def _at_marked_position(loop: Loop, statements: list, mark: str) -> list:
    """`statements` (a store and what it is computed from) again after `loop`, at its marked
    position: their registers renamed, the counter's set by _marked_position."""
    counter = f"{loop.counter}.marked"
    names = {loop.counter: counter,
             **{s.target: f"{s.target}.marked" for s in statements if not isinstance(s, Store)}}
    copies = []
    for statement in statements:
        renamed = [names.get(o, o) if isinstance(o, str) else o
                   for o in statement_reads(statement)]
        if isinstance(statement, Load):
            copies.append(dataclasses.replace(statement, target=names[statement.target],
                                              offset=renamed[0]))
        elif isinstance(statement, Store):
            copies.append(dataclasses.replace(statement, offset=renamed[0], operand=renamed[1]))
        else:
            copies.append(dataclasses.replace(statement, target=names[statement.target],
                                              operands=tuple(renamed)))
    return _marked_position(counter, mark, loop) + copies


def _without_unused(body: list, select: Compute) -> list:
    """`body` without `select` and the statements only it read (the loop reads s no more)."""
    dropped = {select}
    while True:
        read = {o for s in body if s not in dropped for o in statement_reads(s)}
        unused = {s for s in body if isinstance(s, PURE_STATEMENTS) and s not in dropped
                  and s.target not in read and any(o == s.target for d in dropped
                                                   for o in statement_reads(d))}
        if not unused:
            return [s for s in body if s not in dropped]
        dropped |= unused


def _marked_position(counter: str, mark: str, loop: Loop) -> list[IndexOp]:
    """The index operations that set `counter` to `mark` if it is in `loop`'s range, else to the
    range's first position (unsigned `lt`: a negative mark is outside too)."""
    return [IndexOp(f"{counter}.from", "sub", (mark, loop.begin)),
            IndexOp(f"{counter}.inside", "lt", (f"{counter}.from", loop.end - loop.begin)),
            IndexOp(counter, "select", (f"{counter}.inside", mark, loop.begin))]


def _defined(loop: Loop) -> dict:
    return {s.target: s for s in loop.body if isinstance(s, PURE_STATEMENTS)}


def _is_select(statement) -> bool:
    return isinstance(statement, Compute) and statement.primitive == "select"


def _mark(select: Compute, defined: dict, counter: str, unusable: set[str]):
    """k, if `select` chooses by eq(cast(counter), k) or eq(k, cast(counter)), k a register not
    `unusable` (an accumulator, or varying with the position: the counter among them); else
    None."""
    compare = defined.get(select.operands[0])
    if not (isinstance(compare, Compute) and compare.primitive == "eq"
            and compare.in_dtypes == (np.dtype(np.int64),) * 2):
        return None
    for position, other in (compare.operands, reversed(compare.operands)):
        cast = defined.get(position)
        if (isinstance(cast, Compute) and cast.primitive == "cast"
                and cast.operands == (counter,) and cast.dtype == np.dtype(np.int64)
                and isinstance(other, str) and other not in unusable):
            return other
    return None


def _varying(loop: Loop) -> set[str]:
    """The registers of `loop`'s body that may differ from one position to the next: those
    computed from the counter, and loads of a buffer the loop stores."""
    stored = {s.buffer for s in loop.body if isinstance(s, Store)}
    varying = {loop.counter}
    for statement in loop.body:
        if isinstance(statement, PURE_STATEMENTS) and (
                any(o in varying for o in statement_reads(statement))
                or (isinstance(statement, Load) and statement.buffer in stored)):
            varying.add(statement.target)
    return varying


def _making(registers: list, defined: dict) -> set:
    """The statements of a body (`defined`, by target) that `registers` are computed from."""
    making, waiting = set(), [r for r in registers if isinstance(r, str)]
    while waiting:
        statement = defined.get(waiting.pop())
        if statement is not None and statement not in making:
            making.add(statement)
            waiting += [o for o in statement_reads(statement) if isinstance(o, str)]
    return making


def _is_identity(operand, primitive: str, dtype: np.dtype) -> bool:
    """Whether the literal `operand` leaves an accumulator of `primitive` and `dtype` unchanged
    whatever its value (for a float add, -0.0: 0.0 turns -0.0 into 0.0)."""
    if isinstance(operand, (str, bool)):
        return False
    floating = np.issubdtype(dtype, np.floating)
    if primitive == "add":
        return operand == 0 and (not floating or math.copysign(1.0, operand) < 0)
    if primitive not in ("maximum", "minimum"):
        return False
    if floating:
        return operand == (-math.inf if primitive == "maximum" else math.inf)
    limits = np.iinfo(dtype)
    return operand == (limits.min if primitive == "maximum" else limits.max)
