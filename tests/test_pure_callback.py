"""tr.pure_callback (JAX's pure_callback): NumPy/SciPy code with declared result shapes, eagerly and
under @tr.trace, where it never runs while tracing; a result that differs from its declaration, or
a gradient asked of it, raises HostCallbackError naming the line, with the arguments unchanged; a
Function whose forward and backward are pure callbacks trains as PyTorch's conv2d does."""
import numpy as np
import pytest
import torch
import tracer as tr
from numpy_extensions import convolve2d, correlate2d  # scipy.signal's, or numpy's

RNG = np.random.default_rng(0)


def correlate(x, w):
    return correlate2d(x, w, mode="valid").astype(x.dtype)


def test_eager_result_is_the_callbacks_as_a_tensor():
    x, w = RNG.standard_normal((7, 9)).astype(np.float32), RNG.standard_normal((3, 2))
    y = tr.pure_callback(correlate, tr.ShapeDtypeStruct((5, 8), tr.float32), tr.tensor(x),
                         w.astype(np.float32))
    assert isinstance(y, tr.Tensor) and y.dtype == tr.float32 and not y.requires_grad
    np.testing.assert_allclose(y.numpy(), correlate2d(x, w, mode="valid"), rtol=1e-5,
                               atol=1e-5)


def test_traced_callback_runs_on_each_call_and_never_while_tracing():
    seen = []

    def moments(x):
        seen.append(x.copy())
        return x.mean(axis=0), np.float64(x.std())

    @tr.trace
    def step(x):
        mean, spread = tr.pure_callback(
            moments, (tr.ShapeDtypeStruct((4,), tr.float32), np.zeros((), np.float64)), x * 2)
        return mean.exp().sum() + spread

    x = tr.tensor(RNG.standard_normal((5, 4)).astype(np.float32))
    text = step.ir(x, stage="optimized")  # traced and compiled: the callback has not run
    assert seen == [] and "host_callback" in text and "pure_callback.test_traced" in text
    for scale in (1.0, 3.0):
        seen.clear()
        result = step(x * scale)
        doubled = x.numpy() * scale * 2
        assert seen and all(np.array_equal(s, doubled) for s in seen)
        expected = np.exp(doubled.mean(axis=0)).sum() + doubled.std()
        np.testing.assert_allclose(result.item(), expected, rtol=1e-5)


def test_a_result_unlike_its_declaration_fails_the_call_and_leaves_the_arguments():
    def wrong(x):
        return np.zeros((3, 3), np.float32)

    with pytest.raises(tr.HostCallbackError, match=r"test_pure_callback.py:\d+: .*returned shape "
                                                   r"\[3, 3\].*where shape \[2, 3\]"):
        tr.pure_callback(wrong, tr.ShapeDtypeStruct((2, 3), tr.float32), tr.ones(2, 3))

    @tr.trace
    def step(w):
        loss = tr.pure_callback(wrong, np.zeros((2, 3), np.float64), w).sum()
        with tr.no_grad():
            w -= 0.5
        return loss

    w = tr.ones(2, 3)
    with pytest.raises(tr.HostCallbackError, match=r"dtype float32 as result 0.*dtype float64"):
        step(w)
    np.testing.assert_array_equal(w.numpy(), np.ones((2, 3), np.float32))


def test_a_gradient_through_it_is_refused_with_the_line():
    w = tr.randn(4, 4, requires_grad=True)
    y = tr.pure_callback(np.tanh, tr.ShapeDtypeStruct((4, 4), tr.float32), w)
    assert y.requires_grad
    with pytest.raises(tr.HostCallbackError, match=r"test_pure_callback.py:\d+: pure_callback: "
                                                   r"tanh is not differentiable"):
        y.sum().backward()

    @tr.trace
    def step(w):
        tr.pure_callback(np.tanh, tr.ShapeDtypeStruct((4, 4), tr.float32), w).sum().backward()
        return w.grad

    with pytest.raises(tr.HostCallbackError, match="not differentiable"):
        step(w)


def test_a_declaration_without_shape_and_dtype_is_refused():
    with pytest.raises(tr.ArgumentError, match=r"result 0 is declared as a tuple.*ShapeDtypeStruct"):
        tr.pure_callback(np.tanh, [(4, 4)], tr.ones(4, 4))


class ScipyConv2d(tr.autograd.Function):
    """PyTorch's numpy-extension tutorial's ScipyConv2dFunction, with declared shapes."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        shape = (x.shape[0] - w.shape[0] + 1, x.shape[1] - w.shape[1] + 1)
        return tr.pure_callback(correlate, tr.ShapeDtypeStruct(shape, x.dtype), x, w) + b

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors

        def gradients(g, x, w):
            return (convolve2d(g, w, mode="full").astype(g.dtype),
                    correlate2d(x, g, mode="valid").astype(g.dtype))

        grad_x, grad_w = tr.pure_callback(gradients, (x, w), grad, x, w)
        return grad_x, grad_w, grad.sum().reshape(1)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_a_function_of_pure_callbacks_trains_as_torch_conv2d(traced):
    x0 = RNG.standard_normal((10, 10)).astype(np.float32)
    w0, b0 = RNG.standard_normal((3, 3)).astype(np.float32), np.float32([0.1])
    target = RNG.standard_normal((8, 8)).astype(np.float32)

    def step(x, w, b):
        loss = ((ScipyConv2d.apply(x, w, b) - tr.tensor(target)) ** 2).mean()
        loss.backward()
        with tr.no_grad():
            w -= 0.1 * w.grad
            b -= 0.1 * b.grad
        w.grad, b.grad = None, None
        return loss

    run = tr.trace(step) if traced else step
    x, w, b = tr.tensor(x0), tr.tensor(w0, requires_grad=True), tr.tensor(b0, requires_grad=True)
    tx = torch.tensor(x0)[None, None]
    tw, tb = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    for _ in range(3):
        loss = run(x, w, b)
        expected = ((torch.nn.functional.conv2d(tx, tw[None, None], tb)[0, 0] -
                     torch.tensor(target)) ** 2).mean()
        expected.backward()
        with torch.no_grad():
            tw -= 0.1 * tw.grad
            tb -= 0.1 * tb.grad
        tw.grad, tb.grad = None, None
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-5)
    np.testing.assert_allclose(w.detach().numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.detach().numpy(), tb.detach().numpy(), rtol=1e-5, atol=1e-6)
