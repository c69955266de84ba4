"""A compiled call writes its outputs into the arrays of the previous call's outputs that nothing
references any more (runtime/compiled.py, `_new_outputs`): never into one the caller can still
reach -- through a tensor, a numpy array or a view of it, a `.grad`, the eager tape or torch. The oracle
is numpy: every value the caller holds keeps what it was computed as."""
from __future__ import annotations

import numpy as np
import pytest

import tracer as tr


def _double(x):
    return x * 2


def test_an_output_the_caller_dropped_is_written_again_with_the_right_values():
    f = tr.trace(_double)
    x = np.arange(6, dtype=np.float32)
    first = f(tr.tensor(x))
    address = first.numpy().ctypes.data
    del first
    second = f(tr.tensor(x + 1))
    np.testing.assert_array_equal(second.numpy(), (x + 1) * 2)
    # (reused: the point of it, and what makes the other tests below able to fail)
    assert second.numpy().ctypes.data == address


@pytest.mark.parametrize("hold", ["tensor", "numpy", "view", "torch"])
def test_an_output_the_caller_still_reaches_is_never_overwritten(hold):
    f = tr.trace(_double)
    x = np.arange(6, dtype=np.float32)
    result = f(tr.tensor(x))
    if hold == "tensor":
        held, expected = result, x * 2
    elif hold == "numpy":
        held, expected = result.numpy(), x * 2
    elif hold == "view":  # a numpy view: its base is the output
        held, expected = result.numpy()[2:5], (x * 2)[2:5]
    else:
        torch = pytest.importorskip("torch")
        held, expected = torch.from_numpy(result.numpy()), x * 2
    del result
    for k in range(3):
        again = f(tr.tensor(x + 10 * (k + 1)))
        np.testing.assert_array_equal(np.asarray(held), expected)
        np.testing.assert_array_equal(again.numpy(), (x + 10 * (k + 1)) * 2)


def test_a_gradient_kept_after_zero_grad_keeps_its_values():
    w = tr.tensor(np.ones(4, np.float32), requires_grad=True)
    optimizer = tr.optim.SGD([w], lr=0.5)

    @tr.trace
    def step(x):
        optimizer.zero_grad()
        loss = (w * x).sum()
        loss.backward()
        optimizer.step()
        return loss

    kept = []
    for k in range(4):
        x = tr.tensor(np.full(4, k + 1.0, np.float32))
        step(x)
        kept.append(w.grad)
    for k, grad in enumerate(kept):
        np.testing.assert_array_equal(grad.numpy(), np.full(4, k + 1.0, np.float32))
    np.testing.assert_array_equal(w.detach().numpy(),
                                  1 - 0.5 * (1 + 2 + 3 + 4) * np.ones(4, np.float32))


def test_a_result_the_eager_tape_saved_keeps_its_values():
    f = tr.trace(lambda x: x.exp())
    x = tr.tensor(np.linspace(-1, 1, 5, dtype=np.float32), requires_grad=True)
    y = f(x)
    loss = (y * y).sum()  # the tape saves y for the product's backward
    del y
    f(x.detach() + 3)  # a call that could reuse y's array if the tape's reference were missed
    loss.backward()
    expected = 2 * np.exp(2 * np.linspace(-1, 1, 5).astype(np.float64))
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-5)


def test_a_returned_grad_is_the_grad_itself_as_in_pytorch():
    def step(x):
        (x * x).sum().backward()
        return x.grad

    x = tr.tensor(np.arange(3, dtype=np.float32), requires_grad=True)
    eager_x = tr.tensor(np.arange(3, dtype=np.float32), requires_grad=True)
    assert step(eager_x) is eager_x.grad  # eager mode, as PyTorch
    traced = tr.trace(step)
    for _ in range(3):  # (the first call compiles; the later ones reuse outputs)
        x.grad = None
        returned = traced(x)
        assert returned is x.grad
        np.testing.assert_array_equal(returned.numpy(), 2 * np.arange(3, dtype=np.float32))
    returned.add_(1)  # one tensor: the change is x.grad's
    np.testing.assert_array_equal(x.grad.numpy(), 2 * np.arange(3, dtype=np.float32) + 1)


def test_a_returned_argument_changed_in_place_is_the_argument():
    @tr.trace
    def bump(x, w):
        x.add_(w)
        return x, x * 2

    x = tr.tensor(np.ones(4, np.float32))
    w = tr.tensor(np.arange(4, dtype=np.float32))
    for k in range(1, 4):
        same, doubled = bump(x, w)
        assert same is x
        np.testing.assert_array_equal(x.numpy(), 1 + k * np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(doubled.numpy(), 2 * x.numpy())


def test_a_returned_captured_parameter_and_its_grad_are_the_model_s():
    model = tr.nn.Linear(3, 2)
    optimizer = tr.optim.SGD(model.parameters(), lr=0.1)

    @tr.trace
    def step(x):
        optimizer.zero_grad()
        model(x).pow(2).sum().backward()
        optimizer.step()
        return model.weight, model.weight.grad, model.bias.grad.clone()

    x = tr.tensor(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
    for _ in range(3):
        before = model.weight.detach().numpy().copy(), model.bias.detach().numpy().copy()
        weight, grad, bias_grad = step(x)
        assert weight is model.weight and grad is model.weight.grad
        assert bias_grad is not model.bias.grad  # a clone is a tensor of its own
        prediction = x.numpy() @ before[0].T + before[1]
        np.testing.assert_allclose(grad.numpy(), 2 * prediction.T @ x.numpy(), rtol=1e-5)
        np.testing.assert_allclose(bias_grad.numpy(), 2 * prediction.sum(0), rtol=1e-5)
        np.testing.assert_allclose(weight.detach().numpy(), before[0] - 0.1 * grad.numpy(),
                                   rtol=1e-6)
