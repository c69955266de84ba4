"""Where an activation's derivative is 0 (hardsigmoid beyond +-3, hardswish up to -3, relu below
0, clamp outside its range, ...), PyTorch's backward kernels choose 0 rather than multiply the
incoming gradient by 0: a nan gradient from further on (acos of a nan, an overflowed loss) gives
0 there, not nan. tracer's hardsigmoid and hardswish multiplied (found by the slow random-program
run of 2026-11-28: acos(tanh(hardsigmoid(4 log x))) at x < 0 gave x.grad nan, PyTorch's 0).
Every activation, eager and traced, against torch with a nan gradient and inputs in every region
(and a nan input): the same nans."""
import numpy as np
import pytest
import torch

import tracer as tr

INPUTS = np.array([-10.0, -3.0, -1.0, 0.0, 0.5, 3.0, 10.0, np.nan], np.float32)
ACTIVATIONS = {
    "relu": lambda m, x: m.relu(x),
    "relu6": lambda m, x: m.nn.functional.relu6(x),
    "hardtanh": lambda m, x: m.nn.functional.hardtanh(x),
    "hardsigmoid": lambda m, x: m.nn.functional.hardsigmoid(x),
    "hardswish": lambda m, x: m.nn.functional.hardswish(x),
    "threshold": lambda m, x: m.nn.functional.threshold(x, 0.2, -1.0),
    "clamp": lambda m, x: x.clamp(-1, 1),
    "clamp_min": lambda m, x: x.clamp(min=0),
    "leaky_relu": lambda m, x: m.nn.functional.leaky_relu(x),
    "elu": lambda m, x: m.nn.functional.elu(x),
    "celu": lambda m, x: m.nn.functional.celu(x),
    "selu": lambda m, x: m.nn.functional.selu(x),
    "gelu": lambda m, x: m.nn.functional.gelu(x),
    "silu": lambda m, x: m.nn.functional.silu(x),
    "mish": lambda m, x: m.nn.functional.mish(x),
    "softplus": lambda m, x: m.nn.functional.softplus(x),
    "maximum": lambda m, x: m.maximum(x, m.zeros_like(x)),
    "abs": lambda m, x: x.abs(),
    "where": lambda m, x: m.where(x > 0, x, m.zeros_like(x)),
    "masked_fill": lambda m, x: x.masked_fill(x < 0, 0.0),
    "tanhshrink": lambda m, x: m.nn.functional.tanhshrink(x),
    "logsigmoid": lambda m, x: m.nn.functional.logsigmoid(x),
    "sigmoid": lambda m, x: m.sigmoid(x),
}


def gradient(m, activation, traced: bool) -> np.ndarray:
    x = m.tensor(INPUTS, requires_grad=True)

    def step(x):
        (activation(m, x) * float("nan")).sum().backward()
    (tr.trace(step) if traced and m is tr else step)(x)
    return x.grad.numpy()


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_a_nan_gradient_stops_where_the_derivative_is_zero(name, traced):
    expected = gradient(torch, ACTIVATIONS[name], False)
    got = gradient(tr, ACTIVATIONS[name], traced)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(got[~np.isnan(got)], expected[~np.isnan(expected)])
