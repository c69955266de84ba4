"""Autograd odds and ends against PyTorch, eager and traced: Tensor.register_hook (and its
handle's remove), retain_grad, a Function argument left to its default, non-tensor outputs of a
forward, outputs marked non-differentiable, gradcheck's PyTorch keywords."""
import numpy as np
import pytest
import torch

import tracer as tr

MODES = pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])


def hooked_step(lib, x, w):
    h = x * w
    h.retain_grad()
    h.register_hook(lambda g: g * 2)          # replaces the gradient that goes on
    removed = h.register_hook(lambda g: g * 100)
    removed.remove()
    h2 = h.exp()
    h2.retain_grad()
    w.register_hook(lambda g: g + 1)          # a leaf's hook: before .grad
    (h2 * h2).sum().backward()
    return h.grad, h2.grad


@MODES
def test_register_hook_and_retain_grad_as_pytorch(traced):
    data_x, data_w = np.array([0.5, 2.0, -1.0]), np.array([0.5, -1.0, 1.5])
    x, w = tr.tensor(data_x, requires_grad=True), tr.tensor(data_w, requires_grad=True)
    step = tr.trace(lambda x, w: hooked_step(tr, x, w)) if traced else (
        lambda x, w: hooked_step(tr, x, w))
    h_grad, h2_grad = step(x, w)
    xt, wt = torch.tensor(data_x, requires_grad=True), torch.tensor(data_w, requires_grad=True)
    expected_h, expected_h2 = hooked_step(torch, xt, wt)
    # retain_grad keeps the gradient the other hooks made (PyTorch runs it last)
    np.testing.assert_allclose(h_grad.numpy(), expected_h.numpy(), rtol=1e-13)
    np.testing.assert_allclose(h2_grad.numpy(), expected_h2.numpy(), rtol=1e-13)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-13)
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-13)


def test_hook_sees_the_whole_gradient_once_and_on_autograd_grad():
    seen = []
    x = tr.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    y.register_hook(lambda g: seen.append(g.numpy().copy()))
    (gx,) = tr.autograd.grad((y * y).sum() + y.sum(), x)
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], [7.0, 13.0])  # 2y + 1
    np.testing.assert_array_equal(gx.numpy(), [21.0, 39.0])
    with pytest.raises(tr.ArgumentError, match="does not require grad"):
        tr.tensor([1.0]).register_hook(print)


def function_zoo(lib):
    class MixedDifferentiable(lib.autograd.Function):  # PyTorch's test_mark_non_differentiable_mixed
        @staticmethod
        def forward(ctx, x):
            a, b = x + 1, x + 2
            ctx.mark_non_differentiable(a)
            return a, b

        @staticmethod
        def backward(ctx, grad_a, grad_b):
            return grad_b * 3 + grad_a

    class WithDefault(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x, eps=1e-3):
            ctx.eps = eps
            return x * (1 + eps)

        @staticmethod
        def backward(ctx, grad):
            return grad * (1 + ctx.eps)  # one gradient: apply() was given one argument

    class NonTensorOutputs(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, 3, 2.5, True, "name"

        @staticmethod
        def backward(ctx, grad, *others):
            assert all(g is None for g in others)
            return grad * 2

    return MixedDifferentiable, WithDefault, NonTensorOutputs


def zoo_step(lib, x):
    mixed, with_default, non_tensor = function_zoo(lib)
    a, b = mixed.apply(x)
    assert not a.requires_grad and b.requires_grad
    outputs = non_tensor.apply(x)
    assert outputs[1:] == (3, 2.5, True, "name")
    (b.sum() + with_default.apply(x).sum()
     + outputs[0].sum()).backward()
    return a


@MODES
def test_function_defaults_non_tensor_and_non_differentiable_outputs(traced):
    x = tr.tensor([1.0, 2.0], dtype=tr.float64, requires_grad=True)
    a = (tr.trace(lambda x: zoo_step(tr, x)) if traced else lambda x: zoo_step(tr, x))(x)
    xt = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    expected = zoo_step(torch, xt)
    np.testing.assert_array_equal(a.numpy(), expected.numpy())
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-15)


def test_function_defaults_still_check_the_given_count():
    _, with_default, _ = function_zoo(tr)

    class TooFew(tr.Function):
        @staticmethod
        def forward(ctx, x, y, eps=1e-3):
            return x * y

        @staticmethod
        def backward(ctx, grad):
            return grad

    x = tr.tensor([1.0], requires_grad=True)
    with pytest.raises(tr.FunctionBackwardError, match="returned 1 gradient.*given 2"):
        TooFew.apply(x, x).sum().backward()


def test_gradcheck_accepts_pytorch_keywords():
    x = tr.tensor([[0.3, 0.8]], dtype=tr.float64, requires_grad=True)
    assert tr.gradcheck(lambda x: x.sin(), (x,), fast_mode=True, nondet_tol=0.0)

    class Wrong(tr.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 3

    assert tr.gradcheck(Wrong.apply, (x,), raise_exception=False, fast_mode=True) is False
    assert tr.autograd.gradcheck is tr.gradcheck and tr.autograd.Function is tr.Function
