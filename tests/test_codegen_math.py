"""The inline transcendental approximations (codegen/templates/math.ll.j2) against numpy, over wide
ranges including 0, -0, inf, nan, subnormal inputs and subnormal results.

float64 results are checked in ulps against numpy's float64 functions (accurate to < 1 ulp), with
the bounds documented in the template. float32 results are checked against numpy's float64 result
rounded to float32 (correctly rounded but for the rare double rounding), over every 4096th float32
bit pattern (about a million points: both signs, subnormals, inf and nan payloads) plus the special
values and thresholds; the slow run sweeps every 64th pattern (67 million points).

sin and cos are also checked over every exponent up to the largest finite value against mpmath
(the C library's float64 sin and cos, which numpy calls, are off by 8 ulp at the hardest argument),
at random arguments and at the arguments closest to multiples of pi/2, where the reduction cancels
most; and the table of the bits of 2/pi that reduces them is checked against mpmath's pi.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from tracer import ir
from tracer.codegen.template_environment import render
from tracer.ir.types import TensorType
from tracer.runtime.compiled import CompiledFunction
from tracer.runtime.pipeline import compile_graph

RNG = np.random.default_rng(1)


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACER_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Units in the last place between a and b (0 where both are nan, huge where one is)."""
    signed = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}[a.dtype]
    a_int = a.view(signed).astype(np.int64)
    b_int = b.view(signed).astype(np.int64)
    lowest = np.iinfo(signed).min
    a_int = np.where(a_int < 0, lowest - a_int, a_int)
    b_int = np.where(b_int < 0, lowest - b_int, b_int)
    distance = np.abs(a_int - b_int).astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    one_nan = np.isnan(a) ^ np.isnan(b)
    return np.where(both_nan, 0.0, np.where(one_nan, np.inf, distance))


def compile_unary(primitive: str, dtype: str, size: int) -> CompiledFunction:
    function = ir.Graph(primitive)
    x = function.add_parameter("x", TensorType((size,), dtype))
    function.outputs = [ir.GraphBuilder(function).op(primitive, x)]
    return compile_graph(function)


SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1e-310, -1e-310,
           2.2250738585072014e-308, 1.0, -1.0, 0.5, -0.5]


def sample(low: float, high: float, count: int = 4000) -> np.ndarray:
    """Values spread over magnitudes (log-spaced) and uniformly over [low, high]."""
    uniform = RNG.uniform(low, high, count)
    span = max(abs(low), abs(high))
    magnitudes = np.logspace(-300, np.log10(span), count)
    signed = np.concatenate([magnitudes, -magnitudes])
    signed = signed[(signed >= low) & (signed <= high)]
    return np.concatenate([uniform, signed, SPECIAL])


CASES = {
    # primitive: (inputs, float64 ulp bound)
    "exp": (np.concatenate([sample(-800.0, 800.0), RNG.uniform(-745.2, -708.0, 2000),
                            RNG.uniform(-1.0, 1.0, 2000), [709.78, 709.79, -745.13, -745.14]]), 1),
    "log": (np.concatenate([sample(-1.0, 1e308), np.abs(sample(0, 1e-300)),
                            1 + RNG.uniform(-1e-6, 1e-6, 1000), RNG.uniform(0.5, 2.0, 2000)]), 1),
    "tanh": (np.concatenate([sample(-40.0, 40.0), RNG.uniform(-0.5, 0.5, 4000),
                             [0.4, -0.4, np.nextafter(0.4, 0), 20.0, 19.0]]), 4),
    "sin": (np.concatenate([sample(-1e5, 1e5), RNG.uniform(-10, 10, 4000)]), 2),
    "cos": (np.concatenate([sample(-1e5, 1e5), RNG.uniform(-10, 10, 4000)]), 2),
    "sqrt": (np.concatenate([sample(-1.0, 1e308), np.abs(sample(0, 1e-300))]), 0),
}
REFERENCE = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sin": np.sin, "cos": np.cos,
             "sqrt": np.sqrt}


@pytest.mark.parametrize("primitive", sorted(CASES))
def test_float64_within_documented_ulps(primitive):
    inputs, bound = CASES[primitive]
    (actual,) = compile_unary(primitive, "f64", inputs.size)([inputs])
    with np.errstate(all="ignore"):
        expected = REFERENCE[primitive](inputs)
    distance = ulp_distance(actual, expected)
    worst = int(np.argmax(distance))
    assert distance[worst] <= bound, (inputs[worst], actual[worst], expected[worst])


# float32: the ulp bounds documented in codegen/templates/math.ll.j2, and the inputs where each
# function changes regime (sin and cos: from Cody-Waite to Payne-Hanek reduction at 1647099.25).
FLOAT32_BOUNDS = {"exp": 1, "log": 1, "tanh": 2, "sin": 2, "cos": 2, "sqrt": 0}
EDGES = np.float32([88.72283, 88.72284, -87.33654, -87.33655, -103.27892, -103.97207, -103.97208,
                    -104.0, 89.0, 9.01, 9.02, 20.0, 0.55, 3.4028235e38, 1.1754944e-38, 1e-45,
                    np.pi, np.pi / 2, 1647099.25, 2 ** 20 * np.pi / 2, 1e9, 1.0, 0.0, np.inf,
                    np.nan])
with np.errstate(over="ignore"):
    EDGES = np.concatenate([EDGES, -EDGES, np.nextafter(EDGES, np.float32(np.inf)),
                            np.nextafter(EDGES, np.float32(-np.inf))])


def float32_sweep(stride: int, start: int = 0, stop: int = 2 ** 32) -> np.ndarray:
    """Every `stride`-th float32 bit pattern in [start, stop)."""
    return np.arange(start, stop, stride, dtype=np.uint64).astype(np.uint32).view(np.float32)


def float32_ulps(primitive: str, inputs: np.ndarray, compiled: CompiledFunction) -> np.ndarray:
    """The ulp distance of the compiled float32 function from numpy's float64 one, rounded."""
    (actual,) = compiled([inputs])
    with np.errstate(all="ignore"):
        expected = REFERENCE[primitive](inputs.astype(np.float64)).astype(np.float32)
    return ulp_distance(actual, expected)


@pytest.mark.parametrize("primitive", sorted(CASES))
def test_float32_within_documented_ulps(primitive):
    inputs = np.concatenate([float32_sweep(4096), float32_sweep(4096, 1234, 2 ** 31),
                             CASES[primitive][0].astype(np.float32), EDGES])
    distance = float32_ulps(primitive, inputs, compile_unary(primitive, "f32", inputs.size))
    worst = int(np.argmax(distance))
    assert distance[worst] <= FLOAT32_BOUNDS[primitive], (inputs[worst], distance[worst])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("primitive", sorted(CASES))
def test_signs_of_zero_and_of_the_smallest_subnormals(primitive, dtype):
    # (ulp_distance takes -0 and +0 as equal)
    numpy_dtype = {"f32": np.float32, "f64": np.float64}[dtype]
    tiny = np.finfo(numpy_dtype).smallest_subnormal
    inputs = np.array([-0.0, 0.0, -tiny, tiny], numpy_dtype)
    (actual,) = compile_unary(primitive, dtype, inputs.size)([inputs])
    with np.errstate(all="ignore"):
        expected = REFERENCE[primitive](inputs)
    both = ~np.isnan(expected)
    np.testing.assert_array_equal(actual[both], expected[both])
    np.testing.assert_array_equal(np.signbit(actual[both]), np.signbit(expected[both]))


@pytest.mark.parametrize("dtype, zero_from", [("f32", -104.0), ("f64", -746.0)])
def test_exp_is_positive_zero_from_its_threshold_down_and_subnormal_just_above(dtype, zero_from):
    # exp selects 0 at and below `zero_from` instead of underflowing there (a masked softmax's
    # -inf elements): the values beside that threshold, in a vector loop's lanes and its tail
    numpy_dtype = {"f32": np.float32, "f64": np.float64}[dtype]
    info = np.finfo(numpy_dtype)
    near = np.nextafter(numpy_dtype(zero_from), numpy_dtype(0), dtype=numpy_dtype)
    inputs = np.array([-np.inf, info.min, -1e30, -1000.0, zero_from, near, zero_from + 0.5,
                       zero_from + 10.0, -50.0, 0.0, np.nan] * 7, numpy_dtype)
    (actual,) = compile_unary("exp", dtype, inputs.size)([inputs])
    with np.errstate(all="ignore"):
        expected = np.exp(inputs.astype(np.float64)).astype(numpy_dtype)
    assert ulp_distance(actual, expected).max() <= 1
    below = inputs <= zero_from
    np.testing.assert_array_equal(actual[below], 0.0)
    assert not np.signbit(actual[below]).any()
    # just above the threshold the results are subnormal, not flushed to 0
    assert ((actual[inputs == zero_from + 10.0] > 0)
            & (actual[inputs == zero_from + 10.0] < info.smallest_normal)).all()


@pytest.mark.slow
@pytest.mark.parametrize("primitive", sorted(CASES))
def test_float32_within_documented_ulps_dense(primitive):
    chunk = 2 ** 30  # bit patterns per call: 2^24 points at stride 64
    compiled = compile_unary(primitive, "f32", chunk // 64)
    for start in range(0, 2 ** 32, chunk):
        inputs = float32_sweep(64, start, start + chunk)
        distance = float32_ulps(primitive, inputs, compiled)
        worst = int(np.argmax(distance))
        assert distance[worst] <= FLOAT32_BOUNDS[primitive], (inputs[worst], distance[worst])


# sin and cos over the whole range ----------------------------------------------------------------

FORMATS = {"f64": (np.float64, 53, range(-60, 972)), "f32": (np.float32, 24, range(-30, 105))}
HARDEST_DOUBLE = math.ldexp(6381956970095103, 797)  # within 2^-60.9 of a multiple of pi/2
FRACTION_BITS = 256  # of 2^e * 2/pi mod 1, for continued fractions of denominators below 2^53
with mpmath.workprec(1100 + FRACTION_BITS):
    TWO_OVER_PI_BITS = int(mpmath.floor(mpmath.ldexp(2 / mpmath.pi, 1100 + FRACTION_BITS)))


def closest_to_multiples_of_half_pi(exponent: int, bits: int, count: int = 2) -> list[int]:
    """Mantissas m of `bits` bits whose m * 2^exponent are among the closest to a multiple of
    pi/2: m * alpha is nearest an integer (alpha = 2^exponent * 2/pi mod 1) at multiples, sums and
    differences of the last denominators of alpha's continued fraction below 2^bits."""
    scale = 1 << FRACTION_BITS
    alpha = (TWO_OVER_PI_BITS >> (1100 - exponent)) % scale
    low, high = 1 << (bits - 1), 1 << bits
    numerator, denominator, previous, current, denominators = alpha, scale, 0, 1, []
    while numerator and current < high:
        quotient = denominator // numerator
        denominator, numerator = numerator, denominator % numerator
        previous, current = current, quotient * current + previous
        denominators.append(previous)
    last = denominators[-4:]
    candidates = {j * d + i * e for d in last for e in [0, *last] for i in (-1, 0, 1)
                  for j in range(max(1, low // d - 1), low // d + 3) if low <= j * d + i * e < high}

    def distance(m: int) -> int:
        remainder = m * alpha % scale
        return min(remainder, scale - remainder)
    return sorted(candidates, key=distance)[:count]


def whole_range(dtype: str) -> np.ndarray:
    """For each exponent (from |x| near 2^-8 to the largest finite value): a random mantissa and
    the two closest to a multiple of pi/2; both signs."""
    numpy_dtype, bits, exponents = FORMATS[dtype]
    mantissas = [[int(RNG.integers(1 << (bits - 1), 1 << bits)),
                  *closest_to_multiples_of_half_pi(exponent, bits)] for exponent in exponents]
    values = [math.ldexp(m, exponent) for exponent, row in zip(exponents, mantissas) for m in row]
    if dtype == "f64":
        values.append(HARDEST_DOUBLE)
    values = np.array(values, numpy_dtype)
    return np.concatenate([values, -values])


def correctly_rounded(primitive: str, inputs: np.ndarray) -> np.ndarray:
    """mpmath's sin or cos, exact to far below an ulp (the argument's 1024 + 53 bits and the
    cancellation near a multiple of pi/2), rounded to the inputs' dtype."""
    function = getattr(mpmath, primitive)
    with mpmath.workprec(1300):
        exact = [float(function(mpmath.mpf(float(x)))) for x in inputs]
    return np.array(exact).astype(inputs.dtype)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("primitive", ["sin", "cos"])
def test_sin_cos_over_the_whole_finite_range(primitive, dtype):
    inputs = whole_range(dtype)
    (actual,) = compile_unary(primitive, dtype, inputs.size)([inputs])
    distance = ulp_distance(actual, correctly_rounded(primitive, inputs))
    worst = int(np.argmax(distance))
    assert distance[worst] <= 2, (inputs[worst], actual[worst], distance[worst])


def test_sin_cos_of_the_hardest_double():
    # cos(6381956970095103 * 2^797) = -4.68716592425462761112e-19 (Muller, Elementary Functions):
    # correctly rounded here (the C library's is 8 ulp off)
    inputs = np.array([HARDEST_DOUBLE, -HARDEST_DOUBLE])
    (sine,) = compile_unary("sin", "f64", 2)([inputs])
    (cosine,) = compile_unary("cos", "f64", 2)([inputs])
    np.testing.assert_array_equal(cosine, [-4.68716592425462761112e-19] * 2)
    np.testing.assert_array_equal(sine, [1.0, -1.0])


# The tables of 2/pi in the rendered code: row b of the float64 table is 2^(32 b - 1023) 2/pi
# mod 2^54, of the float32 one 2^(16 b - 127) 2/pi mod 2^25, each truncated to its lowest chunk's
# last bit (2^-158, 2^-81), in chunks that are doubles.
TABLES = {"f64": (32, 1023, 54, -158), "f32": (16, 127, 25, -81)}


def rendered_table(dtype: str) -> list[list[float]]:
    text = render("math.ll.j2")
    body = re.search(rf"@tracer\.two_over_pi\.{dtype} = .*?constant [^\n]*\n(.*?)\]\n", text,
                     re.S).group(1)
    hexadecimal = [re.findall(r"double (0x[0-9A-F]+)", line) for line in body.splitlines()]
    return [[np.uint64(int(h, 16)).view(np.float64).item() for h in row] for row in hexadecimal]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_the_bits_of_two_over_pi_in_the_code_against_mpmath(dtype):
    bucket, bias, modulus, last = TABLES[dtype]
    rows = rendered_table(dtype)
    assert len(rows) == (2 * bias + 1) // bucket + 1
    with mpmath.workprec(1300):
        two_over_pi = 2 / mpmath.pi
        for b, row in enumerate(rows):
            exponent = bucket * b - bias
            units = int(mpmath.floor(mpmath.ldexp(two_over_pi, exponent - last)))
            expected = units % (1 << (modulus - last))
            assert sum(Fraction(chunk) for chunk in row) == Fraction(expected) * Fraction(2) ** last, b


def compile_pow(dtype: str, size: int) -> CompiledFunction:
    function = ir.Graph("pow")
    x = function.add_parameter("x", TensorType((size,), dtype))
    y = function.add_parameter("y", TensorType((size,), dtype))
    function.outputs = [ir.GraphBuilder(function).op("pow", x, y)]
    return compile_graph(function)


def pow_inputs() -> tuple[np.ndarray, np.ndarray]:
    special = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, np.inf, -np.inf,
                        np.nan, 1e-310, 1e300, -1e300, 2.5, 1e17])
    grid_x, grid_y = np.meshgrid(special, special)
    x = np.concatenate([grid_x.ravel(), RNG.uniform(0, 10, 3000), -RNG.integers(1, 10, 1000),
                        RNG.uniform(-5, 5, 1000)])
    y = np.concatenate([grid_y.ravel(), RNG.uniform(-20, 20, 3000),
                        RNG.integers(-8, 9, 1000).astype(np.float64), RNG.uniform(-5, 5, 1000)])
    return x, y


def test_pow_float64_special_cases_and_error_bound():
    x, y = pow_inputs()
    (actual,) = compile_pow("f64", x.size)([x, y])
    with np.errstate(all="ignore"):
        expected = np.power(x, y)
        bound = 2 + 2 * np.abs(y * np.log(np.abs(x)))
    distance = ulp_distance(actual, expected)
    bound = np.where(np.isfinite(bound), bound, 2)
    assert np.all(distance <= bound + 1), [(x[i], y[i], actual[i], expected[i])
                                           for i in np.nonzero(distance > bound + 1)[0][:5]]


def test_pow_float32():
    with np.errstate(over="ignore"):
        x, y = (v.astype(np.float32) for v in pow_inputs())
    (actual,) = compile_pow("f32", x.size)([x, y])
    with np.errstate(all="ignore"):
        expected = np.power(x.astype(np.float64), y.astype(np.float64)).astype(np.float32)
    distance = ulp_distance(actual, expected)
    assert np.all(distance <= 1), [(x[i], y[i], actual[i], expected[i])
                                   for i in np.nonzero(distance > 1)[0][:5]]


def test_integer_pow():
    function = ir.Graph("ipow")
    x = function.add_parameter("x", TensorType((200,), "i64"))
    y = function.add_parameter("y", TensorType((200,), "i64"))
    function.outputs = [ir.GraphBuilder(function).op("pow", x, y)]
    base = RNG.integers(-20, 20, 200)
    exponent = RNG.integers(0, 30, 200)
    (actual,) = compile_graph(function)([base, exponent])
    np.testing.assert_array_equal(actual, np.power(base, exponent))
