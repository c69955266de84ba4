"""Tensor fusion of collectives (Horovod's, inside the compiled step): the small all_reduces of one
op and dtype, none of which depends on another, become one all_reduce of the concatenation of
their flattened operands, each former result a slice of it.

Every all_reduce is a call whose latency (over a network) and synchronization (each rank waits for
the others) a small one costs more than its data; a large one costs its data, and copying it
into a concatenation and out again costs more than the call it saves (fusing the seed step's
400 KB gradient with its two small all_reduces made its step 5% slower on 2 ranks; fusing the 1
KB gradient with the loss saves a call for a 4 KB copy). So only operands of at most
FUSED_BYTES are fused. The sum (max, min) of a concatenation is the concatenation of the sums,
element for element, so the values are exactly those of the separate all_reduces. The
concatenation is a copy (each part its own loop, ir/schedule_index.py's seams); the slices fuse
into their readers. (DistributedDataParallel concatenates all of a model's gradients itself.)
"""
from __future__ import annotations

import heapq

from tracer.ir.builder import GraphBuilder
from tracer.ir.graph import Graph, Instruction, Value
from tracer.ir.types import is_float

# The largest operand fused: MPICH sends messages up to 64 KiB eagerly, in one step
FUSED_BYTES = 64 * 1024


def fuse_all_reduces(function: Graph) -> Graph:
    """Merge each group of independent small all_reduces of one op and dtype into one (in place)."""
    reductions = [i for i in function.instructions if i.primitive == "all_reduce"
                  and i.inputs[0].type.size * i.inputs[0].dtype.itemsize <= FUSED_BYTES]
    if len(reductions) < 2:
        return function
    upstream = _reductions_upstream(function)
    groups: list[list[Instruction]] = []
    for reduction in reductions:  # the first group of its kind that it does not depend on
        kind = (reduction.attributes["op"], reduction.inputs[0].dtype)
        for group in groups:
            if (group[0].attributes["op"], group[0].inputs[0].dtype) == kind and not any(
                    id(member) in upstream[id(reduction)] for member in group):
                group.append(reduction)
                break
        else:
            groups.append([reduction])
    groups = [group for group in groups if len(group) > 1]
    if not groups:
        return function
    rank = {id(i): float(position) for position, i in enumerate(function.instructions)}
    replacements: dict[int, Value] = {}
    for group in groups:
        added = _merged(function, group, replacements)
        last = max(rank[id(member)] for member in group)
        for step, instruction in enumerate(added, 1):  # in their order, where the last one was
            rank[id(instruction)] = last + step / (len(added) + 1)
        function.instructions.extend(added)
    merged = {id(member) for group in groups for member in group}
    function.instructions = [i for i in function.instructions if id(i) not in merged]
    for instruction in function.instructions:
        instruction.inputs = [replacements.get(id(v), v) for v in instruction.inputs]
    function.outputs = [replacements.get(id(v), v) for v in function.outputs]
    function.instructions = _ordered(function.instructions, rank)
    return function


def _reductions_upstream(function: Graph) -> dict[int, frozenset[int]]:
    """For each instruction (by id), the all_reduces (by id) its operands depend on."""
    upstream: dict[int, frozenset[int]] = {}
    for instruction in function.instructions:
        found: set[int] = set()
        for value in instruction.inputs:
            producer = value.producer
            if producer is not None and id(producer) in upstream:
                found |= upstream[id(producer)]
                if producer.primitive == "all_reduce":
                    found.add(id(producer))
        upstream[id(instruction)] = frozenset(found)
    return upstream


def _merged(function: Graph, group: list[Instruction], replacements: dict[int, Value]
            ) -> list[Instruction]:
    """The instructions of one all_reduce of the group's operands, concatenated (as tr.cat does:
    a float part padded as -pad(-x), so that -0.0 comes through the sum of the parts unchanged),
    and the slices that replace the group's results (recorded in `replacements`)."""
    added: list[Instruction] = []
    b = GraphBuilder(function, lambda: group[0].location, added)
    total = sum(member.inputs[0].type.size for member in group)
    floating = is_float(group[0].inputs[0].dtype)
    concatenation, offset = None, 0
    for member in group:
        operand = member.inputs[0]
        size = operand.type.size
        flat = b.reshape(operand, (size,))
        pad = {"low": (offset,), "high": (total - offset - size,), "interior": (0,)}
        part = b.neg(b.op("pad", b.neg(flat), **pad)) if floating else b.op("pad", flat, **pad)
        concatenation = part if concatenation is None else b.add(concatenation, part)
        offset += size
    reduced = b.op("all_reduce", concatenation, **group[0].attributes)
    offset = 0
    for member in group:
        (result,) = member.outputs
        size = result.type.size
        piece = b.op("slice", reduced, starts=(offset,), stops=(offset + size,), steps=(1,))
        replacements[id(result)] = b.reshape(piece, result.shape)
        offset += size
    return added


def _ordered(instructions: list[Instruction], rank: dict[int, float]) -> list[Instruction]:
    """The instructions in an order where each follows its operands' producers: by `rank` where
    the dependencies allow (a reader of a merged result moves after the merged all_reduce)."""
    present = {id(i) for i in instructions}
    waiting: dict[int, int] = {}
    readers: dict[int, list[Instruction]] = {}
    for instruction in instructions:
        producers = {id(v.producer) for v in instruction.inputs
                     if v.producer is not None and id(v.producer) in present}
        waiting[id(instruction)] = len(producers)
        for producer in producers:
            readers.setdefault(producer, []).append(instruction)
    ready = [(rank[id(i)], n, i) for n, i in enumerate(instructions) if not waiting[id(i)]]
    heapq.heapify(ready)
    order = {id(i): n for n, i in enumerate(instructions)}
    result = []
    while ready:
        _, _, instruction = heapq.heappop(ready)
        result.append(instruction)
        for reader in readers.get(id(instruction), []):
            waiting[id(reader)] -= 1
            if not waiting[id(reader)]:
                heapq.heappush(ready, (rank[id(reader)], order[id(reader)], reader))
    return result
