"""The steps of benchmarks/higher_order.py as JAX users write them, for jax.jit: the PINN's
derivatives by `jax.grad` of `jax.grad` of the network at one point, `jax.vmap`ped over the
points; the WGAN-GP penalty by `jax.grad` of the critic inside the loss that `jax.value_and_grad`
differentiates again; per-sample gradients by `jax.vmap(jax.grad(loss))`; Adam's update and the
clipped step as pure functions. Each step's new state is returned, its old state donated; a call
waits for the loss only (the outputs of one call are ready together). jax is imported when a
program is built (peers.jax_programs): the workloads list their programs in tests that run
without it."""
from __future__ import annotations

from benchmarks.harness import Program
from benchmarks.jax_training import adam, adam_state, cross_entropy
from benchmarks.peers import installed, jax_programs


def mlp(params, x, activation):
    """Linear layers given as (weight, bias) pairs in torch's layout, `activation` between them."""
    for index, (w, b) in enumerate(params):
        x = x @ w.T + b
        if index < len(params) - 1:
            x = activation(x)
    return x


def _adam_programs(loss_function, params, data, **adam_options) -> list[Program]:
    """The programs of an Adam step on `loss_function(params, *data)`, from the (weight, bias)
    pairs `params`; each call returns the loss and the new parameters, flat."""
    def step(params, optimizer_state, *data):
        loss, grads = installed("jax").value_and_grad(loss_function)(params, *data)
        return (loss, *adam(params, grads, optimizer_state, **adam_options))

    def build(function):
        jax = installed("jax")
        weights = [(jax.numpy.asarray(w), jax.numpy.asarray(b)) for w, b in params]
        optimizer_state = adam_state(weights)
        arrays = [jax.numpy.asarray(d) for d in data]

        def run():
            nonlocal weights, optimizer_state
            loss, weights, optimizer_state = function(weights, optimizer_state, *arrays)
            return (loss.block_until_ready(), *jax.tree.leaves(weights))  # w, b of each layer
        return run
    return jax_programs(step, build, donate_argnums=(0, 1))


def pinn_programs(initial, data, nu: float) -> list[Program]:
    """examples/pinn_burgers.py's Adam step for the viscosity `nu`, in float64 (jax.enable_x64
    around every call)."""
    def loss(params, t, x, t_data, x_data, u_data):
        jax = installed("jax")

        def u(t, x):  # the network at one point
            return mlp(params, jax.numpy.stack([t, x]), jax.numpy.tanh)[0]
        u_t, u_x = jax.grad(u, argnums=0), jax.grad(u, argnums=1)
        u_xx = jax.grad(u_x, argnums=1)

        def residual(t, x):
            return u_t(t, x) + u(t, x) * u_x(t, x) - nu * u_xx(t, x)
        equation = (jax.vmap(residual)(t[:, 0], x[:, 0]) ** 2).mean()
        return equation + ((jax.vmap(u)(t_data[:, 0], x_data[:, 0]) - u_data[:, 0]) ** 2).mean()

    programs = _adam_programs(loss, initial, data, learning_rate=3e-3)
    for program in programs:
        program.setting = lambda: installed("jax").enable_x64(True)
    return programs


def wgan_programs(critic, generator, data, penalty_weight: float) -> list[Program]:
    """examples/wgan_gp.py's critic step, its penalty weighted by `penalty_weight`: Adam(lr 1e-4,
    betas (0, 0.9)) on the critic; the generator's weights (numpy) are constants of the step."""
    def loss(critic, real, noise, epsilon):
        jax = installed("jax")
        tanh = jax.numpy.tanh
        fake = jax.lax.stop_gradient(mlp(generator, noise, jax.nn.relu))
        interpolates = epsilon * real + (1 - epsilon) * fake
        # each row's gradient (rows are independent, so the gradient of their sum)
        gradients = jax.grad(lambda x: mlp(critic, x, tanh).sum())(interpolates)
        penalty = ((jax.numpy.linalg.norm(gradients, axis=1) - 1) ** 2).mean()
        return (mlp(critic, fake, tanh).mean() - mlp(critic, real, tanh).mean()
                + penalty_weight * penalty)

    return _adam_programs(loss, critic, data, learning_rate=1e-4, betas=(0.0, 0.9))


def sample_loss(params, x, y):
    """The cross-entropy of one sample (x: features, y: a 0-d class label) of the MLP
    x @ w1 + b1, tanh, @ w2 + b2 (examples/per_sample_grads.py's)."""
    hidden = installed("jax").numpy.tanh(x @ params["w1"] + params["b1"])
    return cross_entropy(hidden @ params["w2"] + params["b2"], y)


def per_sample_grads(params, x, y):
    jax = installed("jax")
    return jax.vmap(jax.grad(sample_loss), in_axes=(None, 0, 0))(params, x, y)


def norms(grads: dict):
    """Each sample's gradient norm over every parameter."""
    sums = sum((g.reshape(g.shape[0], -1) ** 2).sum(axis=1) for g in grads.values())
    return installed("jax").numpy.sqrt(sums)


def clipped_programs(initial: dict, x, y, clip: float) -> list[Program]:
    """examples/per_sample_grads.py's clipped step (learning rate 0.1): the per-sample norms and
    the parameters moved by the mean of the gradients clipped to norm `clip`."""
    def clipped_step(params, x, y):
        grads = per_sample_grads(params, x, y)
        total = norms(grads)
        scale = installed("jax").numpy.minimum(clip / (total + 1e-6), 1.0)
        params = {name: p - 0.1 * (grads[name] * scale.reshape(-1, *[1] * p.ndim)).mean(axis=0)
                  for name, p in params.items()}
        return total, params

    def build(function):
        jnp = installed("jax").numpy
        params = {name: jnp.asarray(value) for name, value in initial.items()}
        arrays = jnp.asarray(x), jnp.asarray(y)

        def run():
            nonlocal params
            total, params = function(params, *arrays)
            return (total.block_until_ready(), *(params[name] for name in initial))
        return run
    return jax_programs(clipped_step, build, donate_argnums=0)
