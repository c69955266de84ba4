"""Constant offsets out of a kernel's text and into the pointers the entry passes it.

A kernel that reads a buffer at a constant offset (the time step of an unrolled recurrent network:
`x[t]`, a gate's quarter of a product) differs from its siblings only in that constant: an LSTM's
8 steps made 143 kernel modules of which 72 differed in text, each compiled by LLVM at O3, and the
groups of identical modules differed in `add 96, %i` against `add 80, %i` alone. Here a buffer
whose every access is at an offset `c + (non-negative terms)` with the least `c` above 0 gets
that `c` as its `Buffer.shift` (the entry passes the pointer that much further on) and its
accesses drop it, so that the siblings' texts match and the kernel is compiled once
(runtime/kernels.py finds a module by its text).

Offsets are read as linear forms over the kernel's non-negative index registers (loop counters,
checked indices, quotients and remainders of non-negative forms); a buffer with any other access
keeps its shift of 0. Index operations that only the old offsets used are removed."""
from __future__ import annotations

import dataclasses
from typing import Iterator

from tracer.ir.loops import (Accumulate, Accumulator, CheckIndex, Compute, IndexOp, Load, Loop,
                             LoopKernel, Store, nested_statements)

# (constant, {register: coefficient}): an offset's value as a linear form
Linear = tuple[int, dict[str, int]]

SHIFTED_KINDS = ("loop", "rows", "accumulate", "scatter", "combine")


def shift_constant_offsets(kernel: LoopKernel) -> LoopKernel:
    """`kernel` with the least constant offset of each buffer that has one moved into its
    pointer's shift (see the module's docstring); the same kernel if none has."""
    statements = list(nested_statements(kernel.body))
    if kernel.kind not in SHIFTED_KINDS or not all(
            isinstance(s, (Compute, IndexOp, CheckIndex, Load, Store, Loop, Accumulator,
                           Accumulate)) for s in statements):
        return kernel
    forms = _linear_forms(statements)
    accesses: dict[str, list] = {}
    for statement in statements:
        if isinstance(statement, (Load, Store)):
            accesses.setdefault(statement.buffer, []).append(statement)
    shifts = {}
    for name, used in accesses.items():
        found = [_form(forms, access.offset) for access in used]
        if all(form is not None and all(c >= 0 for c in form[1].values()) for form in found):
            least = min(constant for constant, _ in found)
            if least > 0:
                shifts[name] = least
    if not shifts:
        return kernel
    names = _Names(statements)

    def rewritten(body: list) -> list:
        result = []
        for statement in body:
            if isinstance(statement, Loop):
                statement = dataclasses.replace(statement, body=rewritten(statement.body))
            elif isinstance(statement, (Load, Store)) and statement.buffer in shifts:
                constant, terms = _form(forms, statement.offset)
                offset, made = _emit(constant - shifts[statement.buffer], terms, names)
                result += made
                statement = dataclasses.replace(statement, offset=offset)
            result.append(statement)
        return result

    buffers = [dataclasses.replace(b, shift=shifts.get(b.name, 0)) for b in kernel.buffers]
    return dataclasses.replace(kernel, buffers=buffers, body=_without_unused(rewritten(kernel.body)))


def _linear_forms(statements: list) -> dict[str, Linear | None]:
    """The linear form of each index register (None where it is not one over non-negative
    registers)."""
    forms: dict[str, Linear | None] = {}
    for statement in statements:
        if isinstance(statement, Loop):
            forms[statement.counter] = (0, {statement.counter: 1})
        elif isinstance(statement, CheckIndex):
            forms[statement.target] = (0, {statement.target: 1})  # (in [0, size) once checked)
        elif isinstance(statement, IndexOp):
            operands = [_form(forms, operand) for operand in statement.operands]
            forms[statement.target] = _combine(statement, operands)
    return forms


def _form(forms: dict[str, Linear | None], operand) -> Linear | None:
    if isinstance(operand, bool):
        return None
    if isinstance(operand, int):
        return (operand, {})
    if operand in ("begin", "end"):
        return (0, {operand: 1})
    return forms.get(operand)


def _combine(statement: IndexOp, operands: list[Linear | None]) -> Linear | None:
    if any(operand is None for operand in operands):
        return None
    if statement.op in ("add", "sub"):
        (a, a_terms), (b, b_terms) = operands
        sign = 1 if statement.op == "add" else -1
        terms = dict(a_terms)
        for register, coefficient in b_terms.items():
            terms[register] = terms.get(register, 0) + sign * coefficient
        return (a + sign * b, {r: c for r, c in terms.items() if c != 0})
    if statement.op == "mul":
        (a, a_terms), (b, b_terms) = operands
        if a_terms and b_terms:
            return None
        (k, _), (constant, terms) = ((a, a_terms), (b, b_terms)) if not a_terms else (
            (b, b_terms), (a, a_terms))
        return (k * constant, {r: k * c for r, c in terms.items() if k * c != 0})
    if statement.op in ("div", "rem") and all(
            constant >= 0 and all(c >= 0 for c in terms.values()) for constant, terms in operands):
        return (0, {statement.target: 1})  # (a non-negative register of its own)
    return None


class _Names:
    """Fresh register names for the offsets made anew (%s0, %s1, ...: the same in every kernel,
    so that siblings' texts match)."""

    def __init__(self, statements: list):
        self.taken = {name for statement in statements for name in _defined(statement)}
        self.count = 0

    def __call__(self) -> str:
        while f"%s{self.count}" in self.taken:
            self.count += 1
        self.count += 1
        return f"%s{self.count - 1}"


def _emit(constant: int, terms: dict[str, int], names: _Names) -> tuple[object, list[IndexOp]]:
    """The offset `constant + sum(coefficient * register)` and the index operations that make it
    (terms in the order their registers were first met)."""
    made: list[IndexOp] = []
    total: object = None
    for register, coefficient in terms.items():
        term: object = register
        if coefficient != 1:
            term = names()
            made.append(IndexOp(term, "mul", (register, coefficient)))
        if total is None:
            total = term
        else:
            target = names()
            made.append(IndexOp(target, "add", (total, term)))
            total = target
    if total is None:
        return constant, made
    if constant:
        target = names()
        made.append(IndexOp(target, "add", (constant, total)))
        total = target
    return total, made


def _defined(statement) -> Iterator[str]:
    if isinstance(statement, (Compute, IndexOp, CheckIndex, Load)):
        yield statement.target
    elif isinstance(statement, Loop):
        yield statement.counter
    elif isinstance(statement, Accumulator):
        yield statement.name


def _used(statement) -> Iterator[object]:
    if isinstance(statement, (Compute, IndexOp)):
        yield from statement.operands
    elif isinstance(statement, CheckIndex):
        yield statement.position
    elif isinstance(statement, Load):
        yield statement.offset
    elif isinstance(statement, Store):
        yield from (statement.offset, statement.operand)
    elif isinstance(statement, Loop):
        yield from (statement.begin, statement.end)
    elif isinstance(statement, Accumulator):
        yield statement.initial
    elif isinstance(statement, Accumulate):
        yield statement.operand


def _without_unused(body: list) -> list:
    """`body` without the index operations nothing uses (the old offsets), to a fixed point."""
    while True:
        used = {operand for statement in nested_statements(body) for operand in _used(statement)
                if isinstance(operand, str)}
        pruned = _pruned(body, used)
        if sum(1 for _ in nested_statements(pruned)) == sum(1 for _ in nested_statements(body)):
            return body
        body = pruned


def _pruned(body: list, used: set[str]) -> list:
    result = []
    for statement in body:
        if isinstance(statement, IndexOp) and statement.target not in used:
            continue
        if isinstance(statement, Loop):
            statement = dataclasses.replace(statement, body=_pruned(statement.body, used))
        result.append(statement)
    return result
