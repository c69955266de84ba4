"""asin, acos, atan and atan2 (and numpy's arcsin/arccos/arctan/arctan2 names, as PyTorch has
them): fdlibm's algorithms (e_asin.c, e_acos.c, s_atan.c, e_atan2.c) written with the
primitives, in float64; a float32 input is computed in float64 and rounded once, as FreeBSD's
asinf does part of its work in double. Gradients are PyTorch's formulas, in the input's dtype.

Compositions, not primitives, by measurement. Accuracy (tests/test_api_arcs_scans_medians.py,
against 40-digit mpmath over the whole domain): float64 within 0.81 (asin), 0.86 (acos), 0.70
(atan) and 1.0 ulp (atan2), float32 within 0.5 ulp (correctly rounded but for the double
rounding); eager and compiled give the same bits (the kernels' fmul and fadd are not contracted
into fma, numpy's neither), where a primitive's LLVM IR and its numpy reference would each round
their own way. Speed, compiled and fused into one loop (1e6 elements, one thread each, PyTorch
2.13's vectorized Sleef): float64 0.45-0.84x PyTorch's time, float32 1.5-2.3x (computed in
float64: half the lanes); a primitive would run the same polynomial and divisions. The cost is
eager: about 100 primitives per call, 3 ms for 16 elements (PyTorch 2 us), 100 ms for 1e6
(medians of 9 on the 2-core machine, 2026-11-26).

The ranges and constants are fdlibm's. Where fdlibm splits a double into its high and low words,
the split here is Veltkamp's (c = s * (2^27 + 1), hi = c - (c - s)): hi has 26 bits, so hi * hi
is exact, as fdlibm's word with its low half cleared.
"""
from __future__ import annotations

import math

from tracer.ir import types as irtypes
from tracer.arithmetic import to_float, where
from tracer.creation import zeros_like
from tracer.dispatch import promote
from tracer.function import NativeFunction
from tracer.tensor import Tensor

PIO2_HI, PIO2_LO = 1.57079632679489655800e+00, 6.12323399573676603587e-17
PIO4_HI = 7.85398163397448278999e-01
PI_HI, PI_LO = 3.1415926535897931160e+00, 1.2246467991473531772e-16
# asin and acos: R(t) = P(t) / Q(t), asin(x) = x + x * R(x^2) on [0, 0.5]
ASIN_P = (1.66666666666666657415e-01, -3.25565818622400915405e-01, 2.01212532134862925881e-01,
          -4.00555345006794114027e-02, 7.91534994289814532176e-04, 3.47933107596021167570e-05)
ASIN_Q = (1.0, -2.40339491173441421878e+00, 2.02094576023350569471e+00,
          -6.88283971605453293030e-01, 7.70381505559019352791e-02)
# atan on [0, 7/16]: t + t * (t^2 * A(t^2)); beyond, atan(t) = atan(c) + atan((t - c) / (1 + c t))
ATAN_A = (3.33333333333329318027e-01, -1.99999999998764832476e-01, 1.42857142725034663711e-01,
          -1.11111104054623557880e-01, 9.09088713343650656196e-02, -7.69187620504482999495e-02,
          6.66107313738753120669e-02, -5.83357013379057348645e-02, 4.97687799461593236017e-02,
          -3.65315727442169155270e-02, 1.62858201153657823623e-02)
# (from |x|, reduced argument's numerator scale and offset, denominator offset and scale,
# atan(c) as hi + lo): fdlibm's four ranges, c = 0.5, 1, 1.5 and infinity
ATAN_RANGES = ((2.4375, 0.0, -1.0, 0.0, 1.0, 1.57079632679489655800e+00, 6.12323399573676603587e-17),
               (1.1875, 1.0, -1.5, 1.0, 1.5, 9.82793723247329054082e-01, 1.39033110312309984516e-17),
               (0.6875, 1.0, -1.0, 1.0, 1.0, 7.85398163397448278999e-01, 3.06161699786838301793e-17),
               (0.4375, 2.0, -1.0, 2.0, 1.0, 4.63647609000806093515e-01, 2.26987774529616870924e-17))
TINY = 2.0 ** -27  # below it asin(x) and atan(x) round to x (and keep -0.0)
VELTKAMP = 2.0 ** 27 + 1


def _polynomial(coefficients, z: Tensor) -> Tensor:
    result = coefficients[-1] * z + coefficients[-2]
    for coefficient in reversed(coefficients[:-2]):
        result = result * z + coefficient
    return result


def _rational(t: Tensor) -> Tensor:
    """R(t) = t P(t) / Q(t)."""
    return t * _polynomial(ASIN_P, t) / _polynomial(ASIN_Q, t)


def _high_half(s: Tensor) -> Tensor:
    c = s * VELTKAMP
    return c - (c - s)


def _asin(x: Tensor) -> Tensor:
    magnitude = x.abs()
    below_half = magnitude < 0.5
    t = where(below_half, x * x, (1 - magnitude) * 0.5)  # one rational function for both ranges
    r = _rational(t)
    s = t.sqrt()
    near_one = PIO2_HI - (2 * (s + s * r) - PIO2_LO)
    high = _high_half(s)
    correction = (t - high * high) / (s + high)
    middle = PIO4_HI - ((2 * s * r - (PIO2_LO - 2 * correction)) - (PIO4_HI - 2 * high))
    large = where(magnitude >= 0.975, near_one, middle)
    large = where(x < 0, -large, large)
    return where(magnitude < TINY, x, where(below_half, x + x * r, large))


def _acos(x: Tensor) -> Tensor:
    below_half = x.abs() < 0.5
    t = where(below_half, x * x, where(x < 0, 1 + x, 1 - x) * 0.5)
    r = _rational(t)
    s = t.sqrt()
    small = PIO2_HI - (x - (PIO2_LO - x * r))
    negative = PI_HI - 2 * (s + (r * s - PIO2_LO))
    high = _high_half(s)
    positive = 2 * (high + (r * s + (t - high * high) / (s + high)))
    return where(below_half, small, where(x < 0, negative, where(x == 1, 0.0, positive)))


def _atan_of_magnitude(magnitude: Tensor) -> Tensor:
    """atan(|x|) for |x| (nan stays nan: it is in no range)."""
    reduced, high, low = magnitude, zeros_like(magnitude), zeros_like(magnitude)
    for start, scale, offset, denominator, slope, atan_high, atan_low in reversed(ATAN_RANGES):
        inside = magnitude >= start
        numerator = scale * magnitude + offset if scale else offset  # (-1 / |x|: inf too)
        reduced = where(inside, numerator / (denominator + slope * magnitude), reduced)
        high, low = where(inside, atan_high, high), where(inside, atan_low, low)
    z = reduced * reduced
    series = reduced * (z * _polynomial(ATAN_A, z))
    result = high - ((series - low) - reduced)
    return where(magnitude < TINY, magnitude, result)


def _atan(x: Tensor) -> Tensor:
    result = _atan_of_magnitude(x.abs())
    return where(x.abs() < TINY, x, where(x < 0, -result, result))


def _is_negative(x: Tensor) -> Tensor:
    """x < 0, and x is -0.0 (1 / -0.0 is -inf)."""
    return (x < 0) | ((x == 0) & (1 / x < 0))


def _atan2(y: Tensor, x: Tensor) -> Tensor:
    """atan(|y| / |x|) moved to the quadrant of (x, y); 0 for two zeros and pi/4 for two
    infinities, where the quotient is nan; the signs of zeros as C99's atan2."""
    angle = _atan_of_magnitude(y.abs() / x.abs())
    angle = where((y == 0) & (x == 0), 0.0, where((y.abs() == math.inf) & (x.abs() == math.inf),
                                                  PIO4_HI, angle))
    angle = where(_is_negative(x), PI_HI - (angle - PI_LO), angle)
    return where(_is_negative(y), -angle, angle)


def _in_float64(function, *tensors: Tensor) -> Tensor:
    dtype = tensors[0].dtype
    result = function(*(t.to(irtypes.float64) for t in tensors))
    return result.to(dtype)


class _Arc(NativeFunction):
    """asin, acos or atan of x with PyTorch's gradient: g (1 - x^2)^(-1/2), its negation, or
    g / (1 + x^2), computed in x's dtype as PyTorch's."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, name):
        ctx.save_for_backward(x)
        ctx.name = name
        return _in_float64({"asin": _asin, "acos": _acos, "atan": _atan}[name], x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        if ctx.name == "atan":
            return grad_output / (x * x + 1), None
        gradient = grad_output * (-x * x + 1).rsqrt()
        return (-gradient if ctx.name == "acos" else gradient), None


class _Atan2(NativeFunction):
    """atan2(y, x) with PyTorch's gradients: g x / (y^2 + x^2) and -g y / (y^2 + x^2), the
    reciprocal 0 where it is infinite (at the origin, and where y^2 + x^2 underflows)."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, y, x):
        ctx.save_for_backward(y, x)
        return _in_float64(_atan2, y, x)

    @staticmethod
    def backward(ctx, grad_output):
        y, x = ctx.saved_tensors
        reciprocal = 1 / (y * y + x * x)
        reciprocal = where(reciprocal == math.inf, 0.0, reciprocal)
        return grad_output * x * reciprocal, grad_output * -y * reciprocal


def _arc(name: str):
    def arc(x: Tensor) -> Tensor:
        return _Arc.apply(to_float(x), name)
    arc.__name__ = arc.__qualname__ = name
    return arc


asin, acos, atan = map(_arc, ("asin", "acos", "atan"))


def atan2(y: Tensor, x) -> Tensor:
    """The angle of the point (x, y) in (-pi, pi], by the signs of both (PyTorch's atan2)."""
    y, x = promote(y, x)
    result = _Atan2.apply(to_float(y), to_float(x))
    result._weak = y._weak and x._weak
    return result


METHODS = {"asin": asin, "acos": acos, "atan": atan, "atan2": atan2, "arcsin": asin,
           "arccos": acos, "arctan": atan, "arctan2": atan2}
for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)
    setattr(Tensor, _name + "_", lambda self, *args, _name=_name: self._assign(
        getattr(self, _name)(*args), _name + "_"))
FUNCTIONS = dict(METHODS)
