"""Builders: one vocabulary of operations over two kinds of handle.

VJP rules and the tracer are written once against `Builder`. A `GraphBuilder` appends instructions to
a Function and its handles are `Value`s; the tracer's eager mode uses an `ArrayBuilder`, whose handles
are numpy arrays computed at once by the reference semantics.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tracer.ir.graph import Graph, Instruction, Value
from tracer.ir.primitives import check_types, infer_types
from tracer.ir.reference import evaluate_primitive
from tracer.ir.types import TensorType, as_dtype

Handle = Any


def normalize_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """Canonical attribute values, so equal attributes compare and print equal."""
    result = {}
    for key, value in attributes.items():
        if isinstance(value, (list, tuple)):
            value = tuple(int(v) for v in value)
        elif isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
            value = as_dtype(value)
        elif isinstance(value, (np.floating, np.integer, np.bool_)):
            value = value.item()
        result[key] = value
    return result


class Builder:
    """Operations on handles. Subclasses define `emit` and `type_of`."""

    def emit(self, primitive: str, inputs: Sequence[Handle], attributes: dict[str, Any]) -> list[Handle]:
        raise NotImplementedError

    def type_of(self, handle: Handle) -> TensorType:
        raise NotImplementedError

    def op(self, primitive: str, *inputs: Handle, **attributes: Any) -> Handle:
        (result,) = self.emit(primitive, inputs, normalize_attributes(attributes))
        return result

    # Sources.
    def constant(self, value: float | int | bool, dtype) -> Handle:
        dtype = as_dtype(dtype)
        return self.op("constant", value=dtype.type(value).item(), dtype=dtype)

    def full(self, shape: Sequence[int], value: float | int | bool, dtype) -> Handle:
        return self.broadcast(self.constant(value, dtype), shape)

    def zeros_like(self, x: Handle) -> Handle:
        t = self.type_of(x)
        return self.full(t.shape, 0, t.dtype)

    # Elementwise. A Python number operand becomes a constant of the other operand's dtype.
    def _scalar_operands(self, *operands):
        # Exactly Python's types: a numpy scalar (np.float64 is a float) is a handle gone 0-d.
        def literal(o) -> bool:
            return type(o) in (int, float, bool)
        dtype = next(self.type_of(o).dtype for o in operands if not literal(o))
        return [self.constant(o, dtype) if literal(o) else o for o in operands]

    def binary(self, primitive: str, x, y) -> Handle:
        return self.op(primitive, *self._scalar_operands(x, y))

    def add(self, x, y): return self.binary("add", x, y)
    def sub(self, x, y): return self.binary("sub", x, y)
    def mul(self, x, y): return self.binary("mul", x, y)
    def div(self, x, y): return self.binary("div", x, y)
    def pow(self, x, y): return self.binary("pow", x, y)
    def eq(self, x, y): return self.binary("eq", x, y)
    def gt(self, x, y): return self.binary("gt", x, y)
    def lt(self, x, y): return self.binary("lt", x, y)
    def neg(self, x): return self.op("neg", x)
    def logical_and(self, x, y): return self.op("logical_and", x, y)

    def select(self, condition, on_true, on_false) -> Handle:
        on_true, on_false = self._scalar_operands(on_true, on_false)
        return self.op("select", condition, on_true, on_false)

    def cast(self, x, dtype) -> Handle:
        dtype = as_dtype(dtype)
        return x if self.type_of(x).dtype == dtype else self.op("cast", x, dtype=dtype)

    # Layout.
    def broadcast(self, x, shape: Sequence[int]) -> Handle:
        return x if self.type_of(x).shape == tuple(shape) else self.op("broadcast", x, shape=shape)

    def reshape(self, x, shape: Sequence[int]) -> Handle:
        return x if self.type_of(x).shape == tuple(shape) else self.op("reshape", x, shape=shape)

    def transpose(self, x, permutation: Sequence[int]) -> Handle:
        if tuple(permutation) == tuple(range(len(permutation))):
            return x
        return self.op("transpose", x, permutation=permutation)

    def swap_last_axes(self, x) -> Handle:
        rank = self.type_of(x).ndim
        return self.transpose(x, (*range(rank - 2), rank - 1, rank - 2))

    # Reductions.
    def reduce_sum(self, x, axes: Sequence[int]) -> Handle:
        return x if not axes else self.op("reduce_sum", x, axes=tuple(sorted(axes)))

    def sum_to_shape(self, x, shape: Sequence[int]) -> Handle:
        """Sum `x` over the dimensions that broadcasting `shape` to x's shape stretched."""
        shape = tuple(shape)
        x_shape = self.type_of(x).shape
        if x_shape == shape:
            return x
        lead = len(x_shape) - len(shape)
        axes = [i for i in range(len(x_shape))
                if i < lead or (shape[i - lead] == 1 and x_shape[i] != 1)]
        return self.reshape(self.reduce_sum(x, axes), shape)

    def broadcast_reduced(self, reduced, shape: Sequence[int], axes: Sequence[int]) -> Handle:
        """Broadcast the result of a reduction over `axes` back to the operand's `shape`."""
        kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
        return self.broadcast(self.reshape(reduced, kept), shape)


class GraphBuilder(Builder):
    """Appends instructions to `instructions` (by default the body of `function`, which names the
    new values); `location()` says which user line each one comes from."""

    def __init__(self, function: Graph, location: Callable[[], str] = lambda: "",
                 instructions: list[Instruction] | None = None):
        self.function = function
        self.location = location
        self.instructions = function.instructions if instructions is None else instructions

    def type_of(self, handle: Value) -> TensorType:
        return handle.type

    def emit(self, primitive, inputs, attributes):
        out_types = infer_types(primitive, [v.type for v in inputs], attributes)
        instruction = Instruction(primitive, list(inputs), dict(attributes), location=self.location())
        instruction.outputs = [Value(self.function.new_name(), t, instruction) for t in out_types]
        self.instructions.append(instruction)
        return instruction.outputs


class ArrayBuilder(Builder):
    """Computes each operation at once on numpy arrays (the reference semantics)."""

    def type_of(self, handle: np.ndarray) -> TensorType:
        return TensorType(handle.shape, handle.dtype)

    def emit(self, primitive, inputs, attributes):
        check_types(primitive, [(a.shape, a.dtype) for a in inputs], attributes)
        return evaluate_primitive(primitive, inputs, attributes)
