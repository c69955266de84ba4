"""The seed training step, examples/two_layer_net.py: relu(x @ w1) @ w2 with the custom MyReLU
Function, squared loss, `.backward()`, in-place SGD and `w.grad.zero_()`; each peer runs the same
step on the same data (jax's update is functional, with the weights donated)."""
from __future__ import annotations

import numpy as np

from benchmarks import floors
from benchmarks.harness import CALLS_BEFORE_CHECK, Program, Row, Timing, load_example, measure
from benchmarks.peers import installed, jax_programs, torch_programs

# (N, D_in, H, D_out) and a learning rate small enough that repeated steps stay finite.
SIZES = {"64×1000→100→10": ((64, 1000, 100, 10), 1e-6),
         "512×1024→1024→1024": ((512, 1024, 1024, 1024), 1e-9)}
# Reductions of up to 1024 float32 products per matmul: typical error sqrt(K) u ≈ 2e-6 of the
# scale, worst K u ≈ 6e-5. The weights are checked on their change over the steps (not on their
# value, which the update barely moves), so 1e-4 of that change.
TOLERANCE = 1e-4
QUICK_SIZES = ("64×1000→100→10",)


def seed_module():
    """examples/two_layer_net.py, the program users start from, loaded from its file."""
    return load_example("two_layer_net.py")


def make_inputs(sizes, seed: int = 0) -> list[np.ndarray]:
    n, d_in, h, d_out = sizes
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32)
            for shape in ((n, d_in), (n, d_out), (d_in, h), (h, d_out))]


def numpy_step(x, y, w1, w2, learning_rate):
    hidden = x @ w1
    relu = np.maximum(hidden, 0)
    difference = relu @ w2 - y
    loss = np.sum(difference * difference)
    grad_prediction = 2 * difference
    grad_w2 = relu.T @ grad_prediction
    grad_hidden = grad_prediction @ w2.T
    grad_hidden[hidden < 0] = 0
    grad_w1 = x.T @ grad_hidden
    w1 -= learning_rate * grad_w1
    w2 -= learning_rate * grad_w2
    return loss


def reference(inputs, learning_rate):
    """Loss of the last of CALLS_BEFORE_CHECK steps and the weights after them, in float64, with
    the scales of the check: the loss, and how far the steps moved each weight."""
    x, y, w1, w2 = (a.astype(np.float64) for a in inputs)
    for _ in range(CALLS_BEFORE_CHECK):
        loss = numpy_step(x, y, w1, w2, learning_rate)
    expected = [np.asarray(loss), w1, w2]
    scales = [abs(float(loss)), float(np.abs(w1 - inputs[2]).max()),
              float(np.abs(w2 - inputs[3]).max())]
    return expected, scales


def tracer_program(inputs, learning_rate) -> Program:
    import tracer as tr

    def build():
        x, y, w1, w2 = (tr.tensor(a.copy()) for a in inputs)
        w1.requires_grad_()
        w2.requires_grad_()
        step = tr.trace(seed_module().step)

        def run():
            return (step(x, y, w1, w2, learning_rate), w1, w2)
        run.traced = step  # for benchmarks/kernel_profile.py
        return run
    return Program("tracer", build)


def numpy_program(inputs, learning_rate) -> Program:
    def build():
        x, y, w1, w2 = (a.copy() for a in inputs)
        rate = np.float32(learning_rate)
        return lambda: (numpy_step(x, y, w1, w2, rate), w1, w2)
    return Program("numpy", build)


def torch_step_programs(inputs, learning_rate) -> list[Program]:
    torch = installed("torch")
    if torch is None:
        return []

    class MyReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input):
            ctx.save_for_backward(input)
            return input.clamp(min=0)

        @staticmethod
        def backward(ctx, grad_output):
            (input,) = ctx.saved_tensors
            grad_input = grad_output.clone()
            grad_input[input < 0] = 0
            return grad_input

    def step(x, y, w1, w2, learning_rate):
        y_pred = MyReLU.apply(x.mm(w1)).mm(w2)
        loss = (y_pred - y).pow(2).sum()
        loss.backward()
        with torch.no_grad():
            w1.sub_(learning_rate * w1.grad)
            w2.sub_(learning_rate * w2.grad)
            w1.grad.zero_()
            w2.grad.zero_()
        return loss.detach()  # fullgraph=True refuses to return a tensor backward consumed

    def build(function):
        x, y, w1, w2 = (torch.from_numpy(a.copy()) for a in inputs)
        w1.requires_grad_()
        w2.requires_grad_()
        return lambda: (function(x, y, w1, w2, learning_rate), w1, w2)
    return torch_programs(step, build)


def jax_step_programs(inputs, learning_rate) -> list[Program]:
    jax = installed("jax")
    if jax is None:
        return []
    jnp = jax.numpy

    @jax.custom_vjp
    def relu(input):
        return jnp.maximum(input, 0)

    def relu_forward(input):
        return relu(input), input

    def relu_backward(input, grad_output):
        return (jnp.where(input < 0, 0, grad_output),)

    relu.defvjp(relu_forward, relu_backward)

    def loss_function(w1, w2, x, y):
        return jnp.sum((relu(x @ w1) @ w2 - y) ** 2)

    def step(x, y, w1, w2, learning_rate):
        loss, (grad_w1, grad_w2) = jax.value_and_grad(loss_function, argnums=(0, 1))(w1, w2, x, y)
        return loss, w1 - learning_rate * grad_w1, w2 - learning_rate * grad_w2

    def build(function):
        x, y, w1, w2 = (jnp.asarray(a) for a in inputs)
        state = [w1, w2]

        def run():
            loss, state[0], state[1] = function(x, y, state[0], state[1], learning_rate)
            return loss.block_until_ready(), state[0], state[1]
        return run
    return jax_programs(step, build, donate_argnums=(2, 3))


def programs(inputs, learning_rate) -> list[Program]:
    return [tracer_program(inputs, learning_rate), numpy_program(inputs, learning_rate),
            *torch_step_programs(inputs, learning_rate),
            *jax_step_programs(inputs, learning_rate)]


def matmul_shapes(sizes) -> list[tuple[int, int, int]]:
    """(m, k, n) of the step's five products: two forward, three backward."""
    n, d_in, h, d_out = sizes
    return [(n, d_in, h), (n, h, d_out), (h, n, d_out), (n, d_out, h), (d_in, n, h)]


def rows(quick: bool, timing: Timing) -> list[Row]:
    result = []
    for label in QUICK_SIZES if quick else SIZES:
        sizes, learning_rate = SIZES[label]
        inputs = make_inputs(sizes)
        expected, scales = reference(inputs, learning_rate)
        result.append(measure(Row("training step (seed)", label),
                              programs(inputs, learning_rate), expected, TOLERANCE, timing, scales,
                              floors=floors.sgemm(matmul_shapes(sizes))))
    return result
