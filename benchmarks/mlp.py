"""An MLP classifier's training step as PyTorch users write one: `nn.Sequential(Linear, ReLU,
Linear)`, `F.cross_entropy`, `loss.backward()`, `optimizer.step()` (SGD) and
`optimizer.zero_grad()`, the whole step under `@tr.trace`. PyTorch runs the same model written with
torch.nn from the same weights on the same batch, eagerly and under torch.compile, and jax.jit runs
it written with jax.numpy, `jax.value_and_grad` and SGD's update as a pure function.

The float64 reference is the tracer's eager mode in float64 (the reference semantics, which the
test suite checks against PyTorch).
"""
from __future__ import annotations

import numpy as np

from benchmarks import floors
from benchmarks.harness import CALLS_BEFORE_CHECK, Program, Row, Timing, measure
from benchmarks.jax_training import cross_entropy, sgd
from benchmarks.peers import installed, jax_programs, torch_programs

# (batch, inputs, hidden, classes): MNIST's shape.
SIZES = {"256×784→512→10": (256, 784, 512, 10)}
LEARNING_RATE = 0.05
# Sums of up to 784 float32 products: typical error sqrt(K) u ≈ 2e-6 of the scale; the weights
# are checked on how far the steps moved them.
TOLERANCE = 1e-4


def make_inputs(sizes, seed: int = 0):
    """Initial weights (float32, by name) and one batch (inputs, class labels)."""
    batch, inputs, hidden, classes = sizes
    rng = np.random.default_rng(seed)
    weights = {}
    for name, (fan_out, fan_in) in (("0", (hidden, inputs)), ("2", (classes, hidden))):
        bound = fan_in ** -0.5
        weights[f"{name}.weight"] = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
        weights[f"{name}.bias"] = rng.uniform(-bound, bound, fan_out).astype(np.float32)
    x = rng.standard_normal((batch, inputs)).astype(np.float32)
    y = rng.integers(0, classes, batch).astype(np.int64)
    return sizes, weights, (x, y)


def tracer_model(sizes, weights, double: bool = False):
    from tracer import nn
    _, inputs, hidden, classes = sizes
    model = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    if double:
        model = model.double()
    model.load_state_dict(weights)
    return model


def make_step(model, optimizer):
    import tracer.nn.functional as F

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss
    return step


def reference(inputs):
    """The loss of the last of CALLS_BEFORE_CHECK steps and the parameters after them, in float64,
    with the scales of the check: the loss, and how far the steps moved each parameter."""
    import tracer as tr
    sizes, weights, (x, y) = inputs
    model = tracer_model(sizes, weights, double=True)
    step = make_step(model, tr.optim.SGD(model.parameters(), lr=LEARNING_RATE))
    for _ in range(CALLS_BEFORE_CHECK):
        loss = step(tr.tensor(x.astype(np.float64)), tr.tensor(y))
    expected = [loss.detach().numpy()] + [p.detach().numpy() for p in model.parameters()]
    moved = [float(np.abs(p - weights[name]).max()) for (name, _), p in
             zip(model.named_parameters(), expected[1:])]
    return expected, [abs(float(loss))] + moved


def tracer_program(inputs) -> Program:
    import tracer as tr
    sizes, weights, (x, y) = inputs

    def build():
        model = tracer_model(sizes, weights)
        step = tr.trace(make_step(model, tr.optim.SGD(model.parameters(), lr=LEARNING_RATE)))
        tokens, labels = tr.tensor(x), tr.tensor(y)

        def run():
            return (step(tokens, labels), *model.parameters())
        run.traced = step  # for benchmarks/kernel_profile.py
        return run
    return Program("tracer", build)


def torch_mlp_programs(inputs) -> list[Program]:
    torch = installed("torch")
    if torch is None:
        return []
    (_, features, hidden, classes), weights, (x, y) = inputs
    nn = torch.nn
    cross_entropy = nn.functional.cross_entropy

    def torch_step(model, optimizer, x, y):
        loss = cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    def build(function):
        model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        model.load_state_dict({name: torch.tensor(value) for name, value in weights.items()})
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        data, labels = torch.from_numpy(x), torch.from_numpy(y)
        return lambda: (function(model, optimizer, data, labels), *model.parameters())
    return torch_programs(torch_step, build)


def jax_mlp_programs(inputs) -> list[Program]:
    _, weights, (x, y) = inputs

    def loss_function(params, x, y):
        hidden = installed("jax").nn.relu(x @ params["0.weight"].T + params["0.bias"])
        return cross_entropy(hidden @ params["2.weight"].T + params["2.bias"], y)

    def step(params, x, y):
        loss, grads = installed("jax").value_and_grad(loss_function)(params, x, y)
        return loss, sgd(params, grads, LEARNING_RATE)

    def build(function):  # (jax is imported here, when the program is built: peers.jax_programs)
        jnp = installed("jax").numpy
        params = {name: jnp.asarray(value) for name, value in weights.items()}
        data, labels = jnp.asarray(x), jnp.asarray(y)

        def run():
            nonlocal params
            loss, params = function(params, data, labels)
            # (the outputs of one call are ready together, as two_layer.py's jax step assumes)
            return (loss.block_until_ready(), *(params[name] for name in weights))
        return run
    return jax_programs(step, build, donate_argnums=0)


def matmul_shapes(sizes) -> list[tuple[int, int, int]]:
    """(m, k, n) of the step's products: two forward, and the backward's three."""
    batch, features, hidden, classes = sizes
    return [(batch, features, hidden), (batch, hidden, classes), (hidden, batch, classes),
            (batch, classes, hidden), (features, batch, hidden)]


def profiles(quick: bool) -> list[str]:
    from benchmarks.kernel_profile import profile_text
    return [profile_text(f"MLP step {label}", tracer_program(make_inputs(sizes)).build)
            for label, sizes in SIZES.items()]


def rows(quick: bool, timing: Timing) -> list[Row]:
    result = []
    for label, sizes in SIZES.items():
        inputs = make_inputs(sizes)
        expected, scales = reference(inputs)
        result.append(measure(Row("MLP classifier step (SGD)", label),
                              [tracer_program(inputs), *torch_mlp_programs(inputs),
                               *jax_mlp_programs(inputs)], expected,
                              TOLERANCE, timing, scales,
                              floors=floors.sgemm(matmul_shapes(sizes))))
    return result
