"""Integer indexing (gather) and its scatter-add gradient, index assignment, index_select, gather,
take_along_dim, index_add_ and boolean-mask reads: values and gradients against PyTorch, eagerly
and traced (conftest also checks every compiled call against the interpreter), finite differences
in float64, and out-of-range indices."""
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer as tr
import tracer.nn.functional as F
from torch_oracle import compare_with_torch

RNG = np.random.default_rng(7)


def _key(spec, indices, module):
    """The index key `spec` describes, with index tensors taken from `indices`."""
    key = []
    for kind, value in spec:
        key.append({"slice": lambda: slice(*value), "int": lambda: value, "none": lambda: None,
                    "ellipsis": lambda: Ellipsis, "tensor": lambda: indices[value]}[kind]())
    return tuple(key)


def _torch_indices(arrays):
    return [torch.tensor(a) for a in arrays]


def _check_getitem(shape, spec, arrays, traced):
    """x[key] and the gradient of sum(x[key] * weights) against PyTorch."""
    x = RNG.standard_normal(shape)
    reference = torch.tensor(x, requires_grad=True)
    expected = reference[_key(spec, _torch_indices(arrays), torch)]
    weights = RNG.standard_normal(tuple(expected.shape))
    (expected * torch.tensor(weights)).sum().backward()

    def indexed(x, weights, *indices):
        y = x[_key(spec, indices, tr)]
        (y * weights).sum().backward()
        return y

    function = tr.trace(indexed) if traced else indexed
    tensor = tr.tensor(x, requires_grad=True)
    result = function(tensor, tr.tensor(weights), *map(tr.tensor, arrays))
    assert result.shape == tuple(expected.shape)
    np.testing.assert_allclose(result.detach().numpy(), expected.detach().numpy(), rtol=0,
                               atol=0)
    np.testing.assert_allclose(tensor.grad.numpy(), reference.grad.numpy(), rtol=1e-12,
                               atol=1e-12)


def _check_setitem(shape, spec, arrays, traced):
    """y = x * 1; y[key] = 2 * s for a 0-d s (repeated indices then write equal values, which
    PyTorch defines), and the gradients of x and s, against PyTorch."""
    x, scalar = RNG.standard_normal(shape), RNG.standard_normal(())
    weights = RNG.standard_normal(shape)
    references = [torch.tensor(a, requires_grad=True) for a in (x, scalar)]
    expected = references[0] * 1
    expected[_key(spec, _torch_indices(arrays), torch)] = references[1] * 2
    (expected * torch.tensor(weights)).sum().backward()

    def assigned(x, scalar, weights, *indices):
        y = x * 1
        y[_key(spec, indices, tr)] = scalar * 2
        (y * weights).sum().backward()
        return y

    function = tr.trace(assigned) if traced else assigned
    tensors = [tr.tensor(a, requires_grad=True) for a in (x, scalar)]
    result = function(*tensors, tr.tensor(weights), *map(tr.tensor, arrays))
    np.testing.assert_array_equal(result.detach().numpy(), expected.detach().numpy())
    for tensor, reference in zip(tensors, references):
        np.testing.assert_allclose(tensor.grad.numpy(), reference.grad.numpy(), rtol=1e-12,
                                   atol=1e-12)


I = np.array([2, 0, -1, 2])
J = np.array([[1], [-2]])
CASES = {
    "one tensor": ((4, 3), [("tensor", 0)], [I]),
    "a list": ((4, 3), [("slice", (None,)), ("tensor", 0)], [np.array([0, 2, 2])]),
    "rows and columns": ((4, 3), [("tensor", 0), ("tensor", 1)], [J, np.array([0, 2, 1])]),
    "adjacent after a slice": ((2, 4, 3, 5), [("slice", (None,)), ("tensor", 0), ("tensor", 1)],
                               [J, np.array([0, -1, 1])]),
    "separated by a slice": ((4, 2, 3), [("tensor", 0), ("slice", (None,)), ("tensor", 1)],
                             [I, np.array([0, 1, 2, 2])]),
    "separated by None": ((4, 3, 2), [("tensor", 0), ("none", None), ("tensor", 1)],
                          [I, np.array([0, 1, 2, 0])]),
    "an int between (PyTorch drops it first)": (
        (4, 3, 3), [("tensor", 0), ("int", -1), ("tensor", 1)], [I, np.array([0, 1, 2, 0])]),
    "an int before": ((2, 4, 3), [("int", 1), ("slice", (None,)), ("tensor", 0)],
                      [np.array([0, 2])]),
    "ellipsis": ((2, 3, 4), [("ellipsis", None), ("tensor", 0)], [np.array([[3, 0]])]),
    "strided slice and None": ((5, 4), [("slice", (1, None, 2)), ("tensor", 0), ("none", None)],
                               [np.array([3, 3, 0])]),
    "size-0 index": ((4, 3), [("tensor", 0)], [np.zeros(0, np.int64)]),
    "0-d index": ((4, 3), [("tensor", 0)], [np.array(-2)]),
}


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_getitem_matches_pytorch(case, traced):
    _check_getitem(*CASES[case], traced)


def test_lists_and_the_log_probability_of_labels():
    logits = RNG.standard_normal((6, 5)).astype(np.float32)
    labels = RNG.integers(0, 5, 6)

    @tr.trace
    def loss(logits, labels):
        logp = logits.log_softmax(1)
        value = -logp[tr.arange(6), labels].mean()
        value.backward()
        return value

    x = tr.tensor(logits, requires_grad=True)
    reference = torch.tensor(logits, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(reference, torch.tensor(labels))
    expected.backward()
    np.testing.assert_allclose(loss(x, tr.tensor(labels)).item(), expected.item(), rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), reference.grad.numpy(), rtol=1e-5, atol=1e-7)
    assert tr.tensor(logits)[[1, 3]].numpy().tolist() == logits[[1, 3]].tolist()
    assert tr.tensor(logits)[[True, False, True, False, False, True]].shape == (3, 5)


def test_gather_fuses_into_the_loop_as_a_checked_load():
    @tr.trace
    def picked(logp, labels):
        return -logp[tr.arange(8), labels].sum()

    arguments = (tr.randn(8, 10), tr.tensor(RNG.integers(0, 10, 8)))
    fused = picked.ir(*arguments, stage="fused")
    # the labels are checked whole in a loop of their own (the arange needs no check), then read
    # in the loop that sums the gathered values
    check, gather = fused.split("kernel_")[1:]
    assert "check_index %labels {size=10, axis=1, wrap=True}" in check and check.count(" = ") == 2
    assert "gather" in gather and "reduce_sum" in gather and "check_index" not in gather
    assert "index" in picked.ir(*arguments, stage="llvm")  # the range check's blocks


@pytest.mark.parametrize("size", [4, 96], ids=["inline-matmul", "blas-matmul"])
def test_gather_beside_every_kernel_kind(size):
    """A function that gathers has checked kernels, and every other kernel of it (matmul, matmul
    accumulating a bias, reductions, scatter) takes the error record too: a matmul that did not
    take it wrote its product to the wrong buffer (its arguments were shifted by one)."""
    x = RNG.standard_normal((size, size))
    w = RNG.standard_normal((3, size)) * 0.3
    b = RNG.standard_normal(3)
    labels = RNG.integers(0, 3, size)

    def loss(m, x, w, b, labels):
        logits = x.matmul(w.t()) + b
        picked = logits.log_softmax(1)[m.arange(size), labels]
        return -picked.mean() + logits.sum(0).pow(2).sum() * 1e-3

    reference = [torch.tensor(a, requires_grad=True) for a in (w, b)]
    expected = loss(torch, torch.tensor(x), *reference, torch.tensor(labels))
    expected.backward()

    @tr.trace
    def step(x, w, b, labels):
        value = loss(tr, x, w, b, labels)
        value.backward()
        return value

    ours = [tr.tensor(a, requires_grad=True) for a in (w, b)]
    value = step(tr.tensor(x), *ours, tr.tensor(labels))
    np.testing.assert_allclose(value.item(), expected.item(), rtol=1e-10)
    for mine, theirs in zip(ours, reference):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_embedding_lookup_gradient_adds_repeated_rows(traced):
    table = RNG.standard_normal((5, 3))
    index = np.array([[1, 4], [1, -5]])

    def lookup(table, index):
        (table[index] ** 2).sum().backward()

    function = tr.trace(lookup) if traced else lookup
    weights = tr.tensor(table, requires_grad=True)
    function(weights, tr.tensor(index))
    reference = torch.tensor(table, requires_grad=True)
    (reference[torch.tensor(index)] ** 2).sum().backward()
    np.testing.assert_allclose(weights.grad.numpy(), reference.grad.numpy(), rtol=1e-12)


def _operations(module):
    """The dimension-wise index operations, each as f(x, source) -> tensor, in `module`'s API."""
    ints = lambda values: module.tensor(np.array(values))  # noqa: E731
    gather_index = np.array([[0, 3, 3], [2, 1, 0]])
    along = np.array([[[1], [0], [4], [4]]])

    def index_add(x, source):
        y = x * 1
        y.index_add_(1, ints([3, 0, 3]), source, alpha=2)
        return y

    def assign(x, source):
        y = x * 1
        y[ints([2, 0]), 1:] = source[:2] * 3
        y[:, ints([[1], [0]])] = 0.5
        return y

    return {
        "index_select": lambda x, s: module.index_select(x, 1, ints([3, 0, 3])),
        "gather": lambda x, s: module.gather(x, 1, ints(np.stack([gather_index] * 3))),
        "take_along_dim": lambda x, s: module.take_along_dim(x, ints(along), 2),
        "take_along_dim flat": lambda x, s: module.take_along_dim(x, ints([[7, 59], [0, 7]])),
        "index_add_": index_add,
        "index assignment": assign,
        "masked_fill": lambda x, s: x.masked_fill(x > 0, -1.0),
    }


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", sorted(_operations(tr)))
def test_index_operations_match_pytorch(name, traced):
    x, source = RNG.standard_normal((3, 4, 5)), RNG.standard_normal((3, 3, 5))
    reference, reference_source = (torch.tensor(a, requires_grad=True) for a in (x, source))
    expected = _operations(torch)[name](reference, reference_source)
    weights = RNG.standard_normal(tuple(expected.shape))
    (expected * torch.tensor(weights)).sum().backward()

    def run(x, source, weights):
        result = _operations(tr)[name](x, source)
        (result * weights).sum().backward()
        return result

    function = tr.trace(run) if traced else run
    tensors = [tr.tensor(a, requires_grad=True) for a in (x, source)]
    result = function(*tensors, tr.tensor(weights))
    np.testing.assert_allclose(result.detach().numpy(), expected.detach().numpy(), rtol=1e-12)
    for tensor, torch_tensor in zip(tensors, (reference, reference_source)):
        if torch_tensor.grad is None:
            assert tensor.grad is None or not tensor.grad.numpy().any()
        else:
            np.testing.assert_allclose(tensor.grad.numpy(), torch_tensor.grad.numpy(),
                                       rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_gradcheck_in_float64(traced):
    index = tr.tensor([[2, 0], [2, -1]])

    def function(x, source):
        y = x[index, 1:] * 2
        z = x.index_add(0, tr.tensor([1, 1, 0]), source)
        z[tr.tensor([0, 2])] = source[:2] ** 2
        return y.sum() + (z * z).sum() + tr.take_along_dim(x, index[:, :1], 0).sum()

    inputs = (tr.tensor(RNG.standard_normal((3, 4)), requires_grad=True),
              tr.tensor(RNG.standard_normal((3, 4)), requires_grad=True))
    assert tr.gradcheck(tr.trace(function) if traced else function, inputs)


def test_boolean_mask_reads_eagerly_with_a_gradient():
    x = RNG.standard_normal((3, 4))
    tensor, reference = tr.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    mask = x > 0
    selected = tensor[tr.tensor(mask)]
    (selected.exp().sum()).backward()
    reference[torch.tensor(mask)].exp().sum().backward()
    np.testing.assert_allclose(selected.detach().numpy(), x[mask], rtol=0)
    np.testing.assert_allclose(tensor.grad.numpy(), reference.grad.numpy(), rtol=1e-12)
    row_mask = np.array([True, False, True, True])
    np.testing.assert_array_equal(tr.tensor(x)[1:, tr.tensor(row_mask)].numpy(), x[1:, row_mask])
    with pytest.raises(tr.ShapeMismatchError, match="shape of the mask"):
        tr.tensor(x)[tr.tensor(row_mask)]


def test_boolean_mask_assignment_of_one_value_per_element_eagerly():
    x, values = RNG.standard_normal((3, 4)), RNG.standard_normal(5)
    mask = np.zeros((3, 4), bool)
    mask.flat[[1, 4, 5, 9, 11]] = True
    results = []
    for module in (tr, torch):
        source = module.tensor(values, requires_grad=True)
        y = module.tensor(x) * 1
        y[module.tensor(mask)] = source * 2
        (y ** 2).sum().backward()
        results.append((y.detach().numpy(), source.grad.numpy()))
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)


def test_boolean_mask_read_under_trace_points_to_where_and_masked_fill():
    @tr.trace
    def positive(x):
        return x[x > 0]

    with pytest.raises(tr.TracingError, match=r"test_api_gather.py:\d+: .*tr.where.*masked_fill"):
        positive(tr.randn(5))


def test_bad_index_tensors_are_refused_clearly():
    x = tr.randn(3, 4)
    with pytest.raises(tr.ArgumentError, match="int64 or bool"):
        x[tr.tensor([0.0, 1.0])]
    with pytest.raises(tr.ShapeMismatchError, match="cannot be broadcast"):
        x[tr.tensor([0, 1]), tr.tensor([0, 1, 2])]
    with pytest.raises(tr.ShapeMismatchError, match="index_add_"):
        x.index_add_(0, tr.tensor([0]), tr.ones(2, 4))


@pytest.mark.parametrize("bad", [3, -4])
def test_out_of_range_eagerly_names_the_line_and_changes_nothing(bad):
    x = tr.tensor(np.arange(12.0).reshape(3, 4))
    before = x.numpy().copy()
    operations = [lambda: x[tr.tensor([0, bad])], lambda: x.index_select(0, tr.tensor([bad])),
                  lambda: x.index_add_(0, tr.tensor([bad]), tr.ones(1, 4, dtype=tr.float64)),
                  lambda: x.__setitem__(tr.tensor([1, bad]), 0.0)]
    for operation in operations:
        with pytest.raises(tr.IndexOutOfRangeError,
                           match=rf"test_api_gather.py:\d+: index {bad} is out of bounds"):
            operation()
        assert isinstance(tr.IndexOutOfRangeError(""), IndexError)
        np.testing.assert_array_equal(x.numpy(), before)


def test_out_of_range_compiled_names_the_line_and_leaves_the_arguments_unchanged():
    @tr.trace
    def step(table, counts, index, learning_rate):
        counts.add_(1.0)  # written in place before the gather's kernel may run
        loss = (table[index] ** 2).sum()
        loss.backward()
        with tr.no_grad():
            table -= learning_rate * table.grad
        return loss

    table = tr.tensor(RNG.standard_normal((5, 3)).astype(np.float32), requires_grad=True)
    counts = tr.zeros(4)
    step(table, counts, tr.tensor([0, 4, -5]), 0.1)
    before = [table.detach().numpy().copy(), table.grad.numpy().copy(), counts.numpy().copy()]
    for bad in (5, -6):
        with pytest.raises(tr.IndexOutOfRangeError,
                           match=rf"test_api_gather.py:\d+: index {bad} is out of bounds"):
            step(table, counts, tr.tensor([0, bad, 1]), 0.1)
        after = [table.detach().numpy(), table.grad.numpy(), counts.numpy()]
        for old, new in zip(before, after):
            np.testing.assert_array_equal(new, old)


def test_out_of_range_in_bounds_checked_code_is_still_an_index_error(monkeypatch):
    # The index check comes before the (bounds-checked) load, so the user hears about the index.
    monkeypatch.setenv("TRACER_CHECK_BOUNDS", "1")

    @tr.trace
    def pick(x, index):
        return x[:, index].sum()

    x = tr.tensor(np.arange(6.0).reshape(2, 3))
    assert pick(x, tr.tensor([2, -3])).item() == 2 + 5 + 0 + 3
    with pytest.raises(tr.IndexOutOfRangeError, match="index -4 is out of bounds"):
        pick(x, tr.tensor([2, -4]))


@pytest.mark.parametrize("rows, classes", [(0, 1), (0, 5), (3, 1)])
def test_labels_of_an_empty_batch_compile_and_give_eagers_result(rows, classes):
    """Found by the slow differential run: the check of zero labels sat in a row kernel of zero
    rows, which the scheduler leaves out, so the code wrote no error record while the runtime
    read one (garbage from a fresh arena). The back end decides once whether there is a record."""
    def loss(logits, labels):
        return F.cross_entropy(logits, labels)

    logits = tr.tensor(np.ones((rows, classes), np.float32), requires_grad=True)
    labels = tr.tensor(np.zeros(rows, np.int64))
    expected = loss(logits, labels).detach().numpy()
    for _ in range(3):  # fresh and reused arenas
        np.testing.assert_array_equal(tr.trace(loss)(logits, labels).detach().numpy(), expected)


def test_out_of_range_compiled_scatter():
    @tr.trace
    def add_rows(x, index, rows):
        x.index_add_(0, index, rows)

    x = tr.zeros(3, 2)
    add_rows(x, tr.tensor([2, 2, 0]), tr.ones(3, 2))
    assert x.numpy().tolist() == [[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]]
    with pytest.raises(tr.IndexOutOfRangeError, match="index 3 is out of bounds"):
        add_rows(x, tr.tensor([0, 3, 1]), tr.ones(3, 2))
    # negative indices are refused by index_add_, as PyTorch refuses them
    with pytest.raises(tr.IndexOutOfRangeError, match="index -3 is out of bounds"):
        add_rows(x, tr.tensor([0, -3, 1]), tr.ones(3, 2))
    assert x.numpy().tolist() == [[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]]


def test_the_documented_snippet_runs(capsys):
    page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "indexing.md")).read()
    snippet = page[page.index("```python") + len("```python"):page.index("```\n", page.index("```python") + 10)]
    exec(compile(snippet, "indexing.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "[[1., 0.],\n        [0., 1.]]" in printed
    assert "indexing.md:" in printed and "index 70 is out of bounds" in printed


# A property test: random keys with index tensors against PyTorch, eagerly and compiled ---------

@st.composite
def keys(draw):
    """(shape, spec, index arrays): several index tensors broadcast together (with repeated and
    negative indices, size-0 and size-1 dimensions), mixed with slices, ints and None."""
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    common = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    spec, arrays = [], []
    for size in shape:
        choice = draw(st.sampled_from(["tensor", "tensor", "slice", "int", "none"]))
        if choice == "none":
            spec.append(("none", None))
        if choice == "int" and size:
            spec.append(("int", draw(st.integers(-size, size - 1))))
        elif choice == "tensor" and (size or 0 in common):
            # a shape that broadcasts to `common`: a suffix of it, some dimensions set to 1
            own = common[draw(st.integers(0, len(common))):]
            own = tuple(1 if draw(st.booleans()) else d for d in own) if size else common
            values = draw(st.lists(st.integers(-size, size - 1), min_size=int(np.prod(own)),
                                   max_size=int(np.prod(own)))) if size else []
            spec.append(("tensor", len(arrays)))
            arrays.append(np.array(values, np.int64).reshape(own))
        else:
            start, stop = draw(st.integers(-5, 5)), draw(st.integers(-5, 5))
            spec.append(("slice", (start, stop, draw(st.integers(1, 3)))))
    if not arrays:  # an empty index tensor fits any dimension
        first = next(n for n, (kind, _) in enumerate(spec) if kind != "none")
        spec[first] = ("tensor", 0)
        arrays.append(np.zeros((0,), np.int64))
    return shape, spec, arrays


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys(), st.booleans(), st.booleans())
def test_random_keys_match_pytorch(key, traced, assigning):
    (_check_setitem if assigning else _check_getitem)(*key, traced)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys(), st.booleans(), st.booleans())
def test_random_keys_match_pytorch_exhaustively(key, traced, assigning):
    (_check_setitem if assigning else _check_getitem)(*key, traced)


# Found by the differential tester: PyTorch takes a 0-d index tensor as an int -- its dimension
# goes first, before the other index tensors are placed, and with only 0-d ones the result is a
# view (tracer's is a copy that refuses an in-place change, as x[0]'s does).
ZERO_D_KEYS = {
    "0-d, slice, 1-d": lambda m: (m.tensor(1), slice(None), m.tensor([0, 1, 1])),
    "slice, 0-d, 1-d": lambda m: (slice(None), m.tensor(-1), m.tensor([0, 3])),
    "1-d, slice, 0-d": lambda m: (m.tensor([1, 0]), slice(None), m.tensor(2)),
    "0-d, 2-d, 1-d": lambda m: (m.tensor(1), m.tensor([[0], [2]]), m.tensor([1, 3])),
    "0-d, 0-d": lambda m: (m.tensor(0), m.tensor(-1)),
}


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("key", sorted(ZERO_D_KEYS))
def test_zero_dimensional_index_tensors_act_as_ints(key, traced):
    x = RNG.standard_normal((2, 3, 4))
    values = RNG.standard_normal(torch.from_numpy(x)[ZERO_D_KEYS[key](torch)].shape)

    def read_and_assign(m, x, values):
        y = x * 1
        y[ZERO_D_KEYS[key](m)] = values
        return x[ZERO_D_KEYS[key](m)], y
    compare_with_torch(lambda x, v: read_and_assign(tr, x, v),
                       lambda x, v: read_and_assign(torch, x, v), [x, values], traced=traced)


def test_zero_dimensional_index_tensors_give_a_view_whose_change_is_refused():
    y = tr.ones(2, 3) * 1
    with pytest.raises(tr.InplaceError, match="copy, not a view"):
        y[tr.tensor(0)].mul_(2)  # PyTorch changes y through its view; tracer's copy cannot
    np.testing.assert_array_equal(y.numpy(), np.ones((2, 3)))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_index_operations_of_a_zero_dimensional_tensor_give_new_tensors(traced):
    # Found by the differential tester: they ended in a reshape, whose result is a view-copy that
    # refuses an in-place change; PyTorch's are new tensors.
    def changed(m, x):
        picked, gathered = x.index_select(0, m.tensor([0])), x.gather(0, m.tensor(0))
        picked.add_(1)
        gathered.mul_(3)
        return picked, gathered
    compare_with_torch(lambda x: changed(tr, x * 1), lambda x: changed(torch, x * 1),
                       [np.array(1.5)], traced=traced)
