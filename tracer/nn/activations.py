"""PyTorch's activation functions beyond relu, gelu and silu, as compositions of tensor operations.

Where the composition's own gradient differs from PyTorch's -- at a kink (hardswish at -3 and 3),
at nan, or where an intermediate overflows that the result does not (mish's exp at x = 100 in
float32, whose autodiff gives inf / inf) -- a NativeFunction computes the value as PyTorch's kernel
does and the gradient by PyTorch's backward formula, written in tensor operations so that a second
derivative follows it. A branch that a `where` does not take is fed a harmless input (0) when its
derivative could overflow there: its gradient is 0 times that derivative, nan if it is inf.
"""
from __future__ import annotations

import builtins

import numpy as np

from tracer import derivatives
from tracer.arithmetic import where
from tracer.dimensions import normalize_dim
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.function import NativeFunction
from tracer.tensor import Tensor

# SELU's constants, as PyTorch's (from the paper, to double precision)
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _assigned(input: Tensor, result: Tensor, inplace: builtins.bool) -> Tensor:
    return input.copy_(result) if inplace else result


def leaky_relu(input: Tensor, negative_slope: float = 0.01,
               inplace: builtins.bool = False) -> Tensor:
    """x where x > 0, else negative_slope * x; the gradient at 0 and at nan is negative_slope, as
    PyTorch's."""
    return _assigned(input, where(input > 0, input, input * negative_slope), inplace)


class _Elu(NativeFunction):
    """PyTorch's elu kernel: alpha * scale * expm1(x * input_scale) where x <= 0, else x * scale
    (nan takes the linear side); its gradient elu_backward's, from exp (the gradient of expm1 from
    its result, result + 1, is 0 where expm1 rounds to -1: celu's at x = -88.7 in float32)."""

    @staticmethod
    def forward(ctx, x, alpha, scale, input_scale):
        ctx.save_for_backward(x)
        ctx.options = alpha, scale, input_scale
        return where(x <= 0, (x * input_scale).expm1() * (alpha * scale), x * scale)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        alpha, scale, input_scale = ctx.options
        # x < 0 inside exp: the second derivative at 0 is PyTorch's elu_double_backward's 0
        exponential = (where(x < 0, x, 0.0) * input_scale).exp()
        slope = where(x <= 0, exponential * (input_scale * alpha * scale), scale)
        return grad_output * slope, None, None, None


def _elu(input: Tensor, alpha: float, scale: float, input_scale: float) -> Tensor:
    return _Elu.apply(input, alpha, scale, input_scale)


def elu(input: Tensor, alpha: float = 1.0, inplace: builtins.bool = False) -> Tensor:
    return _assigned(input, _elu(input, alpha, 1.0, 1.0), inplace)


def selu(input: Tensor, inplace: builtins.bool = False) -> Tensor:
    return _assigned(input, _elu(input, SELU_ALPHA, SELU_SCALE, 1.0), inplace)


def celu(input: Tensor, alpha: float = 1.0, inplace: builtins.bool = False) -> Tensor:
    if alpha == 0:
        raise ArgumentError("celu: alpha cannot be 0 (the input is divided by it)")
    return _assigned(input, _elu(input, alpha, 1.0, 1.0 / alpha), inplace)


class _Mish(NativeFunction):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x.exp().log1p().tanh()  # PyTorch's: softplus without its threshold

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        sigmoid_x = derivatives.sigmoid(x)
        tanh_softplus = x.exp().log1p().tanh()
        # mish_backward (nan at ±inf, where x * 0 is nan, as PyTorch's)
        return grad_output * (tanh_softplus + x * sigmoid_x * (1.0 - tanh_softplus * tanh_softplus))


def mish(input: Tensor, inplace: builtins.bool = False) -> Tensor:
    return _assigned(input, _Mish.apply(input), inplace)


class _Hardswish(NativeFunction):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * (x + 3.0).clamp(0.0, 6.0) / 6.0

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        # hardswish_backward: 0 up to -3 (inclusive), x/3 + 1/2 below 3, then 1 (also at nan);
        # the 0 is chosen, not a product (PyTorch's kernel: 0 there even for a nan gradient)
        slope = where(x < 3.0, x / 3.0 + 0.5, 1.0)
        return where(x <= -3.0, 0.0, grad_output * slope)


def hardswish(input: Tensor, inplace: builtins.bool = False) -> Tensor:
    return _assigned(input, _Hardswish.apply(input), inplace)


# PyTorch's hardsigmoid_backward multiplies by 1/6 rounded to float32 (a float literal), in float64 too
_ONE_SIXTH_FLOAT32 = float(np.float32(1.0 / 6.0))


class _Hardsigmoid(NativeFunction):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x + 3.0).clamp(0.0, 6.0) / 6.0

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        # strictly between -3 and 3 only (0 at nan), and 0 outside even for a nan gradient (chosen,
        # as PyTorch's kernel does, not multiplied)
        return where((x > -3.0) & (x < 3.0), grad_output * _ONE_SIXTH_FLOAT32, 0.0)


def hardsigmoid(input: Tensor, inplace: builtins.bool = False) -> Tensor:
    return _assigned(input, _Hardsigmoid.apply(input), inplace)


class _LogSigmoid(NativeFunction):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        # min(x, 0) - log1p(exp(-|x|)): no exp overflows, for any x
        return where(x < 0, x, 0.0) - (-x.abs()).exp().log1p()

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        negative = x < 0
        # exp(-|x|), with -|x| as where(x < 0, x, -x): its derivative at 0 is -1, not abs's 0, so
        # that the second derivative at 0 is PyTorch's -sigmoid(x) * (1 - sigmoid(x))
        ratio = where(negative, x, -x).exp()
        ratio = ratio / (1.0 + ratio)
        # log_sigmoid_backward: 1 - ratio below 0, ratio from 0 on (nan at nan)
        return grad_output * where(negative, 1.0 - ratio, ratio)


def logsigmoid(input: Tensor) -> Tensor:
    return _LogSigmoid.apply(input)


def softsign(input: Tensor) -> Tensor:
    return input / (input.abs() + 1)  # PyTorch's own composition


def tanhshrink(input: Tensor) -> Tensor:
    return input - input.tanh()


def threshold(input: Tensor, threshold: float, value: float,
              inplace: builtins.bool = False) -> Tensor:
    """`value` where x <= threshold, else x (nan stays nan, with gradient 1, as PyTorch's)."""
    return _assigned(input, where(input <= threshold, value, input), inplace)


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """The first half of `input` along `dim` times the sigmoid of the second half."""
    if input.ndim == 0:
        raise ShapeMismatchError("glu does not take a 0-d tensor: it halves a dimension")
    axis = normalize_dim(dim, input.ndim)
    if input.shape[axis] % 2:
        raise ShapeMismatchError(f"glu halves dimension {axis}, which has an odd size "
                                 f"{input.shape[axis]}")
    # (halves by narrow: chunk gives one chunk of a dimension of size 0, where PyTorch's glu gives
    # an empty result; found by the long differential run)
    half = input.shape[axis] // 2
    first, second = input.narrow(axis, 0, half), input.narrow(axis, half, half)
    return first * derivatives.sigmoid(second)


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """x where x > 0, else weight * x, with one weight or one per channel (dimension 1)."""
    if input.ndim == 0:
        raise ShapeMismatchError("prelu does not take a 0-d input")
    channels = input.shape[1] if input.ndim >= 2 else 1
    if weight.numel() not in (1, channels):
        raise ShapeMismatchError(f"prelu: {weight.numel()} weights for an input of {channels} "
                                 f"channels; pass 1 or one per channel (dimension 1)")
    if weight.numel() > 1:
        weight = weight.reshape((channels,) + (1,) * (input.ndim - 2))
    positive = input > 0
    # (x fed to the weight's side is 0 where unused: its gradient 0 * inf would be nan at x = inf)
    return where(positive, input, weight * where(positive, 0.0, input))

