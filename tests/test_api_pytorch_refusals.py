"""Code that PyTorch refuses or treats in its own way, run in PyTorch 2.13 and in tracer side by
side, eagerly and under @tr.trace: assigning `.grad`; a custom Function's forward that changes a
leaf in place (mark_dirty), reads `.numpy()` (grad mode is off in a forward), or returns one
tensor at several places. Where PyTorch refuses, tracer refuses on the same line with a
TracerError (a TypeError where PyTorch's is one), and the user's tensors are as they were."""
import functools

import numpy as np
import pytest
import torch

import tracer as tr

HERE = "test_api_pytorch_refusals.py"


def outcome(action):
    """The exception `action()` raises, or None."""
    try:
        action()
    except Exception as error:  # noqa: BLE001 - the exception is the outcome
        return error
    return None


def function_class(m):
    return torch.autograd.Function if m is torch else tr.Function


# Assigning .grad ----------------------------------------------------------------------------------

GRADS = {  # what is assigned to the .grad of a float32 0-d leaf
    "float": lambda m: 0.0,
    "int": lambda m: 1,
    "numpy array": lambda m: np.array(1.0, np.float32),
    "list": lambda m: [1.0],
    "shape [3]": lambda m: m.zeros(3),
    "shape [1]": lambda m: m.zeros(1),
    "float64": lambda m: m.tensor(1.0, dtype=m.float64),
    "int64": lambda m: m.tensor(1),
    "right tensor": lambda m: m.tensor(0.5),
    "one that requires grad": lambda m: m.tensor(0.5, requires_grad=True),
    "None": lambda m: None,
}


def assign_then_backward(m, name):
    """a.grad after one backward, the assignment's outcome, and a.grad after a second one."""
    a = m.tensor(1.0, requires_grad=True)
    (a * 2).backward()
    error = outcome(lambda: setattr(a, "grad", GRADS[name](m)))
    (a * 3).backward()
    return error, a.grad.detach().numpy().copy()


@pytest.mark.parametrize("name", sorted(GRADS))
def test_assigning_grad_is_refused_where_pytorch_refuses_it(name):
    expected_error, expected_grad = assign_then_backward(torch, name)
    error, grad = assign_then_backward(tr, name)
    assert (error is None) == (expected_error is None), (error, expected_error)
    if error is not None:
        assert isinstance(error, tr.TracerError) and HERE in str(error), error
        assert isinstance(error, TypeError) == isinstance(expected_error, TypeError), error
    # refused: .grad kept its value (2) and the next backward adds to it, as in PyTorch
    np.testing.assert_array_equal(grad, expected_grad)


def test_grad_of_a_tensor_without_requires_grad_or_not_a_leaf_is_assignable_as_in_pytorch():
    for m in (torch, tr):
        plain, computed = m.ones(2, 3), m.ones(2, requires_grad=True) * 2
        plain.grad, computed.grad = m.zeros(2, 3), m.ones(2)
        assert plain.grad.shape == (2, 3) and computed.grad.shape == (2,)
        refused = (RuntimeError, TypeError) if m is torch else tr.TracerError
        for tensor, wrong in ((plain, m.zeros(3, 2)), (computed, 0.5)):
            error = outcome(functools.partial(setattr, tensor, "grad", wrong))
            assert isinstance(error, refused), error


@pytest.mark.parametrize("name", ["float", "shape [3]", "float64", "numpy array"])
def test_assigning_a_wrong_grad_under_trace_is_refused_on_its_line(name):
    def step(a):
        (a * 2).backward()
        a.grad = GRADS[name](tr)
        return a * 1

    a = tr.tensor(1.0, requires_grad=True)
    with pytest.raises(tr.TracerError, match=HERE) as error:
        tr.trace(step)(a)
    assert isinstance(error.value, TypeError) == isinstance(
        assign_then_backward(torch, name)[0], TypeError)
    assert a.grad is None and a.item() == 1.0  # nothing of the call reached the caller's tensor


def test_a_right_grad_assigned_under_trace_is_written_back():
    @tr.trace
    def step(a):
        (a * 2).backward()
        a.grad = a.grad * 10
        return a * 1

    a = tr.tensor(1.0, requires_grad=True)
    step(a)
    assert a.grad.item() == 20.0


# A forward that changes a leaf in place ------------------------------------------------------------

def doubling(m):
    class Double(function_class(m)):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad * 2
    return Double


def test_a_forward_that_changes_a_leaf_requiring_grad_is_refused_and_the_leaf_kept():
    reference = torch.tensor([1.0, -3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        doubling(torch).apply(reference)
    x = tr.tensor([1.0, -3.0], requires_grad=True)
    earlier = (x * x).sum()  # its backward reads x: it must still run after the refusal
    with pytest.raises(tr.InplaceError, match=f"{HERE}.*Double.forward.*leaf") as error:
        doubling(tr).apply(x)
    assert "mark_dirty" in str(error.value)
    # PyTorch leaves the leaf doubled (and its version moved); tracer puts it back
    np.testing.assert_array_equal(reference.detach().numpy(), [2.0, -6.0])
    np.testing.assert_array_equal(x.detach().numpy(), [1.0, -3.0])
    assert x.is_leaf and x.grad_fn is None and x._version == 0
    earlier.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, -6.0])  # 2x


def test_every_input_a_refused_forward_changed_is_put_back():
    def both_changed(m):
        class Both(function_class(m)):
            @staticmethod
            def forward(ctx, x, leaf):
                x.add_(1)
                leaf.mul_(3)
                ctx.mark_dirty(x, leaf)
                return x, leaf

            @staticmethod
            def backward(ctx, grad_x, grad_leaf):
                return grad_x, grad_leaf * 3
        return Both

    base = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        both_changed(torch).apply(base * 1, torch.ones(2, requires_grad=True))
    source, leaf = tr.ones(2, requires_grad=True), tr.tensor([2.0, 5.0], requires_grad=True)
    computed = source * 1
    with pytest.raises(tr.InplaceError, match="leaf"):
        both_changed(tr).apply(computed, leaf)
    np.testing.assert_array_equal(computed.detach().numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(leaf.detach().numpy(), [2.0, 5.0])


def test_a_forward_that_fails_after_changing_a_leaf_leaves_it_as_it_was():
    class Failing(tr.Function):
        @staticmethod
        def forward(ctx, x, scale):
            x.mul_(2)
            return x * scale.item()  # a 1-element tensor: 3 elements raise

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    x = tr.tensor([1.0, -3.0], requires_grad=True)
    with pytest.raises(tr.ArgumentError, match="item"):
        Failing.apply(x, tr.ones(3))
    np.testing.assert_array_equal(x.detach().numpy(), [1.0, -3.0])
    assert x._version == 0


def test_changing_a_leaf_in_a_forward_is_allowed_where_pytorch_allows_it():
    results = []
    for m in (torch, tr):
        with m.no_grad():  # nothing recorded: accepted
            leaf = m.tensor([1.0, 2.0], requires_grad=True)
            doubled = doubling(m).apply(leaf)
        computed = m.tensor([1.0, 2.0], requires_grad=True)
        y = doubling(m).apply(computed * 1)  # not a leaf: accepted, and differentiated
        (y * m.tensor([1.0, 10.0])).sum().backward()
        results.append([doubled.detach().numpy().copy(), leaf.detach().numpy().copy(),
                        y.detach().numpy().copy(), computed.grad.numpy().copy()])
    for expected, actual in zip(*results):
        np.testing.assert_array_equal(actual, expected)


def test_a_traced_forward_that_changes_a_leaf_argument_is_refused():
    @tr.trace
    def step(x):
        return doubling(tr).apply(x).sum()

    x = tr.tensor([1.0, -3.0], requires_grad=True)
    with pytest.raises(tr.InplaceError, match=f"{HERE}.*leaf"):
        step(x)
    np.testing.assert_array_equal(x.detach().numpy(), [1.0, -3.0])
    assert x.grad is None

    @tr.trace
    def computed_step(x):
        doubled = doubling(tr).apply(x * 1)  # a tensor computed in the trace is accepted
        (doubled * tr.tensor([1.0, 10.0])).sum().backward()
        return doubled

    np.testing.assert_array_equal(computed_step(x).numpy(), [2.0, -6.0])
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 20.0])


# .numpy() in a forward (grad mode is off) --------------------------------------------------------

def numpy_sort(m):
    """The NumpySort example of PyTorch's documentation (extending autograd)."""
    class NumpySort(function_class(m)):
        @staticmethod
        def forward(ctx, x):
            order = np.argsort(x.numpy())  # x requires grad; gradients are not recorded here
            ctx.save_for_backward(m.from_numpy(order))
            return m.from_numpy(np.take(x.numpy(), order))

        @staticmethod
        def backward(ctx, grad):
            (order,) = ctx.saved_tensors
            result = np.zeros_like(grad.numpy())
            result[order.numpy()] = grad.numpy()
            return m.from_numpy(result)
    return NumpySort


def test_a_forward_reads_numpy_of_an_input_that_requires_grad_as_in_pytorch():
    values = np.array([3.0, -1.0, 2.0, 0.5], np.float32)
    weights = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    results = []
    for m in (torch, tr):
        x = m.tensor(values, requires_grad=True)
        y = numpy_sort(m).apply(x)
        (y * m.from_numpy(weights)).sum().backward()
        results.append((y.detach().numpy().copy(), x.grad.numpy().copy()))
    for expected, actual in zip(*results):
        np.testing.assert_array_equal(actual, expected)
    np.testing.assert_array_equal(results[1][0], np.sort(values))
    np.testing.assert_array_equal(results[1][1], weights[np.argsort(np.argsort(values))])


def test_numpy_of_a_tensor_that_requires_grad_follows_grad_mode_as_in_pytorch():
    for m in (torch, tr):
        x = m.ones(3, requires_grad=True)
        assert outcome(x.numpy) is not None  # recorded: refused
        with m.no_grad():
            array = x.numpy()
        assert np.shares_memory(array, x.detach().numpy())
    with pytest.raises(tr.ArgumentError, match=f"{HERE}.*detach"):
        tr.ones(3, requires_grad=True).numpy()


def test_a_traced_forward_that_reads_numpy_runs_on_the_host_as_in_pytorch():
    # Under @tr.trace the Function is a host callback (docs/host_callbacks.md), with a backward
    # that reads the index it saved in numpy.
    values = np.array([3.0, -1.0, 2.0, 0.5], np.float32)
    weights = np.array([1.0, 2.0, 3.0, 4.0], np.float32)

    @tr.trace
    def weighted(x):
        y = numpy_sort(tr).apply(x)
        (y * tr.from_numpy(weights)).sum().backward()
        return y, x.grad

    y, grad = weighted(tr.tensor(values, requires_grad=True))
    x = torch.tensor(values, requires_grad=True)
    expected = numpy_sort(torch).apply(x)
    (expected * torch.from_numpy(weights)).sum().backward()
    assert y.tolist() == expected.tolist() and grad.tolist() == x.grad.tolist()


# One tensor returned at several places ------------------------------------------------------------

def returning_twice(m, kind, record=True):
    """A Function returning one tensor at two places: computed in forward, an input changed in
    place (dirty), the input as it is, or a computed one marked non-differentiable; backward
    reports what it received."""
    received = []

    class Twice(function_class(m)):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(kind != "no materialize")
            if kind == "dirty":
                x.mul_(2)
                ctx.mark_dirty(x)
                return x, x
            if kind == "input":
                return x, x
            y = x * 2
            if kind == "non-differentiable":
                ctx.mark_non_differentiable(y)
            return y, y

        @staticmethod
        def backward(ctx, first, second):
            if record:  # (not when traced: the values are not known yet)
                received.append([None if g is None else g.detach().numpy().copy()
                                 for g in (first, second)])
            total = second if first is None else first + 5 * second
            return total * 2
    return Twice, received


def run_twice(m, kind):
    leaf = m.tensor([1.0, -2.0], requires_grad=True)
    x = leaf * 1 if kind == "dirty" else leaf
    Twice, received = returning_twice(m, kind)
    first, second = Twice.apply(x)
    facts = [first is second, first is x, first.requires_grad]
    if first.requires_grad:
        (first * m.tensor([1.0, 10.0])).sum().add((second * 3).sum()).backward()
    grad = None if leaf.grad is None else leaf.grad.numpy().copy()
    return facts, received, grad, first.detach().numpy().copy()


@pytest.mark.parametrize("kind", ["computed", "dirty", "input", "non-differentiable",
                                  "no materialize"])
def test_a_tensor_returned_twice_is_one_result_as_in_pytorch(kind):
    expected, actual = run_twice(torch, kind), run_twice(tr, kind)
    assert actual[0] == expected[0]
    assert len(actual[1]) == len(expected[1])
    for theirs, ours in zip(expected[1], actual[1]):  # what backward received, by place
        for e, a in zip(theirs, ours):
            assert (e is None) == (a is None)
            if e is not None:
                np.testing.assert_array_equal(a, e)
    for e, a in zip(expected[2:], actual[2:]):
        assert (e is None) == (a is None)
        if e is not None:
            np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("kind", ["computed", "dirty", "input"])
def test_a_tensor_returned_twice_under_trace_gets_pytorchs_gradient(kind):
    expected_grad = run_twice(torch, kind)[2]
    same = []

    def step(leaf):
        x = leaf * 1 if kind == "dirty" else leaf
        first, second = returning_twice(tr, kind, record=False)[0].apply(x)
        same.append(first is second)
        (first * tr.tensor([1.0, 10.0])).sum().add((second * 3).sum()).backward()
        return first

    leaf = tr.tensor([1.0, -2.0], requires_grad=True)
    tr.trace(step)(leaf)
    assert same == [run_twice(torch, kind)[0][0]]
    np.testing.assert_array_equal(leaf.grad.numpy(), expected_grad)
