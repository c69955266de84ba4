"""Per-sample gradients with `tr.vmap(tr.grad(loss), in_dims=(None, 0, 0))` (torch.func's recipe),
their norms, and the clipped step of differentially private SGD (Abadi et al., 2016) that needs
them: each sample's gradient is scaled to norm at most CLIP before the batch's are averaged.
Gaussian noise, added in DP-SGD proper, is left out so that the step can be checked exactly.

The loss is written for one sample; vmap maps it over the batch by the batching pass, so under
`@tr.trace` the graph does not grow with the batch: the norms and the step are one native call.
"""
import numpy as np

import tracer as tr
import tracer.nn.functional as F

CLIP = 3.0


def init(features: int = 16, hidden: int = 32, classes: int = 4, seed: int = 0) -> dict:
    random = np.random.default_rng(seed)
    shapes = {"w1": (features, hidden), "b1": (hidden,), "w2": (hidden, classes),
              "b2": (classes,)}
    return {name: tr.tensor(random.standard_normal(shape) / np.sqrt(shape[0]), dtype=tr.float32)
            for name, shape in shapes.items()}


def loss(params: dict, x, y):
    """The cross-entropy of one sample (x: features, y: a 0-d class label)."""
    h = (x @ params["w1"] + params["b1"]).tanh()
    logits = h @ params["w2"] + params["b2"]
    return F.cross_entropy(logits.unsqueeze(0), y.unsqueeze(0))


per_sample_grads = tr.vmap(tr.grad(loss), in_dims=(None, 0, 0))


def norms(params: dict, x, y):
    """Each sample's gradient norm over every parameter."""
    grads = per_sample_grads(params, x, y)
    return sum((g.reshape(g.shape[0], -1) ** 2).sum(dim=1) for g in grads.values()).sqrt()


def clipped_step(params: dict, x, y, lr: float = 0.1):
    """The per-sample norms, and params updated in place by the mean of the clipped gradients."""
    grads = per_sample_grads(params, x, y)
    total = sum((g.reshape(g.shape[0], -1) ** 2).sum(dim=1) for g in grads.values()).sqrt()
    scale = (CLIP / (total + 1e-6)).clamp(max=1.0)
    for name, g in grads.items():
        factor = scale.reshape(-1, *([1] * (g.ndim - 1)))
        params[name].sub_(lr * (g * factor).mean(dim=0))
    return total


def data(size: int = 32, features: int = 16, classes: int = 4, seed: int = 0):
    random = np.random.default_rng(seed)
    return (tr.tensor(random.standard_normal((size, features)), dtype=tr.float32),
            tr.tensor(random.integers(0, classes, size)))


if __name__ == "__main__":
    params = init()
    step = tr.trace(clipped_step)
    for n in range(5):
        print("largest gradient norm:", float(step(params, *data(seed=n)).max()))
