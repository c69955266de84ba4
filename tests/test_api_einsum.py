"""tr.einsum against torch.einsum, eagerly and traced, values and gradients: products, batches,
diagonals, traces, outer products, sums, '...' broadcasting, implicit outputs, chains."""
import numpy as np
import pytest
import torch

import tracer as tr
from torch_oracle import compare_with_torch

rng = np.random.default_rng(50)


def r(*shape):
    return rng.standard_normal(shape)


CASES = [
    ("bij,bjk->bik", [r(2, 3, 4), r(2, 4, 5)]),
    ("ij,jk", [r(3, 4), r(4, 2)]),
    ("ii->i", [r(4, 4)]),
    ("ii", [r(4, 4)]),
    ("bii->b", [r(2, 3, 3)]),
    ("iji->j", [r(3, 2, 3)]),
    ("ij->ji", [r(3, 5)]),
    ("ij->", [r(3, 5)]),
    ("i,i->", [r(6), r(6)]),
    ("i,j->ij", [r(3), r(4)]),
    ("bhqd,bhkd->bhqk", [r(2, 3, 4, 5), r(2, 3, 6, 5)]),  # attention scores
    ("bhqk,bhkd->bqhd", [r(2, 3, 4, 6), r(2, 3, 6, 5)]),
    ("...ij,...jk->...ik", [r(2, 3, 4), r(4, 5)]),
    ("...j,j", [r(2, 3, 4), r(4)]),
    ("ij...,j->i...", [r(3, 4, 2), r(4)]),
    ("ij,jk,kl->il", [r(2, 3), r(3, 4), r(4, 5)]),
    ("ab,cd,bd->ac", [r(2, 3), r(4, 5), r(3, 5)]),
    ("bn,anm,bm->ba", [r(2, 3), r(4, 3, 5), r(2, 5)]),  # a bilinear layer
    ("ij,ij->ij", [r(3, 4), r(1, 4)]),  # a size-1 label broadcasts
    ("i j , j k -> i k", [r(2, 3), r(3, 2)]),
    ("ik,jk->", [r(0, 3), r(2, 3)]),
]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("equation,inputs", CASES, ids=[c[0] for c in CASES])
def test_matches_torch(equation, inputs, dtype, traced):
    compare_with_torch(lambda *xs: tr.einsum(equation, *xs),
                       lambda *xs: torch.einsum(equation, *xs),
                       [a.astype(dtype) for a in inputs], traced=traced)


def test_integers_a_list_of_operands_and_a_new_tensor_for_the_identity():
    a, b = rng.integers(-5, 5, (3, 4)), rng.integers(-5, 5, (4, 2))
    got = tr.einsum("ij,jk->ik", [tr.tensor(a), tr.tensor(b)])
    assert got.dtype == tr.int64 and got.tolist() == (a @ b).tolist()
    x = tr.ones(2, 2)
    same = tr.einsum("ij->ij", x)
    assert same is not x
    same.add_(1)  # a tensor of its own, as PyTorch's (a view there, a copy here)
    assert x.tolist() == [[1.0, 1.0], [1.0, 1.0]]


@pytest.mark.parametrize("equation,shapes,match", [
    ("ij,jk->ik", [(2, 3), (4, 2)], "label 'j' has sizes 3 and 4"),
    ("ij->ik", [(2, 3)], "appear in no operand"),
    ("ij,jk->ik", [(2, 3)], "names 2 operands"),
    ("ijk->i", [(2, 3)], "does not fit"),
    ("i1->i", [(2, 3)], "invalid term"),
    ("ij->ii", [(2, 3)], "twice"),
])
def test_bad_equations_name_the_problem(equation, shapes, match):
    with pytest.raises(tr.TracerError, match=match):
        tr.einsum(equation, *[tr.ones(*s) for s in shapes])


def test_operands_of_two_dtypes_are_refused_as_pytorch_refuses_them():
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(3)
    with pytest.raises(RuntimeError, match="expected scalar type"):
        torch.einsum("ij,j->i", torch.tensor(a), torch.tensor(b))
    with pytest.raises(tr.ArgumentError, match="dtypes"):
        tr.einsum("ij,j->i", tr.tensor(a), tr.tensor(b))
