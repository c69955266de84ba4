"""tr.nn.init and the in-place fills uniform_ / normal_: the fans, gains and bounds exactly as
PyTorch's formulas give them, the distributions checked statistically at fixed seeds, the fills
the same eagerly and traced."""
import math

import numpy as np
import pytest
import torch

import tracer as tr
from tracer.nn import init

SHAPES = [(7, 3), (16, 4, 3, 3), (5, 2, 7), (3, 1, 2, 2, 2)]
COUNT = 40_000  # elements of the tensors whose distributions are tested


def _normal_cdf(x):
    return 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _kolmogorov_smirnov(sample, cdf):
    """The largest distance between the sample's empirical distribution and `cdf`."""
    values = np.sort(sample.astype(np.float64))
    expected = cdf(values)
    n = len(values)
    return max((np.arange(1, n + 1) / n - expected).max(), (expected - np.arange(n) / n).max())


# Under the hypothesis, the KS distance exceeds 1.95 / sqrt(n) with probability below 1e-3
# (Kolmogorov's limit: P(D sqrt(n) > t) ~ 2 exp(-2 t**2)); the moments' bounds are 5 standard
# errors: the variance of a uniform's square is 4 b**4 / 45, of a normal's 2 std**4.
KS_LIMIT = 1.95 / math.sqrt(COUNT)


def _check_uniform(values, low, high):
    assert low <= values.min() and values.max() < high
    assert abs(values.mean() - (low + high) / 2) < 5 * (high - low) / math.sqrt(12 * COUNT)
    assert _kolmogorov_smirnov(values, lambda v: (v - low) / (high - low)) < KS_LIMIT


def _check_normal(values, mean, std):
    assert abs(values.mean() - mean) < 5 * std / math.sqrt(COUNT)
    assert abs(values.var() / std ** 2 - 1) < 5 * math.sqrt(2 / COUNT)
    assert _kolmogorov_smirnov(values, lambda v: _normal_cdf((v - mean) / std)) < KS_LIMIT


@pytest.mark.parametrize("shape", SHAPES)
def test_fans_and_gains_are_pytorchs(shape):
    ours = tr.zeros(*shape)
    theirs = torch.zeros(shape)
    assert init._calculate_fan_in_and_fan_out(ours) == \
        torch.nn.init._calculate_fan_in_and_fan_out(theirs)
    for nonlinearity, param in [("linear", None), ("conv2d", None), ("sigmoid", None),
                                ("tanh", None), ("relu", None), ("leaky_relu", None),
                                ("leaky_relu", 0.2), ("leaky_relu", math.sqrt(5)), ("selu", None)]:
        assert init.calculate_gain(nonlinearity, param) == \
            torch.nn.init.calculate_gain(nonlinearity, param)


def _bound_of(function, shape, **kwargs):
    """The bound PyTorch's uniform initialization draws within, read off its call of uniform_."""
    seen = []
    original = torch.Tensor.uniform_

    def spy(self, a, b, generator=None):
        seen.append((a, b))
        return original(self, a, b, generator=generator)

    torch.Tensor.uniform_ = spy
    try:
        function(torch.zeros(shape), **kwargs)
    finally:
        torch.Tensor.uniform_ = original
    return seen[0]


def _std_of(function, shape, **kwargs):
    seen = []
    original = torch.Tensor.normal_

    def spy(self, mean, std, generator=None):
        seen.append((mean, std))
        return original(self, mean, std, generator=generator)

    torch.Tensor.normal_ = spy
    try:
        function(torch.zeros(shape), **kwargs)
    finally:
        torch.Tensor.normal_ = original
    return seen[0]


CASES = [("kaiming_uniform_", {}), ("kaiming_uniform_", dict(a=math.sqrt(5))),
         ("kaiming_uniform_", dict(mode="fan_out", nonlinearity="relu")),
         ("xavier_uniform_", {}), ("xavier_uniform_", dict(gain=init.calculate_gain("tanh"))),
         ("kaiming_normal_", {}), ("kaiming_normal_", dict(mode="fan_out", nonlinearity="relu")),
         ("xavier_normal_", dict(gain=2.0))]


@pytest.mark.parametrize("shape", [(200, 200), (50, 8, 10, 10)])
@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}{k}" for n, k in CASES])
def test_initializations_draw_pytorchs_distribution(name, kwargs, shape):
    tr.manual_seed(3)
    weight = tr.nn.Parameter(tr.zeros(*shape))
    result = getattr(init, name)(weight, **kwargs)
    assert result is weight and weight.requires_grad and weight.grad is None
    values = weight.detach().numpy().reshape(-1)
    assert values.dtype == np.float32
    if name.endswith("uniform_"):
        low, high = _bound_of(getattr(torch.nn.init, name), shape, **kwargs)
        _check_uniform(values, low, high)
    else:
        mean, std = _std_of(getattr(torch.nn.init, name), shape, **kwargs)
        _check_normal(values, mean, std)


def test_uniform_normal_and_constants_fill_in_place():
    tr.manual_seed(0)
    x = tr.zeros(COUNT, dtype=tr.float64)
    assert x.uniform_(-2, 3) is x
    _check_uniform(x.numpy(), -2, 3)
    assert init.normal_(x, mean=1.5, std=0.5) is x
    _check_normal(x.numpy(), 1.5, 0.5)
    assert init.uniform_(x, b=4.0) is x
    _check_uniform(x.numpy(), 0.0, 4.0)
    assert x.uniform_(**{"from": 1, "to": 2}) is x  # PyTorch's keyword names
    _check_uniform(x.numpy(), 1.0, 2.0)
    assert init.constant_(x, 0.25).tolist() == [0.25] * COUNT
    assert init.zeros_(x).sum().item() == 0 and init.ones_(x).sum().item() == COUNT


def test_seeds_reproduce_and_a_generator_can_be_passed():
    tr.manual_seed(7)
    first = init.kaiming_normal_(tr.zeros(30, 20)).numpy().copy()
    tr.manual_seed(7)
    np.testing.assert_array_equal(init.kaiming_normal_(tr.zeros(30, 20)).numpy(), first)
    generator = tr.Generator(7)
    own = init.xavier_uniform_(tr.zeros(30, 20), generator=generator).numpy().copy()
    generator.manual_seed(7)
    again = init.xavier_uniform_(tr.zeros(30, 20), generator=generator).numpy()
    np.testing.assert_array_equal(own, again)
    first, second = tr.zeros(30, 20).normal_(), tr.zeros(30, 20).normal_()
    assert not np.array_equal(first.numpy(), second.numpy())


def test_fills_are_the_same_numbers_traced_with_the_state_an_argument():
    tr.manual_seed(1)
    eager = tr.zeros(4, 6).normal_(2.0, 3.0).numpy().copy()
    eager_uniform = tr.zeros(5).uniform_(-1, 1).numpy().copy()

    @tr.trace
    def fill(x, y, state):
        return x.normal_(2.0, 3.0), y.uniform_(-1, 1)

    tr.manual_seed(1)
    x, y = tr.zeros(4, 6), tr.zeros(5)
    fill(x, y, tr.default_generator.state)
    np.testing.assert_array_equal(x.numpy(), eager)
    np.testing.assert_array_equal(y.numpy(), eager_uniform)
    # the state read from the generator (not an argument) advances too: new numbers each call
    refill = tr.trace(lambda x: x.uniform_())
    tr.manual_seed(1)
    expected = [tr.zeros(3).uniform_().numpy().copy() for _ in range(2)]
    tr.manual_seed(1)
    for numbers in expected:
        np.testing.assert_array_equal(refill(tr.zeros(3)).numpy(), numbers)


def test_bad_arguments_are_refused_as_pytorch_refuses_them():
    with pytest.raises(tr.ShapeMismatchError, match="at least 2 dimensions"):
        init.xavier_uniform_(tr.zeros(5))
    with pytest.raises(tr.ArgumentError, match="mode 'fan_mid'"):
        init.kaiming_uniform_(tr.zeros(3, 3), mode="fan_mid")
    with pytest.raises(tr.ArgumentError, match="unsupported nonlinearity"):
        init.calculate_gain("softplus")
    with pytest.raises(tr.ArgumentError, match="negative_slope"):
        init.calculate_gain("leaky_relu", True)
    with pytest.raises(tr.InplaceError, match="leaf tensor that requires grad"):
        tr.nn.Parameter(tr.zeros(3)).uniform_()  # outside no_grad, as PyTorch refuses it
    with pytest.raises(tr.ArgumentError, match="a <= b"):
        tr.zeros(3).uniform_(2, 1)
    with pytest.raises(tr.ArgumentError, match="std >= 0"):
        tr.zeros(3).normal_(0, -1)
    with pytest.warns(UserWarning, match="zero-element"):
        init.kaiming_uniform_(tr.zeros(0, 3))
