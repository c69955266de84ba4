"""tracer/nn/distances.py and distance_modules.py against torch: normalize, cosine_similarity
(PyTorch 2.13's formula: each input divided by its norm clamped at eps, the clamp invisible to
autograd) and pairwise_distance, values and gradients for every option, float64 (to 1e-12) and
float32, eagerly and traced, with zero and tiny vectors where eps decides; second derivatives;
modules; errors; a traced training step that compiles once."""
import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn
from torch_oracle import compare_with_torch

rng = np.random.default_rng(17)
ROWS = rng.standard_normal((5, 4))
OTHER = rng.standard_normal((5, 4))
ROWS[1] = 0.0  # a zero vector: the norm's clamp at eps, and its gradient masked at 0
ROWS[2] *= 1e-10  # a tiny one: its norm below cosine_similarity's eps (1e-8)
ROW = rng.standard_normal(4)
TIGHT = {np.float64: dict(rtol=1e-12, atol=1e-14), np.float32: None}

CASES = {
    "normalize": lambda lib, x, y: lib.nn.functional.normalize(x),
    "normalize p=1 dim=0": lambda lib, x, y: lib.nn.functional.normalize(x, p=1.0, dim=0),
    "normalize p=3 eps": lambda lib, x, y: lib.nn.functional.normalize(x, 3.0, -1, eps=0.5),
    "normalize p=inf": lambda lib, x, y: lib.nn.functional.normalize(x, float("inf")),
    "cosine_similarity": lambda lib, x, y: lib.nn.functional.cosine_similarity(x, y),
    "cosine_similarity dim 0 eps": lambda lib, x, y: lib.nn.functional.cosine_similarity(
        x, y, dim=0, eps=0.3),
    "cosine_similarity broadcast": lambda lib, x, y: lib.nn.functional.cosine_similarity(
        x, y[0], dim=-1),
    "cosine_similarity 1-d": lambda lib, x, y: lib.nn.functional.cosine_similarity(
        x[0], y[0], dim=0),
    "pairwise_distance": lambda lib, x, y: lib.nn.functional.pairwise_distance(x, y),
    "pairwise_distance p=1 keepdim": lambda lib, x, y: lib.nn.functional.pairwise_distance(
        x, y, p=1.0, keepdim=True),
    "pairwise_distance p=3 eps=0": lambda lib, x, y: lib.nn.functional.pairwise_distance(
        x, y, p=3.0, eps=0.0),
    "pairwise_distance p=inf": lambda lib, x, y: lib.nn.functional.pairwise_distance(
        x, y, p=float("inf")),
    "pairwise_distance p=0.5": lambda lib, x, y: lib.nn.functional.pairwise_distance(
        x, y, p=0.5),
    "pairwise_distance broadcast": lambda lib, x, y: lib.nn.functional.pairwise_distance(
        x[0], y),
    "pairwise_distance 0-d": lambda lib, x, y: lib.nn.functional.pairwise_distance(
        x[0, 0], y[0, 0]),
    "pairwise_distance same": lambda lib, x, y: lib.nn.functional.pairwise_distance(
        x, x.detach() + 1e-6, eps=-1e-6),
}


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_distance_matches_torch(name, dtype, traced):
    call = CASES[name]
    compare_with_torch(lambda x, y: call(tr, x, y), lambda x, y: call(torch, x, y),
                       [ROWS.astype(dtype), OTHER.astype(dtype)], traced=traced,
                       tolerance=TIGHT[dtype])


def test_cosine_similarity_gradient_passes_the_clamp():
    """PyTorch clamps the norms under no_grad: below eps the gradient is that of x / ||x||'s
    clamped value with the norm's own gradient still flowing (not zero, as a clamp's would be)."""
    grads = []
    for lib in (tr, torch):
        x = lib.tensor(ROWS[2], requires_grad=True)
        lib.nn.functional.cosine_similarity(x, lib.tensor(OTHER[2]), dim=0).backward()
        grads.append(x.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12)
    assert np.abs(grads[0]).max() > 1e7  # (of the order of 1 / eps)


@pytest.mark.parametrize("name", ["normalize p=3 eps", "cosine_similarity",
                                  "cosine_similarity dim 0 eps", "pairwise_distance",
                                  "pairwise_distance p=3 eps=0"])
def test_second_derivatives_match_torch(name):
    call = CASES[name]
    grads = []
    for lib in (tr, torch):
        grad = torch.autograd.grad if lib is torch else tr.autograd.grad
        x, y = lib.tensor(ROWS[3:], requires_grad=True), lib.tensor(OTHER[3:], requires_grad=True)
        first = grad(call(lib, x, y).sum(), (x, y), create_graph=True, allow_unused=True,
                     materialize_grads=True)
        second = grad(sum((g * g).sum() for g in first), (x, y), allow_unused=True,
                      materialize_grads=True)
        grads.append([g.detach().numpy() for g in second])
    for ours, theirs in zip(*grads):
        np.testing.assert_allclose(ours, theirs, rtol=1e-11, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name, options", [
    ("CosineSimilarity", {}), ("CosineSimilarity", dict(dim=0, eps=0.1)),
    ("PairwiseDistance", {}), ("PairwiseDistance", dict(p=1.0, eps=0.0, keepdim=True))])
def test_module_matches_torch(name, options, traced):
    ours, theirs = getattr(nn, name)(**options), getattr(torch.nn, name)(**options)
    assert repr(ours) == repr(theirs)
    assert {k: getattr(ours, k) for k in ("dim", "eps", "norm", "keepdim") if hasattr(theirs, k)} \
        == {k: getattr(theirs, k) for k in ("dim", "eps", "norm", "keepdim") if hasattr(theirs, k)}
    compare_with_torch(ours, theirs, [ROWS, OTHER], traced=traced, tolerance=TIGHT[np.float64])


def test_errors():
    x = tr.tensor(ROWS)
    with pytest.raises(tr.TracerError, match="out="):
        tr.nn.functional.normalize(x, out=x)
    with pytest.raises(tr.TracerError, match="broadcast"):
        tr.nn.functional.cosine_similarity(x, x[:, :3])
    with pytest.raises(tr.TracerError, match="out of range"):
        tr.nn.functional.cosine_similarity(x, x, dim=2)
    with pytest.raises(tr.TracerError, match="broadcast"):
        tr.nn.functional.pairwise_distance(x, x[:3])


def test_traced_training_step_matches_torch_and_compiles_once():
    """A cosine-embedding objective written with CosineSimilarity and normalize."""
    generator = np.random.default_rng(3)
    weight = generator.standard_normal((3, 4)) * 0.5
    ours, theirs = tr.tensor(weight, requires_grad=True), torch.tensor(weight, requires_grad=True)
    our_optimizer, their_optimizer = tr.optim.SGD([ours], lr=0.2), torch.optim.SGD([theirs], lr=0.2)
    similarity, their_similarity = nn.CosineSimilarity(dim=1), torch.nn.CosineSimilarity(dim=1)

    def objective(lib, module, w, x, y):
        embedded = lib.nn.functional.normalize(x @ w.t(), dim=1)
        return (1 - module(embedded, y @ w.t())).mean() + lib.nn.functional.pairwise_distance(
            x @ w.t(), y @ w.t()).mean() * 0.1

    @tr.trace
    def step(x, y):
        our_optimizer.zero_grad()
        loss = objective(tr, similarity, ours, x, y)
        loss.backward()
        our_optimizer.step()
        return loss

    for _ in range(4):
        loss = step(tr.tensor(ROWS), tr.tensor(OTHER))
        their_optimizer.zero_grad()
        expected = objective(torch, their_similarity, theirs, torch.tensor(ROWS),
                             torch.tensor(OTHER))
        expected.backward()
        their_optimizer.step()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-12)
    assert step.cache_info().misses <= 2  # the first call without .grad, then one signature
    assert step.cache_info().hits >= 2
