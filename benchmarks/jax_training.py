"""What the jax.jit training steps share: cross-entropy on integer labels, and the optimizers as
JAX users without optax write them -- pure functions from (parameters, gradients, state) to new
parameters and state, over any pytree of parameters, with PyTorch's update rules
(torch.optim.SGD, Adam and AdamW with their defaults), so that each jax step computes what the
PyTorch and tracer steps compute."""
from __future__ import annotations

from benchmarks.peers import installed


def cross_entropy(logits, labels):
    """The mean over the rows of -log softmax(logits)[label], as F.cross_entropy."""
    jax = installed("jax")
    log_probabilities = jax.nn.log_softmax(logits, axis=-1)
    return -jax.numpy.take_along_axis(log_probabilities, labels[..., None], axis=-1).mean()


def sgd(params, grads, learning_rate: float):
    """torch.optim.SGD without momentum: p - lr * g."""
    return installed("jax").tree.map(lambda p, g: p - learning_rate * g, params, grads)


def adam_state(params) -> dict:
    """Adam's state for `params`: the step count and both moments, zero (arrays of their own,
    which a step may donate)."""
    jax = installed("jax")
    zeros = jax.numpy.zeros_like
    return {"step": jax.numpy.zeros((), "int32"), "m": jax.tree.map(zeros, params),
            "v": jax.tree.map(zeros, params)}


def adam(params, grads, state: dict, learning_rate: float, betas=(0.9, 0.999), eps: float = 1e-8,
         weight_decay: float = 0.0) -> tuple:
    """One step of torch.optim.AdamW (of Adam with weight_decay=0): the weights decay by
    lr * weight_decay first (decoupled), then move by lr * m_hat / (sqrt(v_hat) + eps). Returns
    the new parameters and state."""
    jax = installed("jax")
    jnp = jax.numpy
    beta1, beta2 = betas
    step = state["step"] + 1
    m = jax.tree.map(lambda m, g: beta1 * m + (1 - beta1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: beta2 * v + (1 - beta2) * g * g, state["v"], grads)
    step_size = learning_rate / (1 - beta1 ** step)
    root_correction = jnp.sqrt(1 - beta2 ** step)

    def update(p, m, v):
        p = p * (1 - learning_rate * weight_decay)
        return p - step_size * m / (jnp.sqrt(v) / root_correction + eps)
    return jax.tree.map(update, params, m, v), {"step": step, "m": m, "v": v}


def adamw(params, grads, state: dict, learning_rate: float, weight_decay: float = 1e-2) -> tuple:
    """torch.optim.AdamW with its defaults (weight_decay 0.01)."""
    return adam(params, grads, state, learning_rate, weight_decay=weight_decay)
