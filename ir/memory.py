"""Memory planning: where every stored value lives when a fused function runs.

Parameters are read where the caller passed them. Each distinct function output gets its own fresh
buffer (allocated by the runtime per call), unless the caller asked for it to be written into a
parameter's buffer (`write_into={output index: parameter index}`, the in-place update of a
parameter) and that is safe: see `in_place_conflict`. Every other stored value is a temporary placed in one
arena whose size is fixed at compile time: a temporary reuses the block of one that is dead. A
kernel never writes a block that one of its inputs occupies (kernel pointers are `noalias`).
"""
from __future__ import annotations

from typing import NamedTuple

from tracer.ir.fusion import FusedFunction, Kernel, matmul_operand
from tracer.ir.index_walk import misaligned_reads
from tracer.ir.graph import Value
from tracer.ir.types import ALIGNMENT


class Location(NamedTuple):
    """Where a buffer lives: `kind` is "parameter", "output" or "arena"; `index` is the parameter or
    output position, or the byte offset in the arena. (A NamedTuple, not a frozen dataclass, whose
    methods generated at import took ~1 ms of every fresh process's tr.trace.)"""

    kind: str
    index: int


class MemoryPlan:
    """Where each stored value is read and written. (A plain class: @dataclass generating its
    methods took ~1 ms of every fresh process's tr.trace.)"""

    def __init__(self, output_slots: list[Value] | None = None):
        self.locations: dict[int, Location] = {}  # value id -> where it is read
        self.result_locations: dict[int, Location] = {}  # value id -> where written
        # the value stored in each output slot
        self.output_slots: list[Value] = output_slots if output_slots is not None else []
        self.arena_size = 0
        # output index -> parameter index: outputs written into the parameter's buffer (no slot)
        self.in_place: dict[int, int] = {}
        # output index -> why a requested in-place write was refused
        self.refused: dict[int, str] = {}

    def read(self, value: Value) -> Location:
        return self.locations[id(value)]

    def write(self, value: Value) -> Location:
        return self.result_locations[id(value)]


def _aligned(size: int) -> int:
    return max(ALIGNMENT, -(-size // ALIGNMENT) * ALIGNMENT)


def _misaligned(kernel: Kernel, fused: FusedFunction) -> set[int] | None:
    """The ids of the values `kernel` reads at another index than the one it is writing (see
    index_walk.misaligned_reads: elementwise ops on equal shapes from a result of a loop kernel
    down to a parameter keep the index), or None where a kernel of its kind may read any value at
    any index."""
    if kernel.kind == "matmul":
        update = kernel.update
        if update is None:
            return None
        # a gemm operand in the buffer the gemm writes is read at every index
        operands = {id(matmul_operand(v)[0]) for v in update.matmul.inputs}
        roots, stop = kernel.results, {id(update.matmul.outputs[0])}
    elif kernel.kind == "loop":
        operands, roots, stop = set(), kernel.results, set()
    else:  # accumulate and scatter kernels write their result before they have read all
        # operands; a row kernel's parts may read them at any index (not checked, refused)
        return None
    own = {id(v) for v in kernel.results}

    def is_boundary(value: Value) -> bool:
        return id(value) in stop or (fused.is_materialized(value) and id(value) not in own)

    return operands | misaligned_reads(roots, is_boundary)


def _identity_only(kernel: Kernel, fused: FusedFunction, parameter: Value,
                   misaligned: dict[int, set[int] | None]) -> bool:
    """Whether `kernel` reads `parameter` only at the index it is writing, or not at all;
    `misaligned` keeps each kernel's `_misaligned` for the plan's other in-place writes."""
    if not any(v is parameter for v in kernel.inputs):
        return True
    if id(kernel) not in misaligned:
        misaligned[id(kernel)] = _misaligned(kernel, fused)
    reads = misaligned[id(kernel)]
    # A root that is the parameter itself is a copy of it: read at the index it writes.
    return reads is not None and id(parameter) not in reads


def in_place_conflict(fused: FusedFunction, output_index: int, parameter_index: int,
                      write_into: dict[int, int],
                      misaligned: dict[int, set[int] | None] | None = None) -> str | None:
    """Why output `output_index` cannot be written into the buffer of parameter `parameter_index`
    (None if it can): the value must be computed by a kernel (not a parameter), have exactly the
    parameter's type, appear once among the outputs, be the only output requested for that
    parameter, and its kernel must be the last to read the parameter and read it only at the index
    it writes (so every element is read before it is overwritten)."""
    function = fused.function
    if not 0 <= output_index < len(function.outputs):
        return "no such output"
    if not 0 <= parameter_index < len(function.parameters):
        return "no such parameter"
    value, parameter = function.outputs[output_index], function.parameters[parameter_index]
    if value.producer is None:
        return "the output is a parameter"
    if value.type != parameter.type:
        return f"type {value.type} differs from the parameter's {parameter.type}"
    if sum(v is value for v in function.outputs) != 1:
        return "the value is also another output"
    if list(write_into.values()).count(parameter_index) != 1:
        return "two outputs are to be written into the same parameter"
    number = next(n for n, k in enumerate(fused.kernels) if any(v is value for v in k.results))
    if any(any(v is parameter for v in k.inputs) for k in fused.kernels[number + 1:]):
        return "a later kernel reads the parameter"
    if not _identity_only(fused.kernels[number], fused, parameter,
                          {} if misaligned is None else misaligned):
        return "the kernel reads the parameter at another index than it writes"
    return None


def plan_memory(fused: FusedFunction, write_into: dict[int, int] | None = None) -> MemoryPlan:
    function = fused.function
    plan = MemoryPlan()
    for index, parameter in enumerate(function.parameters):
        plan.locations[id(parameter)] = Location("parameter", index)
    misaligned: dict[int, set[int] | None] = {}  # per kernel, shared by the in-place writes
    for output_index, parameter_index in sorted((write_into or {}).items()):
        reason = in_place_conflict(fused, output_index, parameter_index, write_into, misaligned)
        if reason is not None:
            plan.refused[output_index] = reason
            continue
        value = function.outputs[output_index]
        plan.in_place[output_index] = parameter_index
        plan.result_locations[id(value)] = plan.locations[id(value)] = Location(
            "parameter", parameter_index)
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


def arena_overflow(fused: FusedFunction, plan: MemoryPlan) -> str | None:
    """What lies outside the arena in `plan`, if anything. The kernels check each offset against
    its buffer's element count, relative to the buffer's pointer; that every temporary's block is
    inside the arena is a fact of the plan, so it is checked once, at compile time."""
    for kernel in fused.kernels:
        for value in kernel.results:
            location = plan.write(value)
            end = location.index + value.type.size * value.dtype.itemsize
            if location.kind == "arena" and (location.index < 0 or end > plan.arena_size):
                return (f"the memory plan puts %{value.name} ({value.type}) at bytes "
                        f"[{location.index}, {end}) of an arena of {plan.arena_size} bytes")
    return None


def shared_buffers(kernel: Kernel, plan: MemoryPlan) -> dict[int, int]:
    """result position -> input position, for the results written into the buffer an input is read
    from (an in-place update): the kernel gets one pointer for both, so `noalias` stays true."""
    reads = {plan.read(v): i for i, v in enumerate(kernel.inputs)}
    return {j: reads[plan.write(v)] for j, v in enumerate(kernel.results)
            if plan.write(v) in reads}
