"""PyTorch's `div` with its `rounding_mode` (None, "trunc" or "floor"), its aliases `divide` and
`true_divide`, and their in-place forms, composed from `/`, floor_divide (tracer/ops.py) and trunc
(tracer/math_functions.py).

As PyTorch's: without a rounding mode it is `/` (integers divide to float); "trunc" rounds toward
zero and "floor" toward minus infinity, integers staying integers (through float64, exact while
|x| < 2**52, as `//`), and an integer division by zero raises eagerly (PyTorch's
"ZeroDivisionError"; under `@tr.trace` its result is undefined, as `//`'s). A rounded float
quotient requires grad where an operand does, with a zero gradient (PyTorch's backward gives zeros,
also for an infinite or nan cotangent, where `g * 0` would give nan).
"""
from __future__ import annotations

from tracer.ir import types as irtypes
from tracer.arithmetic import where
from tracer.creation import zeros_like
from tracer.dispatch import as_tensor, promote
from tracer.errors import ArgumentError
from tracer.function import NativeFunction
from tracer.math_functions import trunc
from tracer.ops import floor_divide, is_eager_int_zero
from tracer.tensor import Tensor

ROUNDING_MODES = (None, "trunc", "floor")


class _RoundedQuotient(NativeFunction):
    """A float quotient rounded toward zero or minus infinity, whose gradient is zero."""

    @staticmethod
    def forward(ctx, x, y, rounding_mode):
        if rounding_mode == "floor":
            return floor_divide(x, y)
        return trunc(x / y)

    @staticmethod
    def backward(ctx, grad_output):
        return zeros_like(grad_output), zeros_like(grad_output), None


def _integer_trunc(x: Tensor, y: Tensor) -> Tensor:
    if is_eager_int_zero(y):
        raise ArgumentError("integer division by zero (ZeroDivisionError in PyTorch)")
    # (float64 division is exact enough to truncate while |x| < 2**52, as floor_divide's)
    quotient = x.to(irtypes.float64) / y.to(irtypes.float64)
    return where(quotient < 0, -(-quotient).floor(), quotient.floor()).to(x.dtype)


def div(x, other, *, rounding_mode: str | None = None) -> Tensor:
    """x / other; with rounding_mode="trunc" rounded toward zero, "floor" toward minus infinity
    (integer operands then give an integer result)."""
    if rounding_mode not in ROUNDING_MODES:
        raise ArgumentError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' "
                            f"but found {rounding_mode!r}")
    if rounding_mode is None:
        return as_tensor(x) / other
    x, other = promote(x, other)
    if x.dtype == irtypes.bool_:
        raise ArgumentError(f"div with rounding_mode={rounding_mode!r} is not defined on bool "
                            f"tensors (as in PyTorch); convert them with .long()")
    if irtypes.is_float(x.dtype):
        result = _RoundedQuotient.apply(x, other, rounding_mode)
    elif rounding_mode == "floor":
        result = floor_divide(x, other)
    else:
        result = _integer_trunc(x, other)
    result._weak = x._weak and other._weak
    return result


def div_(x: Tensor, other, *, rounding_mode: str | None = None) -> Tensor:
    return x._assign(div(x, other, rounding_mode=rounding_mode), "div_")


def true_divide(x, other) -> Tensor:
    """x / other (PyTorch's alias of div without a rounding mode)."""
    return div(x, other)


def true_divide_(x: Tensor, other) -> Tensor:
    return x._assign(div(x, other), "true_divide_")


METHODS = {"div": div, "divide": div, "true_divide": true_divide}
for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)
Tensor.div_ = Tensor.divide_ = div_
Tensor.true_divide_ = true_divide_

FUNCTIONS = dict(METHODS)
