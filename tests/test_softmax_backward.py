"""softmax's gradient is PyTorch's, computed from its output y alone: y * (g - sum(g * y)).
Checked against PyTorch (values and gradients, eager and traced, masked rows of -inf, a fully
masked row, large inputs, every dim, empty and 0-d tensors), its refusal of an in-place change of
y before backward (as PyTorch's), and what it buys in a compiled attention step: the backward's
row kernel reads the probabilities the forward stored for the product with V instead of computing
the exponentials again and dividing by their sums (no exp, no division in it)."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

import tracer as tr
from torch_oracle import compare_with_torch

torch = pytest.importorskip("torch")


def masked(lib, x):
    """The upper triangle of x's last two axes set to -inf, as a causal attention mask does."""
    size = x.shape[-1]
    keep = lib.tensor(np.tril(np.ones((size, size), np.float32)))
    return x.masked_fill(keep == 0, float("-inf"))


CASES = [
    ("last dim", (5, 7), lambda lib, x: lib.softmax(x, -1)),
    ("first dim", (5, 7), lambda lib, x: lib.softmax(x, 0)),
    ("middle dim of 3", (3, 4, 5), lambda lib, x: lib.softmax(x, 1)),
    ("large inputs", (4, 9), lambda lib, x: lib.softmax(x * 60, -1)),
    ("causal mask", (2, 3, 6, 6), lambda lib, x: lib.softmax(masked(lib, x), -1)),
    ("0-d", (), lambda lib, x: lib.softmax(x, 0)),
    ("empty rows", (0, 4), lambda lib, x: lib.softmax(x, -1)),
    ("empty dim", (3, 0), lambda lib, x: lib.softmax(x, -1)),
    ("dtype argument", (3, 4), lambda lib, x: lib.nn.functional.softmax(x, -1, dtype=lib.float64)),
]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name, shape, function", CASES, ids=[case[0] for case in CASES])
def test_softmax_value_and_gradient_against_torch(name, shape, function, dtype, traced):
    x = np.random.default_rng(len(name)).standard_normal(shape).astype(dtype)
    compare_with_torch(lambda x: function(tr, x), lambda x: function(torch, x), [x],
                       traced=traced)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_fully_masked_row_gives_nan_and_no_gradient_as_torch(traced):
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)

    def run(lib, x):
        y = lib.softmax(x.masked_fill(lib.tensor([[True] * 3, [False] * 3]), float("-inf")), -1)
        (y * lib.tensor([[1.0, 2.0, 3.0]] * 2)).sum().backward()
        return y.detach(), x.grad

    ours = (tr.trace(run) if traced else run)(tr, tr.tensor(x, requires_grad=True))
    theirs = run(torch, torch.tensor(x, requires_grad=True))
    for mine, reference in zip(ours, theirs):
        np.testing.assert_allclose(mine.numpy(), reference.numpy(), rtol=1e-5, atol=1e-6)
    # the masked row's probabilities are nan; masked_fill's gradient is 0 where it filled
    assert np.isnan(ours[0].numpy()[0]).all() and not ours[1].numpy()[0].any()


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_output_changed_in_place_before_backward_is_refused_as_in_torch(traced):
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)

    def run(lib, x):
        y = lib.softmax(x, -1)
        y.mul_(2)
        y.sum().backward()
        return x.grad

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run(torch, torch.tensor(x, requires_grad=True))
    with pytest.raises(tr.TracerError, match="changed in place"):
        (tr.trace(run) if traced else run)(tr, tr.tensor(x, requires_grad=True))


def attention_step(lib, q, k, v, g):
    """Scaled, causally masked attention as a GPT writes it, forward and backward."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    y = lib.softmax(masked(lib, scores), -1) @ v
    (y * g).sum().backward()
    return y.detach(), q.grad, k.grad, v.grad


def test_attention_backward_reads_the_stored_probabilities():
    rng = np.random.default_rng(2)
    q, k, v, g = (rng.standard_normal((2, 3, 16, 8)).astype(np.float32) for _ in range(4))
    function = tr.trace(lambda q, k, v, g: attention_step(tr, q, k, v, g))
    arguments = [tr.tensor(a, requires_grad=n < 3) for n, a in enumerate((q, k, v, g))]
    ours = function(*arguments)
    theirs = attention_step(torch, *(torch.tensor(a, requires_grad=n < 3)
                                     for n, a in enumerate((q, k, v, g))))
    for mine, reference in zip(ours, theirs):
        np.testing.assert_allclose(mine.numpy(), reference.numpy(), rtol=1e-4, atol=1e-5)
    fused = function.ir(*arguments, stage="fused")
    # the probabilities: the forward's division of the exponentials by their row sums, stored
    # as the product's operand
    (probabilities,) = re.findall(r"(%\d+) : f32\[2,3,16,16\] = div ", fused)
    kernels = fused.split("= kernel_")[1:]
    backward = [k for k in kernels if re.match(r"\d+ rows", k) and "(backward)" in k
                and re.search(rf"[(, ]{probabilities}[,)]", k.split("\n")[0])]
    assert len(backward) == 1, fused
    # one exponential in the whole step (the forward's), no division in the backward
    assert len(set(re.findall(r"(%\d+) : \S+ = exp ", fused))) == 1, fused
    assert " = div " not in backward[0] and " = exp " not in backward[0], backward[0]
