"""tr.trace(f, check_grads=True): custom backwards checked against finite differences of their
forwards when a signature compiles."""
import numpy as np
import pytest

import tracer as tr


class Cube(tr.Function):
    # Each run of forward, counted in a list: a list in a class body is state, which the traced
    # code does not read; an int counter there is guarded (it could shape the code), so that
    # incrementing it would make every call trace again.
    runs: list = []

    @staticmethod
    def forward(ctx, x, scale):
        Cube.runs.append(None)
        ctx.save_for_backward(x)
        ctx.scale = scale
        return scale * x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * ctx.scale * x ** 2 * grad, None


class WrongCube(Cube):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        wrong = 3 * ctx.scale * x ** 2 * grad
        wrong[1, 2] = 0.0  # one element of the gradient dropped
        return wrong, None


def loss_of(function):
    def loss(x, w):
        total = function.apply(x.mm(w), 0.5).sum()
        total.backward()
        return total
    return loss


def test_correct_backward_passes_and_is_checked_once_per_signature():
    step = tr.trace(loss_of(Cube), check_grads=True)
    x, w = tr.randn(2, 3), tr.randn(3, 4, requires_grad=True)
    Cube.runs.clear()
    step(x, w)
    checked = len(Cube.runs)
    # the trace runs forward once; the check runs it for every perturbed element and more
    assert checked > 2 * 2 * 4
    w.grad = None
    step(x, w)
    assert len(Cube.runs) == checked  # the same signature: neither traced nor checked again
    np.testing.assert_allclose(w.grad.numpy(), x.numpy().T @ (1.5 * (x.numpy() @ w.detach().numpy()) ** 2),
                               rtol=1e-5)


def test_wrong_backward_is_named_with_input_and_element():
    step = tr.trace(loss_of(WrongCube), check_grads=True)
    with pytest.raises(tr.GradcheckError) as error:
        step(tr.randn(2, 3), tr.randn(3, 4, requires_grad=True))
    message = str(error.value)
    assert "WrongCube.backward" in message and "input 'x' element (1, 2)" in message
    assert error.value.line.startswith("test_observe_check_grads.py:")
    # without the option the same wrong backward compiles and runs
    tr.trace(loss_of(WrongCube))(tr.randn(2, 3), tr.randn(3, 4, requires_grad=True))


def test_r_style_function_and_an_input_computed_from_a_gradient():
    square = tr.autograd_function(
        forward=lambda ctx, input: (ctx.save_for_backward(input=input), input * input)[1],
        backward=lambda ctx, grad: {"input": 3 * ctx.saved_variables.input * grad})  # wrong: 3x

    def step(w):
        (w * w).sum().backward()
        # its input exists only after autodiff: checked on random values
        return square(w.grad * w)

    with pytest.raises(tr.GradcheckError, match=r"input 'input' element \(0,\)") as error:
        tr.trace(step, check_grads=True)(tr.ones(3, requires_grad=True))
    assert "numerically" in str(error.value)


def test_an_index_out_of_range_before_the_function_fails_at_the_user_s_line():
    """The check evaluates the graph on the call's values to find the Function's inputs; an index
    outside its dimension raised the reference semantics' own IndexError from inside the
    compiler, naming no line. Now it is reported at the user's line, with the arguments
    unchanged."""
    def loss(x, i):
        total = Cube.apply(x.index_select(0, i), 0.5).sum()
        total.backward()
        return total

    step = tr.trace(loss, check_grads=True)
    x = tr.tensor([0.5, -0.25, 2.0], requires_grad=True)
    Cube.runs.clear()
    with pytest.raises(tr.IndexOutOfRangeError,
                       match=r"test_observe_check_grads.py:\d+: index 3 is out of bounds"):
        step(x, tr.tensor([3, 0]))
    assert x.detach().tolist() == [0.5, -0.25, 2.0] and x.grad is None
    assert len(Cube.runs) == 1  # traced, not checked
    step(x, tr.tensor([2, 0]))
    assert len(Cube.runs) > 2  # traced again and checked, at this call's values
    np.testing.assert_allclose(x.grad.numpy(), [0.375, 0.0, 6.0], rtol=1e-6)


class ClipAtThree(tr.Function):
    @staticmethod
    def forward(ctx, x):
        return tr.minimum(x, tr.tensor(3.0, dtype=x.dtype))

    @staticmethod
    def backward(ctx, grad):
        return grad  # wrong where x > 3 (the clip forgotten)


def test_a_call_after_an_index_out_of_range_is_checked_at_its_own_values():
    """A backward wrong only above 3 passed the check at drawn (standard normal) values when the
    first call's index was outside its dimension, and the next call, valid, ran the code compiled
    then without a check: its gradient was 1 where PyTorch's is 0. The first call now fails before
    compiling, and the next one is checked at its values."""
    def loss(x, i):
        total = ClipAtThree.apply(x.index_select(0, i)).sum()
        total.backward()
        return total

    step = tr.trace(loss, check_grads=True)
    x = tr.tensor([4.0, 5.0, 6.0], requires_grad=True)
    with pytest.raises(tr.IndexOutOfRangeError, match=r"index 3 is out of bounds"):
        step(x, tr.tensor([3, 0]))
    with pytest.raises(tr.GradcheckError, match=r"ClipAtThree.backward disagrees"):
        step(x, tr.tensor([2, 0]))
