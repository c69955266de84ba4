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
