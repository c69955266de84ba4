"""Which index values are known to be in range before a program runs, and which instructions check
an index at run time (and so can fail, and need the error record, as host callbacks do).

The tracer passes every index tensor a user gives through `check_index` before a gather or
scatter reads it; the iotas it builds itself (the other axes of `gather`) need no check. The
passes drop a check of a value already known in range, and the scheduler checks a gather's or
scatter's index operand itself only when it is not known in range.
"""
from __future__ import annotations

from tracer.ir.graph import Instruction, Value
from tracer.ir.primitives import CHECKS, HOST, INDEXING


def index_in_range(operand: Value, size: int) -> bool:
    """Whether every value of the index operand `operand` lies in [0, size): it is a
    `check_index` against that size (which wraps negative values), or an iota that fits."""
    producer = operand.producer
    if producer is None:
        return False
    if producer.primitive == "check_index":
        return producer.attributes["size"] == size
    return (producer.primitive == "iota"
            and operand.shape[producer.attributes["dimension"]] <= size)


def check_is_needed(instruction: Instruction) -> bool:
    """Whether a `check_index` can fail (its operand is not known in range)."""
    return not index_in_range(instruction.inputs[0], instruction.attributes["size"])


def indexed_sizes(instruction: Instruction) -> list[tuple[Value, int]]:
    """A gather's or scatter's index operands, each with the size of the dimension it indexes."""
    axes = instruction.attributes["axes"]
    data = instruction.inputs[0]
    return [(operand, data.shape[axis])
            for operand, axis in zip(instruction.inputs[-len(axes):], axes)]


def checks_an_index(instruction: Instruction) -> bool:
    """Whether the code of `instruction` checks an index at run time (and so can fail)."""
    if instruction.primitive in CHECKS:
        return check_is_needed(instruction)
    return instruction.primitive in INDEXING and not all(
        index_in_range(operand, size) for operand, size in indexed_sizes(instruction))


def can_fail(instruction: Instruction) -> bool:
    """Whether the code of `instruction` can fail at run time, and so needs the error record and
    stops the program: an index it checks, or a host callback (which may raise)."""
    return instruction.primitive in HOST or checks_an_index(instruction)
