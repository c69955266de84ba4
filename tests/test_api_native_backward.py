"""The operations this project computes with Functions of its own (tracer.function.NativeFunction:
acos, lerp, gelu, cumsum, ...) are PyTorch's built-in operations, whose backward does not run
when no gradient reaches their result: a tensor before one is left with a .grad of None, as in
PyTorch, where a user's custom Function runs on zeros and leaves a .grad of zeros (PyTorch's
own behaviour for both, checked here against PyTorch, eager and traced)."""
from __future__ import annotations

import numpy as np
import pytest

import tracer as tr

torch = pytest.importorskip("torch")

# Operations on a float32 vector of 4 elements in [0.1, 0.7], for tracer and torch alike.
OPERATIONS = {
    "acos": lambda lib, t: t.acos(),
    "asin": lambda lib, t: t.asin(),
    "atan": lambda lib, t: t.atan(),
    "atan2": lambda lib, t: t.atan2(t + 1),
    "sigmoid": lambda lib, t: t.sigmoid(),
    "lerp": lambda lib, t: t.lerp(t * 2, t * 0 + 0.3),
    "addcdiv": lambda lib, t: t.addcdiv(t, t + 2, value=0.5),
    "silu": lambda lib, t: lib.nn.functional.silu(t),
    "gelu": lambda lib, t: lib.nn.functional.gelu(t),
    "erf": lambda lib, t: t.erf(),
    "erfc": lambda lib, t: t.erfc(),
    "rsqrt": lambda lib, t: t.rsqrt(),
    "reciprocal": lambda lib, t: t.reciprocal(),
    "log1p": lambda lib, t: t.log1p(),
    "expm1": lambda lib, t: t.expm1(),
    "log10": lambda lib, t: t.log10(),
    "cosh": lambda lib, t: t.cosh(),
    "sinh": lambda lib, t: t.sinh(),
    "scalar power": lambda lib, t: 2 ** t,
    "logsumexp": lambda lib, t: t.logsumexp(0),
    "softmax": lambda lib, t: t.softmax(0),
    "norm": lambda lib, t: t.norm(),
    "max(dim)": lambda lib, t: t.max(0).values,
    "var": lambda lib, t: t.var(),
    "std": lambda lib, t: t.std(),
    "cumsum": lambda lib, t: t.cumsum(0),
    "cumprod": lambda lib, t: t.cumprod(0),
    "prod": lambda lib, t: t.prod(),
    "nan_to_num": lambda lib, t: t.nan_to_num(),
    "remainder": lambda lib, t: t.remainder(0.25),
    "max_pool2d": lambda lib, t: lib.nn.functional.max_pool2d(t.reshape(1, 1, 2, 2), 2),
}


def no_gradient_first(function_class):
    class NoGradientFirst(function_class):
        """Its backward returns None for its first input."""

        @staticmethod
        def forward(ctx, x, y):
            return x * 2 + y

        @staticmethod
        def backward(ctx, grad_output):
            return None, grad_output

    return NoGradientFirst


def custom_square(function_class):
    class Square(function_class):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return 2 * x * grad_output

    return Square


def step(lib, function_class, operation, x, y):
    """operation(x), then a Function that sends no gradient back to it, then backward."""
    result = no_gradient_first(function_class).apply(operation(lib, x), y)
    result.sum().backward()


def grads(operation) -> list[tuple]:
    """(x.grad, y.grad) after `step` in PyTorch, tracer eager and tracer traced (None or the
    values)."""
    data = np.array([0.1, 0.3, 0.5, 0.7], np.float32)
    found = []
    for lib, function_class, traced in ((torch, torch.autograd.Function, False),
                                         (tr, tr.Function, False), (tr, tr.Function, True)):
        x = lib.tensor(data.copy(), requires_grad=True)
        y = lib.tensor(np.float32(1.0), requires_grad=True)
        if traced:
            tr.trace(lambda x, y: step(tr, tr.Function, operation, x, y))(x, y)
        else:
            step(lib, function_class, operation, x, y)
        found.append(tuple(None if t.grad is None else t.grad.detach().numpy().copy()
                           for t in (x, y)))
    return found


@pytest.mark.parametrize("name", OPERATIONS)
def test_no_gradient_reaches_an_operation_its_input_has_none(name):
    (pytorch, pytorch_y), *ours = grads(OPERATIONS[name])
    assert pytorch is None
    for x_grad, y_grad in ours:  # eager, traced
        assert x_grad is None
        np.testing.assert_array_equal(y_grad, pytorch_y)  # the other input's gradient flows


def test_a_custom_function_runs_on_zeros_as_in_pytorch():
    (pytorch, _), *ours = grads(lambda lib, t: custom_square(
        torch.autograd.Function if lib is torch else tr.Function).apply(t))
    np.testing.assert_array_equal(pytorch, np.zeros(4, np.float32))
    for x_grad, _ in ours:
        np.testing.assert_array_equal(x_grad, pytorch)
