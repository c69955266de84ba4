"""Realistic programs end to end: layer norm, GELU, softmax cross-entropy and an MLP trained by a
traced step, against eager mode (and, through conftest, every compiled call against the
interpreter), with gradients checked by finite differences in float64."""
import math

import numpy as np
import pytest

import tracer as tr


def layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    centered = x - mean
    variance = (centered * centered).mean(dim=-1, keepdim=True)
    return centered / (variance + eps).sqrt() * weight + bias


def gelu(x):
    return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)).tanh())


def cross_entropy(logits, labels_one_hot):
    return -(logits.log_softmax(dim=-1) * labels_one_hot).sum(dim=-1).mean()


def model(x, w1, b1, gamma, beta, w2):
    return gelu(layer_norm(x @ w1 + b1, gamma, beta)) @ w2


def train_step(x, labels, w1, b1, gamma, beta, w2, learning_rate):
    loss = cross_entropy(model(x, w1, b1, gamma, beta, w2), labels)
    loss.backward()
    with tr.no_grad():
        for parameter in (w1, b1, gamma, beta, w2):
            parameter.sub_(learning_rate * parameter.grad)
            parameter.grad.zero_()
    return loss


def make_problem(dtype=tr.float32, batch=16, features=12, hidden=32, classes=5):
    generator = np.random.default_rng(7)
    x = tr.tensor(generator.standard_normal((batch, features)), dtype=dtype)
    labels = np.eye(classes)[generator.integers(0, classes, batch)]
    parameters = [generator.standard_normal((features, hidden)) / np.sqrt(features),
                  np.zeros(hidden), np.ones(hidden), np.zeros(hidden),
                  generator.standard_normal((hidden, classes)) / np.sqrt(hidden)]
    return x, tr.tensor(labels, dtype=dtype), [tr.tensor(p, dtype=dtype, requires_grad=True)
                                                 for p in parameters]


def test_traced_training_matches_eager_step_by_step():
    x, labels, eager_parameters = make_problem()
    _, _, traced_parameters = make_problem()
    traced_step = tr.trace(train_step)
    losses = []
    for _ in range(15):
        eager_loss = train_step(x, labels, *eager_parameters, 0.5)
        traced_loss = traced_step(x, labels, *traced_parameters, 0.5)
        np.testing.assert_allclose(traced_loss.item(), eager_loss.item(), rtol=2e-5)
        for eager, traced in zip(eager_parameters, traced_parameters):
            np.testing.assert_allclose(traced.detach().numpy(), eager.detach().numpy(),
                                       rtol=1e-4, atol=1e-5)
        losses.append(traced_loss.item())
    assert losses[-1] < 0.5 * losses[0]  # it learns
    assert traced_step.cache_info().misses == 2  # without, then with .grad


@pytest.mark.parametrize("function", [layer_norm, lambda x, w, b: gelu(x) * w + b])
def test_gradcheck_traced(function):
    generator = np.random.default_rng(1)
    x = tr.tensor(generator.standard_normal((3, 6)), requires_grad=True)
    w = tr.tensor(generator.standard_normal(6), requires_grad=True)
    b = tr.tensor(generator.standard_normal(6), requires_grad=True)
    assert tr.gradcheck(tr.trace(function), (x, w, b))


def test_cross_entropy_gradient_is_softmax_minus_labels():
    _, labels, _ = make_problem(tr.float64)
    values = np.random.default_rng(2).standard_normal(labels.shape) * 3
    gradient = tr.trace(tr.grad(cross_entropy))(tr.tensor(values), labels)
    exponentials = np.exp(values - values.max(axis=1, keepdims=True))
    softmax = exponentials / exponentials.sum(axis=1, keepdims=True)
    expected = (softmax - labels.numpy()) / values.shape[0]
    np.testing.assert_allclose(gradient.numpy(), expected, rtol=1e-12, atol=1e-15)


def test_fused_stage_groups_layer_norm_into_few_kernels():
    x, labels, parameters = make_problem()
    traced = tr.trace(lambda *a: model(*a).sum())
    fused = traced.ir(x, *parameters, stage="fused")
    optimized = traced.ir(x, *parameters, stage="optimized")
    kernels = fused.count("kernel")
    instructions = optimized.count(" = ")
    assert 0 < kernels < instructions / 3, fused
