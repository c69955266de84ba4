"""tr.nn.Sequential, ModuleList and ModuleDict against torch.nn's: the same operations on both give
the same registered names, order and modules; a traced step through them fills every gradient."""
import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn


def build(library):
    """The same container operations, in either library; the names of the parameters after each."""
    names = []
    layers = library.ModuleList([library.Linear(2, 3), library.Linear(3, 4)])
    layers.append(library.Linear(4, 5))
    layers.extend([library.ReLU(), library.Linear(5, 1)])
    layers.insert(1, library.Tanh())
    layers[-1] = library.Linear(5, 2)
    names.append([n for n, _ in layers.named_parameters()])
    del layers[0]  # the names are numbered again from 0
    names.append([n for n, _ in layers.named_parameters()])
    names.append([type(m).__name__ for m in layers[1:3]] + [type(layers[1:3]).__name__])
    heads = library.ModuleDict({"b": library.Linear(1, 1), "a": library.Linear(1, 2)})
    heads["c"] = library.Linear(2, 2)
    heads.update([("a", library.Linear(1, 3))])  # replaced, keeping its place
    names.append([n for n, _ in heads.named_parameters()] + list(heads) + [len(heads)])
    model = library.Module()
    model.layers, model.heads = layers, heads
    model.body = library.Sequential(library.Linear(2, 2), library.ReLU())
    model.body.append(library.Linear(2, 1))
    names.append(list(model.state_dict()))
    names.append(["c" in heads, "z" in heads, len(layers), len(model.body),
                  type(model.body[0:2]).__name__])
    joined = layers + library.ModuleList([library.Flatten(), library.Identity()])
    popped = [type(joined.pop(1)).__name__, type(joined.pop(-1)).__name__,
              type(heads.pop("b")).__name__]
    names.append(popped + [n for n, _ in joined.named_parameters()] + list(heads.keys()))
    return names


def test_container_operations_register_what_torch_registers():
    assert build(nn) == build(torch.nn)


def test_bad_container_uses_are_clear_errors():
    layers = nn.ModuleList([nn.Linear(1, 1)])
    with pytest.raises(tr.ArgumentError, match="test_nn_containers.py.*ModuleList holds"):
        layers.append(tr.ones(1))
    with pytest.raises(IndexError, match="index 3 is out of range for ModuleList of 1"):
        layers[3]
    with pytest.raises(tr.ArgumentError, match="ModuleDict holds"):
        nn.ModuleDict({"a": "not a module"})


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(3, 3, dtype=tr.float64) for _ in range(2)])
        self.heads = nn.ModuleDict({"out": nn.Linear(3, 1, dtype=tr.float64)})

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).tanh()
        return self.heads["out"](x)


def test_traced_step_through_containers_equals_eager():
    """Parameters reached through a ModuleList and a ModuleDict are runtime inputs of a traced
    step: SGD updates them as eager mode does (same initial weights)."""
    x = tr.tensor(np.random.default_rng(0).standard_normal((4, 3)))
    models = []
    for traced in (False, True):
        tr.manual_seed(5)
        model = Stack()
        optimizer = tr.optim.SGD(model.parameters(), lr=0.1)

        def step(x):  # reads this iteration's model and optimizer, as a training script does
            optimizer.zero_grad()  # noqa: B023
            loss = model(x).pow(2).mean()  # noqa: B023
            loss.backward()
            optimizer.step()  # noqa: B023
            return loss

        step = tr.trace(step) if traced else step
        losses = [step(x).item() for _ in range(3)]
        models.append((model, losses))
    (eager, eager_losses), (traced, traced_losses) = models
    np.testing.assert_allclose(traced_losses, eager_losses, rtol=1e-12)
    assert traced_losses[-1] < traced_losses[0]
    for (name, a), (_, b) in zip(eager.named_parameters(), traced.named_parameters()):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-12,
                                   err_msg=name)
