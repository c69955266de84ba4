"""`x ** c` for a constant c in 0, +-0.5 and the integers +-1 .. +-4, which ir/passes.py computes
by multiplications, sqrt and a reciprocal instead of exp(c log x): values against numpy's power
in float64 (in ulps, over a million float32 bit patterns and float64 samples, with the special
values compared exactly, signs of zero included) and PyTorch; gradients against PyTorch's autograd
and finite differences."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tracer as tr
from test_codegen_math import float32_sweep, ulp_distance

# Largest ulp distance from numpy's power computed in float64 (then rounded to the dtype). 0, 1,
# 2, -1 and 0.5 are one rounding (correctly rounded); -0.5 is two (sqrt, then the reciprocal); a
# negative integer power is a power of the reciprocal, whose rounding the multiplications scale.
BOUNDS = {0: 0, 1: 0, 2: 0, 0.5: 0, -1: 0, -0.5: 2, 3: 1, 4: 2, -2: 2, -3: 3, -4: 5}
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, -2.0, -0.5, 3.0, 1e-40, -1e-40,
           1e-310, -1e-310, 1e30, -1e30, 1e300, -1e300, 3.4e38, -3.4e38]
RNG = np.random.default_rng(5)


def samples(dtype) -> np.ndarray:
    if dtype == np.float32:
        sweep = float32_sweep(4096)
    else:
        sweep = np.concatenate([np.geomspace(1e-320, 1e308, 500000), RNG.uniform(-4, 4, 100000)])
        sweep = np.concatenate([sweep, -sweep])
    with np.errstate(over="ignore"):
        return np.concatenate([sweep, np.array(SPECIAL, dtype)]).astype(dtype)


def traced_power(exponent):
    return tr.trace(lambda x: x ** exponent)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("exponent", sorted(BOUNDS))
def test_constant_power_within_bound_of_numpy(dtype, exponent):
    x = samples(dtype)
    power = traced_power(exponent)
    assert " pow " not in power.ir(x, stage="optimized")
    actual = power(x).numpy()
    with np.errstate(all="ignore"):
        wide = np.power(x.astype(np.float64), exponent).astype(dtype)
        same_dtype = np.power(x, dtype(exponent))
        if exponent == -0.5:  # PyTorch's rsqrt, 1 / sqrt(x): (-0) ** -0.5 = -inf, (-inf) ** -0.5 = nan
            wide, same_dtype = (np.where((x == 0) | (x == -np.inf), 1 / np.sqrt(x), values)
                                for values in (wide, same_dtype))
    distance = ulp_distance(actual, wide)
    worst = int(np.argmax(distance))
    assert distance[worst] <= BOUNDS[exponent], (x[worst], actual[worst], wide[worst])
    # at 0, -0, inf, -inf, nan, 1 and -1: exactly numpy's power, signs of zero included
    exact = (x == 0) | np.isinf(x) | np.isnan(x) | (np.abs(x) == 1)
    np.testing.assert_array_equal(actual[exact], same_dtype[exact])
    signed = exact & ~np.isnan(same_dtype)
    np.testing.assert_array_equal(np.signbit(actual[signed]), np.signbit(same_dtype[signed]))


@pytest.mark.parametrize("exponent", sorted(BOUNDS))
def test_constant_power_matches_pytorch(exponent):
    x = np.array(SPECIAL + list(RNG.uniform(-3, 3, 50)), np.float32)
    actual = traced_power(exponent)(x).numpy()
    expected = torch.pow(torch.from_numpy(x), exponent).numpy()
    if exponent == -0.5:  # PyTorch's rsqrt (a Python number's power follows PyTorch's pow)
        changed = (x == 0) & np.signbit(x) | (x == -np.inf)
        np.testing.assert_array_equal(actual[changed], np.where(x[changed] == 0, -np.inf, np.nan))
    distance = ulp_distance(actual, expected)
    assert distance.max() <= BOUNDS[exponent] + 1, x[np.argmax(distance)]


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, 4])
def test_integer_constant_power_is_numpys_exactly(exponent):
    x = np.concatenate([RNG.integers(-100, 100, 200), [0, -1, 2 ** 20, -(2 ** 31), 2 ** 62]])
    power = traced_power(exponent)
    assert " pow " not in power.ir(x, stage="optimized")
    np.testing.assert_array_equal(power(x).numpy(), np.power(x, exponent))  # wrapping, as numpy


@pytest.mark.parametrize("exponent", [2.5, -1.5, 5.0, 0.25, np.inf, -np.inf, np.nan])
def test_other_constant_exponents_keep_pow(exponent):
    x = np.float32([0.0, -0.0, 0.5, 1.0, -1.0, 2.0, 7.0, -3.0, np.inf, -np.inf, np.nan])
    power = traced_power(exponent)
    assert " pow " in power.ir(x, stage="optimized")
    with np.errstate(all="ignore"):
        expected = np.power(x, np.float32(exponent))
    assert ulp_distance(power(x).numpy(), expected).max() <= 1


@pytest.mark.parametrize("exponent", sorted(BOUNDS))
def test_constant_power_gradient_matches_pytorch(exponent):
    points = [0.0, -0.0, 1.5, -2.0, 0.25, 3.0]
    if exponent != int(exponent):
        points = [0.0, 1.5, 0.25, 3.0]  # negative bases have no real power

    @tr.trace
    def gradient(x):
        (x ** exponent).sum().backward()
        return x.grad

    x = tr.tensor(np.array(points), requires_grad=True)
    actual = gradient(x).numpy()
    reference = torch.tensor(points, dtype=torch.float64, requires_grad=True)
    (reference ** exponent).sum().backward()
    # c * x ** (c - 1): for c - 1 = -5 the general pow (float64, <= 2 + 2 |y log x| ulp)
    np.testing.assert_allclose(actual, reference.grad.numpy(), rtol=1e-14, atol=0)
    if exponent == 3:
        assert actual[0] == 0.0 and actual[1] == 0.0  # the gradient of x ** 3 at 0


@pytest.mark.parametrize("exponent", sorted(BOUNDS))
def test_constant_power_gradcheck(exponent):
    # traced, in float64, away from 0 (and from negative bases for the square roots)
    low = 0.3 if exponent != int(exponent) else -2.0
    values = RNG.uniform(low, 2.0, (3, 4))
    values[np.abs(values) < 0.2] = 0.5
    x = tr.tensor(values, requires_grad=True)
    assert tr.gradcheck(tr.trace(lambda x: x ** exponent), (x,))
