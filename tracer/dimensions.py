"""The int arguments of operations: dimensions, shapes and basic indices, checked and normalized.

A Python number passed to a traced function is a runtime input (a weak 0-d tensor): where its
value is needed as one of these, the function traces again with the int argument static.
"""
from __future__ import annotations

import builtins
import numbers

import numpy as np

from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.tensor import Tensor


def normalize_dim(dim: int, ndim: int) -> int:
    limit = builtins.max(ndim, 1)
    if not -limit <= dim < limit:
        raise ShapeMismatchError(f"dimension {dim} is out of range for a tensor of {ndim} dimensions")
    return dim % limit


def number_argument(value):
    """`value`, unless it is a Python number passed to the traced function: then its value is
    needed, and the function traces again with the int argument static (a float one is an
    error naming it)."""
    if isinstance(value, Tensor) and value._weak and value._trace is not None:
        value._eager_array("a size, an index or a dimension")
    return value


def as_dim(dim) -> int:
    dim = number_argument(dim)
    if isinstance(dim, (builtins.bool, np.bool_)) or not isinstance(dim, numbers.Integral):
        raise ArgumentError(f"a dimension is an int, got {type(dim).__name__}")
    return int(dim)


def normalize_dims(dim, ndim: int) -> tuple[int, ...]:
    """Sorted non-negative dimensions; a 0-d tensor's only dimension (0 or -1) reduces nothing."""
    if dim is None:
        return tuple(range(ndim))
    dims = [dim] if not isinstance(dim, (tuple, list)) else list(dim)
    normalized = [normalize_dim(as_dim(d), ndim) for d in dims]
    if len(set(normalized)) != len(normalized):
        raise ArgumentError(f"dimension list {list(dims)} names a dimension twice")
    return tuple(sorted(normalized)) if ndim else ()


def dim_or_axis(dim, axis):
    """PyTorch accepts numpy's `axis=` for `dim=`."""
    if axis is not None and dim is not None:
        raise ArgumentError("pass dim= or axis=, not both")
    return dim if axis is None else axis


def shape_arguments(shape) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = [number_argument(d) for d in shape]
    for d in shape:
        if not isinstance(d, (int, np.integer)) or isinstance(d, builtins.bool):
            raise ArgumentError(f"a shape holds ints, got {type(d).__name__}")
        if d < -1:
            raise ArgumentError(f"invalid shape dimension {d}")
    return tuple(int(d) for d in shape)


def number_indices(key):
    """`key`, checked for number arguments of a traced function (see number_argument)."""
    if isinstance(key, tuple):
        return tuple(number_argument(k) for k in key)
    return number_argument(key)
