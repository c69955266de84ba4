"""The training step of examples/cnn_digits.py (Conv-BatchNorm-ReLU-MaxPool twice, Linear,
cross-entropy, AdamW) at the example's shape and at an ImageNet-like one (batch 32, 64
channels, 56x56, 3x3 kernels), and conv2d's forward and backward alone at the ImageNet-like
shape against the BLAS time of the three products it needs (im2col's gemm, the weight's and the
windows' gradients). The tracer runs the example's own model; PyTorch the same layers written
with torch.nn from the same weights on the same batch, eagerly and under torch.compile; jax.jit
the same step written with jax.lax (`conv_general_dilated`, `reduce_window` for the max pool) and
jax.numpy (batch norm in training mode, returning its new running statistics), its gradient by
`jax.value_and_grad` and AdamW's update as a pure function.

The float64 reference is PyTorch's eager step in float64 (the tests check the tracer's layers
against it in tests/test_nn_convolution.py and test_nn_batch_norm.py).
"""
from __future__ import annotations

import functools

import numpy as np

from benchmarks import floors
from benchmarks.harness import (CALLS_BEFORE_CHECK, Program, Row, Timing, load_example, measure,
                                with_fresh_grads)
from benchmarks.jax_training import adam_state, adamw, cross_entropy
from benchmarks.peers import installed, jax_programs, torch_programs

# (batch, in_channels, channels, size): the example's shape and an ImageNet-like block
SIZES = {"64×1×8×8, 16 channels": (64, 1, 16, 8),
         "32×64×56×56, 64 channels": (32, 64, 64, 56)}
QUICK_SIZES = ("64×1×8×8, 16 channels",)
CONVOLUTION = "32×64×56×56, 3×3, 64 → 64"
LEARNING_RATE = 1e-3
# Loss after CALLS_BEFORE_CHECK steps, float32 against float64: sums of up to 576 products and
# batch statistics over 100,000 values; 1e-4 of the scale. Parameters: AdamW's first steps move
# each by about lr * sign(g), and at the ImageNet-like shape the sign of a gradient element near
# 0 differs between float32 and float64 (torch's own float32 step moves a weight 1.6 lr away from
# its float64 step), so an element is checked to 2 lr per step, the most two such steps can
# differ: the check catches a wrong or non-finite parameter, the loss a wrong step.
TOLERANCE = 1e-4
PARAMETER_SCALE = 2 * LEARNING_RATE * CALLS_BEFORE_CHECK / TOLERANCE
# conv2d alone: the weight's gradient sums K = 32 * 56 * 56 = 100,352 float32 products per
# element: typical error sqrt(K) u ≈ 2e-5 of the scale, worst K u ≈ 6e-3. Measured against
# float64: torch's and jax's errors have the same RMS (1.1e-6 of the scale), their largest is
# 8.2e-6 (torch) and 1.05e-5 (jax: XLA sums in another order; in float64 it agrees to 2.5e-14),
# so 1e-5 failed a correct float32 result; 1e-4 sits between typical and worst, as elsewhere.
CONVOLUTION_TOLERANCE = 1e-4


@functools.cache
def example():
    return load_example("cnn_digits.py")


def make_inputs(size, seed: int = 0):
    """The model's arguments, its initial weights (float32 arrays by name) and one batch."""
    import tracer as tr
    batch, in_channels, channels, pixels = size
    tr.manual_seed(seed)
    model = example().CNN(in_channels, channels, 10, pixels)
    weights = {name: value.numpy().copy() for name, value in model.state_dict().items()}
    generator = np.random.default_rng(seed)
    x = generator.standard_normal((batch, in_channels, pixels, pixels)).astype(np.float32)
    return size, weights, (x, generator.integers(0, 10, batch))


def torch_cnn(size):
    """The example's CNN written with torch.nn, parameter for parameter (the same names)."""
    nn = installed("torch").nn
    _, in_channels, channels, pixels = size

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(in_channels, channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(channels), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(channels, 2 * channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(2 * channels), nn.ReLU(), nn.MaxPool2d(2))
            self.classifier = nn.Linear(2 * channels * (pixels // 4) ** 2, 10)

        def forward(self, x):
            return self.classifier(self.features(x).flatten(1))

        def loss(self, x, y):
            return nn.functional.cross_entropy(self(x), y)
    return CNN()


def torch_step(model, optimizer, x, y):
    loss = model.loss(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


def _torch_build(inputs, function, dtype=None):
    torch = installed("torch")
    size, weights, (x, y) = inputs
    model = torch_cnn(size)
    model.load_state_dict({name: torch.tensor(value) for name, value in weights.items()})
    if dtype is not None:
        model = model.to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    images, labels = torch.tensor(x, dtype=dtype), torch.tensor(y)
    return lambda: (function(model, optimizer, images, labels), *model.parameters())


def reference(inputs, use_torch: bool = True):
    """The loss of the last of CALLS_BEFORE_CHECK steps and the parameters after, in float64:
    PyTorch's eager step (faster at the large size), or without PyTorch the tracer's eager one,
    with the scales of the check."""
    if use_torch and installed("torch") is not None:
        run = _torch_build(inputs, torch_step, installed("torch").float64)
    else:
        run = tracer_program(inputs, float64=True).build()
    for _ in range(CALLS_BEFORE_CHECK):
        results = run()
    expected = [value.detach().numpy() for value in results]
    return expected, [abs(float(expected[0]))] + [PARAMETER_SCALE] * (len(expected) - 1)


def tracer_program(inputs, float64: bool = False) -> Program:
    """The example's model and step (on a whole batch), traced; or eager in float64."""
    import tracer as tr
    size, weights, (x, y) = inputs

    def build():
        model = example().CNN(*size[1:3], 10, size[3])
        model.load_state_dict(weights)
        if float64:
            model.double()
        optimizer = tr.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        images, labels = tr.tensor(x, dtype=tr.float64 if float64 else None), tr.tensor(y)

        def step(images, labels):
            optimizer.zero_grad()
            loss = tr.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            return loss
        run = step if float64 else tr.trace(step)

        def call():
            return (run(images, labels), *model.parameters())
        call.traced = run  # for benchmarks/kernel_profile.py
        return call
    return Program("tracer", build)


def jax_conv2d(x, w):
    """A 3x3 'same' convolution of NCHW images by OIHW weights, as F.conv2d(x, w, padding=1)."""
    return installed("jax").lax.conv_general_dilated(
        x, w, window_strides=(1, 1), padding=((1, 1), (1, 1)),
        dimension_numbers=("NCHW", "OIHW", "NCHW"))


def jax_cnn_loss(params, statistics, images, labels):
    """The example's CNN and its cross-entropy, with the batch norms in training mode: the loss,
    and the batch norms' new running statistics (momentum 0.1, the unbiased variance)."""
    jax = installed("jax")
    h, updated = images, {}
    for convolution, norm in (("features.0", "features.1"), ("features.4", "features.5")):
        h = jax_conv2d(h, params[f"{convolution}.weight"])
        mean, variance = h.mean(axis=(0, 2, 3)), h.var(axis=(0, 2, 3))
        count = h.size // h.shape[1]
        updated[f"{norm}.running_mean"] = 0.9 * statistics[f"{norm}.running_mean"] + 0.1 * mean
        updated[f"{norm}.running_var"] = (0.9 * statistics[f"{norm}.running_var"]
                                          + 0.1 * variance * count / (count - 1))
        h = ((h - mean[:, None, None]) / jax.numpy.sqrt(variance[:, None, None] + 1e-5)
             * params[f"{norm}.weight"][:, None, None] + params[f"{norm}.bias"][:, None, None])
        h = jax.lax.reduce_window(jax.nn.relu(h), -jax.numpy.inf, jax.lax.max, (1, 1, 2, 2),
                                  (1, 1, 2, 2), "VALID")
    logits = h.reshape(h.shape[0], -1) @ params["classifier.weight"].T + params["classifier.bias"]
    return cross_entropy(logits, labels), updated


def jax_cnn_programs(inputs) -> list[Program]:
    _, weights, (x, y) = inputs
    # the parameters, in torch's order (not the batch norms' statistics)
    names = [name for name in weights if name.rsplit(".", 1)[1] in ("weight", "bias")]

    def step(params, optimizer_state, statistics, images, labels):
        (loss, statistics), grads = installed("jax").value_and_grad(jax_cnn_loss, has_aux=True)(
            params, statistics, images, labels)
        params, optimizer_state = adamw(params, grads, optimizer_state, LEARNING_RATE)
        return loss, params, optimizer_state, statistics

    def build(function):  # (jax is imported here, when the program is built: peers.jax_programs)
        jnp = installed("jax").numpy
        params = {name: jnp.asarray(weights[name]) for name in names}
        statistics = {name: jnp.asarray(value) for name, value in weights.items()
                      if name.endswith(("running_mean", "running_var"))}
        optimizer_state = adam_state(params)
        images, labels = jnp.asarray(x), jnp.asarray(y)

        def run():
            nonlocal params, optimizer_state, statistics
            loss, params, optimizer_state, statistics = function(
                params, optimizer_state, statistics, images, labels)
            return (loss.block_until_ready(), *(params[name] for name in names))
        return run
    return jax_programs(step, build, donate_argnums=(0, 1, 2))


def convolution_shapes(batch, channels, out_channels, pixels) -> list[tuple[int, int, int]]:
    """(m, k, n) of a 3x3 'same' convolution's three products: weight @ windows, the weight's
    gradient and the windows' gradient."""
    depth, columns = channels * 9, batch * pixels * pixels
    return [(out_channels, depth, columns), (out_channels, columns, depth),
            (depth, out_channels, columns)]


def jax_convolution_programs(arrays) -> list[Program]:
    """conv2d's input and weight gradients by jax.grad, as torch's `.backward()` computes them."""
    jax = installed("jax")
    if jax is None:
        return []

    def gradients(x, w, g):
        return jax.grad(lambda x, w: (jax_conv2d(x, w) * g).sum(), argnums=(0, 1))(x, w)

    def build(function):
        x, w, g = (jax.numpy.asarray(a) for a in arrays)
        return lambda: jax.block_until_ready(function(x, w, g))
    return jax_programs(gradients, build)


def convolution_row(timing: Timing) -> Row:
    """conv2d forward and backward (input and weight gradients) alone."""
    import tracer as tr
    import tracer.nn.functional as F
    batch, channels, pixels = 32, 64, 56
    generator = np.random.default_rng(1)
    arrays = [generator.standard_normal((batch, channels, pixels, pixels)).astype(np.float32),
              (generator.standard_normal((channels, channels, 3, 3)) / 24).astype(np.float32),
              generator.standard_normal((batch, channels, pixels, pixels)).astype(np.float32)]

    def ours(x, w, g):
        (F.conv2d(x, w, padding=1) * g).sum().backward()
        return x.grad, w.grad

    torch = installed("torch")
    convolve = torch.nn.functional.conv2d if torch is not None else None

    def theirs(x, w, g):
        (convolve(x, w, padding=1) * g).sum().backward()
        return x.grad, w.grad

    def tracer_build():
        x, w = (tr.tensor(a, requires_grad=True) for a in arrays[:2])
        return with_fresh_grads(tr.trace(ours), x, w, tr.tensor(arrays[2]))

    def torch_build(function):
        x, w = (torch.tensor(a, requires_grad=True) for a in arrays[:2])
        return with_fresh_grads(function, x, w, torch.tensor(arrays[2]))

    if torch is not None:
        x, w = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays[:2])
        expected = [t.numpy() for t in theirs(x, w, torch.tensor(arrays[2], dtype=torch.float64))]
    else:  # the tracer in float64, eagerly
        x, w = (tr.tensor(a.astype(np.float64), requires_grad=True) for a in arrays[:2])
        expected = [t.numpy() for t in ours(x, w, tr.tensor(arrays[2].astype(np.float64)))]
    programs = [Program("tracer", tracer_build), *torch_programs(theirs, torch_build),
                *jax_convolution_programs(arrays)]
    return measure(Row("conv2d forward + backward", CONVOLUTION), programs, expected,
                   CONVOLUTION_TOLERANCE, timing,
                   floors=floors.sgemm(convolution_shapes(batch, channels, channels, pixels)))


def rows(quick: bool, timing: Timing) -> list[Row]:
    result = []
    for label in QUICK_SIZES if quick else SIZES:
        inputs = make_inputs(SIZES[label])
        expected, scales = reference(inputs)
        batch, in_channels, channels, pixels = SIZES[label]
        shapes = (convolution_shapes(batch, in_channels, channels, pixels)
                  + convolution_shapes(batch, channels, 2 * channels, pixels // 2))
        programs = [tracer_program(inputs),
                    *torch_programs(torch_step, functools.partial(_torch_build, inputs)),
                    *jax_cnn_programs(inputs)]
        result.append(measure(Row("CNN training step (AdamW)", label), programs, expected,
                              TOLERANCE, timing, scales, floors=floors.sgemm(shapes)))
    if not quick:
        result.append(convolution_row(timing))
    return result
