"""`.data` and the augmented assignments (`+=`, `-=`, `*=`, `/=`): in-place, unseen by autograd,
eager and traced alike."""
import numpy as np
import pytest
import torch

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


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("alias", ["detach", "data"])
def test_a_detached_view_copy_is_refused_in_place_as_the_view_copy(alias, traced):
    """`x[0].detach()` (or `.data`) is a view of x in PyTorch (checked here: its change reaches
    x); here it detaches the copy `x[0]`, so its change is refused as the copy's own is (it was
    allowed, and silently missed x)."""
    torch_x = torch.ones(2, 2)
    (torch_x[0].detach() if alias == "detach" else torch_x[0].data).add_(1)
    assert torch_x[0, 0] == 2

    def f(x):
        row = x[0]
        detached = row.detach() if alias == "detach" else row.data
        with pytest.raises(tr.InplaceError, match="result of indexing"):
            detached.add_(1)
        return x * 1

    x = tr.ones(2, 2)
    np.testing.assert_array_equal((tr.trace(f) if traced else f)(x).numpy(), np.ones((2, 2)))


def test_a_view_copy_of_a_detached_tensor_is_stale_after_the_original_changes():
    """PyTorch's `x.detach()` shares x's memory and version counter: a view of it shows x's
    later in-place change (checked here). Here the view is a copy, so reading it after x (or the
    detached alias) changed in place is refused, as for `x[0]` (it was read silently stale)."""
    torch_x = torch.ones(2, 2)
    torch_view = torch_x.detach()[0]
    torch_x.add_(1)
    assert torch_view[0] == 2
    for change in ("original", "alias"):
        x = tr.ones(2, 2)
        detached = x.detach()
        view = detached[0]
        (x if change == "original" else detached).add_(1)
        with pytest.raises(tr.InplaceError, match="changed in place"):
            view + 1


def test_assigning_data_of_a_view_copy_changes_it_alone_as_in_pytorch():
    torch_x = torch.ones(2, 2)
    torch_row = torch_x[0]
    torch_row.data = torch.tensor([5.0, 6.0])
    x = tr.ones(2, 2)
    row = x[0]
    row.data = tr.tensor([5.0, 6.0])
    np.testing.assert_array_equal(row.numpy(), torch_row.numpy())
    np.testing.assert_array_equal(x.numpy(), torch_x.numpy())


@pytest.mark.parametrize("change", ["original", "alias"])
def test_a_saved_detached_tensor_changed_through_its_original_is_refused_at_backward(change):
    """PyTorch's detach() shares its original's version counter: a backward that reads
    `a = x.detach()` after `x.add_(1)` raises (checked here). It ran on the new values, silently
    (w.grad 2 where the forward used 1)."""
    torch_x = torch.ones(3)
    torch_w = torch.ones(3, requires_grad=True)
    torch_product = (torch_w * torch_x.detach()).sum()
    torch_x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch_product.backward()
    x = tr.ones(3)
    w = tr.ones(3, requires_grad=True)
    detached = x.detach()
    product = (w * detached).sum()
    (x if change == "original" else detached).add_(1)
    with pytest.raises(tr.InplaceError):
        product.backward()


def test_a_buffer_that_is_a_view_copy_loads_in_place_as_in_pytorch():
    """A mask registered as `tril(ones).view(...)` is a view-copy; load_state_dict copies into
    it, as PyTorch's does into its view (the detach() of a view-copy is refused in place
    elsewhere: the state dict's is the buffer itself)."""
    def build(library):
        module = library.nn.Module()
        module.register_buffer("mask", library.tril(library.ones(2, 2)).view(1, 2, 2))
        return module

    values = np.array([[[5.0, 6.0], [7.0, 8.0]]], np.float32)
    torch_module, module = build(torch), build(tr)
    torch_module.load_state_dict({"mask": torch.tensor(values)})
    module.load_state_dict({"mask": tr.tensor(values)})
    np.testing.assert_array_equal(module.mask.numpy(), torch_module.mask.numpy())
