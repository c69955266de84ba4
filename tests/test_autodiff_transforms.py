"""Function transforms against torch.func, eager and traced: nested grad / value_and_grad, vjp,
jvp, jacrev, hessian and vmap (per-sample gradients)."""
import numpy as np
import pytest
import torch
import torch.func as tf

import tracer as tr

# (torch.func's own internals warn)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
MODES = pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
RANDOM = np.random.default_rng(3)
X = RANDOM.uniform(-1, 1, size=4)
Y = RANDOM.uniform(-1, 1, size=4)
W = RANDOM.standard_normal((3, 4))
BATCH_X = RANDOM.standard_normal((5, 4))
BATCH_Y = RANDOM.standard_normal((5, 3))


def _flat(value) -> list[np.ndarray]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _flat(item)]
    return [value.detach().numpy()]


def run(function, traced, *arrays):
    """`function` on tensors of `arrays`, eagerly or compiled: its results' arrays, in order."""
    compiled = tr.trace(function) if traced else function
    result = _flat(compiled(*(tr.tensor(a) for a in arrays)))
    return result if len(result) > 1 else result[0]


def torch_run(function, *arrays):
    result = _flat(function(*(torch.tensor(a) for a in arrays)))
    return result if len(result) > 1 else result[0]


def energy(x, y):
    return (x.sin() * y.exp() + x * x * y).sum()


@MODES
def test_nested_grad_value_and_grad_and_perturbation_confusion(traced):
    for make in (
            lambda lib: lib.grad(lambda x, y: lib.grad(energy)(x, y).sum()),
            lambda lib: lib.grad(lambda x, y: lib.grad(energy, argnums=1)(x, y).sum()),
            # third order
            lambda lib: lib.grad(lambda x, y: lib.grad(
                lambda x: lib.grad(energy)(x, y).pow(2).sum())(x).pow(2).sum(), 1),
            # the inner gradient is with respect to its own argument only
            lambda lib: lib.grad(lambda x, y: (x * lib.grad(lambda z: (x * z * y).sum())(x)).sum()),
            # an inner function closing over the outer argument
            lambda lib: lib.grad(lambda x, y: lib.grad(lambda z: (z.exp() * x).sum())(y).sum()),
    ):
        np.testing.assert_allclose(run(make(tr), traced, X, Y), torch_run(make(tf), X, Y),
                                   rtol=1e-12, atol=1e-14)

    def ours(x, y):
        value, gradient = tr.value_and_grad(energy)(x, y)
        return value + gradient.sum()

    def theirs(x, y):
        gradient, value = tf.grad_and_value(energy)(x, y)  # torch.func's order
        return value + gradient.sum()

    np.testing.assert_allclose(run(tr.grad(ours), traced, X, Y),
                               torch_run(tf.grad(theirs), X, Y), rtol=1e-12)


@MODES
def test_vjp_and_jvp(traced):
    def vector_function(x, y):
        return (x * y).tanh(), x.exp().sum() * y

    def with_vjp(lib):
        def f(x, y, u, v):
            out, vjp_fn = lib.vjp(vector_function, x, y)
            return (*out, *vjp_fn((u, v)))
        return f

    def with_jvp(lib):
        def f(x, y, u, v):
            out, tangents = lib.jvp(vector_function, (x, y), (u, v))
            return (*out, *tangents)
        return f

    for make in (with_vjp, with_jvp):
        ours = run(make(tr), traced, X, Y, W[0], W[1])
        theirs = torch_run(make(tf), X, Y, W[0], W[1])
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@MODES
def test_jacrev_and_hessian(traced):
    def model(w, x):
        return (w @ x).tanh()

    for make, arguments in (
            (lambda lib: lib.jacrev(model), (W, X)),
            (lambda lib: lib.jacrev(model, argnums=(0, 1)), (W, X)),
            (lambda lib: lib.hessian(lambda w, x: model(w, x).pow(2).sum(), argnums=1), (W, X)),
            (lambda lib: lib.hessian(energy, argnums=(0, 1)), (X, Y))):
        ours = run(make(tr), traced, *arguments)
        theirs = torch_run(make(tf), *arguments)
        for a, b in zip(_flat_arrays(ours), _flat_arrays(theirs), strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def _flat_arrays(value) -> list[np.ndarray]:
    return value if isinstance(value, list) else [value]


@MODES
def test_vmap_per_sample_gradients(traced):
    def loss(w, x, y):
        return ((w @ x).tanh() - y).pow(2).sum()

    per_sample = run(lambda w, x, y: tr.vmap(tr.grad(loss), in_dims=(None, 0, 0))(w, x, y),
                     traced, W, BATCH_X, BATCH_Y)
    expected = torch_run(lambda w, x, y: tf.vmap(tf.grad(loss), in_dims=(None, 0, 0))(w, x, y),
                         W, BATCH_X, BATCH_Y)
    assert per_sample.shape == (5, 3, 4)
    np.testing.assert_allclose(per_sample, expected, rtol=1e-12, atol=1e-14)
    # their mean is the gradient of the mean loss
    mean = run(lambda w, x, y: tr.grad(lambda w: tr.vmap(loss, in_dims=(None, 0, 0))(
        w, x, y).mean())(w), traced, W, BATCH_X, BATCH_Y)
    np.testing.assert_allclose(mean, per_sample.mean(axis=0), rtol=1e-12)


def test_vmap_dims_and_errors():
    x = tr.tensor(BATCH_X)
    transposed = tr.vmap(lambda row: (row * 2, row.sum()), in_dims=1, out_dims=(1, 0))(x)
    np.testing.assert_array_equal(transposed[0].numpy(), BATCH_X * 2)
    np.testing.assert_array_equal(transposed[1].numpy(), BATCH_X.sum(axis=0))
    expected = tf.vmap(lambda row: (row * 2, row.sum()), in_dims=1, out_dims=(1, 0))(
        torch.tensor(BATCH_X))
    np.testing.assert_array_equal(transposed[0].numpy(), expected[0].numpy())
    with pytest.raises(tr.ArgumentError, match="sizes"):
        tr.vmap(lambda a, b: a + b)(x, tr.tensor(W))
    with pytest.raises(tr.ArgumentError, match="in_dims"):
        tr.vmap(lambda a, b: a + b, in_dims=(0,))(x, x)


def test_vmap_over_a_custom_function_and_a_dict():
    class Cube(tr.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 3 * x * x

    params = {"a": tr.tensor(X), "b": tr.tensor(Y)}
    grads = tr.vmap(tr.grad(lambda p, x: (Cube.apply(p["a"] * x) + p["b"]).sum()),
                    in_dims=(None, 0))(params, tr.tensor(BATCH_X))
    np.testing.assert_allclose(grads["a"].numpy(), 3 * X ** 2 * BATCH_X ** 3, rtol=1e-12)
    np.testing.assert_array_equal(grads["b"].numpy(), np.ones((5, 4)))
