"""A Function applied inside another Function's backward, differentiated again (second and
third order): its own backward is the rule, as in PyTorch, eagerly and under @tr.trace.

Traced, a backward that records its graph used to see its saved tensors as not requiring grad, so
a Function it applied to them recorded no rule and the second derivative differentiated that
Function's forward instead (found by the long second-order random-program run: cosh's backward
applies sinh, whose forward's derivative is 0 * inf = nan at 0, where PyTorch's second derivative
is 0). Each case here has an inner rule that differs from its forward's derivative, so that the
wrong one shows. Oracle: torch.autograd with the same Functions written for torch."""
import numpy as np
import pytest
import torch

import tracer as tr

MODES = pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
X = np.array([0.5, -1.5, 2.0])


def functions(lib):
    """Inner: forward 2x, backward 3 * grad (a rule that is not its forward's derivative, like a
    straight-through estimator's). The outer Functions square x and apply Inner in their backward
    to what they kept: a saved input, a saved output, a tensor kept on ctx, or Inner twice."""
    class Inner(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 3

    class SavedInput(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * Inner.apply(x)

    class SavedOutput(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            result = x.exp()
            ctx.save_for_backward(result)
            return result

        @staticmethod
        def backward(ctx, grad):
            (result,) = ctx.saved_tensors
            return grad * Inner.apply(result) / 2

    class KeptOnContext(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.kept = x
            return x * x

        @staticmethod
        def backward(ctx, grad):
            return grad * Inner.apply(ctx.kept)

    class Twice(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * Inner.apply(x) * Inner.apply(x) * 0.75

    return {"saved input": SavedInput, "saved output": SavedOutput,
            "kept on ctx": KeptOnContext, "twice": Twice}


CASES = sorted(functions(torch))


def derivatives(lib, case, x, order):
    """The first `order` derivatives of sum(case(x)), each of the previous one weighted."""
    outer = functions(lib)[case]
    x = x.detach().requires_grad_()
    value = outer.apply(x).sum()
    found = []
    for k in range(order):
        (gradient,) = lib.autograd.grad(value, [x], create_graph=k < order - 1)
        found.append(gradient)
        value = (gradient * gradient).sum()
    return found


@MODES
@pytest.mark.parametrize("order", [2, 3])
@pytest.mark.parametrize("case", CASES)
def test_the_inner_functions_rule_differentiates_the_backward(case, order, traced):
    def ours(x):
        return derivatives(tr, case, x, order)
    got = (tr.trace(ours) if traced else ours)(tr.tensor(X))
    expected = derivatives(torch, case, torch.tensor(X), order)
    for k, (mine, reference) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=1e-12, atol=1e-12, err_msg=f"derivative {k + 1}")


@MODES
@pytest.mark.parametrize("name", ["cosh", "sinh", "exp", "expm1", "tanh", "sigmoid"])
def test_library_functions_second_derivative_where_the_input_is_constant(name, traced):
    """The long run's program: f(hardswish(4x)) at x where hardswish is flat (4x < -3), whose
    inner value is 0 for every f: second derivative 0 (f'(0) h'' + f''(0) h'^2 with h' = h'' = 0),
    never a nan from differentiating f's backward's own forward at 0."""
    x_values = np.array([-1.0235318, -0.9, 0.3, -2.0], np.float32)

    def second(lib, x):
        x = x.detach().requires_grad_()
        inner = lib.nn.functional.hardswish(x * 4).tanh() * 3
        value = getattr(lib, name)(inner).sum()
        (first,) = lib.autograd.grad(value, [x], create_graph=True)
        (again,) = lib.autograd.grad(first.sum(), [x])
        return first, again

    def ours(x):
        return second(tr, x)
    got = (tr.trace(ours) if traced else ours)(tr.tensor(x_values))
    expected = second(torch, torch.tensor(x_values))
    for mine, reference in zip(got, expected):
        assert np.isfinite(mine.detach().numpy()).all()
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=2e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1].numpy()[[0, 1, 3]], 0.0)
