"""Second-order gradients against PyTorch: `backward(create_graph=True)`, `tr.autograd.grad`,
custom Functions differentiated twice (PyTorch's double-backward tutorial), once_differentiable,
gradgradcheck; eagerly and under @tr.trace (compiled, checked against the interpreter by
conftest.py)."""
import numpy as np
import pytest
import torch

import tracer as tr

MODES = pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
RANDOM = np.random.default_rng(17)
X = RANDOM.uniform(0.3, 1.5, size=(3, 4))
V = RANDOM.standard_normal((3, 4))
W = RANDOM.standard_normal((4, 2))

# Each function of one tensor is written once, for both libraries (the same method names).
FUNCTIONS = {
    "exp_sin": lambda x, lib: (x.exp() * x.sin()).sum(),
    "tanh_sigmoid": lambda x, lib: (x.tanh() * x.sigmoid()).sum(),
    "log_sqrt_div": lambda x, lib: (x.log() / x.sqrt() + 1 / x).sum(),
    "pow": lambda x, lib: (x ** 3.5 + x ** x).sum(),
    "matmul": lambda x, lib: ((x @ lib.tensor(W)) ** 2).sum(),
    "softmax": lambda x, lib: (lib.softmax(x, dim=1) * lib.tensor(V)).sum(),
    "max_mean": lambda x, lib: x.max(dim=1)[0].mean() * x.cos().mean(),
    "where_relu": lambda x, lib: (lib.where(x > 0.8, x * x, x.exp()) + (x - 1).relu() ** 3).sum(),
    "broadcast": lambda x, lib: ((x - x.mean(dim=0, keepdim=True)) ** 2).sum(dim=1).sqrt().sum(),
}


def torch_second_order(function, x, v):
    x = torch.tensor(x, requires_grad=True)
    (g,) = torch.autograd.grad(function(x, torch), x, create_graph=True)
    (h,) = torch.autograd.grad((g * torch.tensor(v)).sum(), x)
    return g.detach().numpy(), h.numpy()


@MODES
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_grad_of_grad_matches_pytorch(name, traced):
    function = FUNCTIONS[name]

    def step(x, v):
        (g,) = tr.autograd.grad(function(x, tr), x, create_graph=True)
        assert g.requires_grad
        (h,) = tr.autograd.grad((g * v).sum(), x)
        return g, h

    g, h = (tr.trace(step) if traced else step)(tr.tensor(X, requires_grad=True), tr.tensor(V))
    expected_g, expected_h = torch_second_order(function, X, V)
    np.testing.assert_allclose(g.detach().numpy(), expected_g, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h.numpy(), expected_h, rtol=1e-10, atol=1e-12)


@MODES
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph")
def test_backward_create_graph_gradient_penalty(traced):
    """A WGAN-GP style penalty: the norm of a gradient, itself differentiated by backward()."""
    def step(x, w):
        out = (x @ w).tanh().sum()
        out.backward(create_graph=True)
        penalty = ((x.grad ** 2).sum(dim=1).sqrt() - 1) ** 2
        x.grad = None
        w.grad = None
        penalty.sum().backward()
        return penalty

    x, w = tr.tensor(X, requires_grad=True), tr.tensor(W, requires_grad=True)
    penalty = (tr.trace(step) if traced else step)(x, w)
    xt, wt = torch.tensor(X, requires_grad=True), torch.tensor(W, requires_grad=True)
    (xt @ wt).tanh().sum().backward(create_graph=True)
    expected = ((xt.grad ** 2).sum(dim=1).sqrt() - 1) ** 2
    xt.grad = wt.grad = None
    expected.sum().backward()
    np.testing.assert_allclose(penalty.detach().numpy(), expected.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-10)


def test_backward_create_graph_accumulates_out_of_place():
    x = tr.tensor([1.0, 2.0], dtype=tr.float64, requires_grad=True)
    (x ** 3).sum().backward(create_graph=True)
    first = x.grad
    (x ** 2).sum().backward(create_graph=True)
    assert x.grad is not first  # PyTorch: out of place, so `first` keeps its value and graph
    np.testing.assert_array_equal(first.detach().numpy(), [3.0, 12.0])
    np.testing.assert_array_equal(x.grad.detach().numpy(), [5.0, 16.0])
    (second,) = tr.autograd.grad(x.grad.sum(), x)
    np.testing.assert_array_equal(second.numpy(), [8.0, 14.0])  # 6x + 2


def test_traced_second_order_is_one_compiled_call():
    @tr.trace
    def step(x, v):
        (g,) = tr.autograd.grad((x.exp() * x).sum(), x, create_graph=True)
        (h,) = tr.autograd.grad((g * v).sum(), x)
        return h

    for _ in range(3):
        h = step(tr.tensor(X, requires_grad=True), tr.tensor(V))
    assert step.cache_info().misses == 1 and step.cache_info().hits == 2
    # (x e^x)'' = (x + 2) e^x
    np.testing.assert_allclose(h.numpy(), (X + 2) * np.exp(X) * V, rtol=1e-12)
    assert "gradient" not in step.ir(tr.tensor(X, requires_grad=True), tr.tensor(V),
                                     stage="optimized")


# PyTorch's double-backward tutorial, written once for both libraries.
def tutorial_functions(lib):
    class Square(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 2

        @staticmethod
        def backward(ctx, grad_out):
            (x,) = ctx.saved_tensors
            return grad_out * 2 * x

    class Exp(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            result = x.exp()
            ctx.save_for_backward(result)  # an output: its gradient goes through Exp again
            return result

        @staticmethod
        def backward(ctx, grad_out):
            (result,) = ctx.saved_tensors
            return grad_out * result

    class Sinh(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            expx = x.exp()
            expnegx = (-x).exp()
            ctx.save_for_backward(expx, expnegx)
            return (expx - expnegx) / 2, expx, expnegx  # intermediates returned, to be saved

        @staticmethod
        def backward(ctx, grad_out, grad_out_exp, grad_out_negexp):
            expx, expnegx = ctx.saved_tensors
            grad_input = grad_out * (expx + expnegx) / 2
            grad_input += grad_out_exp * expx
            grad_input -= grad_out_negexp * expnegx
            return grad_input

    class MyCube(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            dx = 3 * x ** 2
            ctx.save_for_backward(x, dx)
            return x ** 3, dx

        @staticmethod
        def backward(ctx, grad_output, grad_dx):
            x, dx = ctx.saved_tensors
            # another Function inside this backward: differentiated in turn at second order
            return Multiply.apply(grad_output, dx) + grad_dx * 6 * x

    class Multiply(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            return grad * b, grad * a

    return {"Square": Square.apply, "Exp": Exp.apply, "Sinh": lambda x: Sinh.apply(x)[0],
            "MyCube": lambda x: MyCube.apply(x)[0]}


@MODES
@pytest.mark.parametrize("name", ["Square", "Exp", "Sinh", "MyCube"])
def test_double_backward_tutorial_functions(name, traced):
    ours, theirs = tutorial_functions(tr)[name], tutorial_functions(torch)[name]

    def step(x, v):
        (g,) = tr.autograd.grad(ours(x).sum(), x, create_graph=True)
        (h,) = tr.autograd.grad((g * v).sum(), x)
        return g, h

    g, h = (tr.trace(step) if traced else step)(tr.tensor(X, requires_grad=True), tr.tensor(V))
    expected_g, expected_h = torch_second_order(lambda x, lib: theirs(x).sum(), X, V)
    np.testing.assert_allclose(g.detach().numpy(), expected_g, rtol=1e-12)
    np.testing.assert_allclose(h.numpy(), expected_h, rtol=1e-12)
    x = tr.tensor(X[:1, :2], requires_grad=True)
    assert tr.gradgradcheck(tr.trace(ours) if traced else ours, (x,))


def test_saved_intermediate_is_a_constant_at_second_order_as_in_pytorch():
    """An intermediate saved but not returned has no graph: its part of the second derivative is
    missing in PyTorch too (the tutorial's reason to return it)."""
    def make(lib):
        class Cube(lib.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                dx = 3 * x ** 2
                ctx.save_for_backward(dx)
                return x ** 3

            @staticmethod
            def backward(ctx, grad):
                (dx,) = ctx.saved_tensors
                return grad * dx
        return Cube.apply

    for traced in (False, True):
        def step(x):
            (g,) = tr.autograd.grad(make(tr)(x).sum(), x, create_graph=True)
            return g.requires_grad
        assert not (tr.trace(step) if traced else step)(tr.tensor([1.0, 2.0], requires_grad=True))
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    (g,) = torch.autograd.grad(make(torch)(x).sum(), x, create_graph=True)
    assert not g.requires_grad
    with pytest.raises(tr.GradcheckError):
        tr.gradgradcheck(make(tr), (tr.tensor([[0.5, 1.5]], dtype=tr.float64,
                                              requires_grad=True),))


class OnceSquare(tr.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @tr.once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 * x


@MODES
def test_once_differentiable_refuses_second_order_naming_the_function(traced):
    def first(x):
        return tr.autograd.grad(OnceSquare.apply(x).sum(), x, create_graph=True)[0]

    def second(x):
        return tr.autograd.grad(first(x).sum(), x)[0]

    x = tr.tensor([1.0, 3.0], requires_grad=True)
    # first order with create_graph still works (PyTorch's DelayedError waits for the second)
    np.testing.assert_array_equal((tr.trace(first) if traced else first)(x).detach().numpy(),
                                  [2.0, 6.0])
    with pytest.raises(tr.FunctionBackwardError, match="OnceSquare.backward.*once_differentiable"):
        (tr.trace(second) if traced else second)(x)


def test_gradgradcheck_catches_a_wrong_second_derivative():
    class WrongSecond(tr.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 3 * x * x.detach()  # right value, half the second derivative missing

    x = tr.tensor([[0.5, 1.5]], dtype=tr.float64, requires_grad=True)
    assert tr.gradcheck(WrongSecond.apply, (x,))
    with pytest.raises(tr.GradcheckError, match="Jacobian mismatch"):
        tr.gradgradcheck(WrongSecond.apply, (x,))
    assert tr.gradgradcheck(WrongSecond.apply, (x,), raise_exception=False) is False
    assert tr.gradgradcheck(lambda x: (x ** 3).sin(), (x,))
    assert tr.gradgradcheck(tr.trace(lambda x: (x ** 3).sin()), (x,))


def test_autograd_grad_arguments_as_pytorch():
    x = tr.tensor([1.0, 2.0], requires_grad=True)
    unused = tr.tensor([3.0], requires_grad=True)
    y = x * 2
    with pytest.raises(tr.ArgumentError, match="allow_unused"):
        tr.autograd.grad(y.sum(), [x, unused], retain_graph=True)
    gx, gu = tr.autograd.grad(y.sum(), [x, unused], allow_unused=True, retain_graph=True)
    assert gu is None
    (gu,) = tr.autograd.grad(y.sum(), unused, materialize_grads=True, retain_graph=True)
    np.testing.assert_array_equal(gu.numpy(), [0.0])
    with pytest.raises(tr.ArgumentError, match="grad_outputs"):
        tr.autograd.grad(y, x, retain_graph=True)
    (gy,) = tr.autograd.grad(y, x, grad_outputs=tr.tensor([1.0, 10.0]), retain_graph=True)
    np.testing.assert_array_equal(gy.numpy(), [2.0, 20.0])
    # a non-leaf input, and several outputs
    (gy,) = tr.autograd.grad([(y ** 2).sum(), y.sum()], y)
    np.testing.assert_array_equal(gy.numpy(), [5.0, 9.0])
    assert x.grad is None  # autograd.grad fills no .grad
    with pytest.raises(tr.ArgumentError, match="does not require grad"):
        tr.autograd.grad(tr.tensor([1.0]).sum(), x)
    with pytest.raises(tr.TracerError, match="second time"):
        z = (x.exp()).sum()
        tr.autograd.grad(z, x)
        tr.autograd.grad(z, x)


def test_backward_inputs_fills_only_those():
    x = tr.tensor([1.0, 2.0], requires_grad=True)
    w = tr.tensor([3.0, 4.0], requires_grad=True)
    (x * w).sum().backward(inputs=[w])
    assert x.grad is None
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0])


def test_in_place_change_between_first_and_second_backward_is_refused():
    """PyTorch refuses it too: cos(x) of sin's first derivative reads x again."""
    x = tr.tensor([0.5, 1.0], requires_grad=True)
    (g,) = tr.autograd.grad(x.sin().sum(), x, create_graph=True)
    with tr.no_grad():
        x.add_(1)
    with pytest.raises(tr.InplaceError, match="gradient of cos was changed in place"):
        tr.autograd.grad(g.sum(), x)
    xt = torch.tensor([0.5, 1.0], requires_grad=True)
    (gt,) = torch.autograd.grad(xt.sin().sum(), xt, create_graph=True)
    with torch.no_grad():
        xt.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(gt.sum(), xt)


@MODES
def test_second_order_through_an_in_place_change_made_before_the_first_backward(traced):
    """The first backward reads the value before the change, as the forward used it (found by
    the second-order differential tester: traced, this was refused)."""
    def step(x):
        a = x.abs()
        a.mul_(x)
        (g,) = tr.autograd.grad(a.abs().sum(), x, create_graph=True)
        (h,) = tr.autograd.grad((g * g).sum(), x)
        return g, h

    g, h = (tr.trace(step) if traced else step)(tr.tensor([0.5, -2.0], requires_grad=True))
    xt = torch.tensor([0.5, -2.0], requires_grad=True)
    a = xt.abs() * 1
    a.mul_(xt)
    (gt,) = torch.autograd.grad(a.abs().sum(), xt, create_graph=True)
    (ht,) = torch.autograd.grad((gt * gt).sum(), xt)
    np.testing.assert_allclose(g.detach().numpy(), gt.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(h.numpy(), ht.numpy(), rtol=1e-6)


@pytest.mark.parametrize("library", ["tracer", "torch"])
def test_autograd_grad_positional_arguments_in_pytorchs_order(library):
    """The sixth positional argument is only_inputs (ignored), the seventh allow_unused: tracer's
    once took the sixth as allow_unused, so a call written for PyTorch got None where PyTorch
    raised, or the reverse."""
    lib = tr if library == "tracer" else torch
    x = lib.tensor([1.0, 2.0], requires_grad=True)
    unused = lib.tensor([3.0], requires_grad=True)
    y = (x ** 3).sum()
    gradient, none = lib.autograd.grad(y, [x, unused], None, True, False, True, True)
    np.testing.assert_array_equal(gradient.numpy(), [3.0, 12.0])
    assert none is None
    with pytest.raises((RuntimeError, tr.TracerError), match="not .*used"):
        lib.autograd.grad(y, [x, unused], None, True, False, True)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_log_softmax_second_order_reads_its_result_not_its_input_changed_since(traced):
    """PyTorch's double backward of log_softmax reads its result: the input changed in place
    after it is no error there. Eager tracer computed the result again from the input and refused
    (InplaceError) until 2026-11-28 (found by the long second-order differential run)."""
    def second(m, x):
        h = x * 1.0
        y = h.log_softmax(0)
        h.mul_(2.0)
        (g,) = m.autograd.grad((y.sin() * y).sum(), [x], create_graph=True)
        (gg,) = m.autograd.grad((g * g).sum(), [x])
        return g.detach(), gg

    start = np.array([0.5, -1.0, 2.0, 0.25])
    expected = second(torch, torch.tensor(start, requires_grad=True))
    run = tr.trace(lambda x: second(tr, x)) if traced else (lambda x: second(tr, x))
    for result, want in zip(run(tr.tensor(start, requires_grad=True)), expected):
        np.testing.assert_allclose(result.numpy(), want.numpy(), rtol=1e-12)
