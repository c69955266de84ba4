"""Steps that differentiate twice or per sample (issue 17), each the example's own program: the
physics-informed network's Adam step (examples/pinn_burgers.py: second derivatives of the
network in the loss, then the weights' gradient), the WGAN-GP critic's Adam step
(examples/wgan_gp.py: a gradient penalty, a double backward) and the clipped step of DP-SGD on
per-sample gradients (examples/per_sample_grads.py: `vmap(grad(loss))`). PyTorch runs the same
steps written with torch (torch.func.vmap and grad for the per-sample ones) from the same weights,
eagerly and under torch.compile, which is reported failing where it cannot compile a double
backward; jax.jit runs them as JAX users write them (benchmarks/higher_order_jax.py). The float64
reference is PyTorch's eager step in float64.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from benchmarks import higher_order_jax
from benchmarks.harness import CALLS_BEFORE_CHECK, Program, Row, Timing, load_example, measure
from benchmarks.peers import installed, torch_programs

# PINN (float64 throughout): collocation points per step, the example's 20-wide 3-layer network.
PINN_SIZES = {"128 points, 3×20 tanh": 128, "1024 points, 3×20 tanh": 1024}
# WGAN-GP (float32): batch, hidden width of the critic (and the generator).
WGAN_SIZES = {"batch 64, 2→64→64→1": (64, 64), "batch 256, 2→256→256→1": (256, 256)}
# Per-sample gradients (float32): batch, features, hidden width, classes.
PER_SAMPLE_SIZES = {"batch 32, 16→32→4": (32, 16, 32, 4), "batch 64, 64→128→10": (64, 64, 128, 10)}
QUICK = ("128 points, 3×20 tanh", "batch 64, 2→64→64→1", "batch 32, 16→32→4")
# float32 results against float64 (Adam's first steps move each weight by about lr, so the
# weights are checked to a scale of that move); float64 results to rounding.
TOLERANCE = {"float32": 1e-4, "float64": 1e-9}


@functools.cache
def example(name: str):
    return load_example(f"{name}.py")


def _scales(expected, initial, tolerance):
    """The loss's scale, and each parameter's: how far the steps moved it (at least its
    rounding), so that a wrong step is caught where the value barely moves."""
    moved = [max(float(np.abs(e - i).max(initial=0.0)), 1e-7 / tolerance)
             for e, i in zip(expected[1:], initial)]
    return [abs(float(expected[0])), *moved]


# The PINN ------------------------------------------------------------------------------------

@functools.cache
def torch_steps():
    """The torch steps, closures over the torch module (which Dynamo reads as a constant)."""
    torch = installed("torch")
    return (_pinn_step(torch), _critic_step(torch), _clipped_step(torch))


def _pinn_step(torch):
    def torch_pinn_step(weights, optimizer, t, x, t_data, x_data, u_data):
        return pinn_loss_step(torch, weights, optimizer, t, x, t_data, x_data, u_data)
    return torch_pinn_step


def pinn_loss(torch, weights, t, x, t_data, x_data, u_data):
    """examples/pinn_burgers.py's loss written in PyTorch, on the (weight, bias) pairs `weights`
    (also the oracle of tests/test_examples_autodiff.py)."""
    def network(t, x):
        h = torch.cat([t, x], dim=1)
        for index, (w, b) in enumerate(weights):
            h = h @ w.T + b
            if index < len(weights) - 1:
                h = h.tanh()
        return h

    t, x = t.detach().requires_grad_(), x.detach().requires_grad_()
    u = network(t, x)
    u_t, u_x = torch.autograd.grad(u.sum(), [t, x], create_graph=True)
    (u_xx,) = torch.autograd.grad(u_x.sum(), x, create_graph=True)
    equation = ((u_t + u * u_x - 0.01 / math.pi * u_xx) ** 2).mean()
    return equation + ((network(t_data, x_data) - u_data) ** 2).mean()


def pinn_loss_step(torch, weights, optimizer, t, x, t_data, x_data, u_data):
    optimizer.zero_grad()
    loss = pinn_loss(torch, weights, t, x, t_data, x_data, u_data)
    loss.backward()
    optimizer.step()
    return loss.detach()


def pinn_workload(count: int) -> tuple[list[Program], list[np.ndarray], list[float]]:
    """The programs (the tracer's first), the float64 reference and its scales."""
    import tracer as tr
    pinn = example("pinn_burgers")
    tr.manual_seed(0)
    initial = [(layer.weight.detach().numpy().copy(), layer.bias.detach().numpy().copy())
               for layer in pinn.Network().layers]
    data = [d.numpy() for d in pinn.points(count, seed=0)]

    def tracer_build():
        model = pinn.Network()
        for layer, (w, b) in zip(model.layers, initial):
            layer.weight.data.copy_(tr.tensor(w))
            layer.bias.data.copy_(tr.tensor(b))
        optimizer = tr.optim.Adam(model.parameters(), lr=3e-3)
        step = pinn.make_step(model, optimizer)
        arguments = [tr.tensor(d) for d in data]
        return lambda: (step(*arguments), *model.parameters())

    def torch_build(function):
        torch = installed("torch")
        weights = [(torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True))
                   for w, b in initial]
        flat = [p for pair in weights for p in pair]
        optimizer = torch.optim.Adam(flat, lr=3e-3)
        arguments = [torch.tensor(d) for d in data]
        return lambda: (function(weights, optimizer, *arguments), *flat)

    torch_pinn_step = torch_steps()[0]
    expected = _reference(torch_build, torch_pinn_step)
    scales = _scales(expected, [a for pair in initial for a in pair], TOLERANCE["float64"])
    return ([Program("tracer", tracer_build), *torch_programs(torch_pinn_step, torch_build),
             *higher_order_jax.pinn_programs(initial, data, pinn.NU)], expected, scales)


def _reference(torch_build, function) -> list[np.ndarray]:
    run = torch_build(function)
    for _ in range(CALLS_BEFORE_CHECK):
        results = run()
    return [r.detach().numpy().astype(np.float64) for r in results]


# WGAN-GP ------------------------------------------------------------------------------------

def _critic_step(torch):
    def torch_critic_step(critic, generator, optimizer, real, noise, epsilon):
        return critic_step(torch, critic, generator, optimizer, real, noise, epsilon)
    return torch_critic_step


def critic_step(torch, critic, generator, optimizer, real, noise, epsilon):
    optimizer.zero_grad()
    fake = generator(noise).detach()
    interpolates = (epsilon * real + (1 - epsilon) * fake).requires_grad_()
    scores = critic(interpolates)
    (gradients,) = torch.autograd.grad(scores, interpolates, torch.ones_like(scores),
                                       create_graph=True, retain_graph=True)
    penalty = ((gradients.norm(2, dim=1) - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + 10.0 * penalty
    loss.backward()
    optimizer.step()
    return loss.detach()


def _torch_mlp(weights, activation, dtype):
    torch = installed("torch")
    layers = []
    for index, (w, b) in enumerate(weights):
        linear = torch.nn.Linear(w.shape[1], w.shape[0], dtype=dtype)
        with torch.no_grad():
            linear.weight.copy_(torch.tensor(w))
            linear.bias.copy_(torch.tensor(b))
        layers += [linear] + ([activation()] if index < len(weights) - 1 else [])
    return torch.nn.Sequential(*layers)


def wgan_workload(size: tuple[int, int]) -> tuple[list[Program], list[np.ndarray], list[float]]:
    import tracer as tr
    wgan = example("wgan_gp")
    batch, hidden = size
    critic, generator = wgan.models(hidden=hidden)
    critic_weights, generator_weights = (
        [(layer.weight.detach().numpy().copy(), layer.bias.detach().numpy().copy())
         for layer in model.layers] for model in (critic, generator))
    data = [d.numpy() for d in wgan.batch(batch)]

    def tracer_build():
        critic, generator = wgan.models(hidden=hidden)
        optimizer = tr.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))
        step = wgan.make_step(critic, generator, optimizer)
        arguments = [tr.tensor(d) for d in data]
        return lambda: (step(*arguments), *critic.parameters())

    def torch_build(function, dtype=None):
        torch = installed("torch")
        dtype = dtype or torch.float32
        torch_critic = _torch_mlp(critic_weights, torch.nn.Tanh, dtype)
        torch_generator = _torch_mlp(generator_weights, torch.nn.ReLU, dtype)
        optimizer = torch.optim.Adam(torch_critic.parameters(), lr=1e-4, betas=(0.0, 0.9))
        arguments = [torch.tensor(d, dtype=dtype) for d in data]
        return lambda: (function(torch_critic, torch_generator, optimizer, *arguments),
                        *torch_critic.parameters())

    torch_critic_step = torch_steps()[1]
    expected = _reference(functools.partial(torch_build, dtype=installed("torch").float64),
                          torch_critic_step)
    scales = _scales(expected, [a for pair in critic_weights for a in pair], TOLERANCE["float32"])
    return ([Program("tracer", tracer_build), *torch_programs(torch_critic_step, torch_build),
             *higher_order_jax.wgan_programs(critic_weights, generator_weights, data,
                                             wgan.PENALTY)], expected, scales)


# Per-sample gradients -------------------------------------------------------------------------

def _clipped_step(torch):
    def torch_clipped_step(params, x, y, clip):
        return clipped_step(torch, params, x, y, clip)
    return torch_clipped_step


def clipped_step(torch, params, x, y, clip):
    def loss(params, x, y):
        h = (x @ params["w1"] + params["b1"]).tanh()
        logits = h @ params["w2"] + params["b2"]
        return torch.nn.functional.cross_entropy(logits.unsqueeze(0), y.unsqueeze(0))

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    total = sum((g.reshape(g.shape[0], -1) ** 2).sum(dim=1) for g in grads.values()).sqrt()
    scale = (clip / (total + 1e-6)).clamp(max=1.0)
    for name, g in grads.items():
        params[name].sub_(0.1 * (g * scale.reshape(-1, *[1] * (g.ndim - 1))).mean(dim=0))
    return total


def per_sample_workload(size: tuple[int, int, int, int]) -> tuple[list[Program], list[np.ndarray],
                                                                 list[float]]:
    import tracer as tr
    module = example("per_sample_grads")
    batch, features, hidden, classes = size
    initial = {k: v.numpy().copy() for k, v in module.init(features, hidden, classes).items()}
    x, y = (d.numpy() for d in module.data(batch, features, classes))

    def tracer_build():
        params = {k: tr.tensor(v) for k, v in initial.items()}
        step = tr.trace(module.clipped_step)
        arguments = (tr.tensor(x), tr.tensor(y))
        return lambda: (step(params, *arguments), *params.values())

    def torch_build(function, dtype=None):
        torch = installed("torch")
        params = {k: torch.tensor(v, dtype=dtype) for k, v in initial.items()}
        arguments = (torch.tensor(x, dtype=dtype), torch.tensor(y))
        return lambda: (function(params, *arguments, module.CLIP), *params.values())

    torch_clipped_step = torch_steps()[2]
    expected = _reference(functools.partial(torch_build, dtype=installed("torch").float64),
                          torch_clipped_step)
    scales = [float(np.abs(expected[0]).max())] + _scales(
        [0.0, *expected[1:]], list(initial.values()), TOLERANCE["float32"])[1:]
    return ([Program("tracer", tracer_build), *torch_programs(torch_clipped_step, torch_build),
             *higher_order_jax.clipped_programs(initial, x, y, module.CLIP)], expected, scales)


# (name, sizes, the workload, its dtype)
WORKLOADS = [("PINN Adam step (Burgers, 2nd derivatives)", PINN_SIZES, pinn_workload, "float64"),
             ("WGAN-GP critic step (double backward)", WGAN_SIZES, wgan_workload, "float32"),
             ("per-sample gradient norms + clipped step (vmap of grad)", PER_SAMPLE_SIZES,
              per_sample_workload, "float32")]


def rows(quick: bool, timing: Timing) -> list[Row]:
    if installed("torch") is None:  # the float64 reference is PyTorch's
        return []
    result = []
    for name, sizes, workload, dtype in WORKLOADS:
        for label, size in sizes.items():
            if not quick or label in QUICK:
                programs, expected, scales = workload(size)
                result.append(measure(Row(name, label), programs, expected, TOLERANCE[dtype],
                                      timing, scales))
    return result
