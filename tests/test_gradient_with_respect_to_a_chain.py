"""tr.autograd.grad with respect to several tensors, one computed from another (y = f(x), the
gradient with respect to y and to x): x's takes in the path through y, as PyTorch's does. Inside
@trace the gradient stopped at every tensor it was taken with respect to until 2026-11-28, so x's
missed y's path (a silent wrong gradient; eager mode was right)."""
import numpy as np
import pytest
import torch

import tracer as tr

START = np.array([0.5, -1.0, 2.0])


def chain(T, x):
    y = x * 2
    z = (y * 1.5).sin()
    return y, z, z.sum() + (y * x).sum() + (x * 0.5).cos().sum()


ORDERS = {"z, y, x": (1, 0, -1), "x, y, z": (-1, 0, 1), "y, x": (0, -1), "x, z": (-1, 1)}


def gradients(T, x, order, create_graph):
    y, z, loss = chain(T, x)
    tensors = {-1: x, 0: y, 1: z}
    results = T.autograd.grad(loss, [tensors[k] for k in order], create_graph=create_graph)
    if create_graph:  # and a second order through them
        results = list(results) + list(T.autograd.grad(sum(r.sum() for r in results), [x]))
    return [r.detach() for r in results]


@pytest.mark.parametrize("create_graph", [False, True], ids=["first order", "create_graph"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("order", ORDERS.values(), ids=ORDERS.keys())
def test_the_gradient_with_respect_to_x_takes_in_the_paths_through_tensors_made_from_it(
        order, traced, create_graph):
    expected = gradients(torch, torch.tensor(START, requires_grad=True), order, create_graph)
    x = tr.tensor(START, requires_grad=True)
    if traced:
        results = tr.trace(lambda x: gradients(tr, x, order, create_graph))(x)
    else:
        results = gradients(tr, x, order, create_graph)
    assert len(results) == len(expected)
    for result, want in zip(results, expected):
        np.testing.assert_allclose(result.numpy(), want.numpy(), rtol=1e-13)
