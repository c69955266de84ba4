"""asin/acos/atan/atan2 (tracer/arc_functions.py), cumsum/cumprod/prod (tracer/cumulative.py)
and median/nanmedian (tracer/medians.py) beyond tests/test_api_names.py's cases: accuracy over
the whole domain against 40-digit mpmath, the edge values bit for bit against PyTorch (signs of
zeros included), second-order gradients (where PyTorch switches cumprod's and prod's formula),
zeros in products, empty tensors, integer dtypes and the median's indices."""
import math

import mpmath
import numpy as np
import pytest
import torch

import tracer as tr
from torch_oracle import compare_with_torch

rng = np.random.default_rng(7)
DTYPES = [np.float32, np.float64]


def _ulps(ours: np.ndarray, exact: np.ndarray, dtype) -> float:
    spacing = np.spacing(np.abs(exact).astype(dtype)).astype(np.float64)
    return float(np.max(np.abs(ours.astype(np.float64) - exact) / spacing))


def _domain(dtype, name: str) -> np.ndarray:
    """The whole domain: the edges (near 0, 0.5, 0.975 and 1 for the arc sine and cosine; tiny,
    huge and the range boundaries of atan) and random points."""
    if name in ("asin", "acos"):
        near_one = 1 - np.logspace(-16, -0.3, 400)
        values = np.concatenate([rng.uniform(-1, 1, 1500), near_one, -near_one,
                                 np.logspace(-300, 0, 200), np.linspace(0.45, 0.55, 100),
                                 np.linspace(0.97, 0.98, 100), [1.0, -1.0, 0.5, -0.5, 0.975]])
    else:
        values = np.concatenate([np.logspace(-300, 300, 1500), -np.logspace(-30, 30, 500),
                                 rng.uniform(-3, 3, 1000),
                                 np.outer([0.4375, 0.6875, 1.1875, 2.4375],
                                          1 + np.linspace(-1e-6, 1e-6, 9)).ravel()])
    with np.errstate(over="ignore"):
        values = values.astype(dtype)
    return values[np.isfinite(values) & (np.abs(values) <= (1 if name != "atan" else np.inf))]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_arc_functions_are_within_one_ulp_over_the_whole_domain(dtype):
    """fdlibm's algorithms in float64 (float32 rounded once from them): measured 0.5 ulp in
    float32 and below 1 in float64, eagerly and compiled (the same bits: no fma contraction)."""
    mpmath.mp.dps = 40
    for name, exact_function in (("asin", mpmath.asin), ("acos", mpmath.acos),
                                 ("atan", mpmath.atan)):
        values = _domain(dtype, name)
        exact = np.array([float(exact_function(mpmath.mpf(float(v)))) for v in values])
        eager = getattr(tr.tensor(values), name)().numpy()
        compiled = tr.trace(getattr(tr.Tensor, name))(tr.tensor(values)).numpy()
        np.testing.assert_array_equal(eager, compiled)
        assert _ulps(eager, exact, dtype) <= (0.501 if dtype == np.float32 else 1.0), name
    y = (rng.standard_normal(3000) * 10.0 ** rng.integers(-30, 30, 3000)).astype(dtype)
    x = (rng.standard_normal(3000) * 10.0 ** rng.integers(-30, 30, 3000)).astype(dtype)
    exact = np.array([float(mpmath.atan2(mpmath.mpf(float(a)), mpmath.mpf(float(b))))
                      for a, b in zip(y, x)])
    for run in (tr.atan2, tr.trace(tr.atan2)):
        ours = run(tr.tensor(y), tr.tensor(x)).numpy()
        assert _ulps(ours, exact, dtype) <= (0.501 if dtype == np.float32 else 1.0)


SPECIAL = np.array([0.0, -0.0, 1e-300, -1e-300, 5e-324, 1e-8, 0.4375, 0.5, -0.5, 0.6875, 0.975,
                    1.0, -1.0, 1.0000001, -1.5, 1.1875, 2.4375, 1e10, -1e300, np.inf, -np.inf,
                    np.nan])


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_arc_functions_at_the_edges_match_torch_with_the_signs_of_zeros(dtype, traced):
    with np.errstate(over="ignore", under="ignore"):
        values = SPECIAL.astype(dtype)
    y, x = (a.reshape(-1) for a in np.meshgrid(values, values, indexing="ij"))

    def run(library, v, a, b):
        return v.asin(), v.acos(), v.atan(), library.atan2(a, b)

    ours = (tr.trace(lambda *t: run(tr, *t)) if traced else (lambda *t: run(tr, *t)))(
        tr.tensor(values), tr.tensor(y), tr.tensor(x))
    theirs = run(torch, torch.tensor(values), torch.tensor(y), torch.tensor(x))
    for mine, reference in zip(ours, theirs):
        reference = reference.numpy()
        np.testing.assert_allclose(mine.numpy(), reference, rtol=1e-15 if dtype == np.float64
                                   else 2e-7, atol=0, equal_nan=True)
        signed = ~np.isnan(reference)
        np.testing.assert_array_equal(np.signbit(mine.numpy())[signed], np.signbit(reference)[signed])


def _second_order(library, x, y):
    first = (x.asin() + x.acos() * 2 + x.atan() * 3 + library.atan2(x, y)).sum()
    (grad_x, grad_y) = library.autograd.grad(first, [x, y], create_graph=True)
    return grad_x, grad_y


def _scan_second_order(library, x):
    total = (x.cumprod(1) * library.tensor(np.arange(1.0, 6.0))).sum() + x.prod(1).sum() + x.prod()
    (grad,) = library.autograd.grad(total, [x], create_graph=True)
    return grad


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_second_order_gradients_match_torch(traced):
    """cumprod and prod with zeros differentiate PyTorch's second formula (the products of the
    others, no masks), which they take for a backward that builds a graph; without zeros the
    quotients; both against PyTorch's second derivatives."""
    x = np.tanh(rng.standard_normal((3, 4)))
    compare_with_torch(lambda a, b: _second_order(tr, a, b), lambda a, b: _second_order(torch, a, b),
                       [x, x[::-1] + 0.5], traced=traced)
    no_zeros = rng.uniform(0.5, 1.5, (3, 5))
    zeros = no_zeros.copy()
    zeros[0, 1] = zeros[1, 2] = zeros[1, 4] = 0.0
    for values in (no_zeros, zeros):
        compare_with_torch(lambda a: _scan_second_order(tr, a),
                           lambda a: _scan_second_order(torch, a), [values], traced=traced)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_products_at_zeros_and_infinities_match_torch(dtype, traced):
    """Rows with one, two and no zeros, with infinities and nan, where PyTorch's choice between
    its formulas shows in the gradient (inf / inf = nan in the quotient, 0 after the first zero
    of a row)."""
    rows = np.array([[0.0, 2.0, np.inf, 3.0], [2.0, np.inf, 0.0, 1.5], [0.0, 0.0, 2.0, -1.0],
                     [1.5, -2.0, 0.5, 3.0], [np.nan, 0.0, 1.0, 2.0], [2.0, 0.0, 3.0, np.inf]],
                    dtype)
    compare_with_torch(lambda x: (x.cumprod(1), x.prod(1), x.cumprod(0), x.prod(0)),
                       lambda x: (x.cumprod(1), x.prod(1), x.cumprod(0), x.prod(0)), [rows],
                       traced=traced, tolerance=dict(rtol=1e-6, atol=0, equal_nan=True))
    for part in (rows[3], rows[:1], rows[2:4], rows[1]):  # no zero, one, two, with inf
        compare_with_torch(lambda x: x.prod(), lambda x: x.prod(), [part], traced=traced,
                           tolerance=dict(rtol=1e-6, atol=0, equal_nan=True))


def test_float32_cumsum_is_as_accurate_as_torchs():
    """PyTorch accumulates float32 in double: so does tracer (in float64, rounded once)."""
    values = rng.standard_normal(100_000).astype(np.float32) + 1
    exact = np.cumsum(values.astype(np.float64))
    theirs = np.abs(torch.tensor(values).cumsum(0).numpy() - exact).max()
    for run in (lambda x: x.cumsum(0), tr.trace(lambda x: x.cumsum(0))):
        ours = np.abs(run(tr.tensor(values)).numpy() - exact).max()
        assert ours <= theirs


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_scans_with_a_dtype_differentiate_as_torchs(traced):
    """cumsum and cumprod with `dtype=` take the gradient in the input's dtype (PyTorch's
    cumsum_backward(grad.to(self's dtype))), prod in the result's: a float64 input's gradient
    through a float32 cumsum keeps float64's digits (the differential tester found it)."""
    def in_float64(library, x):
        return x.cumsum(0, dtype=library.float32), x.cumprod(1, dtype=library.float32)

    def in_float32(library, x):  # (float32 roundings in another order: float32's tolerance)
        return (x.float().cumsum(1, dtype=library.float64), x.prod(1, dtype=library.float32),
                library.cumprod(x.float(), 0, dtype=library.float64))

    values = rng.uniform(0.5, 1.5, (3, 4))
    compare_with_torch(lambda x: in_float64(tr, x), lambda x: in_float64(torch, x), [values],
                       traced=traced)
    compare_with_torch(lambda x: in_float32(tr, x), lambda x: in_float32(torch, x), [values],
                       traced=traced, tolerance=dict(rtol=1e-6, atol=0))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_empty_tensors_and_dtypes_match_torch(traced):
    def run(library, empty, wide, integers, flags):
        return (empty.cumsum(0), empty.cumprod(1), empty.prod(), empty.prod(1), wide.prod(1),
                wide.cumsum(-1), empty.median(), integers.cumsum(0), integers.cumprod(0),
                integers.prod(), flags.cumsum(0), integers.median(), flags.prod(),
                library.cumsum(integers, 0, dtype=library.float64), wide.asin(), empty.atan(),
                library.prod(integers, 0, dtype=library.float32), integers.asin(),
                library.atan2(integers, integers))

    arrays = (np.zeros((0, 3)), np.zeros((2, 0)), np.array([3, -1, 4, 2, 5]),
              np.array([True, False, True]))
    ours = (tr.trace(lambda *t: run(tr, *t)) if traced else lambda *t: run(tr, *t))(
        *map(tr.tensor, arrays))
    theirs = run(torch, *map(torch.tensor, arrays))
    for mine, reference in zip(ours, theirs):
        assert mine.shape == tuple(reference.shape) and mine.dtype == reference.numpy().dtype
        np.testing.assert_allclose(mine.numpy(), reference.numpy(), rtol=1e-6, equal_nan=True)
    for empty in arrays[:2]:  # gradients through empty rows and along empty dimensions
        compare_with_torch(lambda x: (x.prod(0), x.prod(), x.cumprod(1), x.cumsum(0),
                                      x.prod(1, keepdim=True), x.median(), x.asin()),
                           lambda x: (x.prod(0), x.prod(), x.cumprod(1), x.cumsum(0),
                                      x.prod(1, keepdim=True), x.median(), x.asin()),
                           [empty], traced=traced, tolerance=dict(rtol=0, equal_nan=True))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_median_values_and_indices_match_torch(traced):
    """Distinct values (odd and even rows, so the lower median shows), NaN rows (median: the
    first NaN; nanmedian: the numbers' median) and ties that PyTorch resolves as the stable
    sort does. An all-NaN row's nanmedian index is std::nth_element's in PyTorch: not compared."""
    nan = math.nan
    rows = np.array([[3.0, nan, 1.0, nan, 2.0, 0.5], [2.0, 2.0, 2.0, 1.0, 3.0, 0.0],
                     [5.0, 1.0, 4.0, 2.0, 6.0, 3.0], [1.0, 2.0, 2.0, 3.0, 2.0, 9.0]])
    cube = rng.permutation(60).reshape(3, 4, 5).astype(np.float64)

    def run(library, x, c):
        return (*x.median(1), *library.nanmedian(x, -1), *x.median(1, keepdim=True),
                *c.median(0), *c.median(-2, True), *library.median(c, 2), *x[:, :5].median(1),
                x.median(), c.median(), x.nanmedian(), library.median(c[0, 0, 0], 0).indices)

    ours = (tr.trace(lambda *t: run(tr, *t)) if traced else lambda *t: run(tr, *t))(
        tr.tensor(rows), tr.tensor(cube))
    theirs = run(torch, torch.tensor(rows), torch.tensor(cube))
    for mine, reference in zip(ours, theirs):
        assert mine.shape == tuple(reference.shape) and mine.dtype == reference.numpy().dtype
        np.testing.assert_array_equal(mine.numpy(), reference.numpy())
    result = tr.tensor(rows).median(1)
    assert type(result).__name__ == "median" and result.values is result[0]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_median_gradients_go_where_torchs_go(traced):
    """Along a dimension to the selected element; of the whole tensor, shared among the elements
    equal to the median (and among the NaNs when it is NaN)."""
    ties = np.array([[1.0, 2.0, 2.0, 3.0, 2.0], [4.0, 0.5, 7.0, 0.5, 9.0]])
    with_nan = np.array([[1.0, math.nan, 2.0], [math.nan, 0.0, math.nan]])
    for arrays in ([ties], [with_nan]):
        compare_with_torch(lambda x: (x.median(1).values, x.median(), x.nanmedian(0).values,
                                      x[1].nanmedian()),
                           lambda x: (x.median(1).values, x.median(), x.nanmedian(0).values,
                                      x[1].nanmedian()),
                           arrays, traced=traced, tolerance=dict(rtol=1e-15, atol=0,
                                                                 equal_nan=True))


def test_in_place_forms_and_vmap():
    x = tr.tensor([0.25, -0.5, 0.75])
    x.asin_()
    x.cumsum_(0)
    np.testing.assert_allclose(x.numpy(), np.cumsum(np.arcsin([0.25, -0.5, 0.75]).astype(
        np.float32)), rtol=1e-6)
    batched = tr.vmap(lambda row: (row.cumprod(0), row.prod(), row.atan(), row.median()))(
        tr.tensor(rng.standard_normal((4, 5))))
    values = rng.standard_normal((4, 5))
    batched = tr.vmap(lambda row: (row.cumprod(0), row.prod(), row.atan(), row.median()))(
        tr.tensor(values))
    expected = torch.vmap(lambda row: (row.cumprod(0), row.prod(), row.atan(), row.median()))(
        torch.tensor(values))
    for mine, reference in zip(batched, expected):
        np.testing.assert_allclose(mine.numpy(), reference.numpy(), rtol=1e-12)


@pytest.mark.parametrize("call, error, message", [
    (lambda: tr.zeros(2, 0).median(1), tr.ShapeMismatchError, "no elements"),
    (lambda: tr.ones(2, 3).cumsum(2), tr.ShapeMismatchError, "dimension 2 is out of range"),
    (lambda: tr.ones(2, 3).prod(-3), tr.ShapeMismatchError, "dimension -3 is out of range"),
    (lambda: tr.ones(2, 3).median(5), tr.ShapeMismatchError, "dimension 5 is out of range"),
])
def test_errors_name_the_users_line(call, error, message):
    with pytest.raises(error, match=message) as caught:
        call()
    assert "test_api_arcs_scans_medians.py" in str(caught.value)


@pytest.mark.parametrize("shape", [(), (1,), (3,)])
@pytest.mark.parametrize("name, call", [("cumprod", lambda a: a.cumprod(0)),
                                        ("cumsum", lambda a: a.cumsum(0)),
                                        ("prod", lambda a: a.prod()),
                                        ("prod(0)", lambda a: a.prod(0))])
def test_changing_a_scan_s_input_in_place_is_refused_where_pytorch_refuses(name, call, shape):
    """cumprod and prod read their input in the backward (a 0-d one too, which is one element):
    changing it in place before backward is an error, as in PyTorch; cumsum reads nothing."""
    outcomes = []
    for lib, error in ((torch, RuntimeError), (tr, tr.InplaceError)):
        x = lib.tensor(np.full(shape, 0.5, np.float32), requires_grad=True)
        a = x + x
        result = call(a)
        a.add_(1)
        try:
            (result.sum() + a.sum()).backward()
            outcomes.append(x.grad.numpy().tolist())
        except error:
            outcomes.append("refused")
    assert outcomes[1] == outcomes[0]


@pytest.mark.parametrize("shape", [(), (1,), (3,)])
@pytest.mark.parametrize("dtype", [None, "float64"])
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("change", ["setitem", "add_"])
def test_changing_a_scan_s_result_in_place_is_what_pytorch_does(name, dtype, shape, change):
    """A scan's result is a tensor of its own (a 0-d input's too, scanned as one element):
    assigning into it or adding to it in place changes it alone, and its gradient follows; where
    the backward reads the result (cumprod), the change is refused at the backward, as in
    PyTorch. Found by the slow random-program run: cumsum(0, dtype=float64) of a 0-d tensor was a
    view-copy of a one-element result, and `y[mask] = x` into it was refused."""
    outcomes = []
    for lib, error in ((torch, RuntimeError), (tr, tr.InplaceError)):
        x = lib.tensor(np.full(shape, 0.5, np.float32), requires_grad=True)
        options = {} if dtype is None else {"dtype": getattr(lib, dtype)}
        result = getattr(x, name)(0, **options)
        value = (x * 3).to(result.dtype)
        if change == "setitem":
            result[lib.ones(shape, dtype=lib.bool)] = value.reshape(-1)
        else:
            result.add_(value)
        try:
            (result * result).sum().backward()
            outcomes.append([result.detach().numpy(), x.grad.numpy()])
        except error:
            outcomes.append("refused")
    expected, got = outcomes
    if isinstance(expected, str):
        assert got == expected
    else:
        for wanted, actual in zip(expected, got):
            np.testing.assert_allclose(actual, wanted, rtol=1e-6)


@pytest.mark.parametrize("shape", [(), (3,)])
@pytest.mark.parametrize("call", [lambda a: a.cumsum(0), lambda a: a.cumprod(0),
                                  lambda a: a.prod(), lambda a: a.prod(0)])
def test_an_integer_scan_s_result_is_a_tensor_of_its_own(call, shape):
    """Of integers too (no gradient): an in-place change reaches the result alone, as in PyTorch
    (the product of all elements was a view-copy of its one-element total, and refused it)."""
    outcomes = []
    for lib in (torch, tr):
        x = lib.tensor(np.full(shape, 2, np.int64))
        result = call(x)
        result.add_(1)
        outcomes.append((x.numpy().tolist(), result.numpy().tolist()))
    assert outcomes[1] == outcomes[0]


@pytest.mark.parametrize("shape", [(0,), (2, 0), (5,)])
@pytest.mark.parametrize("name", ["median", "nanmedian"])
@pytest.mark.parametrize("changed", ["input", "result"])
def test_changing_a_whole_median_s_input_or_result_in_place_is_refused_as_in_pytorch(
        shape, name, changed):
    """median() and nanmedian() of the whole tensor save both (evenly_distribute_backward reads
    them): a change of either before backward is refused, of an empty tensor too (found by the
    slow second-order run: an empty median was NaN built without saving anything)."""
    outcomes = []
    for lib, error in ((torch, RuntimeError), (tr, tr.InplaceError)):
        x = lib.tensor(np.arange(math.prod(shape), dtype=np.float32).reshape(shape) / 4,
                       requires_grad=True)
        a = x * 1
        result = getattr(a, name)()
        (a if changed == "input" else result).mul_(2)
        try:
            result.backward()
            outcomes.append(x.grad.numpy().tolist())
        except error:
            outcomes.append("refused")
    assert outcomes[0] == "refused" and outcomes[1] == outcomes[0]
