"""A tensor that PyTorch makes distinct is distinct here: the gradient with respect to it takes in
its own uses only, eagerly and inside @trace, against PyTorch.

Until 2026-11-28 two kinds of tensor shared another's identity, each a silent wrong gradient:
- a view operation that changes nothing (`x.view(x.shape)`, `reshape_as(x)`, `expand` to the same
  shape, `transpose(0, 0)`, `t()` of a vector, `squeeze()` without dimensions of size 1) returned
  `x` itself, where PyTorch's result is a tensor of its own: the gradient with respect to it
  included x's other uses, and its requires_grad_() made x require grad;
- traced, a tensor that starts to require grad (`requires_grad_()`) kept the value it held, so the
  gradient with respect to it also took in that value's uses from before (its own, when it did not
  require grad yet, or another tensor's: `y = x.detach().requires_grad_()` with x still in use).
In each case the gradient was twice PyTorch's or more."""
import numpy as np
import pytest
import torch

import tracer as tr

START = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]])

# Operations PyTorch answers with a tensor of its own though the values do not change.
VIEWS = {
    "view to the same shape": lambda x: x.view(2, 3),
    "view with -1": lambda x: x.view(-1, 3),
    "reshape to the same shape": lambda x: x.reshape(2, 3),
    "reshape_as itself": lambda x: x.reshape_as(x),
    "view_as itself": lambda x: x.view_as(x),
    "unflatten into one": lambda x: x.unflatten(1, (3,)),
    "expand to the same shape": lambda x: x.expand(2, 3),
    "expand_as itself": lambda x: x.expand_as(x),
    "transpose of a dimension with itself": lambda x: x.transpose(1, 1),
    "squeeze without dimensions of size 1": lambda x: x.squeeze(),
    "squeeze of a dimension not of size 1": lambda x: x.squeeze(0),
    "t() of a vector": lambda x: x[0].t(),
}


def library(x):
    return torch if isinstance(x, torch.Tensor) else tr


def gradients_through_a_view(make, x):
    """The gradients with respect to the view and to x of a loss that uses both."""
    y = make(x)
    loss = (y * 1.5).sin().sum() + (x * 0.5).cos().sum()
    return [g.detach() for g in library(x).autograd.grad(loss, [y, x])]


def gradient_of_a_view_made_to_require_grad(make, x):
    """x is data; the view is made to require grad; the loss uses both."""
    y = make(x)
    y.requires_grad_()
    loss = (y * 1.5).sin().sum() + (x * 0.5).cos().sum()
    (gradient,) = library(x).autograd.grad(loss, [y])
    return [gradient.detach(), (x * 1).requires_grad]


def run(program, make, requires_grad, traced):
    if not traced:
        return program(make, tr.tensor(START, requires_grad=requires_grad))
    return tr.trace(lambda x: program(make, x))(tr.tensor(START, requires_grad=requires_grad))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("make", VIEWS.values(), ids=VIEWS.keys())
def test_the_gradient_with_respect_to_a_view_is_the_views_own(make, traced):
    expected = gradients_through_a_view(make, torch.tensor(START, requires_grad=True))
    results = run(gradients_through_a_view, make, True, traced)
    for result, want in zip(results, expected):
        np.testing.assert_allclose(result.numpy(), want.numpy(), rtol=1e-14)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("make", VIEWS.values(), ids=VIEWS.keys())
def test_a_view_made_to_require_grad_is_not_its_base(make, traced):
    expected_gradient, expected_flag = gradient_of_a_view_made_to_require_grad(
        make, torch.tensor(START))
    gradient, flag = run(gradient_of_a_view_made_to_require_grad, make, False, traced)
    np.testing.assert_allclose(gradient.numpy(), expected_gradient.numpy(), rtol=1e-14)
    assert bool(flag) == expected_flag


def test_flatten_returns_the_tensor_itself_where_nothing_merges_as_pytorch():
    for T in (torch, tr):
        x = T.tensor(START)
        assert x.flatten(0, 0) is x and x[0].flatten() is not x and x.flatten() is not x


# Inside @trace: a tensor that starts to require grad, whose value had uses before.
def detached_alias(T, x):
    y = x.detach().requires_grad_()
    return y, (y * 1.5).sin().sum() + (x * 0.5).cos().sum()


def used_before_it_required_grad(T, x):
    before = (x * 0.5).cos().sum()
    x.requires_grad_()
    return x, (x * 1.5).sin().sum() + before


def made_inside_used_before(T, x):
    w = T.ones(2, 3, dtype=x.dtype) * 2
    before = (w * x).sum()
    w.requires_grad_()
    return w, (w * 1.5).sin().sum() + before


@pytest.mark.parametrize("program", [detached_alias, used_before_it_required_grad,
                                     made_inside_used_before], ids=lambda p: p.__name__)
def test_a_tensor_that_starts_to_require_grad_in_a_trace_has_only_its_later_uses(program):
    def gradient(T, x):
        leaf, loss = program(T, x)
        return T.autograd.grad(loss, [leaf])[0]

    expected = gradient(torch, torch.tensor(START))
    np.testing.assert_allclose(gradient(tr, tr.tensor(START)).numpy(), expected.numpy(),
                               rtol=1e-14)
    traced = tr.trace(lambda x: gradient(tr, x))(tr.tensor(START))
    np.testing.assert_allclose(traced.numpy(), expected.numpy(), rtol=1e-14)


def test_a_change_through_data_in_a_trace_is_a_change_as_eagerly():
    """Traced, `w.data.mul_(2)` set w to a new value without a trace of the old one, so a
    backward after it found none of w's uses: w.grad None (PyTorch's: the gradient). Now as
    eagerly: where the backward reads the old value it refuses the change (InplaceError, as eager
    mode does: PyTorch's would silently use the new values), and where it does not, the gradient
    reaches the old value's uses."""
    def unread(x):
        w = x.clone().requires_grad_()
        loss = (w * 3).sum()
        w.data.mul_(2)
        loss.backward()
        return w.grad

    def read(x):
        w = x.clone().requires_grad_()
        loss = (w * w).sum()
        w.data.mul_(2)
        loss.backward()
        return w.grad

    for run in (unread, tr.trace(unread)):
        np.testing.assert_array_equal(run(tr.tensor(START)).numpy(), np.full((2, 3), 3.0))
    for run in (read, tr.trace(read)):
        with pytest.raises(tr.InplaceError):
            run(tr.tensor(START))
