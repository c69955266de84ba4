"""Whether a computation reads values at its own index: the walk that fusion (values kept in
registers), the memory planner (in-place writes) and ir/rows.py (row-aligned reads) share."""
from __future__ import annotations

from typing import Callable

from tracer.ir.graph import Instruction, Value
from tracer.ir.primitives import ELEMENTWISE


def same_index(instruction: Instruction, value: Value, operand: Value) -> bool:
    """Whether computing `value` at an index reads `operand` at that same index: elementwise
    primitives on equal shapes."""
    return instruction.primitive in ELEMENTWISE and operand.shape == value.shape


def reads_at_own_index(root: Value, targets: set[int], is_boundary: Callable[[Value], bool],
                       keeps_index: Callable[[Instruction, Value, Value], bool] = same_index,
                       forbidden: set[int] | frozenset[int] = frozenset(),
                       include_root: bool = False) -> bool:
    """Whether every path from `root` down to a value in `targets` reads it at the root's own
    index, each step keeping it where `keeps_index(instruction, value, operand)`, and no path
    reaches a value in `forbidden`. The walk stops at values without a producer and at values
    for which `is_boundary` holds; the root itself is a target, forbidden or boundary only with
    `include_root`."""
    stack: list[tuple[Value, bool]] = [(root, True)]
    visited: set[tuple[int, bool]] = set()
    while stack:
        value, aligned = stack.pop()
        if (id(value), aligned) in visited:
            continue
        visited.add((id(value), aligned))
        examined = include_root or value is not root
        if examined and id(value) in forbidden:
            return False
        if examined and id(value) in targets:
            if not aligned:
                return False
            continue
        if value.producer is None or (examined and is_boundary(value)):
            continue
        instruction = value.producer
        stack.extend((operand, aligned and keeps_index(instruction, value, operand))
                     for operand in instruction.inputs)
    return True


def misaligned_reads(roots: list[Value], is_boundary: Callable[[Value], bool],
                     keeps_index: Callable[[Instruction, Value, Value], bool] = same_index
                     ) -> set[int]:
    """The ids of the values that some path from one of `roots` reads at another index than the
    root's own: `reads_at_own_index` for every target at once (a value is read aligned by all
    roots iff its id is not in the result), in one walk of a kernel instead of one per target.
    The roots themselves are not examined; the walk stops at values without a producer and at
    the other values for which `is_boundary` holds."""
    stack: list[tuple[Value, bool, bool]] = [(root, True, True) for root in roots]
    visited: set[tuple[int, bool, bool]] = set()
    misaligned: set[int] = set()
    while stack:
        value, aligned, is_root = stack.pop()
        if (id(value), aligned, is_root) in visited:
            continue
        visited.add((id(value), aligned, is_root))
        if not is_root:
            if not aligned:
                misaligned.add(id(value))
            if is_boundary(value):
                continue
        if value.producer is None:
            continue
        instruction = value.producer
        stack.extend((operand, aligned and keeps_index(instruction, value, operand), False)
                     for operand in instruction.inputs)
    return misaligned
