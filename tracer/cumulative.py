"""cumsum, cumprod and prod, with PyTorch's gradients (also where the input holds zeros).

The scans are blocked: left to right within blocks of 16 elements (slices of the row, so that a
row of up to 16 is combined in PyTorch's order, overflow and underflow included), the blocks'
totals scanned the same way one level up, then combined into their blocks: O(n) work in
primitives that fuse, no primitive of their own. Measured (`@tr.trace`, one thread each,
medians of 9, 2026-11-26): cumsum of 1e6 float64 in 3.8 ms against PyTorch's 1.0 ms, of
1000 x 1000 along dim 1 4.0 ms against 1.0, along dim 0 3.6 against 8.9; Hillis and Steele's
scan (log2(n) passes of slices and pads over the whole tensor) took 75 ms for the first, and a
triangular matrix product would be O(n^2). A sequential scan primitive would close the gap
along the last axis, at the cost of a kernel kind of its own. Eagerly each is about 80 ms
(numpy on the slices). prod folds its row the same way. float32 runs in float64 and is
rounded once, as PyTorch accumulates float32 in double.

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
from tracer.derivatives import reduced
from tracer.dispatch import apply
from tracer.dtypes import as_dtype, float64, int64
from tracer.function import NativeFunction
from tracer.functional import cat
from tracer.tensor import Tensor


def _shifted(x: Tensor, axis: int, step: int, reverse: bool) -> Tensor:
    """x moved `step` places along `axis` (toward the end, or the start if `reverse`), the
    vacated places zero (all of them if `step` is the size or more: an empty axis stays empty)."""
    size = x.shape[axis]
    step = min(step, size)
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


BLOCK = 16


def _sequential(values: tuple, axis: int, combine, reverse: bool) -> tuple:
    """The inclusive scan along `axis` (of at most BLOCK elements) one element after another."""
    size = values[0].shape[axis]
    order = range(size - 1, -1, -1) if reverse else range(size)
    running, results = None, []
    for index in order:
        element = tuple(_part(v, axis, index, 1) for v in values)
        running = element if running is None else combine(running, element)
        results.append(running)
    if reverse:
        results.reverse()
    return tuple(cat([r[k] for r in results], axis) for k in range(len(values)))


def _scan(values: tuple, axis: int, combine, identity: tuple, reverse: bool = False) -> tuple:
    """The inclusive scan of `values` (a tuple of tensors) along `axis` (from the end if
    `reverse`) under `combine(earlier, later)`, which is associative with `identity`: left to
    right within blocks of BLOCK elements (all of a row of up to BLOCK, as PyTorch's loop), the
    blocks' totals scanned the same way, one level up, and combined into their blocks."""
    size = values[0].shape[axis]
    if size <= BLOCK:
        return (_sequential(values, axis, combine, reverse) if size
                else tuple(v.clone() for v in values))
    blocks = -(-size // BLOCK)
    low, high = [0] * values[0].ndim, [0] * values[0].ndim
    (low if reverse else high)[axis] = blocks * BLOCK - size  # (after the elements, in order)
    padding = dict(low=tuple(low), high=tuple(high), interior=(0,) * len(low))
    shape = values[0].shape[:axis] + (blocks, BLOCK) + values[0].shape[axis + 1:]
    rows = tuple(apply("pad", [v], **padding).reshape(shape) for v in values)
    within = _sequential(rows, axis + 1, combine, reverse)
    totals = tuple(_part(v, axis + 1, 0 if reverse else BLOCK - 1, 1) for v in within)
    totals = _scan(totals, axis, combine, identity, reverse)
    first = iota(totals[0].shape, axis) == (blocks - 1 if reverse else 0)
    before = tuple(where(first, start, _shifted(v, axis, 1, reverse))
                   for v, start in zip(totals, identity))
    combined = combine(before, within)
    return tuple(_part(v.reshape(v.shape[:axis] + (blocks * BLOCK,) + v.shape[axis + 2:]), axis,
                       low[axis], size) for v in combined)


def _sum(earlier, later):
    return (earlier[0] + later[0],)


def _product(earlier, later):
    return (earlier[0] * later[0],)


def _affine(earlier, later):
    """(a, b) stands for s -> b + a s; the later map applied to the earlier one's result."""
    (a_before, b_before), (a, b) = earlier, later
    return (a * a_before, b + a * b_before)


def _in_accumulator(x: Tensor, function) -> Tensor:
    """function(x) computed in float64 for float32 x (PyTorch's accumulator), rounded once."""
    if x.dtype == irtypes.float32:
        return function(x.to(float64)).to(x.dtype)
    return function(x)


def _result_dtype(x: Tensor, dtype):
    """`dtype`, or x's, or int64 for an integer or bool x (as PyTorch's sums and products)."""
    if dtype is not None:
        return as_dtype(dtype)
    return x.dtype if irtypes.is_float(x.dtype) else int64


def cumulative_sum(x: Tensor, axis: int, reverse: bool = False) -> Tensor:
    return _in_accumulator(x, lambda v: _scan((v,), axis, _sum, (0,), reverse)[0])


def cumulative_product(x: Tensor, axis: int, reverse: bool = False) -> Tensor:
    return _in_accumulator(x, lambda v: _scan((v,), axis, _product, (1,), reverse)[0])


def _exclusive(scan: Tensor, axis: int, reverse: bool) -> Tensor:
    """An inclusive product scan made exclusive: moved one place, 1 where nothing came before."""
    position = iota(scan.shape, axis)
    first = position == (scan.shape[axis] - 1 if reverse else 0)
    return where(first, 1.0, _shifted(scan, axis, 1, reverse))


def products_of_the_others(x: Tensor, axis: int) -> Tensor:
    """The product of all elements but each one along `axis` (no division: zeros are fine)."""
    return (_exclusive(cumulative_product(x, axis), axis, False)
            * _exclusive(cumulative_product(x, axis, reverse=True), axis, True))


class _CumulativeSum(NativeFunction):
    """cumsum of x in `dtype`; the gradient the reversed cumsum of the cotangent in x's dtype,
    as PyTorch's cumsum_backward (not in `dtype`: cumsum(x, dtype=float32) of a float64 x).
    `scalar`: x is a 0-d tensor's one element, the result 0-d."""

    @staticmethod
    def forward(ctx, x, axis, dtype, scalar):
        ctx.axis, ctx.dtype, ctx.shape = axis, x.dtype, x.shape
        return reduced(cumulative_sum(x.to(dtype), axis), (0,), not scalar)

    @staticmethod
    def backward(ctx, grad_output):
        grad_output = grad_output.reshape(ctx.shape)
        return (cumulative_sum(grad_output.to(ctx.dtype), ctx.axis, reverse=True),
                None, None, None)


class _CumulativeProduct(NativeFunction):
    """cumprod of x in `dtype`; the gradient PyTorch's cumprod_backward, in x's dtype.
    `scalar`: x is a 0-d tensor's one element, the result 0-d (the one saved, as PyTorch saves
    it: changing it in place before the backward is refused)."""

    @staticmethod
    def forward(ctx, x, axis, dtype, scalar):
        result = reduced(cumulative_product(x.to(dtype), axis), (0,), not scalar)
        ctx.save_for_backward(x, result)
        ctx.axis = axis
        return result

    @staticmethod
    def backward(ctx, grad_output):
        x, result = ctx.saved_tensors
        grad_output = grad_output.reshape(x.shape).to(x.dtype)
        result = result.reshape(x.shape).to(x.dtype)
        axis = ctx.axis
        if x.shape[axis] <= 1:
            return grad_output, None, None, None
        if state.creating_graph:
            # PyTorch's quotient where no element is zero, else the product of the elements
            # before i times s_i = g_i + x_(i+1) s_(i+1): no masks that a second derivative
            # would miss, and no division by zero in the branch not taken (whose derivative,
            # times 0, would be nan)
            any_zero = (x == 0).any()
            simple = (cumulative_sum(result * grad_output, axis, reverse=True)
                      / where(any_zero, 1.0, x))
            _, after = _scan((_shifted(x, axis, 1, reverse=True), grad_output), axis, _affine,
                             (1, 0), reverse=True)
            others = _exclusive(cumulative_product(x, axis), axis, False) * after
            return where(any_zero, others, simple), None, None, None
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
        at_zero = at_zero * _folded_product(where(before_zero, x, 1.0), axis)
        return where(before_zero, simple, where(first_zero, at_zero, 0.0)), None, None, None


def _part(x: Tensor, axis: int, start: int, length: int) -> Tensor:
    starts, stops = [0] * x.ndim, list(x.shape)
    starts[axis], stops[axis] = start, start + length
    return apply("slice", [x], starts=tuple(starts), stops=tuple(stops), steps=(1,) * x.ndim)


def _folded_product(x: Tensor, axis: int) -> Tensor:
    """The product along `axis`, kept as a dimension of 1: left to right within blocks of BLOCK
    elements (a row of up to BLOCK as PyTorch's loop), then the blocks' products the same way."""
    size = x.shape[axis]
    if size == 0:
        return full(x.shape[:axis] + (1,) + x.shape[axis + 1:], fill_value=1, dtype=x.dtype)
    if size > BLOCK:
        blocks = -(-size // BLOCK)
        high = [0] * x.ndim
        high[axis] = blocks * BLOCK - size
        padded = apply("pad", [x], low=(0,) * x.ndim, high=tuple(high), interior=(0,) * x.ndim)
        padded = where(iota(padded.shape, axis) < size, padded, 1)
        rows = padded.reshape(x.shape[:axis] + (blocks, BLOCK) + x.shape[axis + 1:])
        return _folded_product(_folded_product(rows, axis + 1).squeeze(axis + 1), axis)
    result = _part(x, axis, 0, 1)
    for index in range(1, size):
        result = result * _part(x, axis, index, 1)
    return result


class _Product(NativeFunction):
    """The product along `axis`, its dimension kept with `keepdim`; `whole`: of the whole tensor
    (flattened, a 0-d result), whose gradient PyTorch makes 0 where two or more elements are 0.
    The result returned is the one saved, as PyTorch saves it: changing it in place before the
    backward is refused."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, axis, keepdim, whole):
        kept = _in_accumulator(x, lambda v: _folded_product(v, axis))
        result = reduced(kept, (axis,), keepdim)
        ctx.save_for_backward(x, result)
        ctx.axis, ctx.whole, ctx.kept_shape = axis, whole, kept.shape
        return result

    @staticmethod
    def backward(ctx, grad_output):
        x, result = ctx.saved_tensors
        result, grad_output = result.reshape(ctx.kept_shape), grad_output.reshape(ctx.kept_shape)
        zeros = (x == 0).to(int64).sum()
        simple = grad_output * (result / where(zeros > 0, 1.0, x))  # (see _CumulativeProduct)
        others = grad_output * products_of_the_others(x, ctx.axis)
        if ctx.whole and not state.creating_graph:
            others = where(zeros > 1, 0.0, others)
        return where(zeros == 0, simple, others), None, None, None


def _axis(x: Tensor, dim) -> int:
    return normalize_dim(as_dim(dim), x.ndim)


def _cumulative(function, scan, x: Tensor, dim, dtype) -> Tensor:
    axis = _axis(x, dim)
    target = _result_dtype(x, dtype)
    floats = irtypes.is_float(x.dtype) and irtypes.is_float(target)
    if x.ndim == 0:  # (as one element: cumprod's backward reads it, and refuses its change)
        return function.apply(x.reshape(1), 0, target, True) if floats else x.clone().to(target)
    if floats:
        return function.apply(x, axis, target, False)
    return scan(x.to(target), axis)


def cumsum(x: Tensor, dim, *, dtype=None) -> Tensor:
    """The running sum along `dim` (integers and bools in int64, as PyTorch's)."""
    return _cumulative(_CumulativeSum, cumulative_sum, x, dim, dtype)


def cumprod(x: Tensor, dim, *, dtype=None) -> Tensor:
    """The running product along `dim`, with PyTorch's gradient (see the module docstring)."""
    return _cumulative(_CumulativeProduct, cumulative_product, x, dim, dtype)


def prod(x: Tensor, dim=None, keepdim: builtins.bool = False, *, dtype=None) -> Tensor:
    """The product of all elements, or along `dim` (one dimension, as PyTorch's)."""
    axis = None if dim is None else _axis(x, dim)
    x = x.to(_result_dtype(x, dtype))
    if x.ndim == 0 and not irtypes.is_float(x.dtype):
        return x.clone()
    if not irtypes.is_float(x.dtype):
        kept = _folded_product(x.reshape(-1) if axis is None else x, axis or 0)
        return reduced(kept, (axis or 0,), keepdim and axis is not None)
    if axis is None or x.ndim == 0:  # (a 0-d x as one element: its backward reads it)
        return _Product.apply(x.reshape(-1), 0, False, True)
    return _Product.apply(x, axis, keepdim, False)


METHODS = {"cumsum": cumsum, "cumprod": cumprod, "prod": prod}
for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)
for _name in ("cumsum", "cumprod"):
    setattr(Tensor, _name + "_", lambda self, *args, _name=_name, **kwargs: self._assign(
        getattr(self, _name)(*args, **kwargs), _name + "_"))
FUNCTIONS = dict(METHODS)
