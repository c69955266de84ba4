"""Custom autograd Functions: every ctx feature of the contract, PyTorch style and R torch style,
eagerly and under @tr.trace (same results), against hand-computed gradients and gradcheck.

Edge-case behaviour follows torch.autograd.Function's documentation: mark_non_differentiable outputs
still get a (zero) gradient argument in backward; set_materialize_grads(False) passes None for
outputs that received no gradient; extra trailing Nones from backward are accepted; keyword
arguments are bound to forward's parameters (defaults included) as Function.apply does.
"""
import numpy as np
import pytest

import tracer as tr

RNG = np.random.default_rng(7)


def arr(*shape, dtype=np.float64):
    return np.asarray(RNG.uniform(-2.0, 2.0, size=shape)).astype(dtype)


def eager_and_traced(step, *arrays, requires_grad=None, extra=()):
    """Run `step(*tensors, *extra)` eagerly and traced on fresh copies of the same inputs.
    Returns [(outputs as numpy, grads as numpy or None)] for eager and traced."""
    requires_grad = requires_grad or [True] * len(arrays)
    results = []
    for runner in (step, tr.trace(step)):
        tensors = [tr.tensor(a.copy(), requires_grad=r) for a, r in zip(arrays, requires_grad)]
        out = runner(*tensors, *extra)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        results.append(([o.detach().numpy() for o in outs if o is not None],
                        [None if t.grad is None else t.grad.numpy().copy() for t in tensors]))
    return results


def assert_same(results, expected_grads=None, rtol=1e-12):
    (eager_out, eager_grads), (traced_out, traced_grads) = results
    for e, t in zip(eager_out, traced_out):
        np.testing.assert_allclose(t, e, rtol=rtol, atol=rtol)
    for e, t in zip(eager_grads, traced_grads):
        assert (e is None) == (t is None), (e, t)
        if e is not None:
            np.testing.assert_allclose(t, e, rtol=rtol, atol=rtol)
    if expected_grads is not None:
        for e, expected in zip(eager_grads, expected_grads):
            if expected is None:
                assert e is None
            else:
                np.testing.assert_allclose(e, expected, rtol=rtol, atol=rtol)


# save_for_backward / saved_tensors ----------------------------------------------------------------
class AbsProduct(tr.Function):
    @staticmethod
    def forward(ctx, u, v):
        ctx.save_for_backward(u, v)
        return (u * v).abs()

    @staticmethod
    def backward(ctx, g):
        u, v = ctx.saved_tensors
        return g * u.sign() * v.abs(), g * u.abs() * v.sign()


def test_save_for_backward_and_saved_tensors():
    u, v = arr(3, 4), arr(3, 4)
    w = arr(3, 4)

    def step(u, v):
        y = AbsProduct.apply(u, v)
        (y * tr.tensor(w)).sum().backward()
        return y

    results = eager_and_traced(step, u, v)
    assert_same(results, [w * np.sign(u) * np.abs(v), w * np.abs(u) * np.sign(v)])
    np.testing.assert_allclose(results[0][0][0], np.abs(u * v))
    for f in (AbsProduct.apply, tr.trace(AbsProduct.apply)):
        assert tr.gradcheck(f, (tr.tensor(u, requires_grad=True), tr.tensor(v, requires_grad=True)))


def test_saved_output_and_none():
    class Exp(tr.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y, None)
            return y

        @staticmethod
        def backward(ctx, g):
            y, nothing = ctx.saved_tensors
            assert nothing is None
            return g * y

    a = arr(5)
    assert_same(eager_and_traced(lambda x: [Exp.apply(x).sum().backward(), None][1] or x * 1, a),
                [np.exp(a)])
    assert tr.gradcheck(Exp.apply, (tr.tensor(a, requires_grad=True),))
    assert tr.gradcheck(tr.trace(Exp.apply), (tr.tensor(a, requires_grad=True),))


# needs_input_grad ----------------------------------------------------------------------------------
class Recorder(tr.Function):
    """x * y + z * k: records ctx.needs_input_grad each time backward runs."""
    seen = []

    @staticmethod
    def forward(ctx, x, y, z, k):
        ctx.save_for_backward(x, y, z)
        ctx.k = k
        return x * y + z * k

    @staticmethod
    def backward(ctx, g):
        Recorder.seen.append(tuple(ctx.needs_input_grad))
        x, y, z = ctx.saved_tensors
        needs = ctx.needs_input_grad
        assert needs[3] is False          # the non-tensor argument never needs a gradient
        return (g * y if needs[0] else None, g * x if needs[1] else None,
                g * ctx.k if needs[2] else None, None)


@pytest.mark.parametrize("flags", [(True, False, False), (False, True, True), (True, True, True),
                                   (False, False, True)], ids=str)
def test_needs_input_grad(flags):
    x, y, z = arr(2, 3), arr(2, 3), arr(2, 3)

    def step(x, y, z):
        out = Recorder.apply(x, y, z, 3.0)
        out.sum().backward()
        return out

    Recorder.seen.clear()
    results = eager_and_traced(step, x, y, z, requires_grad=list(flags))
    # eager ran backward once, and tracing traced it once, both with the same flags
    assert Recorder.seen == [(*flags, False)] * 2
    expected = [y if flags[0] else None, x if flags[1] else None,
                np.full((2, 3), 3.0) if flags[2] else None]
    assert_same(results, expected)


def test_needs_input_grad_all_false_backward_never_runs():
    Recorder.seen.clear()
    x = tr.tensor(arr(2))
    out = Recorder.apply(x, x, x, 1.0)
    assert not out.requires_grad and out.grad_fn is None
    traced = tr.trace(lambda a: Recorder.apply(a, a, a, 1.0))(tr.tensor(arr(2)))
    assert not traced.requires_grad
    assert Recorder.seen == []


def test_needs_input_grad_false_under_no_grad():
    Recorder.seen.clear()
    x = tr.tensor(arr(2), requires_grad=True)
    with tr.no_grad():
        out = Recorder.apply(x, x, x, 1.0)
    assert not out.requires_grad
    assert Recorder.seen == []


# mark_dirty ----------------------------------------------------------------------------------------
class AddOneInPlace(tr.Function):
    @staticmethod
    def forward(ctx, x):
        x.add_(1.0)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def test_mark_dirty_returns_the_input_changed_in_place():
    a = arr(4)

    def step(leaf):
        b = leaf.clone()
        c = AddOneInPlace.apply(b)
        assert c is b                         # as PyTorch: the dirty input is the output
        assert c.requires_grad and not c.is_leaf
        (c * c).sum().backward()
        return c

    results = eager_and_traced(step, a)
    assert_same(results, [2 * (a + 1)])
    np.testing.assert_allclose(results[0][0][0], a + 1)


def test_mark_dirty_of_a_saved_tensor_is_caught():
    # PyTorch's documented example: b = a * a saves a; changing a in place before b.backward()
    a = tr.tensor(1.5, dtype=tr.float64, requires_grad=True).clone()
    b = a * a
    AddOneInPlace.apply(a)
    with pytest.raises(tr.InplaceError):
        b.backward()


def test_mark_dirty_on_argument_under_trace_writes_back():
    x = tr.tensor(arr(3))
    before = x.numpy().copy()
    tr.trace(lambda t: [AddOneInPlace.apply(t), None][1])(x)
    np.testing.assert_allclose(x.numpy(), before + 1)


# mark_non_differentiable ---------------------------------------------------------------------------
class ValuesAndIndex(tr.Function):
    """Like a sort: differentiable values and an index-like output (here float, so it has to be
    marked) and an int index (never differentiable)."""
    grads_seen = []

    @staticmethod
    def forward(ctx, x):
        values, index = x.max(1)
        ctx.save_for_backward(x, values)
        marker = (x > 0).sum(1) * 1.0
        ctx.mark_non_differentiable(marker)
        return values, marker, index

    @staticmethod
    def backward(ctx, g_values, g_marker, g_index):
        ValuesAndIndex.grads_seen.append((g_marker, g_index))
        x, values = ctx.saved_tensors
        return tr.where(x == values.unsqueeze(1), g_values.unsqueeze(1), 0.0)


def test_mark_non_differentiable():
    a = np.array([[0.5, 2.0, -1.0], [3.0, -2.0, 1.0]])

    def step(x):
        values, marker, index = ValuesAndIndex.apply(x)
        assert values.requires_grad
        assert not marker.requires_grad and not index.requires_grad
        (values * tr.tensor([2.0, 3.0])).sum().backward()
        return values, marker, index

    ValuesAndIndex.grads_seen.clear()
    results = eager_and_traced(step, a)
    assert_same(results, [[[0, 2.0, 0], [3.0, 0, 0]]])
    values, marker, index = results[0][0]
    np.testing.assert_array_equal(values, [2.0, 3.0])
    np.testing.assert_array_equal(marker, [2.0, 2.0])
    np.testing.assert_array_equal(index, [1, 0])
    # "You still need to accept a gradient for each output in backward(), but it's always going to
    # be a zero tensor with the same shape" -- eagerly and traced
    assert len(ValuesAndIndex.grads_seen) == 2
    (marker_grad, _), _ = ValuesAndIndex.grads_seen
    assert marker_grad is not None and marker_grad.shape == (2,)
    np.testing.assert_array_equal(marker_grad.numpy(), [0.0, 0.0])


# set_materialize_grads ----------------------------------------------------------------------------
def make_two_clones(materialize):
    class TwoClones(tr.Function):
        grads_seen = []

        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(materialize)
            return x.clone(), x * 2

        @staticmethod
        def backward(ctx, g1, g2):
            TwoClones.grads_seen.append((g1 is None, g2 is None))
            result = tr.zeros_like(g1 if g1 is not None else g2)
            if g1 is not None:
                result = result + g1
            if g2 is not None:
                result = result + g2 * 2
            return result

    return TwoClones


@pytest.mark.parametrize("materialize", [True, False])
def test_set_materialize_grads(materialize):
    F = make_two_clones(materialize)
    a = arr(3)

    def step(x):
        first, _ = F.apply(x)          # the second output gets no gradient
        (first * 3).sum().backward()
        return first

    results = eager_and_traced(step, a)
    assert_same(results, [np.full(3, 3.0)])
    # materialized: zeros instead of None (both modes)
    assert F.grads_seen == [(False, not materialize)] * 2


def test_both_outputs_used_sum_their_gradients():
    F = make_two_clones(False)
    a = arr(3)

    def step(x):
        first, second = F.apply(x)
        (first * 3 + second).sum().backward()
        return first, second

    results = eager_and_traced(step, a)
    assert_same(results, [np.full(3, 5.0)])
    assert F.grads_seen == [(False, False)] * 2
    assert tr.gradcheck(F.apply, (tr.tensor(a, requires_grad=True),))
    assert tr.gradcheck(tr.trace(F.apply), (tr.tensor(a, requires_grad=True),))


# plain attributes, non-tensor arguments: the seed's KillHead ---------------------------------------
from course_functions import KillHead  # noqa: E402  (examples/, on the path through conftest)


@pytest.mark.parametrize("n", [0, 2, 5])
def test_plain_attributes_and_non_tensor_argument(n):
    a, w = arr(3, 5), arr(3, 5)

    def step(x):
        r = KillHead.apply(x, n)
        (r * tr.tensor(w)).sum().backward()
        return r

    expected = w.copy()
    expected[:, :n] = 0
    results = eager_and_traced(step, a)
    assert_same(results, [expected])
    forward = a.copy()
    forward[:, :n] = 0
    np.testing.assert_array_equal(results[0][0][0], forward)


def test_non_tensor_argument_as_traced_runtime_scalar():
    # a Python float passed to the traced function becomes a runtime input; the Function sees it
    # as a (weak) traced scalar, and its gradient slot still takes None
    class Scale(tr.Function):
        @staticmethod
        def forward(ctx, x, c):
            ctx.c = c
            return x * c

        @staticmethod
        def backward(ctx, g):
            return g * ctx.c, None

    def step(x, c):
        y = Scale.apply(x, c)
        y.sum().backward()
        return y

    f = tr.trace(step)
    for c in (2.0, 5.0):
        x = tr.tensor([1.0, 2.0], requires_grad=True)
        y = f(x, c)
        assert y.dtype == tr.float32
        np.testing.assert_array_equal(y.numpy(), [c, 2 * c])
        np.testing.assert_array_equal(x.grad.numpy(), [c, c])
    assert f.cache_info().misses == 1


# keyword arguments with defaults --------------------------------------------------------------------
class Affine(tr.Function):
    seen = []

    @staticmethod
    def forward(ctx, x, scale=2.0, bias=None):
        ctx.save_for_backward(bias)
        ctx.scale = scale
        return x * scale if bias is None else x * scale + bias

    @staticmethod
    def backward(ctx, g):
        Affine.seen.append(tuple(ctx.needs_input_grad))
        (bias,) = ctx.saved_tensors
        grad_bias = g.sum(0) if bias is not None and ctx.needs_input_grad[2] else None
        return g * ctx.scale, None, grad_bias


@pytest.mark.parametrize("call", ["default", "keyword_scale", "keyword_bias", "positional"])
def test_keyword_arguments_with_defaults(call):
    a, b = arr(2, 3), arr(3)

    def step(x, bias):
        if call == "default":
            y = Affine.apply(x)
        elif call == "keyword_scale":
            y = Affine.apply(x, scale=3.0)
        elif call == "keyword_bias":
            y = Affine.apply(x, bias=bias)
        else:
            y = Affine.apply(x, 4.0, bias)
        y.sum().backward()
        return y

    scale = {"default": 2.0, "keyword_scale": 3.0, "keyword_bias": 2.0, "positional": 4.0}[call]
    uses_bias = call in ("keyword_bias", "positional")
    Affine.seen.clear()
    results = eager_and_traced(step, a, b)
    assert_same(results, [np.full((2, 3), scale), np.full(3, 2.0) if uses_bias else None])
    np.testing.assert_allclose(results[0][0][0], a * scale + (b if uses_bias else 0))
    # one needs_input_grad entry per forward parameter, defaults included
    assert Affine.seen == [(True, False, uses_bias)] * 2


# R torch style -----------------------------------------------------------------------------------------
def _linear_forward(ctx, input, weight, bias=None):
    ctx.save_for_backward(input=input, weight=weight, bias=bias)
    output = input.mm(weight.t())
    if bias is not None:
        output = output + bias.unsqueeze(0).expand_as(output)
    return output


R_SEEN = []


def _linear_backward(ctx, grad_output):
    s = ctx.saved_variables
    R_SEEN.append((ctx.needs_input_grad.input, ctx.needs_input_grad.weight,
                   ctx.needs_input_grad.bias))
    grads = {"input": None, "weight": None, "bias": None}
    if ctx.needs_input_grad.input:
        grads["input"] = grad_output.mm(s.weight)
    if ctx.needs_input_grad.weight:
        grads["weight"] = grad_output.t().mm(s.input)
    if s.bias is not None and ctx.needs_input_grad.bias:
        grads["bias"] = grad_output.sum(dim=0)
    return grads


r_linear = tr.autograd_function(forward=_linear_forward, backward=_linear_backward)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("input_grad", [True, False])
def test_r_style_linear(with_bias, input_grad):
    x, w, b, g = arr(5, 3), arr(4, 3), arr(4), arr(5, 4)

    def step(x, w, b):
        y = r_linear(x, w, b) if with_bias else r_linear(x, w)
        y.backward(tr.tensor(g))
        return y

    R_SEEN.clear()
    results = eager_and_traced(step, x, w, b, requires_grad=[input_grad, True, True])
    assert_same(results, [g @ w if input_grad else None, g.T @ x,
                          g.sum(0) if with_bias else None])
    np.testing.assert_allclose(results[0][0][0], x @ w.T + (b if with_bias else 0))
    assert R_SEEN == [(input_grad, True, with_bias)] * 2
    inputs = (tr.tensor(x, requires_grad=True), tr.tensor(w, requires_grad=True),
              tr.tensor(b, requires_grad=True))[:3 if with_bias else 2]
    assert tr.gradcheck(r_linear, inputs)
    assert tr.gradcheck(tr.trace(r_linear), inputs)


def test_r_style_saved_variables_by_name_and_index():
    seen = {}

    def forward(ctx, a, b):
        ctx.save_for_backward(first=a, second=b)
        return a * b

    def backward(ctx, g):
        s = ctx.saved_variables
        seen["names"] = (s.first is s[0], s.second is s[1])
        return {"a": g * s.second, "b": g * s.first}

    f = tr.autograd_function(forward=forward, backward=backward)
    a, b = arr(3), arr(3)
    results = eager_and_traced(lambda x, y: [f(x, y).sum().backward(), x * y][1], a, b)
    assert_same(results, [b, a])
    assert seen["names"] == (True, True)


def test_r_style_missing_names_are_none():
    # mul_constant: the dict names only `tensor`; `constant` gets None
    f = tr.autograd_function(
        forward=lambda ctx, tensor, constant: [setattr(ctx, "c", constant), tensor * constant][1],
        backward=lambda ctx, g: {"tensor": g * ctx.c})
    results = eager_and_traced(lambda x: [f(x, 2.0).sum().backward(), x * 1][1], np.array([1.0]))
    assert_same(results, [[2.0]])


# a custom Function inside a bigger graph, and used twice ---------------------------------------------
def test_function_used_twice_and_composed():
    a, b = arr(3, 3), arr(3, 3)

    def step(u, v):
        y = AbsProduct.apply(u, v)
        z = AbsProduct.apply(y, u.tanh())
        loss = (z + y).sum()
        loss.backward()
        return loss

    results = eager_and_traced(step, a, b)
    assert_same(results)

    def value(u, v):
        y = AbsProduct.apply(u, v)
        return AbsProduct.apply(y, u.tanh()) + y

    inputs = (tr.tensor(a, requires_grad=True), tr.tensor(b, requires_grad=True))
    assert tr.gradcheck(value, inputs)
    assert tr.gradcheck(tr.trace(value), inputs)


def test_grad_transform_through_function():
    a, b = arr(4), arr(4)
    def f(u, v):
        return AbsProduct.apply(u, v).sum()

    g_eager = tr.grad(f, argnums=(0, 1))(tr.tensor(a), tr.tensor(b))
    g_traced = tr.trace(tr.grad(f, argnums=(0, 1)))(tr.tensor(a), tr.tensor(b))
    for e, t, expected in zip(g_eager, g_traced, (np.sign(a) * np.abs(b), np.abs(a) * np.sign(b))):
        np.testing.assert_allclose(e.numpy(), expected)
        np.testing.assert_allclose(t.numpy(), expected)


def test_trailing_none_gradients_accepted_like_pytorch():
    class Extra(tr.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2, None, None

    assert_same(eager_and_traced(lambda x: [Extra.apply(x).sum().backward(), x * 1][1], arr(2)),
                [[2.0, 2.0]])


class WithNoneOutput(tr.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, None

    @staticmethod
    def backward(ctx, grad, grad_of_none):
        assert grad_of_none is None  # as in PyTorch: None for an output that is not a tensor
        return grad * 2


@pytest.mark.parametrize("traced", [False, True])
def test_forward_returning_none_gets_none_in_backward(traced):
    def step(x):
        doubled, nothing = WithNoneOutput.apply(x)
        assert nothing is None
        doubled.sum().backward()

    x = tr.ones(3, requires_grad=True)
    (tr.trace(step) if traced else step)(x)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])


def test_r_style_arguments_named_like_tuple_methods():
    scale = tr.autograd_function(
        forward=lambda ctx, count, index: (ctx.save_for_backward(index=index), count * 3)[1],
        backward=lambda ctx, grad: {"count": grad * 3 if ctx.needs_input_grad.count else None})
    x = tr.ones(2, requires_grad=True)
    index = tr.tensor([5.0, 6.0])
    scale(x, index).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_nested_grad_is_the_second_derivative():
    inner = tr.grad(lambda w: (w ** 3).sum())
    second = tr.grad(lambda w: inner(w).sum())(tr.tensor([1.0, 2.0], dtype=tr.float64))
    np.testing.assert_array_equal(second.numpy(), [6.0, 12.0])  # d/dw sum(3 w^2) = 6 w
