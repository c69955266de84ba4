"""The results of the function transforms and the user's autograd, as torch.func's: where an
argument requires grad (a Parameter) the transform's results are connected to it, so that a
`backward()` through them (a gradient penalty) reaches the argument; where none does, or under
no_grad, they are constants. Each transform, eagerly and inside @trace, against torch.func on the
same program: which results require grad, and the argument's gradient after a backward of a sum of
every result that requires grad (each weighted differently) plus a term of the argument itself.

Before 2026-11-27 a leaf argument at the top level was stood for by a fresh leaf (as jax.grad's
constant gradient): its results did not require grad (an aux did, from the stand-in), and the
backward silently left out every path through them."""
import numpy as np
import pytest
import torch
import torch.func as tf

import tracer as tr

START = np.array([1.0, 2.0, -0.5])


def cubes(x):
    return (x ** 3) * 0.5


def half_sum_of_cubes(x):
    return cubes(x).sum()


def with_aux(x):
    return half_sum_of_cubes(x), x * 2


# Each transform's results, written once for both libraries: `F` is torch.func or tracer, `T`
# torch or tracer.
def grad(F, T, w):
    return [F.grad(half_sum_of_cubes)(w)]


def value_and_grad(F, T, w):
    if F is tf:
        gradient, value = tf.grad_and_value(half_sum_of_cubes)(w)
    else:
        value, gradient = tr.value_and_grad(half_sum_of_cubes)(w)
    return [value, gradient]


def value_and_grad_with_aux(F, T, w):
    if F is tf:
        gradient, (value, aux) = tf.grad_and_value(with_aux, has_aux=True)(w)
    else:
        (value, aux), gradient = tr.value_and_grad(with_aux, has_aux=True)(w)
    return [value, aux, gradient]


def vjp(F, T, w):
    value, vjp_function = F.vjp(cubes, w)
    return [value, vjp_function(T.ones(3, dtype=value.dtype))[0]]


def vjp_with_aux(F, T, w):
    value, vjp_function, aux = F.vjp(lambda x: (cubes(x), x * 2), w, has_aux=True)
    return [value, aux, vjp_function(T.ones(3, dtype=value.dtype))[0]]


def jvp(F, T, w):
    return list(F.jvp(cubes, (w,), (T.ones(3, dtype=w.dtype),)))


def jvp_with_aux(F, T, w):
    return list(F.jvp(lambda x: (cubes(x), x * 2), (w,), (T.ones(3, dtype=w.dtype),),
                      has_aux=True))


def jacrev(F, T, w):
    return [F.jacrev(cubes)(w)]


def jacrev_with_aux(F, T, w):
    return list(F.jacrev(lambda x: (cubes(x), x * 2), has_aux=True)(w))


def hessian(F, T, w):
    return [F.hessian(half_sum_of_cubes)(w)]


def grad_of_grad(F, T, w):
    return [F.grad(lambda x: F.grad(half_sum_of_cubes)(x).sum())(w)]


def vmap_of_grad(F, T, w):
    return [F.vmap(F.grad(lambda x: (x ** 3).sum()))(w.reshape(3, 1))]


TRANSFORMS = [grad, value_and_grad, value_and_grad_with_aux, vjp, vjp_with_aux, jvp, jvp_with_aux,
              jacrev, jacrev_with_aux, hessian, grad_of_grad, vmap_of_grad]


def penalized(transform, F, T, w):
    """Which results require grad, and the total a backward runs on (None if nothing requires
    grad)."""
    results = transform(F, T, w)
    flags = [bool(r.requires_grad) for r in results]
    connected = [r.sum() * (i + 2) for i, r in enumerate(results) if r.requires_grad]
    total = None
    if w.requires_grad and T.is_grad_enabled():
        total = (w * w).sum() + sum(connected)
    return flags, total


def torch_side(transform, requires_grad, grad_enabled):
    w = torch.tensor(START, requires_grad=requires_grad)
    with torch.set_grad_enabled(grad_enabled):
        flags, total = penalized(transform, tf, torch, w)
    if total is not None:
        total.backward()
    return flags, None if w.grad is None else w.grad.numpy()


def tracer_side(transform, requires_grad, grad_enabled, traced):
    w = tr.tensor(START, requires_grad=requires_grad)

    def program(w):
        with tr.set_grad_enabled(grad_enabled):
            flags, total = penalized(transform, tr, tr, w)
        if total is not None:
            total.backward()
        return flags

    if traced:
        flags_seen = []
        step = tr.trace(lambda w: flags_seen.append(program(w)) or w.sum())
        step(w)
        flags = flags_seen[0]
    else:
        flags = program(w)
    return flags, None if w.grad is None else w.grad.numpy()


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("requires_grad, grad_enabled",
                         [(True, True), (False, True), (True, False)],
                         ids=["argument requires grad", "argument is data", "under no_grad"])
@pytest.mark.parametrize("transform", TRANSFORMS, ids=lambda t: t.__name__)
def test_transform_results_meet_the_users_autograd_as_torch_funcs(transform, requires_grad,
                                                                  grad_enabled, traced):
    expected_flags, expected_gradient = torch_side(transform, requires_grad, grad_enabled)
    flags, gradient = tracer_side(transform, requires_grad, grad_enabled, traced)
    assert flags == expected_flags
    if expected_gradient is None:
        assert gradient is None
    else:
        np.testing.assert_allclose(gradient, expected_gradient, rtol=1e-12, atol=0)


@pytest.mark.parametrize("leaf", [True, False], ids=["a Parameter", "computed from one"])
def test_changing_a_differentiated_argument_in_place_is_refused_not_wrong(leaf):
    """torch.func raises for a leaf ("a leaf Variable that requires grad is being used in an
    in-place operation"); tracer's stand-in for the argument is a copy, so a change to it would
    not reach the argument: refused for a leaf and a non-leaf alike (it gave the gradient of the
    changed copy, [4, 8, -2] where d/da sum((2a)^2) is [8, 16, -4], with w unchanged)."""
    w = tr.tensor(START, requires_grad=True)
    argument = w if leaf else w * 1

    def doubled_then_squared(a):
        a.mul_(2)
        return (a ** 2).sum()

    with pytest.raises(tr.TracerError):
        tr.grad(doubled_then_squared)(argument)
    np.testing.assert_array_equal(w.detach().numpy(), START)


def test_a_result_that_is_the_argument_is_never_silently_stale():
    """torch.func's vjp of the identity returns a view of w, which shows a later change of w;
    tracer's is a copy, marked as a view's copy is: reading it after w changed is refused (it
    silently kept the old values)."""
    w = tr.tensor(START, requires_grad=True)
    output, _ = tr.vjp(lambda a: a, w)
    with tr.no_grad():
        w.mul_(10)
    with pytest.raises(tr.InplaceError):
        output + 1


# A tensor that requires grad reaching the function some other way than a differentiated
# argument: a weight W it closes over (a WGAN-GP penalty: the gradient with respect to the data,
# the critic's weights closed over), an argument outside argnums, a cotangent or tangent computed
# from W. Before 2026-11-28 the backward recorded its graph only where a differentiated argument
# required grad, so every one of these came back a constant and a backward through it silently
# left out W's path (the first: W.grad[0] [0.69, 1.64, 0.66], torch.func's [-10.54, 12.89, 8.14]).
DATA = np.random.default_rng(0).standard_normal((4, 3))
WEIGHTS = np.random.default_rng(1).standard_normal((2, 3))


def closed_over_grad(F, T, x, W):
    return [F.grad(lambda z: (z @ W.T).tanh().sum())(x)]


def closed_over_value_and_grad_with_aux(F, T, x, W):
    def f(z):
        return (z @ W.T).tanh().sum(), W.sum() * 2
    if F is tf:
        gradient, (value, aux) = tf.grad_and_value(f, has_aux=True)(x)
    else:
        (value, aux), gradient = tr.value_and_grad(f, has_aux=True)(x)
    return [value, aux, gradient]


def closed_over_but_constant_gradient(F, T, x, W):
    return [F.grad(lambda z: (z + W.sum()).sum())(x)]


def outside_argnums(F, T, x, W):
    return [F.grad(lambda z, w: (z @ w.T).sin().sum(), argnums=0)(x, W)]


def data_and_weight_in_argnums(F, T, x, W):
    return list(F.grad(lambda z, w: (z @ w.T).sin().sum(), argnums=(0, 1))(x, W))


def cotangent_from_the_weight(F, T, x, W):
    value, vjp_function = F.vjp(lambda z: (z ** 3).sin(), x)
    return [value, vjp_function(W[0].reshape(1, 3) * T.ones(4, 3, dtype=x.dtype))[0]]


def closed_over_vjp(F, T, x, W):
    value, vjp_function = F.vjp(lambda z: (z @ W.T).tanh(), x)
    return [value, vjp_function(T.ones(4, 2, dtype=x.dtype))[0]]


def tangent_from_the_weight(F, T, x, W):
    return list(F.jvp(lambda z: (z ** 3).sin(), (x,),
                      (W[0].reshape(1, 3) * T.ones(4, 3, dtype=x.dtype),)))


def closed_over_jvp(F, T, x, W):
    return list(F.jvp(lambda z: (z @ W.T).tanh(), (x,), (T.ones(4, 3, dtype=x.dtype),)))


def closed_over_jacrev(F, T, x, W):
    return [F.jacrev(lambda z: (z @ W.T).tanh())(x[0])]


def closed_over_hessian(F, T, x, W):
    return [F.hessian(lambda z: (z @ W.T).tanh().sum())(x[0])]


def closed_over_grad_of_grad(F, T, x, W):
    return [F.grad(lambda z: F.grad(lambda y: (y @ W.T).tanh().sum())(z).pow(2).sum())(x)]


def closed_over_vmap_of_grad(F, T, x, W):
    return [F.vmap(F.grad(lambda z: (z * W[0]).sin().sum()))(x)]


class TorchScaled(torch.autograd.Function):
    """x * w, whose backward for x detaches w: a gradient penalty through it does not reach w
    by that path (torch.func wants the setup_context form)."""
    @staticmethod
    def forward(x, w):
        return x * w

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, gradient):
        x, w = ctx.saved_tensors
        return gradient * w.detach(), gradient * x


class TracerScaled(tr.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, gradient):
        x, w = ctx.saved_tensors
        return gradient * w.detach(), gradient * x


class TorchScaledUnderNoGrad(TorchScaled):
    """The same, w's copy made under no_grad instead of detached."""
    @staticmethod
    def backward(ctx, gradient):
        x, w = ctx.saved_tensors
        with torch.no_grad():
            constant = w * 1
        return gradient * constant, gradient * x


class TracerScaledUnderNoGrad(TracerScaled):
    @staticmethod
    def backward(ctx, gradient):
        x, w = ctx.saved_tensors
        with tr.no_grad():
            constant = w * 1
        return gradient * constant, gradient * x


def custom_function_detaching_in_its_backward(F, T, x, W):
    scaled = TorchScaled if F is tf else TracerScaled
    return [F.grad(lambda z: scaled.apply(z, W[0]).sin().sum())(x)]


def custom_function_with_no_grad_in_its_backward(F, T, x, W):
    """Traced, the no_grad block of a backward that records its graph was differentiated (no
    tensor in it requires grad, so nothing marked it) until 2026-11-28."""
    scaled = TorchScaledUnderNoGrad if F is tf else TracerScaledUnderNoGrad
    return [F.grad(lambda z: scaled.apply(z, W[0]).sin().sum())(x)]


OUTSIDE = [closed_over_grad, closed_over_value_and_grad_with_aux,
           closed_over_but_constant_gradient, outside_argnums, data_and_weight_in_argnums,
           cotangent_from_the_weight, closed_over_vjp, tangent_from_the_weight, closed_over_jvp,
           closed_over_jacrev, closed_over_hessian, closed_over_grad_of_grad,
           closed_over_vmap_of_grad, custom_function_detaching_in_its_backward,
           custom_function_with_no_grad_in_its_backward]


def weights_gradient(transform, F, T, x, W):
    """Which results require grad; W.grad after a backward of a penalty on every result that
    does plus a term of W itself."""
    results = transform(F, T, x, W)
    flags = [bool(r.requires_grad) for r in results]
    total = (W * W).sum() + sum(r.pow(2).sum() * (i + 2)
                                for i, r in enumerate(results) if r.requires_grad)
    total.backward()
    return flags


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("transform", OUTSIDE, ids=lambda t: t.__name__)
def test_a_weight_reaching_the_function_otherwise_meets_the_users_autograd(transform, traced):
    W = torch.tensor(WEIGHTS, requires_grad=True)
    expected_flags = weights_gradient(transform, tf, torch, torch.tensor(DATA), W)
    expected_gradient = W.grad.numpy()

    W = tr.tensor(WEIGHTS, requires_grad=True)
    if traced:
        flags_seen = []
        step = tr.trace(lambda x, W: flags_seen.append(weights_gradient(transform, tr, tr, x, W))
                        or x.sum())
        step(tr.tensor(DATA), W)
        flags = flags_seen[0]
    else:
        flags = weights_gradient(transform, tr, tr, tr.tensor(DATA), W)
    assert flags == expected_flags
    np.testing.assert_allclose(W.grad.numpy(), expected_gradient, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_an_argument_also_closed_over_is_differentiated_in_its_own_use_only(traced):
    """grad(lambda a: (a * x).sum())(x) is x: the closure's x is a constant. Traced, the stand-in
    for a data argument was x's own value, so the gradient took in the closure's use too (2x)
    until 2026-11-28."""
    def gradient(x):
        return tr.grad(lambda a: (a * x).sin().sum())(x)

    x = tr.tensor(START)
    result = tr.trace(gradient)(x) if traced else gradient(x)
    np.testing.assert_allclose(result.numpy(), np.cos(START * START) * START, rtol=1e-14)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_a_vjp_taken_under_no_grad_refuses_a_cotangent_that_requires_grad(traced):
    """torch.func's vjp_fn, for a vjp taken under no_grad and called with grad enabled, returns
    J^T u connected to the cotangent u alone (J a constant). tracer's backward records the
    function's graph too (J's path to the weights) or nothing: it returned a constant, so that
    a backward of (result ** 2).sum() silently reached nothing, where torch.func's gives W.grad
    [[6.05, 6.05, 6.05], [3.19, 3.19, 3.19]] (u's path). Refused; a detached cotangent still
    gives torch.func's values."""
    def vjp_function(F, x, W):
        with (torch if F is tf else tr).no_grad():
            return F.vjp(lambda z: (z @ W.T).tanh(), x)[1]

    def cotangent(T, W):
        return W.sum(1).reshape(1, 2) * T.ones(4, 2, dtype=W.dtype)

    W = torch.tensor(WEIGHTS, requires_grad=True)
    expected = vjp_function(tf, torch.tensor(DATA), W)(cotangent(torch, W).detach())[0]

    def program(x, W):
        with pytest.raises(tr.TracerError, match="under no_grad"):
            vjp_function(tr, x, W)(cotangent(tr, W))
        return vjp_function(tr, x, W)(cotangent(tr, W).detach())[0]

    x, W = tr.tensor(DATA), tr.tensor(WEIGHTS, requires_grad=True)
    result = tr.trace(program)(x, W) if traced else program(x, W)
    assert not result.requires_grad
    np.testing.assert_allclose(result.numpy(), expected.detach().numpy(), rtol=1e-13)
