"""Functions whose gradient is PyTorch's formula (derivatives.yaml, FunctionsManual.cpp) rather
than the autodiff of their composition.

Differentiated step by step, a composition passes its gradient through every intermediate, and
an intermediate that overflows where the result does not turns the gradient into nan: sigmoid as
1 / (1 + exp(-x)) at x = -100 has exp(100) = inf in float32 and a gradient 0 * inf = nan, where
PyTorch's sigmoid_backward, grad * (1 - y) * y from the saved result, gives 0. So do the branch
not taken by a `where` (its gradient 0 times an infinite factor) and a power at 0 whose exponent
is below 1. Each Function here computes its value as before and its gradient by PyTorch's formula,
with NaN exactly where PyTorch's has NaN; tests/test_extreme_inputs.py checks each against
PyTorch at ±0, subnormals, ±inf, nan and the overflow thresholds, eagerly, traced and in the
reference interpreter.
"""
from __future__ import annotations

import builtins
import math
import numbers

import numpy as np

from tracer.ir import types as irtypes
from tracer.ir.vjp import SGN
from tracer.dimensions import normalize_dims
from tracer.dispatch import apply, as_tensor, promote
from tracer.function import NativeFunction
from tracer.layout import fresh
from tracer.symbolic_zeros import zero_kept
from tracer.tensor import Tensor


def _where(condition: Tensor, x, y) -> Tensor:
    # (tracer.arithmetic's `where`, which imports this module, for a tensor and a number)
    return apply("select", [condition, *promote(x, y)])


class _Sigmoid(NativeFunction):
    @staticmethod
    def forward(ctx, x):
        result = 1.0 / (1.0 + (-x).exp())  # 0 where exp(-x) overflows, as PyTorch's
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * (1.0 - result) * result  # sigmoid_backward


def sigmoid(x: Tensor) -> Tensor:
    return _Sigmoid.apply(x)


# The Python-number exponents whose power, or its gradient, PyTorch's pow(Tensor, Scalar) computes
# by sqrt or 1 / sqrt (x ** 1.5's gradient is 1.5 * sqrt(x)); for every other exponent PyTorch's
# value and gradient are the pow primitive's and its VJP's.
ROOT_POWERS = frozenset({0.5, -0.5, 1.5})


def power_value(x: Tensor, exponent: float) -> Tensor:
    """x ** exponent for a Python number, as PyTorch's pow(Tensor, Scalar) computes it: ±0.5 are
    sqrt and 1 / sqrt (so (-0) ** -0.5 = -inf and (-inf) ** ±0.5 = nan, where C99's pow gives
    +inf, and +inf or 0), every other exponent the pow primitive."""
    if exponent == 0.5:
        return x.sqrt()
    if exponent == -0.5:
        return 1.0 / x.sqrt()
    return apply("pow", [x, as_tensor(exponent, x.dtype)])


class _ScalarPower(NativeFunction):
    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, exponent):
        ctx.save_for_backward(x)
        ctx.exponent = exponent
        return power_value(x, exponent)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        if ctx.exponent == 0:
            return grad_output * 0.0, None
        # pow_backward: grad * (exponent * x ** (exponent - 1)), that power PyTorch's too
        return grad_output * (power_value(x, ctx.exponent - 1) * ctx.exponent), None


def scalar_power(x: Tensor, exponent: float) -> Tensor:
    """A float tensor to the power of one of ROOT_POWERS, with PyTorch's value and gradient."""
    return _ScalarPower.apply(x, float(exponent))


def reduced(kept: Tensor, axes, keepdim: builtins.bool) -> Tensor:
    """A reduction's result with the dimensions `axes` kept (`keepdim`) or dropped: a tensor of its
    own either way, not a view-copy of the kept one (an in-place change of it is a change of the
    result, as in PyTorch)."""
    if keepdim:
        return kept
    return fresh(kept.reshape(tuple(d for i, d in enumerate(kept.shape) if i not in axes)))


class _LogSumExp(NativeFunction):
    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, axes, keepdim):
        # around the maximum so that exp cannot overflow; an infinite maximum (all -inf, or some
        # +inf) is not subtracted, as in PyTorch; over an empty dimension (no maximum) the shift
        # is 0 and the result log(0) = -inf, as in PyTorch
        shift = apply("reduce_max", [x], axes=axes)._keep(axes, x.shape) if x.numel() else (
            x.sum(axes, keepdim=True))
        shift = _where(shift.abs() == float("inf"), 0.0, shift)
        kept = (x - shift).exp().sum(axes, keepdim=True).log() + shift
        # the result it returns is the one saved, as PyTorch saves it: at second order it stands
        # for the output and its own gradient is followed, and changing it in place before the
        # backward is refused
        result = reduced(kept, axes, keepdim)
        ctx.save_for_backward(x, result)
        ctx.kept_shape = kept.shape
        return result

    @staticmethod
    def backward(ctx, grad_output):
        x, result = ctx.saved_tensors
        kept = result.reshape(ctx.kept_shape)
        # logsumexp_backward: grad * exp(x - result), 0 where the result is +inf and x finite
        return grad_output.reshape(kept.shape) * (x - kept).exp(), None, None


def logsumexp(x: Tensor, dim, keepdim: builtins.bool = False) -> Tensor:
    """log(sum(exp(x))) over `dim`, computed around the maximum (see _LogSumExp)."""
    if not irtypes.is_float(x.dtype):
        x = x.to(irtypes.float32)
    axes = normalize_dims(dim, x.ndim)
    if not axes:
        return _LogSumExp.apply(x.reshape((1,) + x.shape), (0,), False)
    return _LogSumExp.apply(x, axes, keepdim)


class EvenlyDistributed(NativeFunction):
    """max() or min() of all elements: the gradient shared evenly between the elements equal to
    the result, and a nan result's between the nans (evenly_distribute_backward)."""

    @staticmethod
    def forward(ctx, x, reduction):
        result = apply(reduction, [x], axes=tuple(range(x.ndim)))
        ctx.save_for_backward(x, result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        x, result = ctx.saved_tensors
        hit = (x == result) | ((x != x) & (result != result))
        # (PyTorch's CPU formula puts the shares into zeros: 0 elsewhere even for a nan gradient,
        # where mask * share would give 0 * nan)
        return _where(hit, grad_output / hit.to(x.dtype).sum(), 0.0), None


def evenly_distributed(x: Tensor, reduction: str) -> Tensor:
    return EvenlyDistributed.apply(x, reduction)


class _Selected(NativeFunction):
    """The one element of each row along `axis` that `chosen` marks, exactly (a nan, -0.0 and
    ±inf as they are: a sum of the row with the others set to 0 turned -0.0 into +0.0), with
    its gradient to that element alone -- the values of max(dim), min(dim) and max pooling,
    whose indices pick the element. No gather: nothing to check, so the loop vectorizes."""

    @staticmethod
    def forward(ctx, x, chosen, axis):
        lowest = -math.inf if irtypes.is_float(x.dtype) else int(np.iinfo(x.dtype).min)
        ctx.save_for_backward(chosen)
        ctx.axis = axis
        return apply("reduce_max", [_where(chosen, x, lowest)], axes=(axis,))

    @staticmethod
    def backward(ctx, grad_output):
        (chosen,) = ctx.saved_tensors
        return gradient_to(chosen, grad_output, ctx.axis), None, None


def gradient_to(chosen: Tensor, grad: Tensor, axis: int) -> Tensor:
    """`grad` of a reduction along `axis` sent to the elements `chosen` marks, 0 elsewhere."""
    return _where(chosen, grad.unsqueeze(axis), 0.0)


def selected(x: Tensor, chosen: Tensor, axis: int) -> Tensor:
    """x's element marked by the boolean `chosen` (exactly one per row along `axis`), the axis
    reduced away; its gradient goes to that element alone."""
    return _Selected.apply(x, chosen, axis)


def safe_sqrt(squares: Tensor) -> Tensor:
    """sqrt whose gradient at 0 is 0 (PyTorch's norm backward), not inf * 0 = nan."""
    zero = squares == 0
    return _where(zero, 0.0, _where(zero, 1.0, squares).sqrt())


def two_norm(x: Tensor, dim, keepdim: builtins.bool) -> Tensor:
    """The 2-norm over `dim`, with PyTorch's norm_backward's gradient at 0 and of a symbolic zero
    (a product, which keeps one, where `where` and sqrt's rule would not)."""
    return zero_kept(safe_sqrt((x * x).sum(dim, keepdim=keepdim)), x)


def sgn(x: Tensor) -> Tensor:
    """sign(x): PyTorch's sgn of a real tensor, whose gradient is a symbolic zero where sign's is
    zeros (they differ where a nan or an infinity lies further back on the gradient's path)."""
    if not irtypes.is_float(x.dtype):
        return x.sign()
    # (even where x does not require grad: in a traced custom backward, differentiated later, it
    # may yet)
    return apply("custom_vjp", [x.sign(), x], num_outputs=1, rule=SGN)


class _PowerNorm(NativeFunction):
    """The p-norm for p other than 0 and 2, with norm_backward's gradient for that p."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, p, dim, keepdim):
        axes = normalize_dims(dim, x.ndim)
        magnitude = x.abs()
        if p == float("inf"):
            norm = apply("reduce_max", [magnitude], axes=axes) if axes else magnitude
        elif p == float("-inf"):
            norm = apply("reduce_min", [magnitude], axes=axes) if axes else magnitude
        elif p == 1:
            norm = magnitude.sum(axes)
        else:
            norm = power_value(power_value(magnitude, p).sum(axes), 1.0 / p)
        kept = norm._keep(axes, x.shape)
        result = reduced(kept, axes, keepdim)
        ctx.save_for_backward(x, result)  # the output (see _LogSumExp)
        ctx.p, ctx.axes, ctx.kept_shape = p, axes, kept.shape
        return result

    @staticmethod
    def backward(ctx, grad_output):
        x, norm = ctx.saved_tensors
        norm = norm.reshape(ctx.kept_shape)
        p, axes = ctx.p, ctx.axes
        grad = grad_output.reshape(norm.shape)
        sign = sgn(x)  # as PyTorch's norm_backward
        if p == 1:
            return sign * grad, None, None, None
        if p in (float("inf"), float("-inf")):
            magnitude = x.abs()
            mask = ((magnitude == norm) | (magnitude != magnitude)).to(x.dtype)
            count = mask.sum(axes, keepdim=True) if axes else mask
            return sign * ((grad / count) * mask), None, None, None
        if p < 1:
            scaled = sign * _where(x == 0, 0.0, power_value(x.abs(), p - 1))
            return scaled * grad * power_value(norm, 1 - p), None, None, None
        scaled = sign * power_value(x.abs(), p - 1) if p < 2 else x * power_value(x.abs(), p - 2)
        scale = _where(norm == 0, 0.0, grad / power_value(norm, p - 1))
        return scaled * scale, None, None, None


def power_norm(x: Tensor, p, dim, keepdim: builtins.bool) -> Tensor:
    return _PowerNorm.apply(x, float(p), dim, keepdim)


class _Lerp(NativeFunction):
    """lerp with a tensor weight, from the nearer end (exact at weight 1) as PyTorch computes it;
    the gradient is PyTorch's, not the autodiff of `where`, whose branch not taken would give
    0 * inf = nan at an infinite weight."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, end, weight):
        ctx.save_for_backward(x, end, weight)
        return _where(weight.abs() < 0.5, x + weight * (end - x), end - (end - x) * (1 - weight))

    @staticmethod
    def backward(ctx, grad_output):
        x, end, weight = ctx.saved_tensors
        return grad_output * (1 - weight), grad_output * weight, grad_output * (end - x)


def lerp(x: Tensor, end, weight) -> Tensor:
    """x + weight * (end - x), computed from the nearer end as PyTorch does (exact at weight 1)."""
    if isinstance(weight, numbers.Number) and not isinstance(weight, Tensor):
        # (PyTorch's backward of it is products, which keep a symbolic zero; neg would not)
        if abs(weight) < 0.5:
            return zero_kept(x + weight * (end - x), x, end)
        return zero_kept(end - (end - x) * (1 - weight), x, end)
    x, end, weight = promote(x, end, weight)
    return _Lerp.apply(x, end, weight)


class _AddCDiv(NativeFunction):
    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, tensor1, tensor2, value):
        ctx.save_for_backward(tensor1, tensor2)
        ctx.value = value
        return x + (tensor1 * value) / tensor2  # PyTorch's order of operations

    @staticmethod
    def backward(ctx, grad_output):
        tensor1, tensor2, value = *ctx.saved_tensors, ctx.value
        return (grad_output, grad_output * (value / tensor2),
                -grad_output * (value * tensor1 / (tensor2 * tensor2)), None)


def addcdiv(x: Tensor, tensor1, tensor2, value=1) -> Tensor:
    """x + value * tensor1 / tensor2, with PyTorch's gradients."""
    x, tensor1, tensor2 = promote(x, tensor1, tensor2)
    return _AddCDiv.apply(x, tensor1, tensor2, value)


class _SiLU(NativeFunction):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * (1.0 / (1.0 + (-x).exp()))

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        sigmoid_x = sigmoid(x)  # from x, so that a second derivative follows it
        # silu_backward: finite at a large x, where x * (1 - sigmoid) is 0 (not x * grad = inf, times 0)
        return grad_output * (sigmoid_x * (1 + x * (1 - sigmoid_x)))


def silu(x: Tensor) -> Tensor:
    return _SiLU.apply(x)


_GELU_BETA = math.sqrt(2.0 / math.pi)  # PyTorch's kBeta of the tanh form
_GELU_KAPPA = 0.044715
_NORMAL_DENSITY = 1.0 / math.sqrt(2.0 * math.pi)  # kBeta of the erf form


class _Gelu(NativeFunction):
    """gelu's value as before, its gradient PyTorch's gelu_backward: dy * (cdf + x * pdf), and
    for the tanh form its product in PyTorch's order, which stays finite where the composition's
    autodiff multiplies the upstream gradient 0.5 * x * dy (inf at a large x) by 0."""

    @staticmethod
    def forward(ctx, x, approximate):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        if approximate == "tanh":
            inner = _GELU_BETA * (x + _GELU_KAPPA * (x * x * x))
            return 0.5 * x * (1.0 + inner.tanh())
        # x/2 * erfc(-x/sqrt 2): accurate where 1 + erf(x/sqrt 2) would cancel
        return 0.5 * x * (x * -math.sqrt(0.5)).erfc()

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        if ctx.approximate == "tanh":
            square = x * x
            tanh_inner = (_GELU_BETA * (x + _GELU_KAPPA * (square * x))).tanh()
            left_derivative = 0.5 * (1.0 + tanh_inner)
            inner_derivative = _GELU_BETA * (1.0 + 3.0 * _GELU_KAPPA * square)
            right_derivative = 0.5 * x * (1.0 - tanh_inner * tanh_inner) * inner_derivative
            return grad_output * (left_derivative + right_derivative), None
        cdf = 0.5 * (x * -math.sqrt(0.5)).erfc()
        pdf = _NORMAL_DENSITY * (x * x * -0.5).exp()
        return grad_output * (cdf + x * pdf), None


def gelu(x: Tensor, approximate: str) -> Tensor:
    return _Gelu.apply(x, approximate)
