"""Reference semantics: each primitive as numpy code. Eager mode and the interpreter run these;
they are the oracle every compiled result is checked against."""
from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import numpy as np

from tracer.ir.primitives import IndexRangeError, pad_as_slice, padded_length
from tracer.ir.types import as_dtype


def _pad(x, low, high, interior):
    result = np.zeros(tuple(map(padded_length, x.shape, low, high, interior)), x.dtype)
    region = pad_as_slice(x.shape, low, interior)
    result[tuple(map(slice, region["starts"], region["stops"], region["steps"]))] = x
    return result


def _iota(shape, dimension, dtype):
    index_shape = [1] * len(shape)
    index_shape[dimension] = shape[dimension]
    line = np.arange(shape[dimension], dtype=as_dtype(dtype)).reshape(index_shape)
    return np.broadcast_to(line, shape)


def _check_index(index, size, axis, wrap=True):
    """The index, with `wrap` its negative values counted from the end as PyTorch's indexing
    does; IndexRangeError for one outside [-size, size) (without `wrap`, [0, size)), worded as
    PyTorch's message."""
    outside = (index < (-size if wrap else 0)) | (index >= size)
    if np.any(outside):
        value = int(index[outside].flat[0])
        raise IndexRangeError(f"index {value} is out of bounds for dimension {axis} with "
                              f"size {size}")
    return np.where(index < 0, index + size, index)


def _index_key(shape, indices, axes) -> tuple:
    return tuple(_check_index(index, shape[axis], axis) for index, axis in zip(indices, axes))


def _moved(x, axes):
    """A view of x with `axes` first, in their order: numpy's indexing then puts the indices'
    broadcast shape first and keeps the other dimensions in order, as gather's shape rule says."""
    return np.moveaxis(x, axes, range(len(axes)))


def _gather(x, *indices, axes):
    return _moved(x, axes)[_index_key(x.shape, indices, axes)]


def _scatter(target, updates, *indices, axes, accumulate):
    result = target.copy()
    key = [k.ravel() for k in np.broadcast_arrays(*_index_key(target.shape, indices, axes))]
    updates = updates.reshape((len(key[0]),) + updates.shape[updates.ndim - result.ndim
                                                             + len(axes):])
    if accumulate:
        np.add.at(_moved(result, axes), tuple(key), updates)  # repeated indices add up, in order
        return result
    # Of repeated indices the last write stays, as in compiled code (numpy's own order of
    # assignment is unspecified): keep the last occurrence of each position.
    positions = np.ravel_multi_index(key, [target.shape[a] for a in axes]) if key[0].size else key[0]
    _, last_reversed = np.unique(positions[::-1], return_index=True)
    keep = len(positions) - 1 - last_reversed
    _moved(result, axes)[tuple(k[keep] for k in key)] = updates[keep]
    return result


def _sign(x):
    # As PyTorch: -1, 0 or 1, computed as (x > 0) - (x < 0). So sign(nan) is 0 (numpy's np.sign
    # gives nan) and sign(-0.0) is +0.0 (np.sign gives -0.0).
    if x.dtype.kind == "f":
        return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)
    return np.sign(x)


def _pow(x, y):
    """numpy's power, except for integers to negative powers (numpy raises ValueError), which
    follow PyTorch's integer pow with a tensor exponent: x ** -n is 1 for x == 1, -1 or 1 for
    x == -1 by the parity of n, and 0 for every other x (0 included). Overflow wraps (mod 2**64)."""
    if x.dtype.kind != "i":
        return np.power(x, y)
    negative = y < 0
    if not np.any(negative):
        return np.power(x, y)
    x, y, negative = np.broadcast_arrays(x, y, negative)
    result = np.power(x, np.where(negative, 0, y))
    odd = (y & 1) != 0
    reciprocal = np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1), 0))
    return np.where(negative, reciprocal, result).astype(x.dtype)


def _maximum(x, y):
    return np.maximum(x, y)  # propagates nan, as torch.maximum does


def _all_reduce(x: np.ndarray, op: str) -> np.ndarray:
    """The elementwise sum (max, min) of x over MPI's world, through mpi4py, which the process
    has imported if it is part of a job (tracer.distributed); otherwise a world of one."""
    result = np.array(x, copy=True, order="C")
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.COMM_WORLD.Get_size() == 1:
        return result
    operation = {"sum": mpi.SUM, "max": mpi.MAX, "min": mpi.MIN}[op]
    mpi.COMM_WORLD.Allreduce(mpi.IN_PLACE, result, op=operation)
    return result


# REFERENCE[primitive](*operands, **attributes) -> one array, or a tuple of arrays.
REFERENCE: dict[str, Callable[..., Any]] = {
    "neg": np.negative, "abs": np.abs, "sign": _sign, "exp": np.exp, "log": np.log,
    "sqrt": np.sqrt, "tanh": np.tanh, "sin": np.sin, "cos": np.cos,
    "logical_not": np.logical_not,
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": _pow,
    "fmod": np.fmod,
    "maximum": _maximum, "minimum": np.minimum,
    "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "eq": np.equal, "ne": np.not_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or,
    "select": np.where,
    "cast": lambda x, dtype: x.astype(dtype),
    "broadcast": lambda x, shape: np.broadcast_to(x, shape),
    "reshape": lambda x, shape: np.reshape(x, shape),
    "transpose": lambda x, permutation: np.transpose(x, permutation),
    "slice": lambda x, starts, stops, steps: x[tuple(map(slice, starts, stops, steps))],
    "pad": _pad,
    "reduce_sum": lambda x, axes: np.sum(x, axis=axes, dtype=x.dtype),
    "reduce_max": lambda x, axes: np.max(x, axis=axes),  # nan propagates
    "reduce_min": lambda x, axes: np.min(x, axis=axes),  # nan propagates
    "matmul": np.matmul,
    "gather": _gather,
    "scatter": _scatter,
    "check_index": _check_index,
    "constant": lambda value, dtype: np.array(value, dtype),
    "iota": _iota,
    "stop_gradient": lambda x: x,
    "all_reduce": _all_reduce,
    "host_callback": lambda *operands, callback: callback(*operands),
    "custom_vjp": lambda *operands, num_outputs, rule: tuple(operands[:num_outputs]),
}


# Primitives that only move or index data, which no floating-point exception can come from: they
# skip the errstate, which costs more than their own work on a small array.
_DATA_MOVEMENT = frozenset({"broadcast", "reshape", "transpose", "slice", "pad", "gather", "iota",
                            "stop_gradient"})


# (np.errstate as a decorator sets numpy's error state per call, reentrant and per thread as the
# `with` form is, for half its instructions: no errstate object is made and entered per call)
@np.errstate(all="ignore")
def _quietly(function: Callable[..., Any], inputs: Sequence[np.ndarray],
             attributes: dict[str, Any]) -> Any:
    return function(*inputs, **attributes)


def evaluate_primitive(primitive: str, inputs: Sequence[np.ndarray],
                       attributes: dict[str, Any]) -> list[np.ndarray]:
    """Run one primitive on numpy arrays; always returns a list of arrays (never numpy scalars).

    Floating-point exceptions are quiet (log(0) is -inf, 0/0 is nan), as in PyTorch.
    """
    if primitive in _DATA_MOVEMENT:
        result = REFERENCE[primitive](*inputs, **attributes)
    else:
        result = _quietly(REFERENCE[primitive], inputs, attributes)
    if type(result) is np.ndarray:  # (most primitives: np.asarray would return it unchanged)
        return [result]
    results = result if isinstance(result, tuple) else (result,)
    return [np.asarray(r) for r in results]
