"""sort, argsort and topk: the stable sort (PyTorch's `stable=True`, which `stable=False` may
also return), NaN above every number (first when descending), as in PyTorch.

The sorted positions are integers, off the gradient path. Eagerly they are numpy's stable
argsort. Traced, each element's rank is the count of elements that come before it -- ordered by
value, then by position, so every key is distinct -- and a scatter puts each position at its
rank: a graph of a dozen primitives whatever the size, compiled in about a second, whose work is
quadratic in the length of the sorted dimension (fine for topk over classes and rows of
thousands; a bitonic network, n log^2 n work, took 37 s to compile for 1000 elements). The values
returned are the input gathered at the sorted positions, so their gradient is the gather's (each
gradient goes back to the position it came from).
"""
from __future__ import annotations

import builtins
from collections import namedtuple

import numpy as np

from tracer.ir import types as irtypes
from tracer.context import state
from tracer.creation import iota, zeros
from tracer.dimensions import as_dim, normalize_dim
from tracer.dispatch import apply, constant, leaf
from tracer.dtypes import int64
from tracer.errors import ShapeMismatchError
from tracer.layout import fresh
from tracer.tensor import Tensor

SortResult = namedtuple("sort", ["values", "indices"])
TopkResult = namedtuple("topk", ["values", "indices"])


def _comes_first(value, position, other_value, other_position,
                 descending: builtins.bool) -> Tensor:
    """Whether (value, position) comes before (other_value, other_position) in the order."""
    better = value > other_value if descending else value < other_value
    equal = value == other_value
    if irtypes.is_float(value.dtype):
        nan, other_nan = value != value, other_value != other_value
        better = better | ((nan & ~other_nan) if descending else (other_nan & ~nan))
        equal = equal | (nan & other_nan)
    return better | (equal & (position < other_position))


def _ranked_positions(columns: Tensor, descending: builtins.bool) -> Tensor:
    """The positions along the first dimension of the 2-d `columns` that sort each column."""
    count, width = columns.shape
    values = columns.detach()
    if values.dtype == irtypes.bool_:
        values = values.to(int64)
    positions = iota((count, width), 0)
    # [j, i]: whether element j comes before element i; summed over j, the rank of i
    before = _comes_first(values.reshape(count, 1, width), positions.reshape(count, 1, width),
                          values.reshape(1, count, width), positions.reshape(1, count, width),
                          descending)
    ranks = before.to(int64).sum(0)
    return apply("scatter", [zeros(count, width, dtype=int64), positions, ranks,
                             iota((count, width), 1)], axes=(0, 1), accumulate=False)


def _argsort_numpy(columns: np.ndarray, descending: builtins.bool) -> np.ndarray:
    """numpy's stable argsort along the first dimension, in PyTorch's order of NaN."""
    if columns.dtype == np.bool_:
        columns = columns.astype(np.int64)
    if not descending:
        return np.argsort(columns, axis=0, kind="stable")  # NaN last, as PyTorch's
    if columns.dtype.kind != "f":
        return np.argsort(~columns, axis=0, kind="stable")  # ~x = -x - 1 reverses, exactly
    nan = np.isnan(columns)
    # NaN first, then the numbers from the largest; lexsort is stable, its last key primary
    return np.lexsort((-np.where(nan, 0, columns), ~nan), axis=0)


def _sort(x: Tensor, dim, descending: builtins.bool) -> SortResult:
    if x.ndim == 0:
        normalize_dim(as_dim(dim), 0)
        return SortResult(x.clone(), constant(0, int64))
    axis = normalize_dim(as_dim(dim), x.ndim)
    order = [axis] + [d for d in range(x.ndim) if d != axis]
    moved = x.permute(*order)
    count = x.shape[axis]
    if count <= 1 or x.numel() == 0:
        positions = iota(moved.shape, 0)
    else:
        columns = moved.reshape(count, x.numel() // count)
        if state.trace is None and x._trace is None:
            array = _argsort_numpy(columns._eager_array("sort"), descending)
            positions = leaf(array.reshape(moved.shape), False)
        else:
            positions = _ranked_positions(columns, descending).reshape(moved.shape)
    indices = fresh(positions.permute(*np.argsort(order).tolist()))
    return SortResult(x.take_along_dim(indices, axis), indices)


class SortingMethods:
    """Tensor's sort, argsort and topk (given to Tensor by tracer/methods.py)."""

    def sort(self, dim: int = -1, descending: builtins.bool = False, *,
             stable: builtins.bool = False) -> SortResult:
        """(values, indices) sorted along `dim`; the sort is always stable here."""
        return _sort(self, dim, descending)

    def argsort(self, dim: int = -1, descending: builtins.bool = False, *,
                stable: builtins.bool = False) -> Tensor:
        return _sort(self, dim, descending).indices

    def topk(self, k: int, dim: int = -1, largest: builtins.bool = True,
             sorted: builtins.bool = True) -> TopkResult:
        """The k largest (smallest, without `largest`) along `dim`, in order (also when
        `sorted=False`, which leaves the order to the implementation)."""
        axis = normalize_dim(as_dim(dim), self.ndim)
        size = self.shape[axis] if self.ndim else 1
        if not isinstance(k, int) or isinstance(k, builtins.bool) or not 0 <= k <= size:
            raise ShapeMismatchError(f"topk: k={k!r} is not between 0 and the size {size} of "
                                     f"dimension {axis}")
        values, indices = _sort(self, axis, largest)
        if self.ndim == 0:
            return TopkResult(values, indices)
        key = (slice(None),) * axis + (slice(0, k),)
        return TopkResult(fresh(values[key]), fresh(indices[key]))
