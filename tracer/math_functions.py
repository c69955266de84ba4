"""PyTorch's everyday elementwise functions that are compositions of primitives: reciprocal,
clamp_min/clamp_max, trunc/ceil (from floor), fmod (a primitive), sgn, nan_to_num, tan, log2/log10, log1p/expm1 (by
the classic corrections of the rounded 1 + x and exp(x), to a few ulp), the predicates
isnan/isinf/isfinite/isclose, allclose/equal (Python bools, as PyTorch's), the logical functions
on any dtype, and `Tensor.where`. Attached to Tensor as methods and exported as `tr.<name>`.

tan is sin / cos: within 3 ulp of the exact value in float32 over [-1e4, 1e4] (PyTorch's is
within 1; tests/test_api_math_functions.py measures it). log2 and log10 divide the natural log by
the constant and are exact at the powers of the base, where PyTorch's are (a value one ulp off an
integer would make floor(log2(n)) wrong): the result is the rounded power where x is 2**k (a
test of x's mantissa by rounding) or the float nearest 10**k for |k| <= 22 (a table). sinh and cosh are built from exp(|x| / 2) and expm1
(within 4 ulp; finite up to where the exact value overflows, where PyTorch's overflow a little
before it for positive x but not for negative x). The arc functions are in tracer/arc_functions.py.
"""
from __future__ import annotations

import builtins
import math

import numpy as np

from tracer.ir import types as irtypes
from tracer.arithmetic import to_float, where
from tracer.creation import full_like, zeros_like
from tracer.derivatives import sgn
from tracer.dispatch import apply, as_tensor, from_data, promote
from tracer.errors import ArgumentError
from tracer.function import NativeFunction
from tracer.ops import floor, is_eager_int_zero
from tracer.rounding import RoundingMethods
from tracer.symbolic_zeros import zero_kept
from tracer.tensor import Tensor


class _Reciprocal(NativeFunction):
    """1 / x with PyTorch's gradient, -g r^2 of the result r: where r^2 overflows (|x| under
    ~5e-20 in float32) it is ±inf, as PyTorch's, where the quotient rule's -g r / x stayed finite."""

    @staticmethod
    def forward(ctx, x):
        result = 1 / x
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return -grad_output * (result * result)


def reciprocal(x: Tensor) -> Tensor:
    """1 / x (float for integer x, as PyTorch)."""
    return _Reciprocal.apply(to_float(x))


def clamp_min(x: Tensor, min) -> Tensor:
    return x.clamp(min=min)


def clamp_max(x: Tensor, max) -> Tensor:
    return x.clamp(max=max)


class _ToInteger(NativeFunction):
    """floor, ceil (-floor(-x)) or trunc (toward zero; -0.5 gives -0.0, as PyTorch's): a result
    that requires grad where x does, with a zero gradient, as PyTorch's."""

    @staticmethod
    def forward(ctx, x, how):
        if how == "floor":
            return floor(x)
        if how == "ceil":
            return -floor(-x)
        return where(x < 0, -floor(-x), floor(x))

    @staticmethod
    def backward(ctx, grad_output):
        return zeros_like(grad_output), None


def _to_integer(how: str):
    def rounding(x: Tensor) -> Tensor:
        return _ToInteger.apply(x, how) if irtypes.is_float(x.dtype) else x.clone()
    rounding.__name__ = rounding.__qualname__ = how
    return rounding


floor_with_gradient, ceil, trunc = map(_to_integer, ("floor", "ceil", "trunc"))


def fmod(x: Tensor, other) -> Tensor:
    """C's remainder of x / other truncated toward zero (the sign of x; the fmod primitive,
    exact); gradient grad for x and -grad * trunc(x / other) for other, as PyTorch's. Integers:
    the remainder with the divisor's sign (%), moved to x's sign."""
    x, other = promote(x, other)
    if x.dtype == irtypes.bool_:
        raise ArgumentError("fmod is not defined on bool tensors; convert them with .long()")
    if irtypes.is_float(x.dtype):
        result = apply("fmod", [x, other])
    else:
        if is_eager_int_zero(other):
            raise ArgumentError("integer fmod by zero (ZeroDivisionError in PyTorch)")
        floored = x % other
        result = where((floored != 0) & ((floored < 0) != (x < 0)), floored - other, floored)
    result._weak = x._weak and other._weak
    return result


def isnan(x: Tensor) -> Tensor:
    return x != x


def isinf(x: Tensor) -> Tensor:
    if not irtypes.is_float(x.dtype):
        return full_like(x, False, dtype=irtypes.bool_)
    return x.abs() == math.inf


def isfinite(x: Tensor) -> Tensor:
    if not irtypes.is_float(x.dtype):
        return full_like(x, True, dtype=irtypes.bool_)
    return x.abs() < math.inf  # false at nan too


class _NanToNum(NativeFunction):
    """nan, +inf and -inf replaced; PyTorch's gradient grad * isfinite(x), which is nan where x
    is not finite and the incoming gradient is (a select's 0 there hid it)."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, nan, posinf, neginf):
        ctx.save_for_backward(x)
        value = where(x == math.inf, as_tensor(posinf, x.dtype), x)
        value = where(x == -math.inf, as_tensor(neginf, x.dtype), value)
        return where(x != x, as_tensor(nan, x.dtype), value)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * isfinite(x).to(grad_output.dtype), None, None, None


def nan_to_num(x: Tensor, nan: float = 0.0, posinf: float | None = None,
               neginf: float | None = None) -> Tensor:
    """nan, +inf and -inf replaced by `nan`, `posinf` and `neginf` (by default the dtype's largest
    and lowest finite values); the gradient passes where x is finite, as PyTorch's."""
    if not irtypes.is_float(x.dtype):
        return x.clone()
    limits = np.finfo(x.dtype)
    return _NanToNum.apply(x, nan, limits.max if posinf is None else posinf,
                           limits.min if neginf is None else neginf)


def tan(x: Tensor) -> Tensor:
    """sin(x) / cos(x) (within 3 ulp: see the module docstring)."""
    x = to_float(x)
    return zero_kept(x.sin() / x.cos(), x)  # (PyTorch's tan_backward is a product)


# The powers of ten a float of each dtype holds exactly, or nearly (10**-k correctly rounded).
_POWERS_OF_TEN = 22
_TEN_TO_THE = {dtype: np.array([f"1e{k}" for k in range(-_POWERS_OF_TEN, _POWERS_OF_TEN + 1)],
                               dtype=dtype) for dtype in (np.float32, np.float64)}
# x * 2**-(mantissa bits + 1), exact for x at or above this (above it, no underflow)
_EXACT_HALF_ULP_FROM = {irtypes.float32: 2.0 ** -100, irtypes.float64: 2.0 ** -967}


def _is_power_of_two(x: Tensor) -> Tensor:
    """Whether x is 2**k (or 0, or inf): x plus half its ulp at 1 rounds back to x (a tie, to the
    even mantissa 1.0...0) only there; elsewhere the increment is over half an ulp of x."""
    half_ulp = 2.0 ** -(np.finfo(x.dtype).nmant + 1)
    return ((x + x * half_ulp) == x) & ((x >= _EXACT_HALF_ULP_FROM[x.dtype]) | (x == 0))


def _is_power_of_ten(x: Tensor, power: Tensor) -> Tensor:
    """Whether x is the float nearest 10**power, for |power| <= 22 (a table lookup)."""
    table = from_data(_TEN_TO_THE[x.dtype.type])
    inside = isfinite(power) & (power.abs() <= _POWERS_OF_TEN)
    index = (where(inside, power, 0) + _POWERS_OF_TEN).to(irtypes.int64)
    return inside & (apply("gather", [table, index], axes=(0,)) == x)


class _LogarithmOfBase(NativeFunction):
    """log(x) / log(base), and the integer itself where x is a power of the base; gradient
    grad / (x log(base)), as PyTorch's."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, base):
        ctx.save_for_backward(x)
        ctx.base = base
        value = x.log() / math.log(base)
        power = RoundingMethods.round(value)  # inf, nan and -inf (at 0) stay as they are
        exact = _is_power_of_two(x) if base == 2 else _is_power_of_ten(x, power)
        return where(exact, power, value)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output / (x * math.log(ctx.base)), None


def log2(x: Tensor) -> Tensor:
    return _LogarithmOfBase.apply(to_float(x), 2)


def log10(x: Tensor) -> Tensor:
    return _LogarithmOfBase.apply(to_float(x), 10)


class _Log1p(NativeFunction):
    """log(1 + x) accurate for small x: with w = 1 + x rounded, log(w) * (x / (w - 1)) (Goldberg,
    "What every computer scientist should know about floating-point arithmetic", theorem 4: the
    quotient corrects log's argument for the rounding of w), x itself where w rounds to 1, and w
    where it is infinite; gradient grad / (1 + x), as PyTorch's."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        w = 1 + x
        corrected = w.log() * (x / (w - 1))
        return where(w == 1, x, where(w == math.inf, w, corrected))

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output / (x + 1)


class _Expm1(NativeFunction):
    """exp(x) - 1 accurate for small x: with u = exp(x) rounded, (u - 1) * (x / log(u)) (Kahan's;
    the quotient, near 1, cannot overflow), x where u rounds to 1, -1 where u - 1 does, and u where
    it is infinite; gradient PyTorch's grad * (result + 1) (0 where the result rounds to -1)."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        u = x.exp()
        shifted = u - 1
        corrected = shifted * (x / u.log())
        return where(u == 1, x, where((shifted == -1) | (u == math.inf), shifted, corrected))

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * (expm1(x) + 1)


def _half_exponential_halves(x: Tensor) -> tuple[Tensor, Tensor]:
    """exp(|x|) / 2 and exp(-|x|) / 2; where exp(|x|) overflows but cosh does not, the first as
    (e / 2) * e with e = exp(|x| / 2) (exact halving), about 2 ulp where exp(|x|) is 1."""
    magnitude = x.abs()
    direct = magnitude.exp()
    squared = (0.5 * (magnitude * 0.5).exp()) * (magnitude * 0.5).exp()
    return where(direct == math.inf, squared, 0.5 * direct), 0.5 * (-magnitude).exp()


class _Cosh(NativeFunction):
    """exp(|x|) / 2 + exp(-|x|) / 2 (no cancellation); gradient grad * sinh(x)."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        up, down = _half_exponential_halves(x)
        return up + down

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * sinh(x)


class _Sinh(NativeFunction):
    """(expm1(x) - expm1(-x)) / 2 for |x| < 1, where the terms have opposite signs (no
    cancellation); beyond, sign(x) (exp(|x|) / 2 - exp(-|x|) / 2), whose cancellation costs at most
    a factor coth(1) = 1.31; gradient grad * cosh(x)."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        up, down = _half_exponential_halves(x)
        small = (expm1(x) - expm1(-x)) * 0.5
        large = up - down
        return where(x.abs() < 1, small, where(x < 0, -large, large))

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * cosh(x)


def sinh(x: Tensor) -> Tensor:
    return _Sinh.apply(to_float(x))


def cosh(x: Tensor) -> Tensor:
    return _Cosh.apply(to_float(x))


def log1p(x: Tensor) -> Tensor:
    return _Log1p.apply(to_float(x))


def expm1(x: Tensor) -> Tensor:
    return _Expm1.apply(to_float(x))


def _truth(x) -> Tensor:
    x = as_tensor(x)
    return x if x.dtype == irtypes.bool_ else x != 0


def logical_and(x, other) -> Tensor:
    """Elementwise "both non-zero", a bool tensor, for operands of any dtype (as PyTorch)."""
    return _truth(x) & _truth(other)


def logical_or(x, other) -> Tensor:
    return _truth(x) | _truth(other)


def logical_not(x) -> Tensor:
    return ~_truth(x)


def logical_xor(x, other) -> Tensor:
    return _truth(x) != _truth(other)


def _same_dtype(x, other, what: str) -> tuple[Tensor, Tensor]:
    x, other = as_tensor(x), as_tensor(other)
    if x.dtype != other.dtype:
        raise ArgumentError(f"{what} of a {x.dtype} and a {other.dtype} tensor: PyTorch refuses "
                            f"this; convert one with .to(...)")
    return x, other


def isclose(x, other, rtol: float = 1e-05, atol: float = 1e-08,
            equal_nan: builtins.bool = False) -> Tensor:
    """|x - other| <= atol + rtol * |other| elementwise, or equal (infinities), or both nan with
    `equal_nan`; PyTorch's formula, on tensors of one dtype."""
    x, other = _same_dtype(x, other, "isclose")
    close = x == other
    if equal_nan:
        close = close | (isnan(x) & isnan(other))
    if not irtypes.is_float(x.dtype):
        x, other = x.to(irtypes.float64), other.to(irtypes.float64)
    error = (x - other).abs()
    return close | (isfinite(error) & (error <= atol + (rtol * other).abs()))


def allclose(x, other, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: builtins.bool = False) -> builtins.bool:
    """Whether isclose holds everywhere: a Python bool (so not under @tr.trace, which does not
    know the values; use isclose(...).all() there)."""
    return builtins.bool(isclose(x, other, rtol, atol, equal_nan).all())


def equal(x, other) -> builtins.bool:
    """Whether the two tensors have the same shape and equal elements (a Python bool)."""
    x, other = promote(as_tensor(x), as_tensor(other))
    return x.shape == other.shape and builtins.bool((x == other).all())


# Tensor methods, and the names that are also `tr.<name>` functions.
METHODS = {
    "reciprocal": reciprocal, "clamp_min": clamp_min, "clamp_max": clamp_max,
    "floor": floor_with_gradient, "ceil": ceil, "fmod": fmod, "trunc": trunc, "fix": trunc,
    "sgn": sgn, "isnan": isnan, "isinf": isinf, "isfinite": isfinite, "nan_to_num": nan_to_num,
    "tan": tan, "log2": log2, "log10": log10, "log1p": log1p, "expm1": expm1, "sinh": sinh, "cosh": cosh,
    "logical_and": logical_and, "logical_or": logical_or, "logical_not": logical_not,
    "logical_xor": logical_xor, "isclose": isclose, "allclose": allclose, "equal": equal,
}
for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)


def _where_method(self: Tensor, condition, other) -> Tensor:
    """`x.where(condition, other)` is `tr.where(condition, x, other)`."""
    return where(condition, self, other)


_where_method.__name__, _where_method.__qualname__ = "where", "Tensor.where"
Tensor.where = _where_method
for _name in ("reciprocal", "clamp_min", "clamp_max", "floor", "ceil", "trunc", "fix", "fmod",
              "nan_to_num", "tan", "log2", "log10", "log1p", "expm1", "sinh", "cosh", "sgn"):
    setattr(Tensor, _name + "_", lambda self, *args, _name=_name, **kwargs: self._assign(
        getattr(self, _name)(*args, **kwargs), _name + "_"))

FUNCTIONS = dict(METHODS)
