"""A compiled function's results that are its arguments, captured tensors, or views of them: as
PyTorch (and torch.compile) returns them -- the argument object itself, a view that shares its
base's memory -- or, where tracer's view is a copy, marked as eager mode marks it (mark_view), so
that changing it in place, or reading it after its base changed in place, is refused with the
same InplaceError eager mode gives: never a copy that silently differs from PyTorch's view."""
import operator

import numpy as np
import pytest
import torch

import tracer as tr
from tracer.errors import InplaceError

# PyTorch's view operations, each as the same code for both libraries
VIEWS = {
    "slice": lambda x: x[:, 1:],
    "int index": lambda x: x[1],
    "t": lambda x: x.t(),
    "T": lambda x: x.T,
    "transpose": lambda x: x.transpose(0, 1),
    "permute": lambda x: x.permute(1, 0),
    "view": lambda x: x.view(12),
    "reshape": lambda x: x.reshape(4, 3),
    "flatten": lambda x: x.flatten(),
    "expand": lambda x: x.unsqueeze(0).expand(2, 3, 4),
    "diagonal": lambda x: x.diagonal(),
    "unsqueeze": lambda x: x.unsqueeze(0),
    "narrow": lambda x: x.narrow(1, 0, 2),
    "select": lambda x: x.select(0, 1),
    "unbind": lambda x: x.unbind(0)[0],
    "chunk": lambda x: x.chunk(2, 1)[1],
    "unflatten": lambda x: x.unflatten(1, (2, 2)),
    "view of a view": lambda x: x[1:].t(),
}


def _message(operation, *operands) -> str:
    """The InplaceError `operation(*operands)` raises."""
    with pytest.raises(InplaceError) as caught:
        operation(*operands)
    return str(caught.value)


@pytest.mark.parametrize("name", VIEWS)
def test_a_view_of_an_argument_is_refused_in_place_and_when_stale_as_eagerly(name):
    view = VIEWS[name]
    base = torch.arange(12.0).reshape(3, 4).clone()
    assert view(base)._base is base  # PyTorch: a view, whose change would reach the argument
    compiled = tr.trace(view)
    for _ in range(2):  # (the first call compiles, the second reuses the signature)
        x = tr.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
        eager, result = view(x), compiled(x)
        np.testing.assert_array_equal(result.numpy(), view(base).numpy())
        # the same refusal, word for word, as the eager result's
        assert _message(tr.Tensor.add_, result, 1) == _message(tr.Tensor.add_, eager, 1)
        np.testing.assert_array_equal(x.numpy(), base.numpy())
        x.mul_(2)  # the argument changes: PyTorch's view shows it, the copy cannot
        assert _message(operator.add, result, 1) == _message(operator.add, eager, 1)


def test_a_view_of_an_argument_that_requires_grad_is_marked_and_differentiable():
    f = tr.trace(lambda x: x[1:].t())
    x = tr.tensor(np.arange(6, dtype=np.float32).reshape(3, 2), requires_grad=True)
    result = f(x)
    with pytest.raises(InplaceError, match="indexing|t\\(\\)"):
        result.mul_(2)
    (result * tr.tensor([[1.0, 2.0]])).sum().backward()
    torch_x = torch.arange(6.0).reshape(3, 2).requires_grad_()
    (torch_x[1:].t() * torch.tensor([[1.0, 2.0]])).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), torch_x.grad.numpy())
    with tr.no_grad():
        x.add_(1)
    with pytest.raises(InplaceError, match="changed in place"):
        result.sum()


def test_a_view_of_a_captured_parameter_in_the_split_backward_path():
    """tr.trace(model) with an eager loss.backward(): the results are differentiated through the
    compiled backward (runtime/split_code.py); a result that is a view of a parameter is marked."""
    class Model(tr.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = tr.nn.Parameter(tr.tensor([[1.0, 2.0], [3.0, 4.0]]))

        def forward(self, x):
            return x @ self.weight, self.weight.t()

    model = Model()
    traced = tr.trace(model)
    product, transposed = traced(tr.tensor([[1.0, -1.0]]))
    assert traced.cache_info().size == 1 and _entry(traced).split is not None
    eager = model.weight.t()
    assert _message(tr.Tensor.mul_, transposed, 2) == _message(tr.Tensor.mul_, eager, 2)
    (product.sum() + (transposed * tr.tensor([[0.0, 1.0], [0.0, 0.0]])).sum()).backward()
    torch_weight = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    (torch.tensor([[1.0, -1.0]]) @ torch_weight).sum().add(
        (torch_weight.t() * torch.tensor([[0.0, 1.0], [0.0, 0.0]])).sum()).backward()
    np.testing.assert_array_equal(model.weight.grad.numpy(), torch_weight.grad.numpy())
    with tr.no_grad():
        model.weight.sub_(1)
    assert _message(operator.add, transposed, 1) == _message(operator.add, eager, 1)


def test_an_argument_returned_unchanged_is_the_argument_itself():
    """torch.compile returns the argument object itself (checked here against it)."""
    def identity(x):
        return x

    for requires_grad in (False, True):
        torch_x = torch.ones(3, requires_grad=requires_grad)
        assert torch.compile(identity, backend="aot_eager")(torch_x) is torch_x
        x = tr.ones(3, requires_grad=requires_grad)
        compiled = tr.trace(identity)
        for _ in range(2):
            assert compiled(x) is x
    x = tr.ones(3)
    compiled(x).add_(1)  # the argument itself: the change is the argument's
    np.testing.assert_array_equal(x.numpy(), [2.0, 2.0, 2.0])


def test_results_returned_twice_are_one_tensor_as_in_pytorch():
    def twice(x):
        doubled = x * 2
        return x, x, doubled, doubled

    torch_x = torch.ones(3)
    same, again, first, second = torch.compile(twice, backend="aot_eager")(torch_x)
    assert same is torch_x and again is torch_x and first is second
    compiled = tr.trace(twice)
    for requires_grad in (False, True):
        x = tr.ones(3, requires_grad=requires_grad)
        for _ in range(2):
            same, again, first, second = compiled(x)
            assert same is x and again is x and first is second
    first.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])  # one gradient, not two
    first, second = compiled(tr.ones(3))[2:]
    first.add_(1)
    np.testing.assert_array_equal(second.numpy(), [3.0, 3.0, 3.0])  # one tensor: one change


def test_containers_of_arguments_and_views():
    def split_up(x):
        return {"itself": x, "rows": (x[0], x[1:]), "transposed": [x.t()]}

    x = tr.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    result = tr.trace(split_up)(x)
    eager = split_up(x)
    assert result["itself"] is x
    for compiled, expected in [(result["rows"][0], eager["rows"][0]),
                               (result["rows"][1], eager["rows"][1]),
                               (result["transposed"][0], eager["transposed"][0])]:
        np.testing.assert_array_equal(compiled.numpy(), expected.numpy())
        assert _message(tr.Tensor.zero_, compiled) == _message(tr.Tensor.zero_, expected)


def test_an_argument_changed_in_place_and_a_view_of_it():
    def bump(x):
        x.add_(1)
        return x, x[0]

    x = tr.zeros(2, 2)
    same, row = tr.trace(bump)(x)
    assert same is x
    np.testing.assert_array_equal(row.numpy(), [1.0, 1.0])
    row_eager = x[0]
    assert _message(tr.Tensor.add_, row, 1) == _message(tr.Tensor.add_, row_eager, 1)
    x.add_(1)
    with pytest.raises(InplaceError, match="changed in place"):
        row.sum()


def test_a_detached_argument_shares_its_memory_as_in_pytorch():
    def detached(x):
        return x.detach()

    torch_x = torch.ones(3, requires_grad=True)
    torch.compile(detached, backend="aot_eager")(torch_x).add_(1)
    for requires_grad in (False, True):
        x = tr.ones(3, requires_grad=requires_grad)
        result = tr.trace(detached)(x)
        assert not result.requires_grad
        result.add_(1)
        np.testing.assert_array_equal(x.detach().numpy(), torch_x.detach().numpy())


def test_an_auxiliary_view_of_value_and_grad_is_marked():
    def loss(x):
        return (x * x).sum(), x[0]

    x = tr.tensor([[1.0, 2.0], [3.0, 4.0]])
    (value, auxiliary), gradient = tr.trace(tr.value_and_grad(loss, has_aux=True))(x)
    np.testing.assert_array_equal(gradient.numpy(), 2 * x.numpy())
    np.testing.assert_array_equal(auxiliary.detach().numpy(), [1.0, 2.0])
    eager = x[0]
    assert _message(tr.Tensor.add_, auxiliary, 1) == _message(tr.Tensor.add_, eager, 1)


def _entry(traced):
    return next(iter(traced._signatures.entries.values()))


@pytest.mark.parametrize("traced", [False, True])
def test_a_vjp_output_that_is_a_view_of_its_primal_is_marked(traced):
    """torch.func.vjp's output `x[0]` is a view of x (checked here: its change reaches x);
    tracer's is a copy, marked so, eagerly and compiled (it was an unmarked detach of a
    view-copy of the stand-in: changing it silently missed x)."""
    torch_x = torch.ones(2, 2)
    output, _ = torch.func.vjp(lambda x: x[0], torch_x)
    assert output._base is torch_x

    def first_row(x):
        output, vjp_function = tr.vjp(lambda x: x[0], x)
        return output, vjp_function(tr.tensor([1.0, 2.0]))[0]

    x = tr.ones(2, 2)
    output, gradient = (tr.trace(first_row) if traced else first_row)(x)
    np.testing.assert_array_equal(gradient.numpy(), [[1.0, 2.0], [0.0, 0.0]])
    eager = x[0]
    assert _message(tr.Tensor.add_, output, 1) == _message(tr.Tensor.add_, eager, 1)
    x.mul_(2)
    assert _message(operator.add, output, 1) == _message(operator.add, eager, 1)


def test_a_stale_view_copy_argument_is_refused_as_eagerly():
    """Passing `row = x[0]` after x changed in place: PyTorch's view shows the change, the copy
    cannot, so the call is refused as an eager operation on it is (it ran on the old values)."""
    double = tr.trace(lambda v: v * 2)
    x = tr.ones(2, 2)
    row = x[0]
    np.testing.assert_array_equal(double(row).numpy(), [2.0, 2.0])
    x.add_(1)
    assert _message(double, row) == _message(operator.mul, row, 2)
    weights = tr.ones(2, 2)
    captured_row = weights[0]  # read from outside: a runtime input, refused the same
    scaled = tr.trace(lambda v: v * captured_row)
    np.testing.assert_array_equal(scaled(tr.ones(2)).numpy(), [1.0, 1.0])
    weights.add_(1)
    assert _message(scaled, tr.ones(2)) == _message(operator.mul, captured_row, 2)


def test_changing_a_view_copy_argument_in_place_is_refused_before_anything_changes():
    """PyTorch's in-place change of a view argument reaches its base (checked here); the copy's
    cannot, so the call is refused, as `row.add_(1)` is eagerly (it changed the copy alone)."""
    def bump(v, w):
        w.mul_(2)
        v.add_(1)

    torch_x = torch.ones(2, 2)
    bump(torch_x[0], torch.ones(2))
    assert torch_x[0, 0] == 2
    x, w = tr.ones(2, 2), tr.ones(2)
    row = x[0]
    with pytest.raises(InplaceError, match="result of indexing"):
        tr.trace(bump)(row, w)
    np.testing.assert_array_equal(row.numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(w.numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(x.numpy(), np.ones((2, 2)))


def test_changing_a_detached_argument_in_place_is_a_change_of_the_original():
    """`f(w.detach())` changing it in place changes w (shared memory, as eagerly and in PyTorch)
    and counts as w's change: a backward that reads w is refused after it, as eagerly (it
    silently used the new values: gradient 4 where 2 was due), and a view-copy of w is stale."""
    bump = tr.trace(lambda v: v.add_(1))
    w = tr.ones(3, requires_grad=True)
    product = (w * w).sum()
    row = w.detach()[1:]
    bump(w.detach())
    np.testing.assert_array_equal(w.detach().numpy(), [2.0, 2.0, 2.0])
    with pytest.raises(InplaceError):
        product.backward()
    with pytest.raises(InplaceError, match="changed in place"):
        row + 1
    eager_w = tr.ones(3, requires_grad=True)
    eager_product = (eager_w * eager_w).sum()
    eager_w.detach().add_(1)
    with pytest.raises(InplaceError):
        eager_product.backward()


def test_a_view_of_an_argument_s_grad_is_marked():
    def step(x):
        (x * x).sum().backward()
        return x.grad[0]

    x = tr.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    row = tr.trace(step)(x)
    np.testing.assert_array_equal(row.numpy(), [2.0, 4.0])
    eager = x.grad[0]
    assert _message(tr.Tensor.add_, row, 1) == _message(tr.Tensor.add_, eager, 1)
    x.grad.zero_()  # PyTorch's view of the .grad shows it
    assert _message(operator.add, row, 1) == _message(operator.add, eager, 1)
