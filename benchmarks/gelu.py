"""GELU in its tanh form, written with `x ** 3`, as a custom Function with a hand-written
backward: y = GELU.apply(x); y.backward(grad_output); the results are y and x.grad."""
from __future__ import annotations

import math

import numpy as np

from benchmarks import floors
from benchmarks.harness import Program, Row, Timing, measure, with_fresh_grads
from benchmarks.peers import installed, jax_programs, torch_programs

SIZES = {"64K": 1 << 16, "1M": 1 << 20, "4M": 1 << 22, "16M": 1 << 24}
QUICK_SIZES = ("1M",)
COEFFICIENT = math.sqrt(2 / math.pi)
# Elementwise: about 15 float32 roundings and tanh (a few ulp, codegen/templates/math.ll.j2)
# per element, about 2e-6 of the scale; 1e-5 leaves room for (1 - t * t) cancelling near |t| = 1.
TOLERANCE = 1e-5
BYTES_PER_ELEMENT = 16  # reads x and grad_output, writes y and x.grad


def value(x, tanh):
    return 0.5 * x * (1 + tanh((x + 0.044715 * x ** 3) * COEFFICIENT))


def derivative(x, tanh):
    t = tanh((x + 0.044715 * x ** 3) * COEFFICIENT)
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * COEFFICIENT * (1 + 3 * 0.044715 * x ** 2)


def custom_function(base, tanh):
    """The same GELU for tracer's `tr.Function` and torch's `torch.autograd.Function`."""
    class GELU(base):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return value(x, tanh)

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return grad_output * derivative(x, tanh)
    return GELU


def make_inputs(size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(2 * rng.standard_normal(size)).astype(np.float32),
            rng.standard_normal(size).astype(np.float32)]


def numpy_forward_backward(x, grad_output):
    return value(x, np.tanh), grad_output * derivative(x, np.tanh)


def reference(inputs) -> list[np.ndarray]:
    return list(numpy_forward_backward(*(a.astype(np.float64) for a in inputs)))


def forward_backward_with(gelu):
    def forward_backward(x, grad_output):
        y = gelu.apply(x)
        y.backward(grad_output)
        return y.detach(), x.grad  # fullgraph=True refuses to return a tensor backward consumed
    return forward_backward


def tracer_program(inputs) -> Program:
    import tracer as tr

    def build():
        x, grad_output = tr.tensor(inputs[0], requires_grad=True), tr.tensor(inputs[1])
        traced = tr.trace(forward_backward_with(custom_function(tr.Function, tr.tanh)))
        return with_fresh_grads(traced, x, grad_output)
    return Program("tracer", build)


def torch_gelu_programs(inputs) -> list[Program]:
    torch = installed("torch")
    if torch is None:
        return []

    def build(function):
        x = torch.from_numpy(inputs[0].copy()).requires_grad_()
        return with_fresh_grads(function, x, torch.from_numpy(inputs[1]))
    return torch_programs(forward_backward_with(custom_function(torch.autograd.Function,
                                                                torch.tanh)), build)


def jax_gelu_programs(inputs) -> list[Program]:
    jax = installed("jax")
    if jax is None:
        return []
    jnp = jax.numpy

    @jax.custom_vjp
    def gelu(x):
        return value(x, jnp.tanh)

    gelu.defvjp(lambda x: (gelu(x), x),
                lambda x, grad_output: (grad_output * derivative(x, jnp.tanh),))

    def forward_backward(x, grad_output):
        y, pullback = jax.vjp(gelu, x)
        return y, pullback(grad_output)[0]

    def build(function):
        x, grad_output = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
        return lambda: jax.block_until_ready(function(x, grad_output))
    return jax_programs(forward_backward, build)


def numpy_program(inputs) -> Program:
    return Program("numpy", lambda: lambda: numpy_forward_backward(*inputs))


def programs(inputs) -> list[Program]:
    return [tracer_program(inputs),
            numpy_program(inputs),
            *torch_gelu_programs(inputs), *jax_gelu_programs(inputs)]


def rows(quick: bool, timing: Timing) -> list[Row]:
    result = []
    for label in QUICK_SIZES if quick else SIZES:
        inputs = make_inputs(SIZES[label])
        result.append(measure(Row("GELU custom Function fwd+bwd", f"{label} float32"),
                              programs(inputs), reference(inputs), TOLERANCE, timing,
                              floors=floors.streaming(BYTES_PER_ELEMENT * SIZES[label])))
    return result
