"""Creation functions: `tr.tensor`, `tr.from_numpy`, `tr.zeros`, `tr.full`, `tr.randn`, `tr.arange`,
... and the numpy generator `tr.manual_seed` seeds."""
from __future__ import annotations

import builtins
import math
import numbers
from typing import Sequence

import numpy as np

from tracer.context import state
from tracer.dimensions import shape_arguments
from tracer.dispatch import apply, constant, from_data, leaf
from tracer.dtypes import WEAK_OF_CATEGORY, as_dtype, float32, int64, scalar_category
from tracer.errors import ArgumentError, TracingError
from tracer.tensor import Tensor

# The generator of tr.randn/tr.rand, made on first use: importing numpy.random takes about as long
# as importing the rest of the tracer.
_seeded: list = []  # [the generator], once made


def manual_seed(seed: int) -> None:
    _seeded[:] = [np.random.default_rng(seed)]


def _generator() -> np.random.Generator:
    if not _seeded:
        manual_seed(0)
    return _seeded[0]


def tensor(data, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    """A new tensor holding a copy of `data` (nested lists, numbers or a numpy array)."""
    if isinstance(data, Tensor):
        data = data._eager_array("tr.tensor(tensor)")
    return from_data(data, dtype, requires_grad)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with `array` (in-place changes show through both)."""
    if not isinstance(array, np.ndarray):
        raise ArgumentError(f"from_numpy needs a numpy array, got {type(array).__name__}")
    as_dtype(array.dtype)
    return leaf(array, False)


def as_tensor(data, dtype=None) -> Tensor:
    """PyTorch's `torch.as_tensor`: a numpy array of the dtype asked for is shared (as
    `from_numpy`), a Tensor of it returned as it is; anything else is converted (a copy)."""
    if isinstance(data, Tensor):
        return data if dtype is None or as_dtype(dtype) == data.dtype else data.to(dtype)
    if isinstance(data, np.ndarray) and (dtype is None or as_dtype(dtype) == data.dtype):
        return from_numpy(data)
    return tensor(data, dtype)


class CreationMethods:
    """`Tensor.new(data)`: PyTorch's legacy constructor, a tensor of `data` with this tensor's
    dtype, as custom Functions that compute in numpy use it (`input.new(result)`). Its other form,
    `new(*sizes)`, is PyTorch's `new_empty`. The `new_*` methods make tensors of this tensor's
    dtype unless told otherwise (new_empty's values are zeros here)."""

    def new(self, data) -> Tensor:
        return tensor(data, self.dtype)

    def new_tensor(self, data, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
        return tensor(data, dtype or self.dtype, requires_grad)

    def new_full(self, size, fill_value, dtype=None, requires_grad: builtins.bool = False
                 ) -> Tensor:
        return full(tuple(shape_arguments((size,))), fill_value, dtype=dtype or self.dtype,
                    requires_grad=requires_grad)

    def new_zeros(self, *size, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
        return self.new_full(shape_arguments(size), 0, dtype, requires_grad)

    def new_ones(self, *size, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
        return self.new_full(shape_arguments(size), 1, dtype, requires_grad)

    new_empty = new_zeros


def full(*shape, fill_value=None, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    """`full(size, fill_value)` as in PyTorch (size a tuple or list), or `full(*size,
    fill_value=...)`."""
    if fill_value is None:
        if len(shape) != 2 or not isinstance(shape[0], (tuple, list)):
            raise ArgumentError("full takes a size (a tuple or list) and a fill value: "
                                "tr.full((2, 3), 1.5)")
        shape, fill_value = shape
    shape = shape_arguments(shape)
    dtype = as_dtype(dtype or (float32 if isinstance(fill_value, float) else
                                       WEAK_OF_CATEGORY[scalar_category(fill_value)]))
    if state.trace is not None:
        value = constant(fill_value, dtype).expand(*shape) if shape else constant(fill_value, dtype)
        return Tensor._make(value._handle, state.trace, requires_grad, leaf=True)
    return leaf(np.full(shape, fill_value, dtype), requires_grad)


def zeros(*shape, dtype=float32, requires_grad: builtins.bool = False) -> Tensor:
    return full(*shape, fill_value=0, dtype=dtype, requires_grad=requires_grad)


def ones(*shape, dtype=float32, requires_grad: builtins.bool = False) -> Tensor:
    return full(*shape, fill_value=1, dtype=dtype, requires_grad=requires_grad)


def full_like(x: Tensor, fill_value, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    return full(*x.shape, fill_value=fill_value, dtype=dtype or x.dtype, requires_grad=requires_grad)


def zeros_like(x: Tensor, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    return full_like(x, 0, dtype, requires_grad)


def ones_like(x: Tensor, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    return full_like(x, 1, dtype, requires_grad)


def empty_like(x: Tensor, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    """A tensor of x's shape; PyTorch leaves its values undefined, here they are zeros."""
    return full_like(x, 0, dtype, requires_grad)


def eager_generator(kind: str) -> np.random.Generator:
    """The generator `tr.manual_seed` seeds, for `kind` (a function name) outside a trace."""
    if state.trace is not None:
        raise TracingError(f"tr.{kind} inside a traced function would give the same numbers on "
                           f"every call; make the random tensor outside and pass it as an argument")
    return _generator()


def iota(shape: Sequence[int], dimension: int, dtype=int64) -> Tensor:
    """The index along `dimension`, broadcast to `shape`."""
    return apply("iota", [], shape=tuple(shape), dimension=dimension, dtype=dtype)


def arange(start, end=None, step=1, *, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    """PyTorch's arange: start, start + step, ... below `end` (`arange(end)` from 0); the bounds
    numbers or 0-d tensors. int64 when every bound is an integer, else float32, unless `dtype`
    says otherwise; an integer dtype truncates the bounds first, as PyTorch does. A float range is
    start + i * step in float64, rounded once (PyTorch's vectorized kernel may round a few
    elements otherwise)."""
    if end is None:
        start, end = 0, start
    start, end, step = (_range_bound(b, n) for b, n in ((start, "start"), (end, "end"),
                                                        (step, "step")))
    integers = all(isinstance(b, int) for b in (start, end, step))
    dtype = as_dtype(dtype) if dtype is not None else int64 if integers else float32
    if dtype.kind == "b":
        raise ArgumentError("arange makes no bool ranges (neither does PyTorch's)")
    if dtype.kind in "iu":
        start, end, step = int(start), int(end), int(step)
    if step == 0:
        raise ArgumentError("arange: step must not be zero")
    if (end - start) * step < 0:  # as PyTorch, which refuses where numpy gives an empty range
        raise ArgumentError(f"arange({start}, {end}, {step}): the step goes away from the end; "
                            f"use a step of the other sign")
    if dtype.kind in "iu":
        result = iota((-(-(end - start) // step),), 0, int64)
        result = (result if (start, step) == (0, 1) else result * step + start).to(dtype)
    else:
        length = int(np.ceil((end - start) / step))
        result = (iota((length,), 0, np.dtype(np.float64)) * float(step) + float(start)).to(dtype)
    return result.requires_grad_(requires_grad) if requires_grad else result


def _range_bound(bound, name: str) -> builtins.int | builtins.float:
    """A bound of arange as a Python number: a 0-d tensor's value (a traced one becomes static),
    a numpy scalar's; finite."""
    if isinstance(bound, Tensor) and bound.ndim == 0:
        bound = bound.item()
    if isinstance(bound, builtins.bool) or not isinstance(bound, numbers.Real):
        raise ArgumentError(f"arange: {name} must be a number or a 0-d tensor, got "
                            f"{type(bound).__name__}")
    if isinstance(bound, numbers.Integral):
        return builtins.int(bound)
    if not math.isfinite(bound):
        raise ArgumentError(f"arange: {name} must be finite, got {bound}")
    return builtins.float(bound)
