"""The closed set of primitives and their shape/dtype rules.

Every computation in the IR is one of these primitives. Each one has exactly one row in each of the
tables: `SHAPE_RULES` here, `REFERENCE` in reference.py, `VJP_RULES` in vjp.py and the lowering table
in codegen. tests/test_ir_tables.py fails when a table misses a primitive.

Elementwise primitives broadcast their operands the numpy way (trailing dimensions aligned, size-1
dimensions stretched); their operands have one dtype (the tracer inserts explicit casts).

`gather x, i1..ik {axes}` reads x at computed indices: the int64 index operands broadcast to a
shape B and index the dimensions `axes` of x; the result has shape B followed by x's other
dimensions, in order. `scatter target, updates, i1..ik {axes, accumulate}` is target with updates
(of gather's result shape) written, or with `accumulate` added, at those positions. Negative
indices count from the end; one outside [-size, size) is an IndexRangeError.

`check_index i {size, axis, wrap}` is i after checking every element lies in [0, size), or with
`wrap` in [-size, size) with negative values wrapped (+ size), as PyTorch's indexing `x[i]` counts
them from the end where its index_select, gather and losses refuse them. The tracer passes each index tensor a user gives through it before
the gather or scatter reads it. It checks the whole tensor even where the gather reads only some
of it or nothing (an empty or sliced result, a result never used), as PyTorch does, so the passes
keep it when its result is unused and fusion always stores it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from tracer.ir.types import TensorType, as_dtype, bool_, float32, float64, int64, is_float

UNARY_FLOAT = frozenset({"exp", "log", "sqrt", "tanh", "sin", "cos"})
UNARY = UNARY_FLOAT | {"neg", "abs", "sign", "logical_not"}
# fmod is C's (the remainder of x / y truncated, with x's sign, exact): no composition of the
# others computes it exactly where x / y overflows or underflows.
BINARY_ARITHMETIC = frozenset({"add", "sub", "mul", "div", "pow", "maximum", "minimum", "fmod"})
COMPARE = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
LOGICAL = frozenset({"logical_and", "logical_or"})
BINARY = BINARY_ARITHMETIC | COMPARE | LOGICAL
ELEMENTWISE = UNARY | BINARY | {"select", "cast"}
LAYOUT = frozenset({"broadcast", "reshape", "transpose", "slice", "pad"})
REDUCE = frozenset({"reduce_sum", "reduce_max", "reduce_min"})
SOURCES = frozenset({"constant", "iota"})
# Integer indexing: a read at computed indices, and a write (or accumulation) at computed indices.
INDEXING = frozenset({"gather", "scatter"})
# A check that can fail: kept by dead-code elimination, computed over its whole shape.
CHECKS = frozenset({"check_index"})
# Identity on their operands at run time; they only tell the autodiff pass how gradients flow.
GRADIENT_MARKERS = frozenset({"stop_gradient", "custom_vjp"})
# Python code the program calls back into on the host (ir/host.py): `host_callback %a, ...
# {callback}` has the results of `callback(a, ...)`, whose types the callback declares.
HOST = frozenset({"host_callback"})
# Primitives with several results (the VJP rule takes and gives a list of cotangents per output).
MULTIPLE_OUTPUTS = frozenset({"custom_vjp", "host_callback"})
# Communication between the processes of a data-parallel job (MPI): `all_reduce x {op}` is the
# elementwise sum (max, min) of x over every process; a process alone is a world of one.
COLLECTIVES = frozenset({"all_reduce"})
REDUCE_OPS = ("sum", "max", "min")

PRIMITIVES = (ELEMENTWISE | LAYOUT | REDUCE | SOURCES | INDEXING | CHECKS | GRADIENT_MARKERS
              | COLLECTIVES | HOST | {"matmul"})

# Not primitives but requests to a pass: `gradient %output, %seed, %wrt...` stands for the gradients
# of %output (seeded by %seed) with respect to each %wrt until the autodiff pass expands it in place.
DIRECTIVES = frozenset({"gradient"})

# Primitives through which no gradient flows, whatever their operands.
NON_DIFFERENTIABLE = COMPARE | LOGICAL | CHECKS | {"logical_not", "constant", "iota",
                                                   "stop_gradient"}

# Primitives whose gradient needs none of their operand or result values: an eager in-place change
# to one of their inputs cannot invalidate a later backward.
LINEAR = frozenset({"add", "sub", "neg", "cast", "stop_gradient", "custom_vjp"}) | LAYOUT | {
    "reduce_sum", "constant", "iota"}


class ShapeError(ValueError):
    """Operands whose shapes or dtypes a primitive does not accept."""


class IndexRangeError(IndexError):
    """An index operand of gather or scatter holds a value outside its dimension (the reference
    semantics raise it; compiled code reports the same through its error record)."""


def accumulator_dtype(primitive: str, dtype: np.dtype) -> np.dtype:
    """The dtype a reduction of `dtype` elements accumulates in: float32 sums add in float64
    (rounded once at the end), everything else in its own dtype."""
    return float64 if primitive == "reduce_sum" and dtype == float32 else dtype


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    if all(shape == shapes[0] for shape in shapes[1:]):  # (most operands of a trace)
        return tuple(shapes[0])
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(
            "shapes " + ", ".join(str(list(s)) for s in shapes) + " cannot be broadcast together"
        ) from None


def _same_dtype(primitive: str, in_types: list[TensorType]) -> np.dtype:
    dtypes = {t.dtype for t in in_types}
    if len(dtypes) != 1:
        raise ShapeError(f"{primitive} needs operands of one dtype, got {sorted(map(str, dtypes))}")
    return dtypes.pop()


def _unary(primitive: str, in_types: list[TensorType]) -> list[TensorType]:
    (x,) = in_types
    if primitive in UNARY_FLOAT and not is_float(x.dtype):
        raise ShapeError(f"{primitive} needs a float operand, got {x.dtype}")
    if primitive == "logical_not" and x.dtype != bool_:
        raise ShapeError(f"logical_not needs a bool operand, got {x.dtype}")
    if primitive in {"neg", "abs", "sign"} and x.dtype == bool_:
        raise ShapeError(f"{primitive} does not take a bool operand")
    return [x]


def _binary(primitive: str, in_types: list[TensorType]) -> list[TensorType]:
    dtype = _same_dtype(primitive, in_types)
    shape = broadcast_shapes(*(t.shape for t in in_types))
    if primitive in COMPARE:
        return [TensorType(shape, bool_)]
    if primitive in LOGICAL:
        if dtype != bool_:
            raise ShapeError(f"{primitive} needs bool operands, got {dtype}")
        return [TensorType(shape, bool_)]
    if dtype == bool_:
        raise ShapeError(f"{primitive} does not take bool operands")
    if primitive in ("div", "fmod") and not is_float(dtype):
        raise ShapeError(f"{primitive} needs float operands, got {dtype}")
    return [TensorType(shape, dtype)]


def _select(in_types: list[TensorType]) -> list[TensorType]:
    condition, on_true, on_false = in_types
    if condition.dtype != bool_:
        raise ShapeError(f"select needs a bool condition, got {condition.dtype}")
    dtype = _same_dtype("select", [on_true, on_false])
    return [TensorType(broadcast_shapes(condition.shape, on_true.shape, on_false.shape), dtype)]


def _broadcast(x: TensorType, shape: tuple[int, ...]) -> list[TensorType]:
    if len(shape) < x.ndim or broadcast_shapes(x.shape, shape) != tuple(shape):
        raise ShapeError(f"cannot broadcast shape {list(x.shape)} to {list(shape)}")
    return [TensorType(shape, x.dtype)]


def _reshape(x: TensorType, shape: tuple[int, ...]) -> list[TensorType]:
    if any(d < 0 for d in shape) or int(np.prod(shape, dtype=np.int64)) != x.size:
        raise ShapeError(f"cannot reshape {list(x.shape)} ({x.size} elements) to {list(shape)}")
    return [TensorType(shape, x.dtype)]


def _transpose(x: TensorType, permutation: tuple[int, ...]) -> list[TensorType]:
    if sorted(permutation) != list(range(x.ndim)):
        raise ShapeError(f"{list(permutation)} is not a permutation of {x.ndim} dimensions")
    return [TensorType(tuple(x.shape[p] for p in permutation), x.dtype)]


def slice_length(start: int, stop: int, step: int) -> int:
    return max(0, (stop - start + step - 1) // step)


def _slice(x: TensorType, starts, stops, steps) -> list[TensorType]:
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ShapeError(f"slice needs one start, stop and step per dimension of {list(x.shape)}")
    for size, start, stop, step in zip(x.shape, starts, stops, steps):
        if step < 1 or not 0 <= start <= size or not start <= stop <= size:
            raise ShapeError(f"slice {start}:{stop}:{step} is out of range for a dimension of {size}")
    shape = tuple(slice_length(*bounds) for bounds in zip(starts, stops, steps))
    return [TensorType(shape, x.dtype)]


def padded_length(size: int, low: int, high: int, interior: int) -> int:
    return low + high + size + max(0, size - 1) * interior


def slice_as_pad(shape, starts, stops, steps) -> dict[str, tuple[int, ...]]:
    """The pad attributes that put a slice of an array of `shape` back where it came from."""
    high = []
    for size, start, stop, step in zip(shape, starts, stops, steps):
        count = slice_length(start, stop, step)
        high.append(size - start - (count - 1) * step - 1 if count else size - start)
    return {"low": tuple(starts), "high": tuple(high),
            "interior": tuple(step - 1 for step in steps)}


def pad_as_slice(shape, low, interior) -> dict[str, tuple[int, ...]]:
    """The slice attributes that take an array of `shape` back out of its padding."""
    steps = tuple(gap + 1 for gap in interior)
    stops = tuple(start + max(0, n - 1) * step + (1 if n else 0)
                  for n, start, step in zip(shape, low, steps))
    return {"starts": tuple(low), "stops": stops, "steps": steps}


def _pad(x: TensorType, low, high, interior) -> list[TensorType]:
    if not len(low) == len(high) == len(interior) == x.ndim:
        raise ShapeError(f"pad needs one low, high and interior per dimension of {list(x.shape)}")
    if min((*low, *high, *interior), default=0) < 0:
        raise ShapeError("pad amounts must be non-negative")
    return [TensorType(tuple(map(padded_length, x.shape, low, high, interior)), x.dtype)]


def _check_axes(x: TensorType, axes: tuple[int, ...]) -> None:
    if len(set(axes)) != len(axes) or any(not 0 <= a < x.ndim for a in axes):
        raise ShapeError(f"bad reduction axes {list(axes)} for shape {list(x.shape)}")


def _reduce(primitive: str, x: TensorType, axes: tuple[int, ...]) -> list[TensorType]:
    _check_axes(x, axes)
    if x.dtype == bool_:
        raise ShapeError(f"{primitive} does not take bool operands; cast first")
    if primitive in ("reduce_max", "reduce_min") and any(x.shape[a] == 0 for a in axes):
        raise ShapeError(f"cannot take the {primitive[-3:]} over an empty dimension of "
                         f"{list(x.shape)}")
    shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [TensorType(shape, x.dtype)]


def _matmul(a: TensorType, b: TensorType) -> list[TensorType]:
    dtype = _same_dtype("matmul", [a, b])
    if dtype == bool_ or a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"matmul needs two numeric operands of rank >= 2 with equal batch "
                         f"dimensions, got {a} and {b}")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: shapes {list(a.shape)} and {list(b.shape)} do not line up "
                         f"({a.shape[-1]} != {b.shape[-2]})")
    return [TensorType(a.shape[:-1] + b.shape[-1:], dtype)]


def _iota(shape: tuple[int, ...], dimension: int, dtype) -> list[TensorType]:
    if not 0 <= dimension < len(shape):
        raise ShapeError(f"iota dimension {dimension} out of range for shape {list(shape)}")
    return [TensorType(shape, dtype)]


def _index_axes(primitive: str, x: TensorType, indices: list[TensorType],
                axes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape the index operands broadcast to, after checking them against `axes`."""
    if not indices or len(indices) != len(axes):
        raise ShapeError(f"{primitive} needs one index operand per axis in {list(axes)}, got "
                         f"{len(indices)}")
    if len(set(axes)) != len(axes) or any(not 0 <= a < x.ndim for a in axes):
        raise ShapeError(f"{primitive}: bad axes {list(axes)} for shape {list(x.shape)}")
    if any(t.dtype != int64 for t in indices):
        raise ShapeError(f"{primitive} needs int64 index operands, got "
                         f"{[str(t.dtype) for t in indices]}")
    return broadcast_shapes(*(t.shape for t in indices))


def gathered_shape(x_shape: tuple[int, ...], index_shape: tuple[int, ...],
                   axes: tuple[int, ...]) -> tuple[int, ...]:
    """gather's result: the indices' broadcast shape, then x's dimensions not in `axes`."""
    return tuple(index_shape) + tuple(d for i, d in enumerate(x_shape) if i not in axes)


def _gather(in_types: list[TensorType], axes: tuple[int, ...]) -> list[TensorType]:
    x, *indices = in_types
    index_shape = _index_axes("gather", x, indices, axes)
    return [TensorType(gathered_shape(x.shape, index_shape, axes), x.dtype)]


def _check_index(in_types: list[TensorType], size: int, axis: int,
                 wrap: bool) -> list[TensorType]:
    (index,) = in_types
    if index.dtype != int64:
        raise ShapeError(f"check_index needs an int64 operand, got {index.dtype}")
    return [index]


def _scatter(in_types: list[TensorType], axes: tuple[int, ...],
             accumulate: bool) -> list[TensorType]:
    target, updates, *indices = in_types
    index_shape = _index_axes("scatter", target, indices, axes)
    _same_dtype("scatter", [target, updates])
    if accumulate and target.dtype == bool_:
        raise ShapeError("scatter with accumulate=True does not take bool operands")
    expected = gathered_shape(target.shape, index_shape, axes)
    if updates.shape != expected:
        raise ShapeError(f"scatter: updates of shape {list(updates.shape)} for indices selecting "
                         f"shape {list(expected)}")
    return [target]


def _custom_vjp(in_types: list[TensorType], num_outputs: int, rule) -> list[TensorType]:
    # Operands: the forward body's results, then the Function's differentiable inputs.
    if not 0 < num_outputs <= len(in_types):
        raise ShapeError(f"custom_vjp: {num_outputs} outputs for {len(in_types)} operands")
    return list(in_types[:num_outputs])


def _gradient(in_types: list[TensorType], through: tuple = ()) -> list[TensorType]:
    values = range(len(in_types) - 2)  # (through: positions among them, ir/autodiff.py)
    if len(in_types) < 3 or in_types[0] != in_types[1] or not set(through) <= set(values):
        raise ShapeError("gradient takes an output, a seed of its type, values, and positions")
    return list(in_types[2:])


def _all_reduce(in_types: list[TensorType], op: str) -> list[TensorType]:
    (x,) = in_types
    if op not in REDUCE_OPS:
        raise ShapeError(f"all_reduce op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
    if x.dtype == bool_:
        raise ShapeError("all_reduce does not take a bool operand")
    return [x]


def _host_callback(in_types: list[TensorType], callback) -> list[TensorType]:
    if not callback.result_types:
        raise ShapeError(f"host_callback {callback!r} declares no results")
    return list(callback.result_types)


def _table() -> dict[str, Callable[..., list[TensorType]]]:
    table: dict[str, Callable[..., list[TensorType]]] = {}
    for name in UNARY:
        table[name] = lambda in_types, _name=name: _unary(_name, in_types)
    for name in BINARY:
        table[name] = lambda in_types, _name=name: _binary(_name, in_types)
    for name in REDUCE:
        table[name] = lambda in_types, axes, _name=name: _reduce(_name, *in_types, axes)
    table.update({
        "select": _select,
        "cast": lambda in_types, dtype: [TensorType(in_types[0].shape, as_dtype(dtype))],
        "broadcast": lambda in_types, shape: _broadcast(*in_types, shape),
        "reshape": lambda in_types, shape: _reshape(*in_types, shape),
        "transpose": lambda in_types, permutation: _transpose(*in_types, permutation),
        "slice": lambda in_types, starts, stops, steps: _slice(*in_types, starts, stops, steps),
        "pad": lambda in_types, low, high, interior: _pad(*in_types, low, high, interior),
        "matmul": lambda in_types: _matmul(*in_types),
        "gather": _gather,
        "scatter": _scatter,
        "check_index": _check_index,
        "constant": lambda in_types, value, dtype: [TensorType((), dtype)],
        "iota": lambda in_types, shape, dimension, dtype: _iota(shape, dimension, dtype),
        "stop_gradient": lambda in_types: list(in_types),
        "custom_vjp": _custom_vjp,
        "gradient": _gradient,
        "all_reduce": _all_reduce,
        "host_callback": _host_callback,
    })
    return table


# SHAPE_RULES[primitive](in_types, **attributes) -> the output types. Raises ShapeError.
SHAPE_RULES = _table()

# How many operands each primitive takes (None: any number).
ARITY = {name: 1 for name in UNARY | LAYOUT | REDUCE | CHECKS | COLLECTIVES | {"cast"}}
ARITY.update({name: 2 for name in BINARY | {"matmul"}})
ARITY.update({"select": 3, "constant": 0, "iota": 0, "stop_gradient": 1, "custom_vjp": None,
              "gradient": None, "gather": None, "scatter": None, "host_callback": None})


# infer_types' results by primitive, operand types and attributes: a trace, its gradient and the
# verifier ask the same questions of every layer and parameter. Only attributes of plain values
# are keys (with their Python types: 1, 1.0 and True are equal keys), so that no array, rule or
# callback a user made is kept alive by the table. Operands are keyed by (shape, dtype), which
# hashes in C (TensorType's __hash__ and __eq__ are Python) and eager mode reads off an array.
_inferred: dict[tuple, list[TensorType]] = {}
_INFERRED_LIMIT = 65536
_PLAIN = frozenset({int, float, bool, str, type(None),
                    *(type(dtype) for dtype in (float32, float64, int64, bool_))})


def _plain(value: object) -> bool:
    return type(value) in _PLAIN or (type(value) is tuple and all(type(v) in _PLAIN for v in value))


def _memo_key(primitive: str, operands: list[tuple], attributes: dict) -> tuple | None:
    """The key of `_inferred` for (shape, dtype) `operands`, or None if an attribute is not plain."""
    for value in attributes.values():
        if not _plain(value):
            return None
    return (primitive, *operands, *((name, type(value), value) for name, value in attributes.items()))


def infer_types(primitive: str, in_types: list[TensorType], attributes: dict) -> list[TensorType]:
    """Output types of `primitive` applied to operands of `in_types`; raises ShapeError."""
    key = _memo_key(primitive, [(t.shape, t.dtype) for t in in_types], attributes)
    if key is not None and key in _inferred:
        return list(_inferred[key])
    if primitive not in PRIMITIVES | DIRECTIVES:
        raise ShapeError(f"unknown primitive {primitive!r}")
    arity = ARITY[primitive]
    if arity is not None and len(in_types) != arity:
        raise ShapeError(f"{primitive} takes {arity} operands, got {len(in_types)}")
    types = SHAPE_RULES[primitive](list(in_types), **attributes)
    if key is not None and len(_inferred) < _INFERRED_LIMIT:
        _inferred[key] = list(types)
    return types


def check_types(primitive: str, operands: list[tuple], attributes: dict) -> None:
    """Raise infer_types' ShapeError if `primitive` does not take operands of these (shape,
    dtype) pairs: all eager mode needs, which asks the memo before making any TensorType."""
    if (key := _memo_key(primitive, operands, attributes)) is None or key not in _inferred:
        infer_types(primitive, [TensorType(shape, dtype) for shape, dtype in operands], attributes)
