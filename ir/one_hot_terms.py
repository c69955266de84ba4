"""A one-hot term out of its loop: a loop that stores

    out[o(i)] = p(i) + select(eq(cast(%i), k), s, 0)

with k and s computed before it (max(dim)'s gradient sent to its argmax: tracer/derivatives.py's
gradient_to) stores p(i) + 0 instead, and after it stores once more at the marked position, the
body's store computed there with the term (or, k outside the range, at the first position, where
eq fails: the value the loop stored there, again). The loop then no longer reads s, a sum the
loop before it makes: ir/loop_fusion.py merges the two (softmax cross-entropy written with
max(dim=1): its last two passes over each row became one).

Exact: every element ends as the loop stored it, the marked one computed by the same statements at
the same position. It applies where the loop's bounds are constant and it is not empty, it holds
no loop, the select is used by that add alone and the add by that store alone; the store's
statements are computations, index operations and loads of buffers the loop does not store; and
the loop neither loads the buffer stored nor stores into it elsewhere.
"""
from __future__ import annotations

import dataclasses

from tracer.ir.loops import Accumulate, Compute, IndexOp, Load, Loop, LoopProgram, Store
from tracer.ir.one_hot_reductions import (is_identity, mark_of, marked_position, operands_of,
                                          statements_making)

_PURE = (Compute, IndexOp, Load)


def move_one_hot_terms(program: LoopProgram) -> LoopProgram:
    """`program` with the one-hot term of every such loop of its kernels stored after it (in
    place)."""
    for kernel in program.kernels:
        kernel.body = _move_block(kernel.body)
    return program


def _move_block(statements: list) -> list:
    result: list = []
    for statement in statements:
        result.append(statement)
        if isinstance(statement, Loop):
            statement.body = _move_block(statement.body)
            result += _move_term(statement)
    return result


def _move_term(loop: Loop) -> list:
    """The statements that store the marked element after `loop` (its term rewritten to 0 in the
    loop), or none if `loop` has no such term."""
    body = loop.body
    if not (isinstance(loop.begin, int) and isinstance(loop.end, int) and loop.begin < loop.end):
        return []
    if not all(isinstance(statement, (*_PURE, Store, Accumulate)) for statement in body):
        return []
    defined = {s.target: s for s in body if isinstance(s, _PURE)}
    stores = [s for s in body if isinstance(s, Store)]
    stored = {store.buffer for store in stores}
    uses: dict = {}
    for statement in body:
        for operand in _reads(statement):
            uses[operand] = uses.get(operand, 0) + 1
    for store in stores:
        found = _term(store, defined, loop.counter, uses)
        if found is None or sum(s.buffer == store.buffer for s in stores) > 1:
            continue
        if any(isinstance(s, Load) and s.buffer == store.buffer for s in body):
            continue
        making = statements_making([store.offset, store.operand], defined)
        if any(isinstance(s, Load) and s.buffer in stored for s in making):
            continue
        add, position, mark = found
        after = _at_marked_position(loop, [s for s in body if s in making] + [store], mark)
        select = defined[add.operands[position]]
        add.operands = tuple(select.operands[2] if index == position else operand
                             for index, operand in enumerate(add.operands))
        loop.body = _without_unused(body, select)
        return after
    return []


def _reads(statement) -> tuple:
    """What a statement of the loop's body reads (an accumulation, its operand)."""
    return (statement.operand,) if isinstance(statement, Accumulate) else operands_of(statement)


def _without_unused(body: list, select: Compute) -> list:
    """`body` without `select` and the statements only it read (the loop reads s no more)."""
    dropped = {select}
    while True:
        read = {o for s in body if s not in dropped for o in _reads(s)}
        unused = {s for s in body if isinstance(s, _PURE) and s not in dropped
                  and s.target not in read and any(o == s.target for d in dropped
                                                   for o in operands_of(d))}
        if not unused:
            return [s for s in body if s not in dropped]
        dropped |= unused


def _term(store: Store, defined: dict, counter: str, uses: dict):
    """(the add, the position of its one-hot operand, k) if `store` stores p + select(eq(cast(
    counter), k), s, 0), k and s made before the loop, the add and the select used once; else
    None."""
    add = defined.get(store.operand)
    if not (isinstance(add, Compute) and add.primitive == "add" and uses[add.target] == 1):
        return None
    for position, operand in enumerate(add.operands):
        select = defined.get(operand)
        if not (isinstance(select, Compute) and select.primitive == "select"
                and uses[select.target] == 1 and is_identity(select.operands[2], "add", add.dtype)):
            continue
        mark, term = mark_of(select, defined, counter), select.operands[1]
        if mark is not None and mark not in defined and (
                not isinstance(term, str) or (term not in defined and term != counter)):
            return add, position, mark
    return None


def _at_marked_position(loop: Loop, statements: list, mark: str) -> list:
    """`statements` (a store and what it is computed from) again after `loop`, at its marked
    position: their registers renamed, the counter's set by marked_position."""
    counter = f"{loop.counter}.marked"
    names = {loop.counter: counter,
             **{s.target: f"{s.target}.marked" for s in statements if not isinstance(s, Store)}}
    copies = []
    for statement in statements:
        renamed = [names.get(o, o) if isinstance(o, str) else o for o in operands_of(statement)]
        if isinstance(statement, Load):
            copies.append(dataclasses.replace(statement, target=names[statement.target],
                                              offset=renamed[0]))
        elif isinstance(statement, Store):
            copies.append(dataclasses.replace(statement, offset=renamed[0], operand=renamed[1]))
        else:
            copies.append(dataclasses.replace(statement, target=names[statement.target],
                                              operands=tuple(renamed)))
    return marked_position(counter, mark, loop) + copies
