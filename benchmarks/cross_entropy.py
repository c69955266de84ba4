"""Softmax cross-entropy written out (shift by the row maximum, log-sum-exp, one-hot targets,
mean over the batch), forward and backward: the results are the loss and logits.grad.
One-hot targets because integer-tensor indexing is not in the tracer yet."""
from __future__ import annotations

import numpy as np

from benchmarks import floors
from benchmarks.harness import Program, Row, Timing, measure, with_fresh_grads
from benchmarks.peers import installed, jax_programs, torch_programs

SIZES = {"4096×1000": (4096, 1000)}
# Row sums of 1000 exponentials and a batch sum of 4096 terms in float32: typical error
# sqrt(K) u ≈ 4e-6 of the scale, worst K u ≈ 2.4e-4; 1e-4 sits between.
TOLERANCE = 1e-4
BYTES_PER_ELEMENT = 12  # reads logits and targets, writes logits.grad


def cross_entropy_forward_backward(logits, targets):
    """The same code for tracer and torch tensors."""
    shifted = logits - logits.max(dim=1, keepdim=True).values
    log_probabilities = shifted - shifted.exp().sum(dim=1, keepdim=True).log()
    loss = -(targets * log_probabilities).sum() / logits.shape[0]
    loss.backward()
    return loss.detach(), logits.grad  # fullgraph=True refuses to return a tensor backward consumed


def numpy_forward_backward(logits, targets):
    shifted = logits - logits.max(axis=1, keepdims=True)
    exponentials = np.exp(shifted)
    sums = exponentials.sum(axis=1, keepdims=True)
    loss = -(targets * (shifted - np.log(sums))).sum() / logits.shape[0]
    return loss, (exponentials / sums - targets) / logits.shape[0]


def make_inputs(shape, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    batch, classes = shape
    targets = np.zeros(shape, np.float32)
    targets[np.arange(batch), rng.integers(0, classes, batch)] = 1
    return [(3 * rng.standard_normal(shape)).astype(np.float32), targets]


def reference(inputs) -> list[np.ndarray]:
    loss, grad = numpy_forward_backward(*(a.astype(np.float64) for a in inputs))
    return [np.asarray(loss), grad]


def tracer_program(inputs) -> Program:
    import tracer as tr

    def build():
        logits, targets = tr.tensor(inputs[0], requires_grad=True), tr.tensor(inputs[1])
        return with_fresh_grads(tr.trace(cross_entropy_forward_backward), logits, targets)
    return Program("tracer", build)


def torch_cross_entropy_programs(inputs) -> list[Program]:
    torch = installed("torch")
    if torch is None:
        return []

    def build(function):
        logits = torch.from_numpy(inputs[0].copy()).requires_grad_()
        return with_fresh_grads(function, logits, torch.from_numpy(inputs[1]))
    return torch_programs(cross_entropy_forward_backward, build)


def jax_cross_entropy_programs(inputs) -> list[Program]:
    jax = installed("jax")
    if jax is None:
        return []
    jnp = jax.numpy

    def loss_function(logits, targets):
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probabilities = shifted - jnp.log(jnp.exp(shifted).sum(axis=1, keepdims=True))
        return -(targets * log_probabilities).sum() / logits.shape[0]

    def build(function):
        logits, targets = jnp.asarray(inputs[0]), jnp.asarray(inputs[1])
        return lambda: jax.block_until_ready(function(logits, targets))
    return jax_programs(jax.value_and_grad(loss_function), build)


def numpy_program(inputs) -> Program:
    return Program("numpy", lambda: lambda: numpy_forward_backward(*inputs))


def programs(inputs) -> list[Program]:
    return [tracer_program(inputs),
            numpy_program(inputs),
            *torch_cross_entropy_programs(inputs), *jax_cross_entropy_programs(inputs)]


def rows(quick: bool, timing: Timing) -> list[Row]:
    result = []
    for label, shape in SIZES.items():
        inputs = make_inputs(shape)
        result.append(measure(Row("softmax cross-entropy fwd+bwd (one-hot)", f"{label} float32"),
                              programs(inputs), reference(inputs), TOLERANCE, timing,
                              floors=floors.streaming(BYTES_PER_ELEMENT * inputs[0].size)))
    return result
