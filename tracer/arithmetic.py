"""Tensor's elementwise operations: arithmetic with PyTorch's promotion, comparisons, logic and
elementwise functions, and `tr.where`."""
from __future__ import annotations

import numbers

from tracer.ir import types as irtypes
from tracer import derivatives
from tracer.context import is_grad_enabled
from tracer.dispatch import apply, as_tensor, promote
from tracer.dtypes import (CATEGORY, DEFAULT_OF_CATEGORY, bool, float32, float64, is_scalar,
                           result_dtype)
from tracer.errors import ArgumentError
from tracer.symbolic_zeros import zero_kept
from tracer.tensor import Tensor


def binary(primitive: str, x, y) -> Tensor:
    x, y = promote(x, y)
    result = apply(primitive, [x, y])
    result._weak = x._weak and y._weak and result.dtype == x.dtype
    return result


def to_float(x: Tensor) -> Tensor:
    return x if irtypes.is_float(x.dtype) else x.to(float64 if x._weak else float32)


def float_binary(primitive: str, x, y) -> Tensor:
    x, y = promote(x, y)
    weak = x._weak
    result = apply(primitive, [to_float(x), to_float(y)])
    result._weak = weak
    return result


def where(condition, x, y) -> Tensor:
    """Elementwise `x` where `condition` holds, else `y` (broadcast together)."""
    condition = as_tensor(condition)
    if condition.dtype != bool:
        raise ArgumentError(f"where needs a bool condition, got {condition.dtype}")
    x, y = promote(x, y)
    if x._weak and condition.ndim:  # Python numbers on both sides: a tensor of the default dtype
        dtype = DEFAULT_OF_CATEGORY[CATEGORY[x.dtype]]
        x, y = x.to(dtype), y.to(dtype)
    result = apply("select", [condition, x, y])
    result._weak = x._weak
    return result


def _scaled(other, alpha):
    """`other * alpha` for add/sub; `alpha` may be a traced Python number (a runtime input), whose
    value is unknown while tracing, so only a literal 1 is skipped."""
    if isinstance(alpha, numbers.Number) and not isinstance(alpha, Tensor) and alpha == 1:
        return other
    return as_tensor(other) * alpha


def _same_weakness(result: Tensor, operand: Tensor) -> Tensor:
    """-s and abs(s) of a Python number passed to a traced function are Python numbers in eager
    mode: they stay weak (they do not widen a float32 tensor)."""
    result._weak = operand._weak
    return result


class ArithmeticMethods:
    """Tensor's elementwise methods and operators (given to Tensor by tracer/methods.py)."""

    def __add__(self, other): return binary("add", self, other)
    def __radd__(self, other): return binary("add", other, self)
    def __sub__(self, other): return binary("sub", self, other)
    def __rsub__(self, other): return binary("sub", other, self)
    def __mul__(self, other): return binary("mul", self, other)
    def __rmul__(self, other): return binary("mul", other, self)
    def __truediv__(self, other): return float_binary("div", self, other)
    def __rtruediv__(self, other): return float_binary("div", other, self)
    def __neg__(self): return _same_weakness(apply("neg", [self]), self)
    def __pos__(self): return self
    def __abs__(self): return self.abs()

    def __pow__(self, exponent):
        if (isinstance(exponent, numbers.Integral) and exponent < 0
                and not irtypes.is_float(self.dtype)):
            raise ArgumentError("integers to negative integer powers are not allowed; use a float "
                                "tensor or exponent")
        if is_scalar(exponent) and not irtypes.is_float(self.dtype) and not isinstance(exponent, int):
            return float_binary("pow", self, exponent)
        if (isinstance(exponent, numbers.Real) and irtypes.is_float(self.dtype)
                and exponent in derivatives.ROOT_POWERS):
            return derivatives.scalar_power(self, exponent)  # PyTorch's sqrt and rsqrt forms
        power = binary("pow", self, exponent)
        # PyTorch's pow(Tensor, Scalar) backward is a product, which keeps a symbolic zero (but
        # is zeros for the exponent 0), its pow(Tensor, Tensor) a where, which does not
        return zero_kept(power, self) if is_scalar(exponent) and exponent != 0 else power

    def __rpow__(self, base):
        return binary("pow", base, self)

    def add(self, other, alpha=1):
        return self + _scaled(other, alpha)

    def sub(self, other, alpha=1):
        return self - _scaled(other, alpha)

    def mul(self, other): return self * other
    def pow(self, exponent): return self ** exponent
    def neg(self): return -self

    # Comparisons and logic.
    def __lt__(self, other): return binary("lt", self, other)
    def __le__(self, other): return binary("le", self, other)
    def __gt__(self, other): return binary("gt", self, other)
    def __ge__(self, other): return binary("ge", self, other)
    def __eq__(self, other): return binary("eq", self, other)
    def __ne__(self, other): return binary("ne", self, other)
    lt, le, gt, ge, eq, ne = __lt__, __le__, __gt__, __ge__, __eq__, __ne__
    # A class body that defines __eq__ gets __hash__ = None; tensors stay hashable by identity.
    __hash__ = object.__hash__

    def _logical(self, primitive, other):
        if self.dtype != bool or as_tensor(other).dtype != bool:
            raise ArgumentError(f"&, | and ~ are defined on bool tensors here, got {self.dtype}")
        return apply(primitive, [self, as_tensor(other)])

    def __and__(self, other): return self._logical("logical_and", other)
    def __or__(self, other): return self._logical("logical_or", other)
    __rand__, __ror__ = __and__, __or__

    def __invert__(self):
        if self.dtype != bool:
            raise ArgumentError(f"~ is defined on bool tensors here, got {self.dtype}")
        return apply("logical_not", [self])

    # Elementwise functions.
    def _unary_float(self, primitive):
        return apply(primitive, [to_float(self)])

    def abs(self): return _same_weakness(apply("abs", [self]), self)
    def sign(self): return apply("sign", [self])
    def exp(self): return self._unary_float("exp")
    def log(self): return self._unary_float("log")
    def sqrt(self): return self._unary_float("sqrt")
    def tanh(self): return self._unary_float("tanh")
    def sin(self): return self._unary_float("sin")
    def cos(self): return self._unary_float("cos")

    def sigmoid(self):
        return derivatives.sigmoid(to_float(self))

    def relu(self):
        # As PyTorch (threshold_backward): no gradient where x <= 0, so nan passes it; nan stays nan
        return where(self <= 0, 0, self)

    def clamp(self, min=None, max=None) -> Tensor:
        if min is None and max is None:
            raise ArgumentError("clamp needs at least one of min= and max=")
        # As PyTorch: the value is min(max(x, min), max) (nan stays nan), and the gradient passes
        # only where min <= x <= max (not at nan, nor anywhere when min > max).
        differentiable = is_grad_enabled() and self.requires_grad
        value = self.detach() if differentiable else self
        if min is not None:
            value = where(value < min, as_tensor(min, result_dtype(self, min)), value)
        if max is not None:
            value = where(value > max, as_tensor(max, result_dtype(value, max)), value)
        if not differentiable:
            return value
        inside = (self >= min) if max is None else (self <= max) if min is None else (
            (self >= min) & (self <= max))
        return where(inside, self, value)

    clip = clamp

    def maximum(self, other): return binary("maximum", self, other)
    def minimum(self, other): return binary("minimum", self, other)
