"""Which index values are known to be in range before a program runs, and which instructions check
an index at run time (and so can fail, and need the error record, as host callbacks do).

The tracer passes every index tensor a user gives through `check_index` before a gather or
scatter reads it; the indices it builds itself from iotas (the other axes of `gather`, the
windows of convolution and pooling) need no check. The
passes drop a check of a value already known in range, and the scheduler checks a gather's or
scatter's index operand itself only when it is not known in range.
"""
from __future__ import annotations

import numpy as np

from tracer.ir.graph import Instruction, Value
from tracer.ir.primitives import CHECKS, HOST, INDEXING


def index_in_range(operand: Value, size: int) -> bool:
    """Whether every value of the index operand `operand` lies in [0, size), as far as its
    producers show (see `value_range`)."""
    bounds = value_range(operand)
    return bounds is not None and bounds[0] >= 0 and bounds[1] < size


_DEPTH = 64  # how far up the producers `value_range` looks


def value_range(value: Value, depth: int = 0) -> tuple[int, int] | None:
    """Bounds [low, high] of every element of the integer `value`, if its producers fix them
    before the program runs: a `check_index` (its result lies in [0, size): it wraps negative
    values and fails on the rest), an iota, an integer constant, and sums, differences, products,
    maxima and minima of such values, through broadcasts, reshapes, transposes, slices and
    integer casts. (The tracer builds the windows of convolution and pooling this way: their
    gathers need no check.) None where they do not."""
    producer = value.producer
    if producer is None or depth > _DEPTH or value.dtype.kind not in "iu":
        return None
    bounds = _bounds(producer, value, depth)
    # Integer arithmetic wraps: bounds beyond the value's type (an overflow, a narrowing cast)
    # are not bounds.
    limits = np.iinfo(value.dtype)
    in_type = bounds is not None and limits.min <= bounds[0] and bounds[1] <= limits.max
    return bounds if in_type else None


def _bounds(producer: Instruction, value: Value, depth: int) -> tuple[int, int] | None:
    """`value_range` of `producer`'s result `value`, before the check that it fits its type."""
    primitive, attributes = producer.primitive, producer.attributes
    if primitive == "check_index":
        return 0, attributes["size"] - 1
    if primitive == "iota":
        return 0, max(value.shape[attributes["dimension"]] - 1, 0)
    if primitive == "constant":
        return (int(attributes["value"]),) * 2
    if primitive in ("broadcast", "reshape", "transpose", "slice", "cast"):
        return value_range(producer.inputs[0], depth + 1)  # (None for a float operand)
    if primitive not in ("add", "sub", "mul", "maximum", "minimum"):
        return None
    operands = [value_range(operand, depth + 1) for operand in producer.inputs]
    if None in operands:
        return None
    (a_low, a_high), (b_low, b_high) = operands
    if primitive == "add":
        return a_low + b_low, a_high + b_high
    if primitive == "sub":
        return a_low - b_high, a_high - b_low
    if primitive == "mul":
        products = [a * b for a in (a_low, a_high) for b in (b_low, b_high)]
        return min(products), max(products)
    if primitive == "maximum":
        return max(a_low, b_low), max(a_high, b_high)
    return min(a_low, b_low), min(a_high, b_high)


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
