"""PyTorch's everyday tensor functions beyond the core methods (tracer/methods.py), each a
composition of primitives, attached to Tensor as methods (and exported as `tr.<name>` through
FUNCTIONS).

floor has no primitive: it is the float -> int64 -> float round trip (truncation) corrected by
one where the truncation went up, and the value itself where it is already an integer (beyond
2**52 or 2**23, or a zero of either sign), infinite or nan. Float floor_divide and remainder
follow PyTorch's from the exact remainder (the fmod primitive) with its sign conventions (rounding
toward minus infinity; the remainder has the divisor's sign).
"""
from __future__ import annotations

import builtins
import functools
import numbers

import numpy as np

from tracer.ir import types as irtypes
from tracer.context import state
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.function import NativeFunction
from tracer.arithmetic import where
from tracer.creation import full, iota
from tracer.dimensions import normalize_dim
from tracer.dispatch import apply, as_tensor, promote, tensor_operand
from tracer.derivatives import addcdiv, lerp, logsumexp, power_norm, two_norm
from tracer.dtypes import float32
from tracer.reductions import amax, amin
from tracer.tensor import Tensor
from tracer.variance import std, var

# The magnitude from which every float of the dtype is an integer.
_INTEGRAL_FROM = {irtypes.float32: 2.0 ** 23, irtypes.float64: 2.0 ** 52}


def floor(x: Tensor) -> Tensor:
    """The largest integer not above x; its gradient is zero, as in PyTorch."""
    if not irtypes.is_float(x.dtype):
        return x.clone()
    value = x.detach()
    truncated = value.to(irtypes.int64).to(x.dtype)  # in range wherever it is used below
    lowered = truncated - (truncated > value).to(x.dtype)
    # (and zeros, so that -0.0 stays -0.0: the round trip gives +0.0)
    integral = (value.abs() >= _INTEGRAL_FROM[x.dtype]) | (value != value) | (value == 0)
    return where(integral, value, lowered)


def is_eager_int_zero(divisor: Tensor) -> builtins.bool:
    return (state.trace is None and divisor._trace is None
            and builtins.bool((divisor._handle == 0).any()))


def floor_divide(x, y) -> Tensor:
    """Division rounded toward minus infinity (Python's and PyTorch's `//`). Integers divide
    through float64, exact while |x| < 2**52. Floats as PyTorch's div_floor: from the exact
    remainder fmod(x, y), (x - fmod) / y less one where the remainder's sign is not y's, and a
    zero quotient with the sign of x / y."""
    x, y = promote(x, y)
    if irtypes.is_float(x.dtype):
        fraction = apply("fmod", [x, y])
        quotient = (x - fraction) / y
        quotient = where((fraction != 0) & ((y < 0) != (fraction < 0)), quotient - 1, quotient)
        whole = floor(quotient)
        whole = where(quotient - whole > 0.5, whole + 1, whole)
        whole = where(quotient != 0, whole, (x / y) * 0.0)
        return where(y == 0, x / y, whole).detach()
    if x.dtype == irtypes.bool_:
        raise ArgumentError("// is not defined on bool tensors; convert them with .long()")
    if is_eager_int_zero(y):
        raise ArgumentError("integer division by zero (ZeroDivisionError in PyTorch)")
    quotient = floor(x.to(irtypes.float64) / y.to(irtypes.float64)).to(x.dtype)
    quotient._weak = x._weak and y._weak
    return quotient


def remainder(x, y) -> Tensor:
    """The remainder with the divisor's sign (Python's and PyTorch's `%`): floats as PyTorch's,
    fmod(x, y) plus y where the two signs differ; integers x - floor_divide(x, y) * y."""
    x, y = promote(x, y)
    result = _Remainder.apply(x, y) if irtypes.is_float(x.dtype) else x - floor_divide(x, y) * y
    result._weak = x._weak and y._weak
    return result


class _Remainder(NativeFunction):
    """Float remainder: fmod(x, y), plus y where their signs differ; PyTorch's gradient, -grad *
    floor_divide(x, y) for y (nan at an infinite x, where fmod's -grad * trunc(x / y) is inf)."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        fraction = apply("fmod", [x, y])
        return where((fraction != 0) & ((y < 0) != (fraction < 0)), fraction + y, fraction)

    @staticmethod
    def backward(ctx, grad_output):
        x, y = ctx.saved_tensors
        return grad_output, -grad_output * floor_divide(x, y)


class _CountOfNonzeros(NativeFunction):
    """norm(p=0): PyTorch's result requires grad where x does, and its backward gives x no
    gradient (x.grad stays None when nothing else reaches it)."""

    @staticmethod
    def forward(ctx, x, dim, keepdim):
        return (x != 0).to(x.dtype).sum(dim, keepdim=keepdim)

    @staticmethod
    def backward(ctx, grad_output):
        return None, None, None


def norm(x: Tensor, p="fro", dim=None, keepdim: builtins.bool = False) -> Tensor:
    """The vector p-norm over `dim` (all elements by default; "fro" is 2): p = 2, 1, inf, -inf,
    0 (the count of non-zeros) or any other number."""
    if not irtypes.is_float(x.dtype):
        raise ArgumentError(f"norm needs a float tensor, got {x.dtype}")
    if p in ("fro", 2, 2.0):
        return two_norm(x, dim, keepdim)
    if not isinstance(p, numbers.Real):
        raise ArgumentError(f"norm: p must be a number or 'fro', got {p!r}")
    if p == 0:
        return _CountOfNonzeros.apply(x, dim, keepdim)
    return power_norm(x, p, dim, keepdim)


def _triangle(x: Tensor, diagonal: int, lower: builtins.bool) -> Tensor:
    if x.ndim < 2:
        raise ShapeMismatchError(f"tril/triu need a tensor of at least 2 dimensions, got {x.ndim}")
    offset = iota(x.shape, x.ndim - 1) - iota(x.shape, x.ndim - 2)  # column - row
    keep = offset <= diagonal if lower else offset >= diagonal
    return where(keep, x, as_tensor(False if x.dtype == irtypes.bool_ else 0, x.dtype))


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle (at and below the `diagonal`-th diagonal) of the last two dimensions."""
    return _triangle(x, diagonal, lower=True)


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle (at and above the `diagonal`-th diagonal) of the last two dimensions."""
    return _triangle(x, diagonal, lower=False)


def masked_fill(x: Tensor, mask, value) -> Tensor:
    """`value` where `mask` holds, else x; the result keeps x's dtype and shape."""
    mask = tensor_operand(mask, "masked_fill")
    if mask.dtype != irtypes.bool_:
        raise ArgumentError(f"masked_fill needs a bool mask, got {mask.dtype}")
    if isinstance(value, Tensor) and value.ndim:
        raise ArgumentError(f"masked_fill takes a number or a 0-d tensor as the value, got shape "
                            f"{list(value.shape)}")
    result = where(mask, as_tensor(value).to(x.dtype), x)
    if result.shape != x.shape:
        raise ShapeMismatchError(f"masked_fill: a mask of shape {list(mask.shape)} does not "
                                 f"broadcast to the tensor's shape {list(x.shape)}")
    return result


def split(x: Tensor, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Pieces of `split_size_or_sections` elements along `dim` (the last may be smaller), or of
    the listed sizes."""
    axis = normalize_dim(dim, x.ndim)
    size = x.shape[axis]
    if isinstance(split_size_or_sections, numbers.Integral):
        step = int(split_size_or_sections)
        if step <= 0 and size:
            raise ArgumentError(f"split size must be positive, got {step}")
        sizes = [builtins.min(step, size - start) for start in range(0, size, step)] or [0]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if builtins.sum(sizes) != size or builtins.min(sizes, default=0) < 0:
            raise ShapeMismatchError(f"split sizes {sizes} do not add up to dimension {axis}'s "
                                     f"size {size}")
    pieces, start = [], 0
    for length in sizes:
        pieces.append(x[(slice(None),) * axis + (slice(start, start + length),)])
        start += length
    return tuple(pieces)


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """At most `chunks` pieces along `dim`, each of ceil(size / chunks) elements but the last."""
    if chunks <= 0:
        raise ArgumentError(f"chunk needs a positive number of chunks, got {chunks}")
    size = x.shape[normalize_dim(dim, x.ndim)]
    return split(x, builtins.max(1, -(-size // chunks)), dim)


def bmm(x: Tensor, y) -> Tensor:
    """Batched matrix product of two 3-d tensors with the same batch size."""
    y = tensor_operand(y, "bmm")
    if x.ndim != 3 or y.ndim != 3 or x.shape[0] != y.shape[0]:
        raise ShapeMismatchError(f"bmm needs two 3-d tensors with the same batch size, got shapes "
                                 f"{list(x.shape)} and {list(y.shape)}")
    return x.matmul(y)


def addcmul(x: Tensor, tensor1, tensor2, value=1) -> Tensor:
    """x + value * tensor1 * tensor2 (PyTorch's order of operations)."""
    return x + (as_tensor(tensor1) * value) * tensor2


# erfc(z) for z >= 0 is t * exp(-z*z) * Q(t), t = 2 / (2 + z), Q a Chebyshev series in 2t - 1
# interpolating erfcx(z) / t at 25 Chebyshev points (40-digit mpmath). Numerical Recipes' exp(-z*z +
# log Q) made exp wait for the series; apart, a vector loop overlaps them (erf GELU, 2048x768 f32,
# one thread: 3.2 -> 2.5 ms). Relative error of erfc below 2e-14 for z <= 6, then growing with the
# rounding of z*z: below 2e-13 up to 26.5 (tests/test_api_ops.py, against math.erfc and PyTorch).
_ERFC_CHEBYSHEV = (
    0.5770337386164697, 0.3554369212704985, 0.06509515882878653, 0.003671142395836639,
    -0.0011128447433526325, -0.0001607582991537808, 3.278031574173137e-05, 5.442441645505016e-06,
    -1.5154665553171482e-06, -1.4297608181169865e-07, 8.234608827419493e-08,
    -1.2962846852306505e-09, -4.154721631015216e-09, 6.347058278362869e-10, 1.4320822712272344e-10,
    -6.160390105269404e-11, 2.0612138561262002e-12, 3.571493153416955e-12, -8.586423079142867e-13,
    -6.145596767398207e-14, 7.418739779604002e-14, -1.2895933089561225e-14, -2.357193931599317e-15,
    1.577984747318439e-15, -2.6374642592727957e-16)
_TWO_OVER_SQRT_PI = 2.0 / np.sqrt(np.pi)


# float32 needs fewer terms: the coefficients after the first 14 add up to 2.1e-10, and the Taylor
# terms after the 7th to below 1e-9 of the sum (float32's half-ulp is 6e-8 of it). A transformer's
# GELU (erf form) ran 7.7 ms per 1M float32 elements forward with every term.
_TERMS = {"float32": (14, 8), "float64": (len(_ERFC_CHEBYSHEV), 14)}  # (Chebyshev, Taylor)


# The series as a polynomial in y, by term count: evaluated by Estrin's scheme, pairs p_2i +
# p_2i+1 y, then pairs of those with y^2, y^4, ...: chains of about 2 log2(n) operations where
# Clenshaw's recurrence is one of 3n, and half the operations of the Chebyshev form, so that a
# vector loop overlaps elements instead of waiting on each step (GELU over 2048x768 float32 on
# one thread: 6.6 ms with Clenshaw, 4.4 with T_k by doubling, 3.4 with this). Its coefficients stay
# below 0.52, so its rounding is that of the Chebyshev form (max abs error on [-1, 1]: 1.3e-7 in
# float32 with 14 terms, 4e-16 in float64 with 25).
@functools.cache
def _erfc_powers(terms: int) -> tuple[float, ...]:
    from numpy.polynomial import chebyshev  # (~5 ms to import: when erf is first traced)
    return tuple(float(p) for p in chebyshev.cheb2poly(_ERFC_CHEBYSHEV[:terms]))


def _estrin(y: Tensor, coefficients: tuple[float, ...]) -> Tensor:
    terms = [a + b * y for a, b in zip(coefficients[::2], coefficients[1::2])]
    terms += list(coefficients[len(terms) * 2:])
    power = y * y
    while len(terms) > 1:
        terms = [a + b * power for a, b in zip(terms[::2], terms[1::2])] + terms[
            len(terms) // 2 * 2:]
        power = power * power if len(terms) > 1 else power
    return terms[0]


def _erfc_of_magnitude(z: Tensor) -> Tensor:
    t = 2.0 / (2.0 + z)
    series = _estrin(2.0 * t - 1.0, _erfc_powers(_TERMS[z.dtype.name][0]))
    return (t * series) * (-(z * z)).exp()


def _erf_near_zero(x: Tensor) -> Tensor:
    """erf's Taylor series, for |x| < 0.5 where 1 - erfc would lose relative accuracy: 14 terms
    leave a relative error below 1e-15 (8 below 1e-9, for float32)."""
    square, term, total = x * x, x, x
    for n in range(1, _TERMS[x.dtype.name][1]):
        term = term * square * (-(2 * n - 1) / (n * (2 * n + 1)))
        total = total + term
    return total * _TWO_OVER_SQRT_PI


def _erf_gradient(ctx, grad_output):
    (x,) = ctx.saved_tensors
    return grad_output * ((-x * x).exp() * _TWO_OVER_SQRT_PI)


class _Erf(NativeFunction):
    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        tail = 1.0 - _erfc_of_magnitude(x.abs())
        return where(x.abs() < 0.5, _erf_near_zero(x), where(x < 0, -tail, tail))

    backward = staticmethod(_erf_gradient)


class _Erfc(NativeFunction):
    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        upper = _erfc_of_magnitude(x.abs())
        return where(x < 0, 2.0 - upper, upper)

    @staticmethod
    def backward(ctx, grad_output):
        return -_erf_gradient(ctx, grad_output)


def erf(x: Tensor) -> Tensor:
    """The error function (relative error about 1e-15 in float64, within 3 ulp in float32)."""
    return _Erf.apply(x if irtypes.is_float(x.dtype) else x.to(float32))


def erfc(x: Tensor) -> Tensor:
    """1 - erf(x), accurate in relative terms where it is tiny (large x)."""
    return _Erfc.apply(x if irtypes.is_float(x.dtype) else x.to(float32))


def format_tensor(x: Tensor, spec: str) -> str:
    """`f"{loss:.3f}"` formats a one-element tensor's value, as PyTorch does."""
    if not spec:
        return str(x)
    if x.ndim != 0:
        raise ArgumentError(f"format spec {spec!r} needs a 0-d tensor, this one has shape "
                            f"{list(x.shape)}; use .item() or .tolist()")
    return format(x.item(), spec)


def contiguous(x: Tensor, memory_format=None) -> Tensor:
    """x itself: every tensor here is laid out contiguously (what PyTorch's view operations
    return are copies here), so there is nothing to copy, as for a contiguous PyTorch tensor."""
    return x


def eye(n: int, m: int | None = None, dtype=float32) -> Tensor:
    """The n x m identity matrix."""
    shape = (n, n if m is None else m)
    return (iota(shape, 0) == iota(shape, 1)).to(dtype)


def empty(*shape, dtype=float32, requires_grad: builtins.bool = False) -> Tensor:
    """A tensor of `shape`. PyTorch leaves its values undefined; here they are zeros."""
    return full(*shape, fill_value=0, dtype=dtype, requires_grad=requires_grad)


def linspace(start, end, steps: int, dtype=None) -> Tensor:
    """`steps` evenly spaced values from start to end; as PyTorch, the first half counts up from
    start and the second half down from end, so both ends are exact (one step is `start`)."""
    if steps < 0:
        raise ArgumentError(f"linspace needs a non-negative number of steps, got {steps}")
    dtype = irtypes.as_dtype(dtype or float32)
    index = iota((steps,), 0, irtypes.float64)
    step = (end - start) / builtins.max(steps - 1, 1)
    halfway = builtins.max(steps // 2, 1)
    values = where(index < halfway, index * step + start, end - (steps - 1 - index) * step)
    return values.to(dtype)


def square(x: Tensor) -> Tensor:
    """x ** 2, as PyTorch's `square` is (its gradient 2 x g overflows where PyTorch's does)."""
    return x ** 2


class _Rsqrt(NativeFunction):
    """1 / sqrt(x) with PyTorch's gradient, -0.5 g r^3 of the result r: at -0.0 the result is
    -inf and the gradient +inf g, at -inf both nan, as PyTorch's (x ** -0.5 gave +inf and 0)."""

    _keeps_zero = True  # (PyTorch's backward of mul, div and add)

    @staticmethod
    def forward(ctx, x):
        result = 1 / x.sqrt()
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return -0.5 * grad_output * (result * result * result)


def rsqrt(x: Tensor) -> Tensor:
    """1 / sqrt(x) (PyTorch's `rsqrt`)."""
    return _Rsqrt.apply(x if irtypes.is_float(x.dtype) else x.to(irtypes.float32))


# Tensor methods, and the names that are also `tr.<name>` functions.
METHODS = {
    "floor_divide": floor_divide, "remainder": remainder,
    "var": var, "std": std, "norm": norm, "amax": amax, "amin": amin, "logsumexp": logsumexp,
    "tril": tril, "triu": triu, "masked_fill": masked_fill, "split": split, "chunk": chunk,
    "bmm": bmm, "addcmul": addcmul, "addcdiv": addcdiv, "lerp": lerp, "erf": erf, "erfc": erfc,
    "square": square, "rsqrt": rsqrt}
Tensor.contiguous = contiguous
for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)
Tensor.__floordiv__ = floor_divide
Tensor.__rfloordiv__ = lambda self, other: floor_divide(other, self)
Tensor.__mod__ = remainder
Tensor.__rmod__ = lambda self, other: remainder(other, self)
Tensor.__format__ = format_tensor
for _name in ("masked_fill", "addcmul", "addcdiv", "lerp", "remainder", "floor_divide"):
    setattr(Tensor, _name + "_", lambda self, *args, _name=_name, **kwargs: self._assign(
        getattr(self, _name)(*args, **kwargs), _name + "_"))
Tensor.__ifloordiv__ = Tensor.floor_divide_
Tensor.__imod__ = Tensor.remainder_

FUNCTIONS = dict(METHODS, eye=eye, empty=empty, linspace=linspace)
