"""`.data` and the augmented assignments (`+=`, `-=`, `*=`, `/=`): in-place, unseen by autograd,
eager and traced alike."""
import numpy as np
import pytest

import tracer as tr


def old_style_step(w, x):
    loss = ((x @ w) ** 2).sum()
    loss.backward()
    w.data -= 0.01 * w.grad.data
    w.grad.data.zero_()
    return loss


def test_old_style_sgd_through_data_traced_equals_eager_and_by_hand():
    generator = np.random.default_rng(0)
    w0 = generator.standard_normal((3, 2)).astype(np.float32)
    x = tr.tensor(generator.standard_normal((4, 3)).astype(np.float32))
    expected = w0.copy()
    for _ in range(3):
        expected -= 0.01 * 2 * x.numpy().T @ (x.numpy() @ expected)
    for step in (old_style_step, tr.trace(old_style_step)):
        w = tr.tensor(w0, requires_grad=True)
        for _ in range(3):
            step(w, x)
        np.testing.assert_allclose(w.detach().numpy(), expected, rtol=1e-5)
        np.testing.assert_array_equal(w.grad.numpy(), np.zeros((3, 2), np.float32))
        assert w.requires_grad and w.is_leaf


def test_data_shares_the_buffer_and_does_not_require_grad():
    w = tr.ones(2, requires_grad=True)
    alias = w.data
    assert not alias.requires_grad
    alias.mul_(3)
    np.testing.assert_array_equal(w.detach().numpy(), [3.0, 3.0])


@pytest.mark.parametrize("traced", [False, True])
def test_augmented_assignment_is_in_place(traced):
    def f(y):
        original = y
        y += 2
        y *= 3
        y -= 1
        y /= 2
        assert y is original
        return y * 1

    y = tr.ones(3)
    result = (tr.trace(f) if traced else f)(y)
    np.testing.assert_array_equal(result.numpy(), [4.0, 4.0, 4.0])
    np.testing.assert_array_equal(y.numpy(), [4.0, 4.0, 4.0])


def test_augmented_assignment_on_a_leaf_that_requires_grad_is_an_error():
    w = tr.ones(3, requires_grad=True)
    with pytest.raises(tr.InplaceError, match="test_api_data.py"):
        w += 1
    np.testing.assert_array_equal(w.detach().numpy(), [1.0, 1.0, 1.0])


@pytest.mark.parametrize("traced", [False, True])
def test_in_place_change_through_detach_reaches_the_original(traced):
    def f(x):
        y = x.detach()
        y.add_(1)
        return x * 1

    x = tr.tensor([1.0, 2.0])
    result = (tr.trace(f) if traced else f)(x)
    np.testing.assert_array_equal(result.numpy(), [2.0, 3.0])
    np.testing.assert_array_equal(x.numpy(), [2.0, 3.0])


def test_detach_cuts_the_gradient_when_traced():
    def f(w):
        loss = (w.detach() * 2 * w).sum()  # d/dw = 2 * w (the detached factor is a constant)
        loss.backward()

    w = tr.tensor([1.0, 3.0], requires_grad=True)
    tr.trace(f)(w)
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 6.0])
