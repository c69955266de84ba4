"""Memory planning: where every stored value lives when a fused function runs.

Parameters are read where the caller passed them. Each distinct function output gets its own fresh
buffer (allocated by the runtime per call). Every other stored value is a temporary placed in one
arena whose size is fixed at compile time: a temporary reuses the block of one that is dead. A
kernel never writes a block that one of its inputs occupies (kernel pointers are `noalias`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ir.fusion import FusedFunction
from ir.graph import Value

ALIGNMENT = 64


@dataclass(frozen=True)
class Location:
    """Where a buffer lives: `kind` is "parameter", "output" or "arena"; `index` is the parameter or
    output position, or the byte offset in the arena."""

    kind: str
    index: int


@dataclass
class MemoryPlan:
    locations: dict[int, Location] = field(default_factory=dict)  # value id -> where it is read
    result_locations: dict[int, Location] = field(default_factory=dict)  # value id -> where written
    output_slots: list[Value] = field(default_factory=list)  # the value stored in each output slot
    arena_size: int = 0

    def read(self, value: Value) -> Location:
        return self.locations[id(value)]

    def write(self, value: Value) -> Location:
        return self.result_locations[id(value)]


def _aligned(size: int) -> int:
    return max(ALIGNMENT, -(-size // ALIGNMENT) * ALIGNMENT)


def plan_memory(fused: FusedFunction) -> MemoryPlan:
    function = fused.function
    plan = MemoryPlan()
    for index, parameter in enumerate(function.parameters):
        plan.locations[id(parameter)] = Location("parameter", index)
    for value in function.outputs:
        if id(value) not in plan.result_locations:
            plan.result_locations[id(value)] = Location("output", len(plan.output_slots))
            plan.output_slots.append(value)
            if value.producer is not None:  # a returned parameter is still read where it was passed
                plan.locations[id(value)] = plan.result_locations[id(value)]

    last_use: dict[int, int] = {}
    for number, kernel in enumerate(fused.kernels):
        for value in kernel.inputs:
            last_use[id(value)] = number

    blocks: list[list[int]] = []  # [offset, size, kernel number after which it is free]
    for number, kernel in enumerate(fused.kernels):
        for value in kernel.results:
            if id(value) in plan.result_locations:
                continue
            size = _aligned(value.type.size * value.dtype.itemsize)
            free_after = last_use.get(id(value), number)
            fitting = [b for b in blocks if b[2] < number and b[1] >= size]
            if fitting:
                block = min(fitting, key=lambda b: b[1])
                block[2] = free_after
            else:
                block = [plan.arena_size, size, free_after]
                blocks.append(block)
                plan.arena_size += size
            location = Location("arena", block[0])
            plan.locations[id(value)] = location
            plan.result_locations[id(value)] = location
    return plan
