"""Issue 7's first-hour list, as a new user writes it: each snippet is one function of the library
module (`tracer` or `torch`), run eagerly and under @tr.trace, with values and gradients equal to
PyTorch's (torch_oracle.compare_with_torch). Integer indexing and boolean masks, the list's first
items, are in test_api_gather.py; objects holding parameters in test_trace_objects.py."""
import numpy as np
import pytest
import torch

import tracer as tr
from torch_oracle import compare_with_torch

RANDOM = np.random.default_rng(7)
X = RANDOM.standard_normal((4, 6))
POSITIVE = RANDOM.uniform(1.0, 4.0, (4, 6))


def library(tensor) -> object:
    return tr if isinstance(tensor, tr.Tensor) else torch


# name: (function of the library and the tensors, input arrays)
SNIPPETS = {
    "dtype names": (lambda lib, x: (x.to(lib.float), x.to(lib.double) * 2,
                                    (x * 3).to(lib.long)), (X,)),
    "var, std, norm": (lambda lib, x: (x.var(1), x.std(0, keepdim=True), x.norm(),
                                       x.norm(dim=1)), (X,)),
    "logsumexp": (lambda lib, x: lib.logsumexp(x, 1), (X,)),
    "tril, triu": (lambda lib, x: (lib.tril(x), x.triu(1)), (X,)),
    "masked_fill": (lambda lib, x: x.masked_fill(x > 0.5, -1.0), (X,)),
    "split, chunk": (lambda lib, x: (*x.split(2, 1), *lib.chunk(x, 3, 0)), (X,)),
    "eye, linspace, full(shape, value)": (
        lambda lib, x: x + lib.eye(4, 6) * lib.linspace(0, 1, 6) + lib.full((4, 6), 0.5), (X,)),
    "bmm": (lambda lib, x: lib.bmm(x.reshape(2, 2, 6), x.reshape(2, 6, 2)), (X,)),
    "// and %": (lambda lib, x: (x // 0.7, x % 0.7, (x * 5).to(lib.long) // 3,
                                 (x * 5).to(lib.long) % 3), (POSITIVE,)),
    "sum(axis=)": (lambda lib, x: x.sum(axis=1), (X,)),
}


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", SNIPPETS)
def test_snippet_gives_pytorchs_values_and_gradients(name, traced):
    function, arrays = SNIPPETS[name]
    compare_with_torch(lambda *tensors: function(library(tensors[0]), *tensors),
                       lambda *tensors: function(torch, *tensors), arrays, traced=traced)


def test_random_creation_has_torchs_shapes_dtypes_and_ranges():
    integers, permutation, empty = tr.randint(2, 9, (3, 5)), tr.randperm(7), tr.empty(2, 3)
    reference = torch.randint(2, 9, (3, 5)), torch.randperm(7), torch.empty(2, 3)
    for ours, theirs in zip((integers, permutation, empty), reference):
        assert ours.shape == tuple(theirs.shape) and ours.dtype == theirs.numpy().dtype
    assert integers.numpy().min() >= 2 and integers.numpy().max() < 9
    assert sorted(permutation.numpy().tolist()) == list(range(7))
    # Traced, numpy's generator would be baked into the compiled code: refused, with what to do.
    with pytest.raises(tr.TracingError, match="randint inside a traced function.*as an argument"):
        tr.trace(lambda x: x + tr.randint(2, 9, (2,)))(tr.ones(2))


def test_a_loss_formats_as_a_number():
    loss = (tr.tensor(X) ** 2).mean()
    assert f"{loss:.3f}" == f"{torch.tensor(X).pow(2).mean():.3f}" == f"{(X ** 2).mean():.3f}"


def test_an_int_argument_used_as_a_shape_index_or_loop_count_is_specialized():
    def step(x, t, n):
        total = x[:, t].reshape(n, -1).sum(0)
        for _ in range(n):
            total = total * 2
        return total

    traced = tr.trace(step)
    for t, n in ((1, 2), (3, 4), (1, 2)):
        expected = step(torch.tensor(X), t, n).numpy()
        np.testing.assert_allclose(traced(tr.tensor(X), t, n).numpy(), expected, rtol=1e-12)
    assert traced.cache_info() == (1, 2, 2)  # (hits, misses, size): one signature per (t, n)
