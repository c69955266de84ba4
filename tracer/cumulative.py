"""cumsum, cumprod and prod, with PyTorch's gradients (also where the input holds zeros).

The scans are Hillis and Steele's: log2(n) steps, step k combining each element with the one 2^k
before it (a slice and a pad of the whole tensor, no primitive of their own). That is O(n log n)
work in primitives that fuse and vectorize, where a triangular matrix product would be O(n^2)
(for a row of 10^6: 1.6 ms per cumsum compiled, about PyTorch's time; the measurement is
tests/test_cumulative.py's docstring). prod halves the row log2(n) times (O(n) work). float32
scans run in float64 and are rounded once, as PyTorch's accumulate float32 in double.

The gradients are PyTorch's (FunctionsManual.cpp), chosen the way it chooses them: prod's
g * result / x where the input has no zero, otherwise the products of all the other elements
(exclusive scans from both ends); cumprod's reversed cumsum of g * result divided by x where the
input has no zero, otherwise its formula for the elements before and at the first zero of a row.
That last one is right to first order only, so a backward that builds a graph (create_graph)
takes the products of all the other elements there instead, as PyTorch's.
"""
from __future__ import annotations

import builtins

from tracer.ir import types as irtypes
from tracer.arithmetic import where
from tracer.context import state
from tracer.creation import full, iota
from tracer.dimensions import as_dim, normalize_dim
from tracer.dispatch import apply
from tracer.dtypes import as_dtype, float64, int64
from tracer.function import Function
from tracer.functional import cat
from tracer.layout import fresh
from tracer.tensor import Tensor


def _shifted(x: Tensor, axis: int, step: int, reverse: bool) -> Tensor:
    """x moved `step` places along `axis` (toward the end, or the start if `reverse`), the
    vacated places zero."""
    size = x.shape[axis]
    starts = [0] * x.ndim
    stops = list(x.shape)
    if reverse:
        starts[axis] = step
    else:
        stops[axis] = size - step
    part = apply("slice", [x], starts=tuple(starts), stops=tuple(stops), steps=(1,) * x.ndim)
    low, high = [0] * x.ndim, [0] * x.ndim
    (high if reverse else low)[axis] = step
    return apply("pad", [part], low=tuple(low), high=tuple(high), interior=(0,) * x.ndim)


def _scan(values: tuple, axis: int, combine, reverse: bool = False) -> tuple:
    """The inclusive scan of `values` (a tuple of tensors) along `axis` under `combine(later,
    earlier, has_earlier)`, which must be associative."""
    size = values[0].shape[axis]
    position = iota(values[0].shape, axis)
    step = 1
    while step < size:
        earlier = tuple(_shifted(v, axis, step, reverse) for v in values)
        has_earlier = position < size - step if reverse else position >= step
        values = combine(values, earlier, has_earlier)
        step *= 2
    return values


def _sum(later, earlier, has_earlier):
    return (later[0] + earlier[0],)


def _product(later, earlier, has_earlier):
    return (where(has_earlier, later[0] * earlier[0], later[0]),)


def _affine(later, earlier, has_earlier):
    """(a, b) stands for s -> b + a s, a later step's applied after an earlier one's."""
    (a, b), (a_before, b_before) = later, earlier
    return (where(has_earlier, a * a_before, a), where(has_earlier, b + a * b_before, b))


def _in_accumulator(x: Tensor, function) -> Tensor:
    """function(x) computed in float64 for float32 x (PyTorch's accumulator), rounded once."""
    if x.dtype == irtypes.float32:
        return function(x.to(float64)).to(x.dtype)
    return function(x)


def _integral(x: Tensor, dtype) -> Tensor:
    """x in `dtype`, or in int64 if it is an integer or bool tensor (as PyTorch's sums)."""
    if dtype is not None:
        return x.to(as_dtype(dtype))
    return x if irtypes.is_float(x.dtype) else x.to(int64)


def cumulative_sum(x: Tensor, axis: int, reverse: bool = False) -> Tensor:
    return _in_accumulator(x, lambda v: _scan((v,), axis, _sum, reverse)[0])


def cumulative_product(x: Tensor, axis: int, reverse: bool = False) -> Tensor:
    return _in_accumulator(x, lambda v: _scan((v,), axis, _product, reverse)[0])


def _exclusive(scan: Tensor, axis: int, reverse: bool) -> Tensor:
    """An inclusive product scan made exclusive: moved one place, 1 where nothing came before."""
    position = iota(scan.shape, axis)
    first = position == (scan.shape[axis] - 1 if reverse else 0)
    return where(first, 1.0, _shifted(scan, axis, 1, reverse))


def products_of_the_others(x: Tensor, axis: int) -> Tensor:
    """The product of all elements but each one along `axis` (no division: zeros are fine)."""
    return (_exclusive(cumulative_product(x, axis), axis, False)
            * _exclusive(cumulative_product(x, axis, reverse=True), axis, True))


class _CumulativeProduct(Function):
    @staticmethod
    def forward(ctx, x, axis):
        result = cumulative_product(x, axis)
        ctx.save_for_backward(x, result)
        ctx.axis = axis
        return result

    @staticmethod
    def backward(ctx, grad_output):
        x, result = ctx.saved_tensors
        axis = ctx.axis
        if x.shape[axis] <= 1:
            return grad_output, None
        if state.creating_graph:
            # PyTorch's quotient where no element is zero, else the product of the elements
            # before i times s_i = g_i + x_(i+1) s_(i+1): no masks that a second derivative
            # would miss, and no division by zero in the branch not taken (whose derivative,
            # times 0, would be nan)
            any_zero = (x == 0).any()
            simple = (cumulative_sum(result * grad_output, axis, reverse=True)
                      / where(any_zero, 1.0, x))
            _, after = _scan((_shifted(x, axis, 1, reverse=True), grad_output), axis, _affine,
                             reverse=True)
            others = _exclusive(cumulative_product(x, axis), axis, False) * after
            return where(any_zero, others, simple), None
        zeros_so_far = cumulative_sum((x == 0).to(int64), axis)
        before_zero = zeros_so_far == 0
        simple = cumulative_sum(where(before_zero, result * grad_output, 0.0), axis,
                                reverse=True) / x
        position = iota(x.shape, axis)
        up_to_second = zeros_so_far == 1
        first_zero = position == where(up_to_second, position, x.shape[axis]).amin(axis, True)
        between = up_to_second & ~first_zero
        at_zero = (cumulative_product(where(between, x, 1.0), axis)
                   * where(up_to_second, grad_output, 0.0)).sum(axis, keepdim=True)
        at_zero = at_zero * _halving_product(where(before_zero, x, 1.0), axis)
        return where(before_zero, simple, where(first_zero, at_zero, 0.0)), None


def _part(x: Tensor, axis: int, start: int, length: int) -> Tensor:
    starts, stops = [0] * x.ndim, list(x.shape)
    starts[axis], stops[axis] = start, start + length
    return apply("slice", [x], starts=tuple(starts), stops=tuple(stops), steps=(1,) * x.ndim)


def _halving_product(x: Tensor, axis: int) -> Tensor:
    """The product along `axis`, kept as a dimension of 1: the row's halves multiplied, until
    one element is left (the middle one of an odd row joins the next round)."""
    if x.shape[axis] == 0:
        return full(x.shape[:axis] + (1,) + x.shape[axis + 1:], fill_value=1, dtype=x.dtype)
    while x.shape[axis] > 1:
        size = x.shape[axis]
        half = size // 2
        product = _part(x, axis, 0, half) * _part(x, axis, size - half, half)
        x = cat([product, _part(x, axis, half, 1)], axis) if size % 2 else product
    return x


class _Product(Function):
    """The product along `axis` (kept as a dimension of 1); `whole`: of the whole tensor,
    flattened, whose gradient PyTorch makes 0 where two or more elements are 0."""

    @staticmethod
    def forward(ctx, x, axis, whole):
        result = _in_accumulator(x, lambda v: _halving_product(v, axis))
        ctx.save_for_backward(x, result)
        ctx.axis, ctx.whole = axis, whole
        return result

    @staticmethod
    def backward(ctx, grad_output):
        x, result = ctx.saved_tensors
        zeros = (x == 0).to(int64).sum()
        simple = grad_output * (result / where(zeros > 0, 1.0, x))  # (see _CumulativeProduct)
        others = grad_output * products_of_the_others(x, ctx.axis)
        if ctx.whole and not state.creating_graph:
            others = where(zeros > 1, 0.0, others)
        return where(zeros == 0, simple, others), None, None


def _axis(x: Tensor, dim) -> int:
    return normalize_dim(as_dim(dim), x.ndim)


def cumsum(x: Tensor, dim, *, dtype=None) -> Tensor:
    """The running sum along `dim` (integers and bools in int64, as PyTorch's)."""
    axis = _axis(x, dim)
    x = _integral(x, dtype)
    if x.ndim == 0:
        return x.clone()
    return cumulative_sum(x, axis)


def cumprod(x: Tensor, dim, *, dtype=None) -> Tensor:
    """The running product along `dim`, with PyTorch's gradient (see the module docstring)."""
    axis = _axis(x, dim)
    x = _integral(x, dtype)
    if x.ndim == 0:
        return x.clone()
    if not irtypes.is_float(x.dtype):
        return cumulative_product(x, axis)
    return _CumulativeProduct.apply(x, axis)


def prod(x: Tensor, dim=None, keepdim: builtins.bool = False, *, dtype=None) -> Tensor:
    """The product of all elements, or along `dim` (one dimension, as PyTorch's)."""
    axis = None if dim is None else _axis(x, dim)
    x = _integral(x, dtype)
    if x.ndim == 0:
        return x.clone()
    if axis is None:
        flat = x.reshape(-1)
        result = (_Product.apply(flat, 0, True) if irtypes.is_float(x.dtype)
                  else _halving_product(flat, 0))
        return result.reshape(())
    result = (_Product.apply(x, axis, False) if irtypes.is_float(x.dtype)
              else _halving_product(x, axis))
    return fresh(result if keepdim else result.squeeze(axis))


METHODS = {"cumsum": cumsum, "cumprod": cumprod, "prod": prod}
for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)
for _name in ("cumsum", "cumprod"):
    setattr(Tensor, _name + "_", lambda self, dim, *, _name=_name, dtype=None: self._assign(
        getattr(self, _name)(dim, dtype=dtype), _name + "_"))
FUNCTIONS = dict(METHODS)
