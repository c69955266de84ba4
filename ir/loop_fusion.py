"""Sibling loops merged: two loops one after the other over the same bounds, neither reading what
the other writes (but the second reading what the first stores at the same element), become one
loop whose body is the first's then the second's.

A row kernel computes each part of a row in a loop of its own (ir/schedule_reduce.py): layer
norm's backward sums the output's gradient for the bias and its product with the normalized row
for the weight in two loops over the same row, softmax cross-entropy takes the row's maximum and
the targets' sum in two. Merged, each element is loaded once for both and the loop's overhead is
paid once.

Two loops merge when the statements between them are accumulator declarations (moved before the
first loop, so none may start from what the first loop updates) or computations, index operations
and loads the second loop does not read (moved after it, so none may read what it changes: a
one-hot term's sum, ir/one_hot.py), their bounds are the same,
neither reads an accumulator the other updates (its value is final only after its loop), and no
buffer one of them stores is read or stored by the other (an element stored at one iteration
could be read at another) -- except a buffer the first innermost loop stores at one offset and
the second loads at that same offset only, as functions of their counters -- and either both
hold loops or neither does (LLVM vectorizes only an innermost loop). Loops that check indices,
call the host, the BLAS or MPI stay as they are. The second loop's counter becomes
a copy of the first's (an `add 0` LLVM folds), so its body is kept as it was.
"""
from __future__ import annotations

from tracer.ir.loops import (Accumulate, Accumulator, Compute, IndexOp, Load, Loop, LoopProgram,
                             Store)

# The statements a merged loop's body may hold (anything else keeps the loop as it is).
_MERGEABLE = (Compute, IndexOp, Load, Store, Accumulate, Accumulator, Loop)
# Statements that compute a register from registers and memory and change nothing else: those
# between two loops may wait until after the second.
PURE_STATEMENTS = (Compute, IndexOp, Load)


def fuse_sibling_loops(program: LoopProgram) -> LoopProgram:
    """`program` with the sibling loops of every kernel's blocks merged (in place)."""
    for kernel in program.kernels:
        kernel.body = _fuse_block(kernel.body)
    return program


def _fuse_block(statements: list) -> list:
    result: list = []
    for statement in statements:
        if isinstance(statement, Loop):
            statement.body = _fuse_block(statement.body)
            merged = _merge_with_previous(result, statement)
            if merged:
                continue
        result.append(statement)
    return result


def _merge_with_previous(result: list, loop: Loop) -> bool:
    """Merge `loop` into the last loop of `result` if it may (see the module's docstring)."""
    declarations, later = [], []
    position = len(result) - 1
    while position >= 0 and isinstance(result[position], (Accumulator, *PURE_STATEMENTS)):
        (declarations if isinstance(result[position], Accumulator) else later).append(
            result[position])
        position -= 1
    if position < 0 or not isinstance(result[position], Loop):
        return False
    first = result[position]
    if (first.begin, first.end) != (loop.begin, loop.end) or _nests(first) != _nests(loop):
        return False
    first_effects, second_effects = _effects(first.body), _effects(loop.body)
    if first_effects is None or second_effects is None:
        return False
    first_loads, first_stores, first_updates = first_effects
    second_loads, second_stores, second_updates = second_effects
    first_reads: set[str] = set()
    second_reads: set[str] = set()
    _collect_reads(first.body, first_reads)
    _collect_reads(loop.body, second_reads)
    # an accumulator either loop updates is read by the other, or starts one declared between
    # them, only once it is final
    initials = {d.initial for d in declarations if isinstance(d.initial, str)}
    if (first_stores & second_stores or second_stores & first_loads
            or not _reads_where_stored(first, loop, first_stores & second_loads)
            or first_updates & (second_reads | initials) or second_updates & first_reads):
        return False
    # what the second loop does not read waits for it (reading neither what it changes nor
    # starting an accumulator declared between)
    later_reads: set[str] = set()
    _collect_reads(later, later_reads)
    later_targets = {statement.target for statement in later}
    later_loads = {s.buffer for s in later if isinstance(s, Load)}
    if (later_targets & (second_reads | initials) or later_reads & second_updates
            or later_loads & second_stores):
        return False
    # the declarations between them go before the first loop, the rest after the merged loop
    del result[position + 1:]
    result[position:position] = reversed(declarations)
    result.extend(reversed(later))
    first.body = first.body + [IndexOp(loop.counter, "add", (first.counter, 0))] + loop.body
    return True


def _reads_where_stored(first: Loop, second: Loop, buffers: set[str]) -> bool:
    """Whether the innermost loop `second` loads each of `buffers` only at the one offset where
    the innermost loop `first` stores it, as functions of their counters: merged, each iteration
    then reads what it has just stored (layer norm's normalized row, which its output stores and
    its weight's gradient reads), never what another iteration stores."""
    if not buffers:
        return True
    if _nests(first) or _nests(second):
        return False
    offsets: dict[str, set] = {}
    for loop, kind in ((first, Store), (second, Load)):
        definitions = {s.target: s for s in loop.body if isinstance(s, IndexOp)}
        for statement in loop.body:
            if isinstance(statement, kind) and statement.buffer in buffers:
                offsets.setdefault(statement.buffer, set()).add(
                    _offset_form(statement.offset, definitions, loop.counter))
    return all(len(forms) == 1 and None not in forms for forms in offsets.values())


def _offset_form(operand, definitions: dict, counter: str):
    """`operand` as a tree of index operations down to the loop's counter, the registers defined
    before the loop and literals (None where it depends on anything else in the loop)."""
    if operand == counter:
        return ("counter",)
    if not isinstance(operand, str) or operand not in definitions:
        return operand
    statement = definitions[operand]
    forms = tuple(_offset_form(o, definitions, counter) for o in statement.operands)
    return None if None in forms else (statement.op, *forms)


def _nests(loop: Loop) -> bool:
    """Whether `loop` holds a loop: an innermost loop merged into one that does would no longer be
    innermost, and LLVM vectorizes only innermost loops."""
    return any(isinstance(statement, Loop) for statement in loop.body)


def _effects(statements: list) -> tuple[set[str], set[str], set[str]] | None:
    """(buffers loaded, buffers stored, accumulators updated) by `statements`, or None if one of
    them is not one a merged loop may hold."""
    loads: set[str] = set()
    stores: set[str] = set()
    updates: set[str] = set()
    for statement in statements:
        if not isinstance(statement, _MERGEABLE):
            return None
        if isinstance(statement, Load):
            loads.add(statement.buffer)
        elif isinstance(statement, Store):
            stores.add(statement.buffer)
        elif isinstance(statement, Accumulate):
            updates.add(statement.name)
        elif isinstance(statement, Loop):
            inner = _effects(statement.body)
            if inner is None:
                return None
            loads |= inner[0]
            stores |= inner[1]
            updates |= inner[2]
    return loads, stores, updates


def statement_reads(statement) -> tuple:
    """The registers and literals one statement reads (a loop: its bounds; an accumulation: the
    accumulator too)."""
    if isinstance(statement, (Compute, IndexOp)):
        return statement.operands
    if isinstance(statement, Load):
        return (statement.offset,)
    if isinstance(statement, Store):
        return (statement.offset, statement.operand)
    if isinstance(statement, Accumulate):
        return (statement.name, statement.operand)
    if isinstance(statement, Loop):
        return (statement.begin, statement.end)
    return ()


def _collect_reads(statements: list, reads: set[str]) -> None:
    """Add the registers `statements` read to `reads`."""
    for statement in statements:
        if isinstance(statement, Loop):
            _collect_reads(statement.body, reads)
        reads.update(o for o in statement_reads(statement) if isinstance(o, str))
