"""A physics-informed network for Burgers' equation, u_t + u u_x - nu u_xx = 0 on x in [-1, 1],
t in [0, 1], u(0, x) = -sin(pi x), u(t, -1) = u(t, 1) = 0 (Raissi et al.'s benchmark).

The network u(t, x) is differentiated twice with respect to its inputs inside the loss
(`tr.autograd.grad(..., create_graph=True)`), and the loss once more with respect to the weights:
third-order reverse mode. Under `@tr.trace` the whole Adam step -- forward, the derivatives the
equation needs, their backward and the update -- is one compiled native call.
"""
import math

import numpy as np

import tracer as tr

NU = 0.01 / math.pi


class Network(tr.nn.Module):
    def __init__(self, width: int = 20, depth: int = 3):
        super().__init__()
        sizes = [2] + [width] * depth + [1]
        self.layers = tr.nn.ModuleList(
            [tr.nn.Linear(a, b, dtype=tr.float64) for a, b in zip(sizes, sizes[1:])])

    def forward(self, t, x):
        h = tr.cat([t, x], dim=1)
        for layer in self.layers[:-1]:
            h = layer(h).tanh()
        return self.layers[-1](h)


def residual(model, t, x):
    """u_t + u u_x - nu u_xx at the points (t, x), differentiable with respect to the weights."""
    u = model(t, x)
    u_t, u_x = tr.autograd.grad(u.sum(), [t, x], create_graph=True)
    (u_xx,) = tr.autograd.grad(u_x.sum(), x, create_graph=True)
    return u_t + u * u_x - NU * u_xx


def loss(model, t, x, t_data, x_data, u_data):
    t = t.detach().requires_grad_()  # the equation differentiates with respect to the points
    x = x.detach().requires_grad_()
    equation = (residual(model, t, x) ** 2).mean()
    data = ((model(t_data, x_data) - u_data) ** 2).mean()
    return equation + data


def points(count: int, seed: int):
    """Collocation points inside the domain, and data points on its initial and boundary lines."""
    random = np.random.default_rng(seed)
    t = random.uniform(0, 1, (count, 1))
    x = random.uniform(-1, 1, (count, 1))
    edge = count // 2
    t_data = np.concatenate([np.zeros((edge, 1)), random.uniform(0, 1, (edge, 1))])
    x_data = np.concatenate([random.uniform(-1, 1, (edge, 1)),
                             random.choice([-1.0, 1.0], (edge, 1))])
    u_data = np.where(t_data == 0, -np.sin(np.pi * x_data), 0.0)
    return [tr.tensor(a) for a in (t, x, t_data, x_data, u_data)]


def make_step(model, optimizer, traced: bool = True):
    def step(t, x, t_data, x_data, u_data):
        optimizer.zero_grad()
        value = loss(model, t, x, t_data, x_data, u_data)
        value.backward()
        optimizer.step()
        return value
    return tr.trace(step) if traced else step


def train(steps: int, traced: bool = True, seed: int = 0, count: int = 128) -> list[float]:
    tr.manual_seed(seed)
    model = Network()
    optimizer = tr.optim.Adam(model.parameters(), lr=3e-3)
    step = make_step(model, optimizer, traced)
    data = points(count, seed)
    return [step(*data).item() for _ in range(steps)]


def main() -> None:
    losses = train(300)
    for index in (0, 99, 199, 299):
        print(f"step {index + 1}: loss {losses[index]:.5f}")


if __name__ == "__main__":
    main()
