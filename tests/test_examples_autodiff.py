"""The higher-order examples (examples/pinn_burgers.py, examples/hessian_vector.py) run, and agree
with the same computations in PyTorch (the PINN's: benchmarks/higher_order.py's pinn_loss)."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tracer as tr
import hessian_vector
import pinn_burgers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.higher_order import pinn_loss  # noqa: E402


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_pinn_loss_and_weight_gradients_match_pytorch(traced):
    tr.manual_seed(1)
    model = pinn_burgers.Network(width=8, depth=2)
    data = pinn_burgers.points(16, seed=1)

    def loss_and_gradients(*data):
        value = pinn_burgers.loss(model, *data)
        value.backward()
        return value

    value = (tr.trace(loss_and_gradients) if traced else loss_and_gradients)(*data)
    weights = [(torch.tensor(layer.weight.detach().numpy(), requires_grad=True),
                torch.tensor(layer.bias.detach().numpy(), requires_grad=True))
               for layer in model.layers]
    expected = pinn_loss(torch, weights, *(torch.tensor(d.numpy()) for d in data))
    expected.backward()
    np.testing.assert_allclose(value.item(), expected.item(), rtol=1e-12)
    for layer, (w, b) in zip(model.layers, weights):
        np.testing.assert_allclose(layer.weight.grad.numpy(), w.grad.numpy(), rtol=1e-9,
                                   atol=1e-13)
        np.testing.assert_allclose(layer.bias.grad.numpy(), b.grad.numpy(), rtol=1e-9,
                                   atol=1e-13)


def test_pinn_training_compiled_matches_eager_and_learns():
    eager = pinn_burgers.train(3, traced=False, count=32)
    traced = pinn_burgers.train(60, traced=True, count=32)
    np.testing.assert_allclose(traced[:3], eager, rtol=1e-10)
    assert traced[-1] < 0.75 * traced[0]  # (0.166 to 0.094 when written)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_hessian_vector_products_match_pytorch(traced):
    w1, w2, x, y = hessian_vector.problem(seed=2)
    random = np.random.default_rng(5)
    v1, v2 = random.standard_normal(w1.shape), random.standard_normal(w2.shape)
    arguments = (w1.detach().requires_grad_(), w2.detach().requires_grad_(), tr.tensor(v1),
                 tr.tensor(v2), x, y)
    by_double_backward = (tr.trace(hessian_vector.hvp) if traced else hessian_vector.hvp)(
        *arguments)
    forward_over_reverse = hessian_vector.hvp_forward_over_reverse
    by_jvp = (tr.trace(forward_over_reverse) if traced else forward_over_reverse)(
        w1, w2, tr.tensor(v1), tr.tensor(v2), x, y)
    _, expected = torch.autograd.functional.hvp(
        lambda a, b: hessian_vector.mlp_loss(a, b, torch.tensor(x.numpy()),
                                             torch.tensor(y.numpy())),
        (torch.tensor(w1.numpy()), torch.tensor(w2.numpy())),
        (torch.tensor(v1), torch.tensor(v2)))
    for ours in (by_double_backward, by_jvp):
        for a, b in zip(ours, expected, strict=True):
            np.testing.assert_allclose(a.detach().numpy(), b.numpy(), rtol=1e-11, atol=1e-14)


def test_newton_cg_main_decreases_the_loss(capsys):
    hessian_vector.main()
    losses = [float(line.split()[-1]) for line in capsys.readouterr().out.splitlines()]
    assert losses[1] < 0.5 * losses[0] and losses[-1] <= losses[1]
