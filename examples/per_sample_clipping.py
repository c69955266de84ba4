"""Per-sample gradient clipping, the step of DP-SGD (without its noise): each example's gradient
by tr.vmap(tr.grad(loss)), scaled down to a norm of at most `max_norm`, then averaged. Under
@tr.trace the per-sample gradients are one batched graph, whatever the batch size."""
import numpy as np

import tracer as tr


def loss(params, x, y):
    """The cross-entropy of one example (x: features, y: its class) under a small MLP."""
    hidden = (x @ params["w1"] + params["b1"]).tanh()
    logits = hidden @ params["w2"] + params["b2"]
    return tr.nn.functional.cross_entropy(logits.unsqueeze(0), y.unsqueeze(0))


def clipped_gradient(params, x, y, max_norm):
    """The mean of the per-sample gradients, each clipped to norm `max_norm`; and their norms."""
    grads = tr.vmap(tr.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    norms = sum(g.pow(2).sum(tuple(range(1, g.ndim))) for g in grads.values()).sqrt()
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    clipped = {k: (g * scale.reshape(-1, *[1] * (g.ndim - 1))).mean(0) for k, g in grads.items()}
    return clipped, norms


def step(params, x, y, learning_rate, max_norm):
    grads, norms = clipped_gradient(params, x, y, max_norm)
    return {k: params[k] - learning_rate * grads[k] for k in params}, norms.max()


def data(count: int = 96, seed: int = 0):
    """Three Gaussian blobs in the plane."""
    random = np.random.default_rng(seed)
    y = random.integers(0, 3, count)
    centers = np.array([[0.0, 2.0], [-2.0, -1.0], [2.0, -1.0]])
    x = centers[y] + random.standard_normal((count, 2))
    return tr.tensor(x), tr.tensor(y)


def initial_params(hidden: int = 16, seed: int = 1):
    random = np.random.default_rng(seed)
    return {"w1": tr.tensor(random.standard_normal((2, hidden)) * 0.5),
            "b1": tr.zeros(hidden, dtype=tr.float64),
            "w2": tr.tensor(random.standard_normal((hidden, 3)) * 0.5),
            "b2": tr.zeros(3, dtype=tr.float64)}


def train(steps: int, traced: bool = True, learning_rate: float = 0.5, max_norm: float = 1.0):
    """The mean loss over the data before each step."""
    x, y = data()
    params = initial_params()
    run = tr.trace(step) if traced else step
    mean_loss = tr.vmap(loss, in_dims=(None, 0, 0))
    losses = []
    for _ in range(steps):
        losses.append(mean_loss(params, x, y).mean().item())
        params, _ = run(params, x, y, learning_rate, max_norm)
    return losses


def main() -> None:
    losses = train(60)
    print(f"mean loss: {losses[0]:.4f} at first, {losses[-1]:.4f} after {len(losses)} steps")


if __name__ == "__main__":
    main()
