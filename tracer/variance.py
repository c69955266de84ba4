"""The variance and standard deviation (PyTorch's var and std, their corrections and their
gradients, also at second order), and the square root with PyTorch's norm gradient at 0."""
from __future__ import annotations

import builtins

import numpy as np

from tracer.ir import types as irtypes
from tracer.arithmetic import where
from tracer.dimensions import normalize_dims
from tracer.derivatives import safe_sqrt
from tracer.errors import ArgumentError
from tracer.function import NativeFunction
from tracer.tensor import Tensor


def row_mean(x: Tensor, axes: tuple[int, ...]) -> Tensor:
    """The mean over `axes` (kept), exactly the value of a constant row, where sum / count rounds
    (88.7 * 3 / 3 is not 88.7 in float32, 1e4 * 3 / 3 is off by 1e-3) and would leave a
    layer_norm of the row, or its variance, at rounding noise amplified by 1 / sqrt(eps) instead
    of 0 (PyTorch's Welford means are exact there). Its gradient is the mean's, 1 / count each."""
    mean = x.mean(axes, keepdim=True)
    if any(x.shape[a] == 0 for a in axes):
        return mean
    first = x[tuple(slice(0, 1) if i in axes else slice(None) for i in range(x.ndim))].detach()
    constant = ((x != first).to(x.dtype).sum(axes, keepdim=True) == 0) & (mean != first)
    return mean + where(constant, first - mean.detach(), 0.0)


def var(x: Tensor, dim=None, unbiased=None, keepdim: builtins.bool = False, *,
        correction=None) -> Tensor:
    """The variance over `dim` with `correction` (default 1, Bessel's) subtracted from the count;
    `unbiased=False` is correction 0. PyTorch's `x.var(False)` form is accepted too."""
    if isinstance(dim, builtins.bool):  # var(unbiased)
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise ArgumentError("var/std take unbiased= or correction=, not both")
    if correction is None:
        correction = 0 if unbiased is False else 1
    if not irtypes.is_float(x.dtype):
        raise ArgumentError(f"var and std need a float tensor, got {x.dtype}; use .float() first")
    axes = normalize_dims(dim, x.ndim)
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    divisor = count - correction
    if divisor <= 0 and (dim is None or x.ndim == 0):
        return _VarianceWithoutDegreesOfFreedom.apply(x, keepdim)
    squares = _SumOfCenteredSquares.apply(x, axes, keepdim)
    if divisor >= 0:  # (0, as PyTorch: inf or nan, and a nan gradient)
        return squares / divisor
    # A count below the correction: PyTorch's value divides by max(0, divisor) = 0 (inf or nan),
    # its gradient by the divisor itself (var_backward), so the gradient is finite.
    scaled = squares / divisor
    return (squares / 0.0 - scaled).detach() + scaled


class _SumOfCenteredSquares(NativeFunction):
    """sum((x - mean(x))^2) over `axes`. Its gradient is PyTorch's var_backward, 2 g (x - mean):
    the mean's own part is zero in exact arithmetic, and leaving it out keeps the gradient
    finite-or-inf where var's divisor is 0, as PyTorch's, rather than nan. Written with tensor
    operations on x, that backward is differentiated again at second order (the Hessian
    2 (I - 1/n) needs the mean's part there: a constant mean would give 2 I)."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, axes, keepdim):
        ctx.save_for_backward(x)
        ctx.axes, ctx.keepdim = axes, keepdim
        centered = x - row_mean(x, axes)
        return (centered * centered).sum(axes, keepdim=keepdim)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        if not ctx.keepdim:  # back to the reduced dimensions kept, to broadcast over them
            grad_output = grad_output.reshape([1 if a in ctx.axes else d
                                               for a, d in enumerate(x.shape)])
        return 2 * grad_output * (x - row_mean(x, ctx.axes)), None, None


class _VarianceWithoutDegreesOfFreedom(NativeFunction):
    """The variance of all elements (no dim, or a 0-d tensor) whose count is at most the
    correction: PyTorch's value divides by 0 (nan where every element equals the mean, else inf)
    and its var_backward multiplies the gradient by nan where an element equals the mean and by
    inf elsewhere, whatever the sign of its difference (with a dim it divides by the count less
    the correction instead, as `var` above does)."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, keepdim):
        ctx.save_for_backward(x)
        centered = x - x.mean()
        squares = (centered * centered).sum(None, keepdim=keepdim)
        return squares / 0.0

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        factor = where(x == x.mean(), float("nan"), float("inf"))
        return grad_output * factor, None


def std(x: Tensor, dim=None, unbiased=None, keepdim: builtins.bool = False, *,
        correction=None) -> Tensor:
    # (where the variance is 0 the gradient is 0, as PyTorch's, not 0 * inf = nan)
    return safe_sqrt(var(x, dim, unbiased, keepdim, correction=correction))
