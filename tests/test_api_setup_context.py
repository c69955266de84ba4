"""PyTorch 2's Function style (forward without ctx, setup_context) and once_differentiable,
eagerly and traced, against finite differences and PyTorch."""
import numpy as np
import pytest
import torch

import tracer as tr
from tracer.function import once_differentiable


class ScaledSquare(tr.Function):
    @staticmethod
    def forward(x, scale=2.0):
        return x * x * scale

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, scale = inputs
        ctx.save_for_backward(x)
        ctx.scale = scale

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        assert not tr.is_grad_enabled()
        return grad_output * 2 * ctx.scale * x, None


class TorchScaledSquare(torch.autograd.Function):
    forward = ScaledSquare.forward
    setup_context = ScaledSquare.setup_context

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * 2 * ctx.scale * x, None


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_setup_context_style_gradients(traced):
    x = tr.tensor(np.linspace(-1, 1, 7), requires_grad=True)

    def f(x):
        return ScaledSquare.apply(x, 3.0).sin()

    assert tr.gradcheck(tr.trace(f) if traced else f, (x,))
    ours = (tr.trace(f) if traced else f)(x)
    reference = torch.tensor(np.linspace(-1, 1, 7), requires_grad=True)
    expected = TorchScaledSquare.apply(reference, 3.0).sin()
    np.testing.assert_allclose(ours.detach().numpy(), expected.detach().numpy(), rtol=1e-14)
    ours.sum().backward()
    expected.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), reference.grad.numpy(), rtol=1e-12)


def test_setup_context_gets_the_defaults_and_needs_input_grad():
    seen = {}

    class Recorder(tr.Function):
        @staticmethod
        def forward(x, y, scale=5.0):
            return x * y * scale

        @staticmethod
        def setup_context(ctx, inputs, output):
            seen["inputs"] = inputs
            seen["output"] = output
            ctx.save_for_backward(*inputs[:2])
            ctx.scale = inputs[2]

        @staticmethod
        def backward(ctx, grad):
            seen["needs"] = tuple(ctx.needs_input_grad)
            x, y = ctx.saved_tensors
            return grad * y * ctx.scale, grad * x * ctx.scale, None

    x, y = tr.tensor([2.0], requires_grad=True), tr.tensor([3.0])
    out = Recorder.apply(x, y)
    assert seen["inputs"][2] == 5.0 and seen["output"].item() == 30.0
    out.backward()
    assert seen["needs"] == (True, False, False)
    assert x.grad.item() == 15.0
