"""sort, argsort and topk against PyTorch, eagerly and traced (where the positions come from a
different construction: numpy's argsort eagerly, ranks and a scatter traced), values, indices and
gradients; ties in PyTorch's stable order, NaN where PyTorch puts it."""
import numpy as np
import pytest
import torch

import tracer as tr
from torch_oracle import compare_with_torch

rng = np.random.default_rng(40)
MATRIX = rng.standard_normal((5, 7))
CUBE = rng.standard_normal((3, 4, 6))
# ties (three 1.0s, two -0.0/0.0), infinities and NaNs
SPECIAL = np.array([[3.0, 1.0, np.nan, 2.0, 1.0, -0.0, 0.0, np.inf, np.nan, -np.inf, 1.0],
                    [0.5, -1.0, 0.5, 0.5, np.nan, 7.0, -3.0, -3.0, 2.0, 0.0, 1e30]])
INTEGERS = np.array([[3, 1, 2, 1, 3, -5, 2 ** 62, -2 ** 63, 0], [0, 0, 0, 1, -1, 4, 4, 4, 2]])

CASES = [
    ("sort", lambda x: x.sort(), lambda x: x.sort(stable=True), [MATRIX]),
    ("sort dim 0", lambda x: x.sort(0), lambda x: x.sort(dim=0, stable=True), [MATRIX]),
    ("sort descending", lambda x: tr.sort(x, dim=1, descending=True),
     lambda x: torch.sort(x, dim=1, descending=True, stable=True), [CUBE]),
    ("sort middle dim", lambda x: x.sort(dim=-2), lambda x: x.sort(dim=-2, stable=True), [CUBE]),
    ("sort ties nan", lambda x: x.sort(), lambda x: x.sort(stable=True), [SPECIAL]),
    ("sort ties nan descending", lambda x: x.sort(descending=True),
     lambda x: x.sort(descending=True, stable=True), [SPECIAL]),
    ("sort values then math", lambda x: x.sort(1).values[:, :3] * x[:, :3],
     lambda x: x.sort(1).values[:, :3] * x[:, :3], [MATRIX]),
    ("argsort", lambda x: x.argsort(), lambda x: x.argsort(stable=True), [SPECIAL]),
    ("argsort descending", lambda x: tr.argsort(x, 0, descending=True),
     lambda x: torch.argsort(x, dim=0, descending=True, stable=True), [MATRIX]),
    ("topk", lambda x: x.topk(3), lambda x: x.topk(3), [MATRIX]),
    ("topk smallest dim 0", lambda x: x.topk(2, dim=0, largest=False),
     lambda x: x.topk(2, dim=0, largest=False), [MATRIX]),
    ("topk all", lambda x: tr.topk(x, 6, 2), lambda x: torch.topk(x, 6, 2), [CUBE]),
    ("topk zero", lambda x: x.topk(0), lambda x: x.topk(0), [MATRIX]),
    ("topk nan", lambda x: x[:, 4:].topk(2), lambda x: x[:, 4:].topk(2), [SPECIAL[1:]]),
    ("sort one element", lambda x: x[:, :1].sort(), lambda x: x[:, :1].sort(), [MATRIX]),
    ("sort empty", lambda x: x[:0].sort(), lambda x: x[:0].sort(), [MATRIX]),
    ("sort 0-d", lambda x: x.sum().sort(0), lambda x: x.sum().sort(0), [MATRIX]),
]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,ours,theirs,inputs", CASES, ids=[c[0] for c in CASES])
def test_matches_torch(name, ours, theirs, inputs, dtype, traced):
    compare_with_torch(ours, theirs, [a.astype(dtype) for a in inputs], traced=traced)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("descending", [False, True])
def test_integers_and_bools_sort_as_pytorchs(descending, traced):
    for values in (INTEGERS, INTEGERS % 2 == 0):
        def ours(x):
            return x.sort(dim=1, descending=descending)
        run = tr.trace(ours) if traced else ours
        got = run(tr.tensor(values))
        expected = torch.tensor(values).sort(dim=1, descending=descending, stable=True)
        assert got.values.tolist() == expected.values.tolist()
        assert got.indices.tolist() == expected.indices.tolist()
        assert got.indices.dtype == tr.int64


@pytest.mark.parametrize("size", [2, 3, 31, 64, 257])
def test_random_ties_sort_stably_traced_and_eager(size):
    values = rng.integers(0, 5, (4, size)).astype(np.float64)
    values[rng.random(values.shape) < 0.1] = np.nan
    expected = torch.tensor(values).sort(dim=1, descending=True, stable=True).indices.numpy()
    traced = tr.trace(lambda x: x.argsort(dim=1, descending=True))
    np.testing.assert_array_equal(traced(tr.tensor(values)).numpy(), expected)
    np.testing.assert_array_equal(tr.tensor(values).argsort(1, descending=True).numpy(), expected)


def test_the_result_is_a_named_pair_and_bad_k_is_refused():
    result = tr.tensor([3.0, 1.0, 2.0]).sort()
    assert result.values.tolist() == [1.0, 2.0, 3.0] and result.indices.tolist() == [1, 2, 0]
    values, indices = tr.tensor([3.0, 1.0, 2.0]).topk(2, sorted=False)
    assert sorted(values.tolist()) == [2.0, 3.0] and sorted(indices.tolist()) == [0, 2]
    with pytest.raises(tr.ShapeMismatchError, match="k=4"):
        tr.tensor([3.0, 1.0, 2.0]).topk(4)
    with pytest.raises(tr.ShapeMismatchError, match="out of range"):
        tr.tensor([3.0, 1.0, 2.0]).sort(dim=1)
