"""median and nanmedian: the lower median (the element at position (n - 1) // 2 of the sorted
row), as PyTorch's, from sort's stable order (tracer/sorting.py: NaN after every number, so
traced it costs what sort costs, quadratic in the row's length).

median of a row holding NaN is NaN, at the row's first NaN (PyTorch's); nanmedian takes the
median of the numbers alone. Along a dimension the result is (values, indices), the values the
input at the indices, so the gradient goes to the selected element; of the whole tensor, the
gradient is shared evenly among the elements equal to the median (PyTorch's
evenly_distribute_backward). Which of several equal elements is the selected one is not part of
PyTorch's contract (its quickselect picks one); here it is the stable sort's, which is the same
in the cases tests/test_api_arcs_scans_medians.py compares.
"""
from __future__ import annotations

import builtins
import math
from collections import namedtuple

from tracer.ir import types as irtypes
from tracer.arithmetic import where
from tracer.creation import zeros
from tracer.derivatives import EvenlyDistributed
from tracer.dimensions import as_dim, normalize_dim
from tracer.errors import ShapeMismatchError
from tracer.layout import fresh
from tracer.tensor import Tensor

MedianResult = namedtuple("median", ["values", "indices"])


def _median_indices(x: Tensor, axis: int, ignore_nan: builtins.bool) -> Tensor:
    """The index along `axis` of each row's median (the dimension kept, of size 1)."""
    size = x.shape[axis]
    if size == 0:
        raise ShapeMismatchError(f"median: dimension {axis} has no elements (shape "
                                 f"{list(x.shape)}); PyTorch refuses it too")
    order = x.detach().sort(axis).indices
    nans = (x != x).to(order.dtype).sum(axis, keepdim=True)
    if ignore_nan:
        numbers = size - nans
        position = where(numbers > 0, numbers - 1, 0) // 2
    else:
        position = where(nans > 0, size - nans, (size - 1) // 2)  # the first NaN, or the median
    return order.take_along_dim(position, axis)


class _WholeMedian(EvenlyDistributed):
    """The median of all elements (of none, PyTorch's NaN, whose gradient is empty); the
    gradient evenly among the elements equal to it. Both x and the result are saved, as PyTorch
    saves them: changing either in place before the backward is refused, empty or not."""

    @staticmethod
    def forward(ctx, x, ignore_nan):
        flat = x.reshape(-1)
        if flat.numel() == 0:
            result = fresh(flat.sum() * math.nan)
        else:
            result = fresh(flat.take_along_dim(_median_indices(flat, 0, ignore_nan), 0).reshape(()))
        ctx.save_for_backward(x, result)
        return result


def _median(x: Tensor, dim, keepdim: builtins.bool, ignore_nan: builtins.bool):
    if dim is None:
        return _WholeMedian.apply(x, ignore_nan)
    axis = normalize_dim(as_dim(dim), x.ndim)
    if x.ndim == 0:
        return MedianResult(x.clone(), zeros((), dtype=irtypes.int64))
    indices = _median_indices(x, axis, ignore_nan)
    values = x.take_along_dim(indices, axis)
    if not keepdim:
        values, indices = values.squeeze(axis), indices.squeeze(axis)
    return MedianResult(fresh(values), fresh(indices))


def median(x: Tensor, dim=None, keepdim: builtins.bool = False):
    """The lower median of all elements, or (values, indices) along `dim`."""
    return _median(x, dim, keepdim, False)


def nanmedian(x: Tensor, dim=None, keepdim: builtins.bool = False):
    """median ignoring NaN (NaN where a row holds nothing else)."""
    return _median(x, dim, keepdim, True)


METHODS = {"median": median, "nanmedian": nanmedian}
for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)
FUNCTIONS = dict(METHODS)
