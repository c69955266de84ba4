"""The Tensor API of the contract, checked against numpy as the oracle: values eagerly and under
@tr.trace, dtype rules, and eager gradients of every differentiable method by gradcheck (float64)."""
import contextlib

import numpy as np
import pytest

import tracer as tr

RNG = np.random.default_rng(1234)


def arr(*shape, low=-2.0, high=2.0, dtype=np.float64):
    return np.asarray(RNG.uniform(low, high, size=shape)).astype(dtype)


def away_from_zero(*shape, dtype=np.float64):
    a = RNG.uniform(0.5, 2.0, size=shape) * RNG.choice([-1.0, 1.0], size=shape)
    return np.asarray(a).astype(dtype)


def both_modes(fn, *arrays):
    """fn on tensors eagerly and under @tr.trace (fresh tensors each time); numpy results."""
    eager = fn(*[tr.tensor(a) for a in arrays])
    traced = tr.trace(fn)(*[tr.tensor(a) for a in arrays])
    def as_np(r):
        return tuple(t.numpy() for t in r) if isinstance(r, tuple) else r.numpy()

    return as_np(eager), as_np(traced)


def check(fn, np_fn, *arrays, rtol=1e-6, atol=1e-6):
    expected = np_fn(*arrays)
    for result in both_modes(fn, *arrays):
        assert result.shape == np.shape(expected)
        assert result.dtype == np.asarray(expected).dtype, (result.dtype, np.asarray(expected).dtype)
        np.testing.assert_allclose(result, expected, rtol=rtol, atol=atol)


# Creation ------------------------------------------------------------------------------------------
def test_tensor_copies_data_and_default_dtypes():
    a = np.array([1.0, 2.0], np.float32)
    t = tr.tensor(a)
    a[0] = 100.0
    assert t.numpy()[0] == 1.0
    assert tr.tensor([1.0, 2.0]).dtype == tr.float32       # Python floats default to float32
    assert tr.tensor([1, 2]).dtype == tr.int64
    assert tr.tensor([True, False]).dtype == tr.bool
    assert tr.tensor(np.zeros(2)).dtype == tr.float64       # numpy arrays keep their dtype
    assert tr.tensor([1, 2], dtype=tr.float64).dtype == tr.float64
    t = tr.tensor(3.5)
    assert t.shape == () and t.ndim == 0 and t.item() == 3.5


def test_from_numpy_shares_memory_both_ways():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = tr.from_numpy(a)
    a[0, 0] = 42.0
    assert t.numpy()[0, 0] == 42.0
    t.add_(1.0)
    np.testing.assert_array_equal(a, np.arange(6).reshape(2, 3) + [[42, 0, 0], [0, 0, 0]] + 1)
    with tr.no_grad():
        t[:, 1] = -1.0
    assert (a[:, 1] == -1.0).all()


def test_zeros_ones_full_shapes_and_dtypes():
    z = tr.zeros(2, 3)
    assert z.shape == (2, 3) and z.dtype == tr.float32 and not z.numpy().any()
    o = tr.ones((4,), dtype=tr.float64)
    assert o.shape == (4,) and o.dtype == tr.float64 and (o.numpy() == 1).all()
    assert tr.zeros(0, 5).shape == (0, 5)
    assert tr.ones(3, requires_grad=True).requires_grad
    assert tr.zeros(2, dtype=tr.int64).dtype == tr.int64


def test_randn_and_manual_seed_reproducible():
    tr.manual_seed(7)
    a = tr.randn(3, 4).numpy().copy()
    b = tr.randn(3, 4).numpy().copy()
    tr.manual_seed(7)
    np.testing.assert_array_equal(tr.randn(3, 4).numpy(), a)
    np.testing.assert_array_equal(tr.randn(3, 4).numpy(), b)
    assert not np.array_equal(a, b)
    assert tr.randn(2, 2).dtype == tr.float32
    assert tr.randn(2, 2, dtype=tr.float64).dtype == tr.float64
    big = tr.randn(20000, dtype=tr.float64).numpy()
    assert abs(big.mean()) < 0.05 and abs(big.std() - 1) < 0.05
    assert tr.randn(2, requires_grad=True).requires_grad


# dtype promotion --------------------------------------------------------------------------------
@pytest.mark.parametrize("scalar", [2, 2.5, True])
def test_python_scalar_does_not_promote_float32(scalar):
    x = tr.tensor([1.0, 2.0])
    for r in (x * scalar, scalar * x, x + scalar, x - scalar, scalar - x, x / 2.0, 2.0 / x, x ** 2.0):
        assert r.dtype == tr.float32


def test_promotion_rules():
    i = tr.tensor([1, 2, 3])
    f32 = tr.tensor([1.0, 2.0, 3.0])
    f64 = tr.tensor([1.0, 2.0, 3.0], dtype=tr.float64)
    assert (i * 2.5).dtype == tr.float32
    np.testing.assert_allclose((i * 2.5).numpy(), [2.5, 5.0, 7.5])
    assert (i * 2).dtype == tr.int64
    assert (i / 2).dtype == tr.float32                       # true division of ints is float
    np.testing.assert_allclose((i / 2).numpy(), [0.5, 1.0, 1.5])
    assert (f32 + f64).dtype == tr.float64
    assert (f64 + f32).dtype == tr.float64
    assert (i + f32).dtype == tr.float32
    assert (i + f64).dtype == tr.float64
    assert (f32 < 2).dtype == tr.bool
    assert (f64 * 3).dtype == tr.float64
    # As PyTorch: a 0-d tensor decides only when it is of a higher category
    assert (f32 * tr.tensor(2.0, dtype=tr.float64)).dtype == tr.float32
    assert (tr.tensor([1, 2]) * tr.tensor(2.0, dtype=tr.float64)).dtype == tr.float64
    assert (tr.tensor(1.0) * tr.tensor(2.0, dtype=tr.float64)).dtype == tr.float64


def test_promotion_under_trace_matches_eager():
    def f(i, a, b, s):
        return i * 2.5, a + b, a * s, i * s

    args = (np.array([1, 2], np.int64), np.array([1.0, 2.0], np.float32),
            np.array([1.0, 2.0], np.float64))
    eager = f(*[tr.tensor(a) for a in args], 0.5)
    traced = tr.trace(f)(*[tr.tensor(a) for a in args], 0.5)
    for e, t in zip(eager, traced):
        assert e.dtype == t.dtype
        np.testing.assert_array_equal(e.numpy(), t.numpy())
    assert [t.dtype for t in traced] == [tr.float32, tr.float64, tr.float32, tr.float32]


# Elementwise and operators --------------------------------------------------------------------------
BINARY = [
    ("add", lambda a, b: a + b, np.add),
    ("sub", lambda a, b: a - b, np.subtract),
    ("mul", lambda a, b: a * b, np.multiply),
    ("div", lambda a, b: a / b, np.divide),
    ("maximum", lambda a, b: a.maximum(b), np.maximum),
]
SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1), (1, 5)), ((2, 1, 3), (4, 1)), ((0, 3), (3,)),
          ((1,), (5,)), ((), (2, 2))]


@pytest.mark.parametrize("name,fn,np_fn", BINARY, ids=[b[0] for b in BINARY])
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_binary_operators_broadcast(name, fn, np_fn, shapes):
    a = arr(*shapes[0])
    b = away_from_zero(*shapes[1])
    check(fn, np_fn, a, b)


def test_pow_forms():
    a = arr(3, 4, low=0.5, high=2.0)
    b = arr(3, 4, low=-1.0, high=2.0)
    check(lambda x, y: x ** y, np.power, a, b)
    check(lambda x, y: x.pow(y), np.power, a, b)
    check(lambda x: x ** 2, lambda x: x ** 2, a)
    check(lambda x: x ** 0.5, np.sqrt, a)
    check(lambda x: 2.0 ** x, lambda x: 2.0 ** x, a)
    check(lambda x: x.pow(3), lambda x: x ** 3, arr(5))


def test_matmul_forms():
    check(lambda x, y: x @ y, np.matmul, arr(3, 4), arr(4, 5))
    check(lambda x, y: x.mm(y), np.matmul, arr(3, 4), arr(4, 2))
    check(lambda x, y: x.matmul(y), np.matmul, arr(2, 3, 4), arr(4, 5))      # batch
    check(lambda x, y: x @ y, np.matmul, arr(4), arr(4, 5))                  # vector @ matrix
    check(lambda x, y: x @ y, np.matmul, arr(3, 4), arr(4))                  # matrix @ vector
    check(lambda x, y: x @ y, np.matmul, arr(4), arr(4))                     # dot
    check(lambda x, y: x @ y, np.matmul, arr(2, 1, 3, 4), arr(5, 4, 2))      # batch broadcast
    check(lambda x, y: x @ y, np.matmul, arr(0, 4), arr(4, 3))
    check(lambda x, y: x @ y, np.matmul, arr(3, 0), arr(0, 2))               # empty contraction
    check(lambda x, y: x @ y, np.matmul, arr(2, 3, 4), arr(4))               # batch @ vector
    check(lambda x, y: x @ y, np.matmul, arr(0, 3, 4), arr(4, 5))            # empty batch


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (4, 5)), ((2, 2, 3, 4), (4,)), ((0, 3, 4), (4, 5))])
def test_batch_times_matrix_is_one_product_with_torch_gradients(shapes, traced):
    """(..., m, k) @ (k, n), a linear layer on a batch, is one (... * m, k) @ (k, n) product, as
    in PyTorch: no copy of the matrix broadcast over the batch, no batch of gradients summed."""
    import torch
    x, y = arr(*shapes[0]), arr(*shapes[1])
    weights = arr(*np.matmul(x, y).shape)

    def loss(a, b):
        return (a @ b * tr.tensor(weights)).sum()

    a, b = tr.tensor(x, requires_grad=True), tr.tensor(y, requires_grad=True)
    (tr.trace(loss) if traced else loss)(a, b).backward()
    ta, tb = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    (ta @ tb * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-12, atol=1e-12)
    text = tr.trace(tr.grad(loss, argnums=(0, 1))).ir(a.detach(), b.detach(), stage="optimized")
    products = [line for line in text.splitlines() if "= matmul" in line]
    # the two of the gradients (the loss is linear in the forward product, which dce removes)
    assert len(products) == 2 and "broadcast" not in text, text
    assert all(line.split("[")[1].split("]")[0].count(",") == 1 for line in products), products


UNARY = [
    ("neg", lambda x: -x, np.negative, None),
    ("abs", lambda x: x.abs(), np.abs, None),
    ("abs_builtin", lambda x: abs(x), np.abs, None),
    ("sign", lambda x: x.sign(), np.sign, None),
    ("exp", lambda x: x.exp(), np.exp, None),
    ("log", lambda x: x.log(), np.log, "positive"),
    ("sqrt", lambda x: x.sqrt(), np.sqrt, "positive"),
    ("tanh", lambda x: x.tanh(), np.tanh, None),
    ("sigmoid", lambda x: x.sigmoid(), lambda x: 1 / (1 + np.exp(-x)), None),
    ("relu", lambda x: x.relu(), lambda x: np.maximum(x, 0), None),
    ("sin", lambda x: x.sin(), np.sin, None),
    ("cos", lambda x: x.cos(), np.cos, None),
    ("clamp_min", lambda x: x.clamp(min=0.1), lambda x: np.maximum(x, 0.1), None),
    ("clamp_max", lambda x: x.clamp(max=-0.3), lambda x: np.minimum(x, -0.3), None),
    ("clamp_both", lambda x: x.clamp(-0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7), None),
]


def unary_input(domain, *shape, dtype=np.float64):
    if domain == "positive":
        return arr(*shape, low=0.2, high=3.0, dtype=dtype)
    return away_from_zero(*shape, dtype=dtype)   # away from kinks of abs/sign/relu/clamp


@pytest.mark.parametrize("name,fn,np_fn,domain", UNARY, ids=[u[0] for u in UNARY])
@pytest.mark.parametrize("shape", [(2, 3), (0,), (1, 1), ()], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_unary_methods(name, fn, np_fn, domain, shape, dtype):
    a = unary_input(domain, *shape, dtype=dtype)
    rtol = 1e-6 if dtype == np.float32 else 1e-12
    check(fn, lambda x: np.asarray(np_fn(x)).astype(dtype), a, rtol=rtol, atol=rtol)


def test_unary_float_methods_of_int_tensors_give_float32():
    i = tr.tensor([1, 2, 4])
    for r in (i.exp(), i.log(), i.sqrt(), i.tanh(), i.sigmoid(), i.sin(), i.cos()):
        assert r.dtype == tr.float32
    np.testing.assert_allclose(i.sqrt().numpy(), [1, np.sqrt(2), 2], rtol=1e-6)
    assert i.abs().dtype == tr.int64 and (-i).dtype == tr.int64


def test_clamp_int_and_bounds_dtype():
    i = tr.tensor([-3, 0, 5])
    assert i.clamp(min=0).dtype == tr.int64
    np.testing.assert_array_equal(i.clamp(min=0, max=2).numpy(), [0, 0, 2])
    f = tr.tensor([-3.0, 0.5, 5.0])
    assert f.clamp(min=0).dtype == tr.float32
    np.testing.assert_array_equal(f.clamp(min=-1, max=1).numpy(), np.float32([-1, 0.5, 1]))


COMPARISONS = [("lt", lambda a, b: a < b, np.less), ("le", lambda a, b: a <= b, np.less_equal),
               ("gt", lambda a, b: a > b, np.greater), ("ge", lambda a, b: a >= b, np.greater_equal),
               ("eq", lambda a, b: a == b, np.equal), ("ne", lambda a, b: a != b, np.not_equal)]


@pytest.mark.parametrize("name,fn,np_fn", COMPARISONS, ids=[c[0] for c in COMPARISONS])
def test_comparisons_are_bool_tensors(name, fn, np_fn):
    a = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    b = np.array([2.0, 2.0, 2.0])
    check(fn, np_fn, a, b)
    check(lambda x: fn(x, 2.0), lambda x: np_fn(x, 2.0), a)
    check(lambda x: fn(2.0, x), lambda x: np_fn(2.0, x), a)   # reflected comparison


# Reductions --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [None, 0, 1, -1, (0, 2)], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_and_mean(dim, keepdim):
    a = arr(2, 3, 4)
    axis = dim if not isinstance(dim, list) else tuple(dim)
    check(lambda x: x.sum(dim=dim, keepdim=keepdim),
          lambda x: np.sum(x, axis=axis, keepdims=keepdim), a)
    check(lambda x: x.mean(dim=dim, keepdim=keepdim),
          lambda x: np.mean(x, axis=axis, keepdims=keepdim), a, rtol=1e-12)


def test_sum_of_empty_and_int_and_bool():
    check(lambda x: x.sum(0), lambda x: x.sum(0), arr(0, 3))
    check(lambda x: x.sum(), lambda x: x.sum(), arr(0, 3))
    i = tr.tensor([[1, 2], [3, 4]])
    assert i.sum().dtype == tr.int64 and i.sum().item() == 10
    assert (tr.tensor([1.0, -1.0, 2.0]) > 0).sum().item() == 2


@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min(keepdim):
    a = np.array([[1.0, 5.0, 5.0, -2.0], [7.0, 2.0, 7.0, 0.0], [-1.0, -3.0, -1.0, -4.0]])
    check(lambda x: x.max(), np.max, a)
    check(lambda x: x.min(), np.min, a)
    for dim in (0, 1, -1):
        for method, np_fn, np_arg in (("max", np.max, np.argmax), ("min", np.min, np.argmin)):
            for result in both_modes(lambda x, method=method, dim=dim: tuple(getattr(x, method)(dim, keepdim)), a):
                values, indices = result
                np.testing.assert_array_equal(values, np_fn(a, axis=dim, keepdims=keepdim))
                # ties resolve to the first index, as numpy's argmax/argmin
                np.testing.assert_array_equal(indices, np_arg(a, axis=dim, keepdims=keepdim))
                assert indices.dtype == np.int64
    t = tr.tensor(a)
    assert t.max(1).values.shape == (3,) and t.max(dim=1).indices.shape == (3,)
    # max(other) is the elementwise maximum
    np.testing.assert_array_equal(t.max(tr.tensor(a * 0)).numpy(), np.maximum(a, 0))


# Layout ------------------------------------------------------------------------------------------
LAYOUT = [
    ("t", lambda x: x.t(), lambda x: x.T, (3, 4)),
    ("t_1d", lambda x: x.t(), lambda x: x, (3,)),
    ("transpose", lambda x: x.transpose(0, 2), lambda x: np.swapaxes(x, 0, 2), (2, 3, 4)),
    ("transpose_neg", lambda x: x.transpose(-1, -2), lambda x: np.swapaxes(x, -1, -2), (2, 3, 4)),
    ("permute", lambda x: x.permute(2, 0, 1), lambda x: np.transpose(x, (2, 0, 1)), (2, 3, 4)),
    ("permute_tuple", lambda x: x.permute((1, 2, 0)), lambda x: np.transpose(x, (1, 2, 0)), (2, 3, 4)),
    ("reshape", lambda x: x.reshape(4, 6), lambda x: x.reshape(4, 6), (2, 3, 4)),
    ("reshape_tuple_neg", lambda x: x.reshape((-1, 4)), lambda x: x.reshape(-1, 4), (2, 3, 4)),
    ("view", lambda x: x.view(24), lambda x: x.reshape(24), (2, 3, 4)),
    ("view_0", lambda x: x.view(3, 0), lambda x: x.reshape(3, 0), (0, 3)),
    ("unsqueeze0", lambda x: x.unsqueeze(0), lambda x: x[None], (2, 3)),
    ("unsqueeze_last", lambda x: x.unsqueeze(-1), lambda x: x[..., None], (2, 3)),
    ("unsqueeze_mid", lambda x: x.unsqueeze(1), lambda x: x[:, None], (2, 3)),
    ("squeeze", lambda x: x.squeeze(), lambda x: x.squeeze(), (1, 3, 1, 2)),
    ("squeeze_dim", lambda x: x.squeeze(2), lambda x: x.squeeze(2), (1, 3, 1, 2)),
    ("squeeze_noop", lambda x: x.squeeze(1), lambda x: x, (1, 3, 1, 2)),
    # PyTorch 2's tuple of dimensions (a TypeError here before); those not of size 1 stay
    ("squeeze_dims", lambda x: x.squeeze((0, 2)), lambda x: x.squeeze((0, 2)), (1, 3, 1, 2)),
    ("squeeze_dims_some", lambda x: x.squeeze([-2, 1]), lambda x: x.squeeze(2), (1, 3, 1, 2)),
    ("expand", lambda x: x.expand(4, 3), lambda x: np.broadcast_to(x, (4, 3)), (1, 3)),
    ("expand_neg", lambda x: x.expand(2, -1, 5), lambda x: np.broadcast_to(x, (2, 3, 5)), (3, 1)),
    ("expand_0", lambda x: x.expand(0, 3), lambda x: np.broadcast_to(x, (0, 3)), (3,)),
]


@pytest.mark.parametrize("name,fn,np_fn,shape", LAYOUT, ids=[case[0] for case in LAYOUT])
def test_layout_methods(name, fn, np_fn, shape):
    check(fn, lambda x: np.ascontiguousarray(np_fn(x)), arr(*shape))


def test_expand_as():
    check(lambda x, y: x.expand_as(y), lambda x, y: np.broadcast_to(x, y.shape), arr(3), arr(2, 3))


@pytest.mark.parametrize("library", ["tracer", "traced", "torch"])
def test_augmented_assignment_to_a_subscript_changes_the_tensor(library):
    """`t[1:3] += 5`, `x[:, 0] *= 2`: Python reads t[key], applies the in-place operator and
    stores the result back into t[key]; tracer's copy refused the in-place step. The same
    values and gradient as PyTorch's; an in-place operator on a kept copy is still refused, and
    a float result into an int tensor raises as PyTorch's does."""
    lib = pytest.importorskip("torch") if library == "torch" else tr

    def step(t, w):
        t[1:3] += 5
        t[0] -= 1
        t[1:3] /= 2
        h = w * 1
        h[:, 0] *= lib.tensor([3.0, 4.0])
        h[1] += 1
        h.sum().backward()
        return t * 1

    t, w = lib.zeros(4), lib.ones(2, 2, requires_grad=True)
    result = (tr.trace(step) if library == "traced" else step)(t, w)
    np.testing.assert_array_equal(result.detach().numpy(), [-1.0, 2.5, 2.5, 0.0])
    np.testing.assert_array_equal(w.grad.numpy(), [[3.0, 1.0], [4.0, 1.0]])
    if library != "traced":
        kept = t[1:3]
        with pytest.raises((RuntimeError, tr.TracerError)) if lib is tr else contextlib.nullcontext():
            kept += 1
        integers = lib.tensor([1, 2])
        with pytest.raises((RuntimeError, tr.TracerError), match="[Ff]loat.*(cannot|can't)"):
            integers[0] /= 2


@pytest.mark.parametrize("traced", [False, True])
def test_in_place_change_of_a_view_result_is_refused(traced):
    # PyTorch's views share storage; here they are copies, so the change would be silently lost:
    # it is refused instead, and a clone() of the result can be changed freely.
    def f(x):
        for make_view in (lambda: x.reshape(6), lambda: x.t(), lambda: x.view(3, 2),
                          lambda: x[0], lambda: x[:, 1:], lambda: x.unsqueeze(0),
                          lambda: x.expand(2, 2, 3), lambda: x.T, lambda: x[...]):
            with pytest.raises(tr.InplaceError, match="clone"):
                make_view().fill_(-1.0)
            copy = make_view().clone()
            copy.fill_(-1.0)
        return x.sum(0, keepdim=True).add_(1)  # results of computations are not views

    x = tr.tensor(np.arange(6.0).reshape(2, 3))
    result = (tr.trace(f) if traced else f)(x)
    np.testing.assert_array_equal(x.numpy(), np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(result.numpy(), [[4.0, 6.0, 8.0]])


# Indexing ----------------------------------------------------------------------------------------
INDEX_KEYS = [0, -1, (1, 2), (slice(None), 1), (slice(1, None), slice(None, None, 2)),
              (slice(None, None, 3),), (None, 0), (Ellipsis, 1), (0, Ellipsis, None),
              (slice(0, 0),), (slice(1, 3), None, slice(4, 0)), (slice(-2, None),),
              (Ellipsis,), (slice(None), slice(1, 4, 2), 0)]


@pytest.mark.parametrize("key", INDEX_KEYS, ids=str)
def test_getitem(key):
    a = arr(4, 5, 3)
    check(lambda x: x[key], lambda x: np.ascontiguousarray(x[key]), a)


def test_getitem_gradient():
    x = tr.tensor(arr(4, 5), requires_grad=True)
    y = x[1:, ::2]
    (y * tr.tensor(np.arange(9.0).reshape(3, 3))).sum().backward()
    expected = np.zeros((4, 5))
    expected[1:, ::2] = np.arange(9.0).reshape(3, 3)
    np.testing.assert_array_equal(x.grad.numpy(), expected)
    assert tr.gradcheck(lambda x: x[None, 1:3, ..., 1], (tr.tensor(arr(4, 5, 2), requires_grad=True),))


SET_KEYS = [(0, 7.0), ((slice(None), slice(0, 2)), 0.0), ((slice(None, None, 2),), -1.0),
            ((Ellipsis, 1), np.array([1.0, 2.0, 3.0, 4.0])), ((1, slice(1, None, 3)), np.array([8.0, 9.0])),
            ((slice(1, 3), 2), np.array([[5.0], [6.0]]).reshape(2)), ((slice(0, 0),), 3.0),
            ((None, 2), np.array([[1.0, 2.0, 3.0, 4.0, 5.0]]))]


@pytest.mark.parametrize("key,value", SET_KEYS, ids=[str(k) for k, _ in SET_KEYS])
def test_setitem(key, value):
    a = arr(4, 5)
    expected = a.copy()
    expected[key] = value

    def f(x):
        x[key] = value if np.isscalar(value) else tr.tensor(value)
        return x

    for result in both_modes(f, a):
        np.testing.assert_array_equal(result, expected)


def test_setitem_boolean_masks_seed_forms():
    a = arr(3, 4)

    def relu_backward(g, x):
        g = g.clone()
        g[x < 0] = 0
        return g

    ones = np.ones((3, 4))
    for result in both_modes(relu_backward, ones, a):
        np.testing.assert_array_equal(result, np.where(a < 0, 0.0, 1.0))

    def kill_head(r, n=2):
        r = r.clone()
        r[:, 0:n] = 0
        return r

    for result in both_modes(kill_head, a):
        expected = a.copy()
        expected[:, 0:2] = 0
        np.testing.assert_array_equal(result, expected)

    def row_mask(x):          # a mask over leading dimensions selects whole rows
        x[x.sum(1) > 0] = 5.0
        return x

    for result in both_modes(row_mask, a):
        expected = a.copy()
        expected[a.sum(1) > 0] = 5.0
        np.testing.assert_array_equal(result, expected)


def test_setitem_gradient_flows_to_value_and_kept_part():
    x = tr.tensor(arr(3, 4), requires_grad=True)
    v = tr.tensor(arr(3), requires_grad=True)
    y = x * 1.0
    y[:, 1] = v
    (y * tr.tensor(np.arange(12.0).reshape(3, 4))).sum().backward()
    w = np.arange(12.0).reshape(3, 4)
    expected_x = w.copy()
    expected_x[:, 1] = 0
    np.testing.assert_array_equal(x.grad.numpy(), expected_x)
    np.testing.assert_array_equal(v.grad.numpy(), w[:, 1])


# In-place ----------------------------------------------------------------------------------------
INPLACE = [
    ("add_", lambda x: x.add_(tr.tensor([1.0, 2.0, 3.0])), lambda a: a + [1, 2, 3]),
    ("add_alpha", lambda x: x.add_(2.0, alpha=3), lambda a: a + 6),
    ("sub_", lambda x: x.sub_(0.5), lambda a: a - 0.5),
    ("mul_", lambda x: x.mul_(tr.tensor([[2.0], [3.0]])), lambda a: a * [[2], [3]]),
    ("div_", lambda x: x.div_(4.0), lambda a: a / 4),
    ("zero_", lambda x: x.zero_(), lambda a: a * 0),
    ("fill_", lambda x: x.fill_(2.5), lambda a: np.full_like(a, 2.5)),
    ("copy_", lambda x: x.copy_(tr.tensor([7.0, 8.0, 9.0])), lambda a: np.broadcast_to([7, 8, 9], a.shape)),
    ("clamp_", lambda x: x.clamp_(-0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5)),
    ("clamp_min_", lambda x: x.clamp_(min=0), lambda a: np.maximum(a, 0)),
]


@pytest.mark.parametrize("name,fn,np_fn", INPLACE, ids=[i[0] for i in INPLACE])
def test_inplace_methods(name, fn, np_fn):
    a = arr(2, 3, dtype=np.float32)
    expected = np.asarray(np_fn(a.astype(np.float64))).astype(np.float32)
    x = tr.tensor(a)
    out = fn(x)
    assert out is x                                     # in-place methods return self
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-6)
    assert x.dtype == tr.float32

    # traced: the argument is written back
    y = tr.tensor(a)
    tr.trace(lambda t: [fn(t), None][1])(y)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6)


def test_inplace_keeps_dtype_and_rejects_widening():
    i = tr.tensor([1, 2, 3])
    with pytest.raises(tr.TracerError):
        i.mul_(2.5)                                   # a float result into an int tensor
    np.testing.assert_array_equal(i.numpy(), [1, 2, 3])
    f = tr.tensor([1.0, 2.0])
    f.add_(tr.tensor([1.0, 1.0], dtype=tr.float64))   # same category: cast back to float32
    assert f.dtype == tr.float32
    np.testing.assert_array_equal(f.numpy(), [2.0, 3.0])


def test_inplace_on_non_leaf_records_gradient():
    x = tr.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y.add_(x)            # y = 3x (add's VJP reads no operand)
    y.mul_(2.0)          # y = 6x
    y.sub_(x, alpha=2)   # y = 4x
    y.clamp_(min=-100.0)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 4.0, 4.0])
    z = tr.tensor([1.0, 2.0], requires_grad=True)
    w = z * 1.0
    w[0] = 0.0
    w.sum().backward()
    np.testing.assert_array_equal(z.grad.numpy(), [0.0, 1.0])


@pytest.mark.parametrize("traced", [False, True])
def test_inplace_mul_of_non_leaf_by_tensor_like_pytorch(traced):
    # PyTorch keeps a copy of `self` (original_self) for in-place ops whose backward reads it.
    def f(x):
        y = x * 2
        y.mul_(x)            # y = 2x * x
        y.sum().backward()

    x = tr.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (tr.trace(f) if traced else f)(x)
    np.testing.assert_allclose(x.grad.numpy(), 4 * np.array([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("traced", [False, True])
def test_sign_gradient_is_zeros_not_none(traced):
    def f(x):
        x.sign().sum().backward()

    x = tr.tensor([0.5, -1.5], requires_grad=True)
    (tr.trace(f) if traced else f)(x)
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0])


def test_sign_has_zero_gradient():
    x = tr.tensor([0.5, -1.5], requires_grad=True)
    (x.sign() * 3 + x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])


def test_where():
    c = np.array([[True, False, True]])
    a, b = arr(2, 3), arr(3)
    check(lambda c, x, y: tr.where(c, x, y), np.where, c, a, b)
    check(lambda x: tr.where(x > 0, x, 0.0), lambda x: np.where(x > 0, x, 0.0), a)
    assert tr.where(tr.tensor([True]), tr.tensor([1.0]), 0.0).dtype == tr.float32
    x = tr.tensor(away_from_zero(5), requires_grad=True)
    y = tr.tensor(arr(5), requires_grad=True)
    assert tr.gradcheck(lambda x, y: tr.where(x > 0, x * y, y ** 2), (x, y))


# Grad mode, detach, clone ----------------------------------------------------------------------------
def test_no_grad_and_enable_grad():
    x = tr.tensor([1.0, 2.0], requires_grad=True)
    with tr.no_grad():
        y = x * 2
        with tr.enable_grad():
            z = x * 3
        w = x * 4
    assert not y.requires_grad and z.requires_grad and not w.requires_grad
    assert (x * 5).requires_grad
    z.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])

    @tr.no_grad()
    def decorated(t):
        return t * 2

    assert not decorated(x).requires_grad


@pytest.mark.parametrize("library", ["tracer", "torch"])
def test_set_grad_enabled_as_a_function_a_block_and_a_decorator(library):
    """As PyTorch's: called alone it sets the mode from then on (tracer's once did nothing so);
    a block restores the mode before it; a decorator's mode holds inside the function only."""
    lib = tr if library == "tracer" else pytest.importorskip("torch")
    x = lib.tensor([1.0, 2.0], requires_grad=True)
    try:
        lib.set_grad_enabled(False)
        assert not (x * 2).requires_grad and not lib.is_grad_enabled()
        lib.set_grad_enabled(True)
        assert (x * 2).requires_grad
        with lib.set_grad_enabled(False):
            assert not (x * 2).requires_grad
        assert (x * 2).requires_grad
        with lib.no_grad():
            with lib.set_grad_enabled(True):
                assert (x * 2).requires_grad
            assert not (x * 2).requires_grad

        @lib.set_grad_enabled(False)
        def decorated(t):
            return t * 2

        assert lib.is_grad_enabled() and not decorated(x).requires_grad and lib.is_grad_enabled()
    finally:
        lib.set_grad_enabled(True)


@pytest.mark.parametrize("library", ["tracer", "torch"])
def test_inference_mode_as_a_block_and_a_decorator(library):
    lib = tr if library == "tracer" else pytest.importorskip("torch")
    x = lib.tensor([1.0, 2.0], requires_grad=True)
    with lib.inference_mode():
        assert not (x * 2).requires_grad and lib.is_inference_mode_enabled()
    assert (x * 2).requires_grad and not lib.is_inference_mode_enabled()
    with lib.no_grad():
        with lib.inference_mode(False):  # PyTorch's turns grad mode on
            assert (x * 2).requires_grad and not lib.is_inference_mode_enabled()
        assert not (x * 2).requires_grad

    @lib.inference_mode
    def bare(t):
        return t * 2

    @lib.inference_mode()
    def called(t):
        return t * 3

    assert not bare(x).requires_grad and not called(x).requires_grad
    assert (x * 2).requires_grad


@pytest.mark.parametrize("library", ["tracer", "torch"])
def test_no_grad_and_enable_grad_decorate_without_the_call(library):
    lib = tr if library == "tracer" else pytest.importorskip("torch")
    x = lib.tensor([1.0, 2.0], requires_grad=True)

    @lib.no_grad
    def evaluate(t):
        @lib.enable_grad
        def inner(u):
            return u * 3
        return t * 2, inner(t)

    doubled, tripled = evaluate(x)
    assert not doubled.requires_grad and tripled.requires_grad
    assert evaluate.__name__ == "evaluate" and (x * 2).requires_grad


def test_inference_mode_inside_a_traced_step_records_no_gradient():
    w = tr.tensor([1.0, 2.0], requires_grad=True)

    @tr.trace
    def step(x):
        loss = (w * x).sum()
        loss.backward()
        with tr.inference_mode():
            evaluated = w * x * 2
        return loss, evaluated

    for k in range(3):
        w.grad = None
        loss, evaluated = step(tr.tensor([3.0, 4.0 + k]))
        assert not evaluated.requires_grad
        np.testing.assert_array_equal(evaluated.numpy(), [6.0, 4.0 * (4.0 + k)])
        np.testing.assert_array_equal(w.grad.numpy(), [3.0, 4.0 + k])
    assert step.cache_info().misses == 1


def test_detach_clone_requires_grad_():
    x = tr.tensor([1.0, 2.0], requires_grad=True)
    assert x.is_leaf and x.requires_grad and x.grad is None
    d = x.detach()
    assert not d.requires_grad and d.is_leaf
    np.testing.assert_array_equal(d.numpy(), [1.0, 2.0])
    c = x.clone()
    assert c.requires_grad and not c.is_leaf
    (c * c).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])   # clone passes the gradient
    c2 = tr.tensor([3.0]).clone()
    assert not c2.requires_grad
    n = tr.tensor([1.0, 2.0])
    assert n.requires_grad_() is n and n.requires_grad
    n.requires_grad_(False)
    assert not n.requires_grad
    with pytest.raises(tr.TracerError):
        c.requires_grad_(False)            # only leaves
    with pytest.raises(tr.TracerError):
        tr.tensor([1, 2]).requires_grad_()  # only floats


def test_item_and_numpy():
    t = tr.tensor([[2.5]])
    assert t.item() == 2.5 and isinstance(t.item(), float)
    assert tr.tensor(3).item() == 3 and isinstance(tr.tensor(3).item(), int)
    a = tr.tensor([1.0, 2.0]).numpy()
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    with pytest.raises(tr.TracerError):
        tr.tensor([1.0, 2.0]).item()
    with pytest.raises(tr.TracerError):
        tr.tensor([1.0], requires_grad=True).numpy()     # as PyTorch: detach first
    assert tr.tensor([1.0], requires_grad=True).detach().numpy()[0] == 1.0


# Eager backward semantics -----------------------------------------------------------------------------
def test_backward_accumulates_like_pytorch():
    x = tr.tensor([1.0, -2.0], requires_grad=True)
    (x * x).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0 + 3, -4.0 + 3])
    x.grad.zero_()
    (x ** 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 12.0])


def test_backward_with_gradient_argument_and_broadcast_reduction():
    x = tr.tensor(arr(2, 3), requires_grad=True)
    b = tr.tensor(arr(3), requires_grad=True)
    y = x * b
    g = arr(2, 3)
    y.backward(tr.tensor(g))
    np.testing.assert_allclose(x.grad.numpy(), g * b.detach().numpy())
    np.testing.assert_allclose(b.grad.numpy(), (g * x.detach().numpy()).sum(0))
    assert b.grad.shape == (3,) and b.grad.dtype == tr.float64


def test_grad_dtype_follows_leaf():
    x = tr.tensor([1.0, 2.0], requires_grad=True)            # float32
    (x.double() * 2).sum().backward()
    assert x.grad.dtype == tr.float32
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])


# Hand-computed gradients ------------------------------------------------------------------------
def test_hand_computed_gradients():
    a = np.array([0.5, -1.5, 2.0])
    cases = [
        (lambda x: x.exp(), np.exp(a)),
        (lambda x: x.tanh(), 1 - np.tanh(a) ** 2),
        (lambda x: x.sigmoid(), np.exp(-a) / (1 + np.exp(-a)) ** 2),
        (lambda x: x.relu(), (a > 0).astype(float)),
        (lambda x: x.abs(), np.sign(a)),
        (lambda x: x.sin(), np.cos(a)),
        (lambda x: x.cos(), -np.sin(a)),
        (lambda x: x ** 3, 3 * a ** 2),
        (lambda x: 1 / x, -1 / a ** 2),
        (lambda x: x.clamp(-1, 1), ((a >= -1) & (a <= 1)).astype(float)),
    ]
    for fn, expected in cases:
        x = tr.tensor(a, requires_grad=True)
        fn(x).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)
    x = tr.tensor(a, requires_grad=True)
    x.mean().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 1 / 3))
    x = tr.tensor(a, requires_grad=True)
    x.max().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 1.0])


# gradcheck of every differentiable method (float64, eager) ----------------------------------------
GRADCHECK = [
    ("add", lambda x, y: x + y, [(2, 3), (3,)], None),
    ("sub", lambda x, y: x - y, [(2, 1), (1, 3)], None),
    ("rsub", lambda x: 1.0 - x, [(2, 3)], None),
    ("mul", lambda x, y: x * y, [(2, 3), (2, 3)], None),
    ("div", lambda x, y: x / y, [(2, 3), (3,)], "nonzero"),
    ("rdiv", lambda x: 2.0 / x, [(2, 3)], "nonzero"),
    ("pow_tensor", lambda x, y: x ** y, [(2, 3), (2, 3)], "positive"),
    ("pow_scalar", lambda x: x.pow(3), [(2, 3)], None),
    ("pow_half", lambda x: x ** 0.5, [(2, 3)], "positive"),
    ("rpow", lambda x: 3.0 ** x, [(2, 3)], None),
    ("matmul", lambda x, y: x @ y, [(2, 3), (3, 4)], None),
    ("mm", lambda x, y: x.mm(y), [(2, 3), (3, 2)], None),
    ("matmul_batch_vec", lambda x, y: x.matmul(y), [(2, 2, 3), (3,)], None),
    ("neg", lambda x: -x, [(2, 3)], None),
    ("abs", lambda x: x.abs(), [(2, 3)], "nonzero"),
    ("sign", lambda x: x.sign() * x, [(2, 3)], "nonzero"),
    ("exp", lambda x: x.exp(), [(2, 3)], None),
    ("log", lambda x: x.log(), [(2, 3)], "positive"),
    ("sqrt", lambda x: x.sqrt(), [(2, 3)], "positive"),
    ("tanh", lambda x: x.tanh(), [(2, 3)], None),
    ("sigmoid", lambda x: x.sigmoid(), [(2, 3)], None),
    ("relu", lambda x: x.relu(), [(2, 3)], "nonzero"),
    ("sin", lambda x: x.sin(), [(2, 3)], None),
    ("cos", lambda x: x.cos(), [(2, 3)], None),
    ("clamp", lambda x: x.clamp(min=-0.3, max=0.4), [(3, 4)], "nonzero"),
    ("maximum", lambda x, y: x.maximum(y), [(2, 3), (2, 3)], None),
    ("t", lambda x: x.t(), [(2, 3)], None),
    ("transpose", lambda x: x.transpose(0, 2), [(2, 3, 2)], None),
    ("permute", lambda x: x.permute(1, 2, 0), [(2, 3, 2)], None),
    ("reshape", lambda x: x.reshape(3, 2), [(2, 3)], None),
    ("view", lambda x: x.view(-1), [(2, 3)], None),
    ("unsqueeze", lambda x: x.unsqueeze(1), [(2, 3)], None),
    ("squeeze", lambda x: x.squeeze(), [(2, 1, 3)], None),
    ("expand", lambda x: x.expand(2, 4, 3), [(4, 1)], None),
    ("expand_as", lambda x, y: x.expand_as(y) * y, [(3,), (2, 3)], None),
    ("sum", lambda x: x.sum(), [(2, 3)], None),
    ("sum_dim", lambda x: x.sum(1), [(2, 3)], None),
    ("sum_keepdim", lambda x: x.sum(dim=0, keepdim=True), [(2, 3)], None),
    ("mean", lambda x: x.mean(), [(2, 3)], None),
    ("mean_dim", lambda x: x.mean(-1, keepdim=True), [(2, 3)], None),
    ("max", lambda x: x.max(), [(2, 3)], None),
    ("max_dim", lambda x: x.max(1).values, [(2, 3)], None),
    ("min", lambda x: x.min(), [(2, 3)], None),
    ("min_dim", lambda x: x.min(0, keepdim=True).values, [(2, 3)], None),
    ("getitem", lambda x: x[1:, None, ::2], [(3, 4)], None),
    ("where", lambda x, y: tr.where(x > 0, x, y), [(2, 3), (2, 3)], "nonzero"),
    ("clone", lambda x: x.clone(), [(2, 3)], None),
    ("broadcast_size1", lambda x, y: x * y, [(1, 1), (2, 3)], None),
    ("size0", lambda x, y: (x * y).sum(0), [(0, 3), (3,)], None),
]


@pytest.mark.parametrize("name,fn,shapes,domain", GRADCHECK, ids=[g[0] for g in GRADCHECK])
def test_gradcheck_every_differentiable_method(name, fn, shapes, domain):
    make = {None: lambda s: arr(*s), "nonzero": lambda s: away_from_zero(*s),
            "positive": lambda s: arr(*s, low=0.3, high=2.0)}[domain]
    inputs = [tr.tensor(make(s), requires_grad=True) for s in shapes]
    assert tr.gradcheck(fn, inputs)


def test_gradcheck_reports_wrong_gradient():
    class Wrong(tr.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 3

    # A step of 2^-20 about 1.0: the central difference of 2x is exactly 2.0 (of random inputs
    # and the default 1e-6 it may print 1.99999999995, as it did when the module's random
    # stream moved, and "2.0" was not found)
    with pytest.raises(tr.GradcheckError) as info:
        tr.gradcheck(Wrong.apply, (tr.tensor([1.0, -0.5], dtype=tr.float64, requires_grad=True),),
                     eps=2.0 ** -20)
    message = str(info.value)
    assert "input 0" in message and "3.0" in message and "2.0" in message


@pytest.mark.parametrize("op", ["exp", "tanh", "sqrt"])
def test_inplace_change_of_a_result_the_vjp_reads_raises(op):
    # exp/tanh/sqrt's VJP reads its result: changing it in place must not give a wrong gradient
    # (PyTorch: "one of the variables needed for gradient computation has been modified").
    x = tr.tensor([0.5, 1.0], requires_grad=True)
    y = getattr(x, op)()
    y.add_(1.0)
    with pytest.raises(tr.InplaceError):
        y.sum().backward()
    assert x.grad is None


def test_inplace_scalar_ops_on_non_leaf_allowed_like_pytorch():
    x = tr.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.mul_(3.0)
    y.div_(4.0)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.5, 1.5])


@pytest.mark.parametrize("traced", [False, True])
def test_min_and_max_with_extreme_integers_and_nan(traced):
    def f(i, x):
        return i.min(), i.min(1), x.max(1), x.min(1), x.argmax()

    i = tr.tensor([[-2 ** 63, 5], [3, 2 ** 63 - 1]])
    x = tr.tensor([[1.0, float("nan"), 0.5], [0.0, -1.0, -1.0]])
    smallest, row_min, row_max, row_min_x, position = (tr.trace(f) if traced else f)(i, x)
    assert smallest.item() == -2 ** 63
    np.testing.assert_array_equal(row_min.values.numpy(), [-2 ** 63, 3])
    np.testing.assert_array_equal(row_min.indices.numpy(), [0, 0])
    np.testing.assert_array_equal(row_max.values.numpy(), [np.nan, 0.0])  # nan is the extremum
    np.testing.assert_array_equal(row_max.indices.numpy(), [1, 0])
    np.testing.assert_array_equal(row_min_x.indices.numpy(), [1, 1])  # the first of the ties
    assert position.item() == 1
