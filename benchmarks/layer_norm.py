"""Layer norm written as users compose it (mean, centre, variance, sqrt, scale and shift) over the
last dimension, forward and backward: the results are y, x.grad, weight.grad and bias.grad."""
from __future__ import annotations

import numpy as np

from benchmarks import floors
from benchmarks.harness import Program, Row, Timing, measure, with_fresh_grads
from benchmarks.peers import installed, jax_programs, torch_programs

SIZES = {"4096×1024": (4096, 1024), "512×8192": (512, 8192)}
QUICK_SIZES = ("4096×1024",)
EPSILON = 1e-5
# Sums of up to 8192 float32 terms (rows) and 4096 (weight and bias gradients): typical error
# sqrt(K) u ≈ 5e-6 of the scale, worst K u ≈ 5e-4; 1e-4 sits between.
TOLERANCE = 1e-4
BYTES_PER_ELEMENT = 16  # reads x and grad_output, writes y and x.grad


def layer_norm_forward_backward(x, weight, bias, grad_output):
    """The same code for tracer and torch tensors."""
    mean = x.mean(dim=-1, keepdim=True)
    centered = x - mean
    variance = (centered * centered).mean(dim=-1, keepdim=True)
    y = centered / (variance + EPSILON).sqrt() * weight + bias
    y.backward(grad_output)
    # fullgraph=True refuses to return a tensor backward consumed
    return y.detach(), x.grad, weight.grad, bias.grad


def numpy_forward_backward(x, weight, bias, grad_output):
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    deviation = np.sqrt((centered * centered).mean(axis=-1, keepdims=True) + EPSILON)
    normalized = centered / deviation
    grad_normalized = grad_output * weight
    grad_x = (grad_normalized - grad_normalized.mean(axis=-1, keepdims=True)
              - normalized * (grad_normalized * normalized).mean(axis=-1, keepdims=True)) / deviation
    return (normalized * weight + bias, grad_x, (grad_output * normalized).sum(axis=0),
            grad_output.sum(axis=0))


def make_inputs(shape, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    rows, columns = shape
    return [(3 * rng.standard_normal(shape) + 1).astype(np.float32),
            (1 + 0.1 * rng.standard_normal(columns)).astype(np.float32),
            (0.1 * rng.standard_normal(columns)).astype(np.float32),
            rng.standard_normal(shape).astype(np.float32)]


def reference(inputs) -> list[np.ndarray]:
    return list(numpy_forward_backward(*(a.astype(np.float64) for a in inputs)))


def tracer_program(inputs) -> Program:
    import tracer as tr

    def build():
        x, weight, bias = (tr.tensor(a, requires_grad=True) for a in inputs[:3])
        traced = tr.trace(layer_norm_forward_backward)
        return with_fresh_grads(traced, x, weight, bias, tr.tensor(inputs[3]))
    return Program("tracer", build)


def torch_layer_norm_programs(inputs) -> list[Program]:
    torch = installed("torch")
    if torch is None:
        return []

    def build(function):
        x, weight, bias = (torch.from_numpy(a.copy()).requires_grad_() for a in inputs[:3])
        return with_fresh_grads(function, x, weight, bias, torch.from_numpy(inputs[3]))
    return torch_programs(layer_norm_forward_backward, build)


def jax_layer_norm_programs(inputs) -> list[Program]:
    jax = installed("jax")
    if jax is None:
        return []
    jnp = jax.numpy

    def layer_norm(x, weight, bias):
        mean = x.mean(axis=-1, keepdims=True)
        centered = x - mean
        variance = (centered * centered).mean(axis=-1, keepdims=True)
        return centered / jnp.sqrt(variance + EPSILON) * weight + bias

    def forward_backward(x, weight, bias, grad_output):
        y, pullback = jax.vjp(layer_norm, x, weight, bias)
        return (y, *pullback(grad_output))

    def build(function):
        arrays = [jnp.asarray(a) for a in inputs]
        return lambda: jax.block_until_ready(function(*arrays))
    return jax_programs(forward_backward, build)


def numpy_program(inputs) -> Program:
    return Program("numpy", lambda: lambda: numpy_forward_backward(*inputs))


def programs(inputs) -> list[Program]:
    return [tracer_program(inputs),
            numpy_program(inputs),
            *torch_layer_norm_programs(inputs), *jax_layer_norm_programs(inputs)]


def rows(quick: bool, timing: Timing) -> list[Row]:
    result = []
    for label in QUICK_SIZES if quick else SIZES:
        inputs = make_inputs(SIZES[label])
        elements = inputs[0].size
        result.append(measure(Row("layer norm fwd+bwd (dx, dw, db)", f"{label} float32"),
                              programs(inputs), reference(inputs), TOLERANCE, timing,
                              floors=floors.streaming(BYTES_PER_ELEMENT * elements)))
    return result
