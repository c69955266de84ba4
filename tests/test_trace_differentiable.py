"""Results of a pure traced function carry a backward, as with torch.compile."""
import numpy as np
import pytest

import tracer as tr


@tr.trace
def layer(x, w, b):
    return (x @ w + b).tanh()


def _data():
    tr.manual_seed(3)
    x = tr.randn(5, 4, dtype=tr.float64)
    w = tr.randn(4, 3, dtype=tr.float64, requires_grad=True)
    b = tr.randn(3, dtype=tr.float64, requires_grad=True)
    return x, w, b


def test_backward_through_traced_result_matches_eager():
    x, w, b = _data()
    (layer(x, w, b) ** 2).sum().backward()
    traced = w.grad.numpy().copy(), b.grad.numpy().copy()
    w.grad = b.grad = None
    (layer.python_function(x, w, b) ** 2).sum().backward()
    np.testing.assert_allclose(traced[0], w.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(traced[1], b.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_hand_computed_gradient():
    x, w, b = _data()
    layer(x, w, b).sum().backward()
    pre = x.numpy() @ w.detach().numpy() + b.detach().numpy()
    expected_b = (1 - np.tanh(pre) ** 2).sum(axis=0)
    np.testing.assert_allclose(b.grad.numpy(), expected_b, rtol=1e-12)


def test_gradcheck_of_traced_layer():
    assert tr.gradcheck(layer, _data())


def test_in_place_change_before_backward_is_an_error():
    x, w, b = _data()
    out = layer(x, w, b).sum()
    with tr.no_grad():
        w.add_(1.0)
    with pytest.raises(tr.InplaceError, match="test_trace_differentiable.py"):
        out.backward()
    assert w.grad is None


def test_step_with_in_place_updates_returns_detached_result():
    @tr.trace
    def step(w):
        loss = (w * w).sum()
        loss.backward()
        with tr.no_grad():
            w.sub_(0.1 * w.grad)
        return loss

    w = tr.ones(3, requires_grad=True)
    loss = step(w)
    assert not loss.requires_grad
    np.testing.assert_allclose(w.detach().numpy(), np.full(3, 0.8, np.float32))
