"""div with rounding_mode (and divide, true_divide), the dtype= of sum and mean, masked_select,
nonzero and argwhere, and scatter / scatter_add: values, dtypes and gradients against PyTorch on
the same inputs, eagerly and traced (conftest also checks every compiled call against the
interpreter), and the errors where PyTorch raises."""
import numpy as np
import pytest
import torch

import tracer as tr
from torch_oracle import compare_with_torch

RNG = np.random.default_rng(11)
MODES = [None, "trunc", "floor"]
SPECIAL = [-7.0, 7.0, 2.5, -0.5, 0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, 5.0, -3.0, 1e-300]
DIVISORS = [2.0, -2.0, 0.75, 2.0, 0.0, 3.0, 2.0, -0.0, 1.0, 1e-10, -0.0, 0.0, -1e10]


def _floats(dtype):
    """The special dividends and divisors with random ones, all pairs of the specials too."""
    x, y = np.meshgrid(SPECIAL, DIVISORS, indexing="ij")
    with np.errstate(over="ignore"):
        x = np.concatenate([x.reshape(-1), SPECIAL, RNG.uniform(-50, 50, 40)]).astype(dtype)
        y = np.concatenate([y.reshape(-1), DIVISORS, RNG.uniform(-5, 5, 40)]).astype(dtype)
    return x, y


# div ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode", MODES)
def test_float_div_matches_torch_with_its_gradient(mode, dtype, traced):
    x, y = _floats(dtype)
    # (the gradients to torch_oracle's tolerance: without a rounding mode the quotient rule's
    # y gradient rounds differently by an ulp; the rounded modes' are zeros)
    (result,) = compare_with_torch(lambda a, b: tr.div(a, b, rounding_mode=mode),
                                   lambda a, b: torch.div(a, b, rounding_mode=mode), [x, y],
                                   traced=traced)
    expected = torch.div(torch.tensor(x), torch.tensor(y), rounding_mode=mode).numpy()
    np.testing.assert_array_equal(result.detach().numpy(), expected)  # (nan where nan)
    numbers = ~np.isnan(expected)  # (and zeros of the same sign; a nan's sign is not compared)
    np.testing.assert_array_equal(np.signbit(result.detach().numpy()[numbers]),
                                  np.signbit(expected[numbers]))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("mode", MODES)
def test_integer_div_matches_torch(mode, traced):
    x = np.array([-7, 7, 5, -1, 0, 9, -9, 2**40 + 3, -(2**40) - 3, 1, -1])
    y = np.array([2, -2, 3, 2, 5, -4, -4, 7, 7, -3, 3])
    def function(a, b):
        return (tr.div(a, b, rounding_mode=mode), a.div(3, rounding_mode=mode),
                tr.divide(-11, b, rounding_mode=mode))

    run = tr.trace(function) if traced else function
    ours = run(tr.tensor(x), tr.tensor(y))
    theirs = (torch.div(torch.tensor(x), torch.tensor(y), rounding_mode=mode),
              torch.tensor(x).div(3, rounding_mode=mode),
              torch.divide(-11, torch.tensor(y), rounding_mode=mode))
    for mine, reference in zip(ours, theirs):
        assert mine.dtype.name == str(reference.dtype).removeprefix("torch.")
        np.testing.assert_array_equal(mine.numpy(), reference.numpy())


def test_integer_div_by_zero_raises_as_pytorchs_and_without_rounding_is_infinite():
    x = tr.tensor([-3, 0, 4])
    for mode in ("trunc", "floor"):
        with pytest.raises(tr.ArgumentError, match="ZeroDivisionError"):
            tr.div(x, tr.tensor([1, 0, 2]), rounding_mode=mode)
        with pytest.raises(tr.ArgumentError, match="ZeroDivisionError"):
            x.div(0, rounding_mode=mode)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            torch.div(torch.tensor([-3, 0, 4]), 0, rounding_mode=mode)
    np.testing.assert_array_equal(tr.div(x, 0).numpy(), [-np.inf, np.nan, np.inf])


def test_div_refuses_what_pytorch_refuses():
    with pytest.raises(tr.ArgumentError, match="rounding_mode to be one of None, 'trunc', or "
                                               "'floor' but found 'round'"):
        tr.div(tr.ones(2), 2.0, rounding_mode="round")
    for mode in ("trunc", "floor"):
        with pytest.raises(tr.ArgumentError, match="bool"):
            tr.div(tr.tensor([True]), tr.tensor([True]), rounding_mode=mode)
    np.testing.assert_array_equal(tr.div(tr.tensor([True, False]), tr.tensor([True, True])).numpy(),
                                  [1.0, 0.0])
    with pytest.raises(tr.ArgumentError, match="cannot be written in place"):
        tr.tensor([4, 5]).div_(2)  # (PyTorch: "result type Float can't be cast to ... Long")


def test_rounded_div_has_zero_gradients_also_for_infinite_cotangents():
    for mode in ("trunc", "floor"):
        x = tr.tensor([1.0, -3.0, 2.0], requires_grad=True)
        y = tr.tensor([2.0, 0.5, -1.0], requires_grad=True)
        result = tr.div(x, y, rounding_mode=mode)
        assert result.requires_grad
        result.backward(tr.tensor([np.inf, np.nan, 1.0]))
        np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 0.0])
        np.testing.assert_array_equal(y.grad.numpy(), [0.0, 0.0, 0.0])


@pytest.mark.parametrize("mode", MODES)
def test_div_in_place_and_aliases_match_torch(mode):
    values = np.array([-7.5, 7.0, 2.5, -0.5])
    ours, theirs = tr.tensor(values), torch.tensor(values)
    assert ours.div_(2.0, rounding_mode=mode) is ours
    theirs.div_(2.0, rounding_mode=mode)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    ours.divide_(tr.tensor([2.0, -1.0, 4.0, 3.0]), rounding_mode=mode)
    theirs.divide_(torch.tensor([2.0, -1.0, 4.0, 3.0]), rounding_mode=mode)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    integers = tr.tensor([-7, 8])
    if mode is not None:
        integers.div_(2, rounding_mode=mode)
        np.testing.assert_array_equal(integers.numpy(), torch.tensor([-7, 8]).div(
            2, rounding_mode=mode).numpy())
    np.testing.assert_array_equal(tr.true_divide(tr.tensor([3, 4]), 8).numpy(), [0.375, 0.5])
    copy = tr.tensor([3.0, 4.0])
    copy.true_divide_(8)
    np.testing.assert_array_equal(copy.numpy(), [0.375, 0.5])
    copy /= 0.5
    np.testing.assert_array_equal(copy.numpy(), [0.75, 1.0])


# sum and mean with dtype= (and the dtype= prod, cumsum and cumprod had) ---------------------
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_reductions_with_a_dtype_convert_the_input_first_as_pytorchs(traced):
    integers = np.array([[1, -7, 3], [3, 4, 2**40 + 1]])
    flags = np.array([[True, False, True], [True, True, False]])

    def reductions(lib, i, b):
        f64, f32 = lib.float64, lib.float32
        return (i.sum(dtype=f64), i.sum(1, dtype=f32), lib.sum(i, 0, keepdim=True, dtype=f64),
                i.mean(dtype=f64), i.mean(1, keepdim=True, dtype=f32), lib.mean(i, dtype=f64),
                b.sum(dtype=f32), b.sum(0, dtype=lib.int64), i.prod(1, dtype=f64),
                i.cumsum(1, dtype=f64), i[:, :2].cumprod(0, dtype=f32))

    def function(i, b):
        return reductions(tr, i, b)

    run = tr.trace(function) if traced else function
    ours = run(tr.tensor(integers), tr.tensor(flags))
    theirs = reductions(torch, torch.tensor(integers), torch.tensor(flags))
    for mine, reference in zip(ours, theirs):
        assert mine.shape == tuple(reference.shape)
        assert mine.dtype.name == str(reference.dtype).removeprefix("torch.")
        np.testing.assert_array_equal(mine.numpy(), reference.numpy())


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_float_reductions_with_a_dtype_match_torch_with_gradients(dtype, traced):
    x = RNG.standard_normal((4, 5)).astype(dtype) * 1e3

    def reductions(lib):
        return lambda a: (a.sum(dtype=lib.float64), a.sum(1, keepdim=True, dtype=lib.float32),
                          a.mean(0, dtype=lib.float64), lib.mean(a, dtype=lib.float32))

    outputs = compare_with_torch(reductions(tr), reductions(torch), [x], traced=traced)
    assert [o.dtype for o in outputs] == [tr.float64, tr.float32, tr.float64, tr.float32]


def test_a_gradient_through_a_dtype_sum_comes_back_in_the_inputs_dtype():
    x = tr.tensor([1.0, 2.0], requires_grad=True)
    x.sum(dtype=tr.float64).backward()
    assert x.grad.dtype == tr.float32
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])


def test_mean_refuses_an_integer_dtype_and_integers_without_one():
    with pytest.raises(tr.ArgumentError, match="dtype must be a float dtype"):
        tr.tensor([1, 2]).mean(dtype=tr.int64)
    with pytest.raises(RuntimeError, match="could not infer output dtype"):
        torch.tensor([1, 2]).mean(dtype=torch.int64)
    with pytest.raises(tr.ArgumentError, match="dtype=tr.float32"):
        tr.tensor([1, 2]).mean()


# masked_select, nonzero, argwhere ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)),
                                    ((2, 1, 3), (4, 1)), ((), ()), ((3,), ())])
def test_masked_select_matches_torch_with_its_gradient(shapes, dtype):
    x_shape, mask_shape = shapes
    x = RNG.standard_normal(x_shape).astype(dtype)
    mask = RNG.random(mask_shape) < 0.5
    if mask.ndim:
        mask.reshape(-1)[0] = True  # (at least one element selected)
    compare_with_torch(lambda a, m: (a.masked_select(m), tr.masked_select(a * 2, m)),
                       lambda a, m: (a.masked_select(m), torch.masked_select(a * 2, m)),
                       [x, mask])


def test_masked_select_refuses_what_pytorch_refuses():
    x = tr.ones(2, 3)
    with pytest.raises(tr.ArgumentError, match="bool mask"):
        x.masked_select(tr.tensor([1, 0, 1]))
    with pytest.raises(tr.ShapeMismatchError, match="does not broadcast"):
        x.masked_select(tr.tensor([True, False]))
    with pytest.raises(tr.ArgumentError, match="takes a Tensor"):
        x.masked_select(True)


@pytest.mark.parametrize("values", [
    np.array([[1.5, 0.0, -0.0], [np.nan, 0.0, 2.0]]), np.array([True, False, True]),
    np.array([[0, 3], [-1, 0], [0, 0]]), np.array(5.0), np.array(0), np.zeros((2, 0)),
    np.zeros((3, 1, 2)), (np.arange(24).reshape(2, 3, 4) % 5).astype(np.float32)],
    ids=lambda v: f"{v.dtype}{list(v.shape)}")
def test_nonzero_and_argwhere_match_torch(values):
    ours, theirs = tr.tensor(values), torch.tensor(values)
    for mine, reference in [(ours.nonzero(), theirs.nonzero()),
                            (tr.nonzero(ours), torch.nonzero(theirs)),
                            (tr.argwhere(ours), torch.argwhere(theirs)),
                            (ours.argwhere(), theirs.argwhere())]:
        assert mine.dtype == tr.int64 and mine.shape == tuple(reference.shape)
        np.testing.assert_array_equal(mine.numpy(), reference.numpy())
    mine, reference = tr.nonzero(ours, as_tuple=True), torch.nonzero(theirs, as_tuple=True)
    assert len(mine) == len(reference)
    for axis, position in zip(mine, reference):
        np.testing.assert_array_equal(axis.numpy(), position.numpy())
        assert axis.dtype == tr.int64


def test_nonzero_of_a_tensor_that_requires_grad_does_not():
    x = tr.tensor([1.0, 0.0, 2.0], requires_grad=True)
    assert not x.nonzero().requires_grad
    np.testing.assert_array_equal(x.nonzero(as_tuple=True)[0].numpy(), [0, 2])


@pytest.mark.parametrize("name, call, advice", [
    ("masked_select", lambda x: x.masked_select(x > 0), "tr.where(mask, x, 0)"),
    ("masked_select", lambda x: tr.masked_select(x, x > 0), "x * mask"),
    ("nonzero", lambda x: x.nonzero(), "pass them in as an argument"),
    ("nonzero", lambda x: tr.nonzero(x, as_tuple=True), "tr.where(x != 0"),
    ("argwhere", lambda x: tr.argwhere(x), "pass them in as an argument")])
def test_selections_whose_shape_depends_on_values_refuse_tracing_naming_the_line(name, call,
                                                                                 advice):
    @tr.trace
    def step(x):
        return call(x)

    with pytest.raises(tr.TracingError) as error:
        step(tr.tensor([1.0, -1.0]))
    message = str(error.value)
    assert message.startswith("test_api_tensor_ops.py:"), message
    assert f"{name} has" in message and "cannot know before it runs" in message
    assert advice in message


# scatter, scatter_add -------------------------------------------------------------------------
def _scatter_cases(lib, x, source, index, value):
    """Each scatter form on the same operands (index: no repeats along each row's dimension 1;
    (repeats along dimension 0 in the first column, where scatter_add adds them up)."""
    return (x.scatter(1, index, source), lib.scatter(x, -1, index, value),
            x.scatter(1, index, value=value), x.scatter_add(1, index, source),
            lib.scatter_add(x, 0, index[:, :2] % 3, source[:, :2]),
            x.scatter(0, index[:2] % 3, source[:2]))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_scatter_and_scatter_add_match_torch_with_gradients(dtype, traced):
    x = RNG.standard_normal((3, 4)).astype(dtype)
    source = RNG.standard_normal((3, 4)).astype(dtype)
    index = np.array([[3, 0, 1, 2], [1, 2, 0, 3], [0, 3, 2, 1]])
    compare_with_torch(lambda a, s, i: _scatter_cases(tr, a, s, i, 2.5),
                       lambda a, s, i: _scatter_cases(torch, a, s, i, 2.5), [x, source, index],
                       traced=traced)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_integer_bool_and_zero_dimensional_scatters_match_torch(traced):
    def cases(lib, x, s, flags, scalar):
        index = lib.tensor([[2, 0], [1, 1]])
        return (x.scatter(1, index, s), x.scatter_add(0, index % 2, s), x.scatter(1, index, 7),
                flags.scatter(1, index, True), scalar.scatter(0, lib.tensor(0), scalar * 3),
                scalar.scatter_add(0, lib.tensor(0), scalar), x.scatter(0, index[:0], s))

    arrays = [np.arange(6).reshape(2, 3), np.array([[10, 20], [30, 40]]), np.zeros((2, 3), bool),
              np.array(1.5)]
    def function(*tensors):
        return cases(tr, *tensors)

    run = tr.trace(function) if traced else function
    for mine, reference in zip(run(*map(tr.tensor, arrays)),
                               cases(torch, *map(torch.tensor, arrays))):
        assert mine.dtype.name == str(reference.dtype).removeprefix("torch.")
        assert mine.shape == tuple(reference.shape)
        np.testing.assert_array_equal(mine.numpy(), reference.numpy())


def test_scatter_in_place_matches_torch_eager_and_traced():
    values = np.arange(6.0).reshape(2, 3)
    index, source = np.array([[1, 0, 1]]), np.array([[9.0, 8.0, 7.0]])
    theirs = torch.tensor(values)
    theirs.scatter_(0, torch.tensor(index), torch.tensor(source)).scatter_add_(
        1, torch.tensor(index), torch.tensor(source)).scatter_(1, torch.tensor(index), -1.0)

    def change(x, i, s):
        x.scatter_(0, i, s).scatter_add_(1, i, s).scatter_(1, i, -1.0)
        return x

    ours = tr.tensor(values)
    assert change(ours, tr.tensor(index), tr.tensor(source)) is ours
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    ours = tr.tensor(values)
    tr.trace(change)(ours, tr.tensor(index), tr.tensor(source))
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_scatter_gradient_of_a_source_larger_than_the_index_is_zero_outside_it():
    # PyTorch's backward fails here ("ScatterBackward0 returned an invalid gradient"): its
    # gradient of src is grad.gather(dim, index), of the index's shape, not src's
    x = tr.zeros(2, 3, dtype=tr.float64, requires_grad=True)
    source = tr.tensor(np.arange(1.0, 13.0).reshape(3, 4), requires_grad=True)
    weights = tr.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=tr.float64)
    (x.scatter(0, tr.tensor([[1, 0, 1]]), source) * weights).sum().backward()
    np.testing.assert_array_equal(source.grad.numpy(), [[4, 2, 6, 0], [0, 0, 0, 0],
                                                        [0, 0, 0, 0]])
    np.testing.assert_array_equal(x.grad.numpy(), [[1, 0, 3], [0, 5, 0]])


@pytest.mark.parametrize("call, error, match, torch_match", [
    (lambda lib: lib.zeros(2, 3).scatter(0, lib.tensor([[-1, 0]]), lib.ones(1, 2)),
     tr.IndexOutOfRangeError, "index -1 is out of bounds", "index -1 is out of bounds"),
    (lambda lib: lib.zeros(2, 3).scatter_add(0, lib.tensor([[2, 0]]), lib.ones(1, 2)),
     tr.IndexOutOfRangeError, "index 2 is out of bounds", "index 2 is out of bounds"),
    (lambda lib: lib.zeros(2, 3).scatter(0, lib.tensor([[1, 0]]), lib.ones(1, 1)),
     tr.ShapeMismatchError, "no larger than", "no larger"),
    (lambda lib: lib.zeros(2, 3).scatter(0, lib.tensor([[1, 0, 1, 1]]), lib.ones(1, 4)),
     tr.ShapeMismatchError, "no larger than", "no larger"),
    (lambda lib: lib.zeros(2, 3).scatter(0, lib.tensor([1, 0]), lib.ones(1, 2)),
     tr.ShapeMismatchError, "1 dimension", "same number of dimensions"),
    (lambda lib: lib.zeros(2, 3).scatter(0, lib.tensor([[1, 0]]), lib.ones(2)),
     tr.ShapeMismatchError, "source of 1", "Dimension out of range"),
    (lambda lib: lib.zeros(2, 3).scatter(0, lib.tensor([[1, 0]]),
                                         lib.ones(1, 2, dtype=lib.float64)),
     tr.ArgumentError, "same dtype", "dtype to be equal"),
    (lambda lib: lib.zeros(2, 3).scatter_add(0, lib.tensor([[1, 0]]), 5.0),
     tr.ArgumentError, "source tensor", "must be Tensor")])
def test_scatter_refuses_what_pytorch_refuses(call, error, match, torch_match):
    with pytest.raises(error, match=match):
        call(tr)
    with pytest.raises((RuntimeError, TypeError, IndexError), match=torch_match):
        call(torch)


def test_an_index_longer_than_the_tensor_along_dim_is_allowed_as_in_pytorch():
    def cases(lib):
        index, source = lib.tensor([[1, 0, 1, 1]]), lib.arange(4.0).reshape(1, 4)
        return (lib.zeros(2, 3).scatter_add(1, index, source),
                lib.zeros(2, 3).scatter(1, index, 2.0))

    for mine, reference in zip(cases(tr), cases(torch)):
        np.testing.assert_array_equal(mine.numpy(), reference.numpy())


def test_scatter_with_reduce_or_without_a_source_is_refused():
    with pytest.raises(tr.ArgumentError, match="scatter_add"):
        tr.zeros(3).scatter(0, tr.tensor([1]), tr.ones(1), reduce="add")
    with pytest.raises(tr.ArgumentError, match="either a source"):
        tr.zeros(3).scatter(0, tr.tensor([1]))


def test_traced_step_with_scatter_and_rounded_div_matches_torch_and_compiles_once():
    """A parameter scattered into a buffer of slots and a rounded division of its positions, in
    a traced training step with an SGD update, against the same steps in PyTorch."""
    slots = np.array([[2, 0, 1], [1, 2, 0]])
    weights = RNG.standard_normal((2, 3))
    ours = tr.tensor(weights, requires_grad=True)
    theirs = torch.tensor(weights, requires_grad=True)
    our_optimizer = tr.optim.SGD([ours], lr=0.1)
    their_optimizer = torch.optim.SGD([theirs], lr=0.1)

    def loss_of(lib, parameter, index, inputs):
        placed = lib.zeros(2, 3, dtype=lib.float64).scatter(1, index, parameter)
        shifted = placed + lib.div(inputs, 2.0, rounding_mode="floor")
        return (shifted * inputs).sum() + placed.scatter_add(0, index % 2, parameter).pow(2).sum()

    @tr.trace
    def step(index, inputs):
        our_optimizer.zero_grad()
        loss = loss_of(tr, ours, index, inputs)
        loss.backward()
        our_optimizer.step()
        return loss

    for _ in range(4):
        inputs = RNG.standard_normal((2, 3)) * 4
        loss = step(tr.tensor(slots), tr.tensor(inputs))
        their_optimizer.zero_grad()
        expected = loss_of(torch, theirs, torch.tensor(slots), torch.tensor(inputs))
        expected.backward()
        their_optimizer.step()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-12)
    assert step.cache_info().misses <= 2  # the first call without .grad, then one signature


def test_vmap_and_second_order_through_scatter_div_and_a_dtype_sum_match_torch():
    x = RNG.standard_normal((4, 3))
    index = np.array([2, 0, 1])

    def per_row(lib):
        return lambda a: a.scatter(0, lib.tensor(index), a * 2).div(
            0.7, rounding_mode="floor").sum(dtype=lib.float64)

    np.testing.assert_array_equal(tr.vmap(per_row(tr))(tr.tensor(x)).numpy(),
                                  torch.vmap(per_row(torch))(torch.tensor(x)).numpy())
    gradients = []
    for lib, grad in ((tr, tr.autograd.grad), (torch, torch.autograd.grad)):
        v = lib.tensor(x, requires_grad=True)
        y = v.scatter(1, lib.tensor(np.tile(index, (4, 1))), v ** 3).pow(2).sum()
        (first,) = grad(y, v, create_graph=True)
        (first * first).sum().backward()
        gradients.append(v.grad.numpy())
    np.testing.assert_allclose(gradients[0], gradients[1], rtol=1e-12)
