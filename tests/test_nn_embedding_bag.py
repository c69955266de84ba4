"""tr.nn.functional.embedding_bag and tr.nn.EmbeddingBag (tracer/nn/embedding_bag.py) against
PyTorch's: values and the gradients of the weight and of per_sample_weights, float64 and float32,
eagerly and traced, for every mode with bags of equal length (2-D input) and bags cut at offsets
(empty bags, padding_idx, include_last_offset, bags longer than the scan's blocks of 16); offsets
as runtime values of one compiled function; the module's parameters and a traced training step;
and the options and inputs refused, as tr.TracerError."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tracer as tr
import tracer.nn.functional as F
from torch_oracle import compare_with_torch

rng = np.random.default_rng(23)
WEIGHT = rng.standard_normal((9, 4))
INDICES = np.array([3, 1, 1, 8, 0, 5, 2, 7, 3, 6, 4, 2])
OFFSETS = np.array([0, 3, 3, 7, 12])  # an empty bag in the middle and one at the end
LONG_INDICES = rng.integers(0, 9, 45)
LONG_OFFSETS = np.array([0, 1, 20, 20, 38])  # bags of 1, 19, 0, 18 and 7 rows
SAMPLE_WEIGHTS = rng.standard_normal(12)
# rows 0 and 1 equal, a nan in row 2: PyTorch's maximum keeps a bag's first row and replaces it
# by each greater one, so a tie sends the gradient to the earlier row, a nan first in its bag is
# the result and a later nan is passed over
TIED = np.concatenate([WEIGHT[:1], WEIGHT[:1], [[np.nan, 1.0, -1.0, 2.0]], WEIGHT[3:]])

# name -> (options, arrays): run as embedding_bag(input, weight, offsets, **options)
CASES = {
    "2-D sum": (dict(mode="sum"), [WEIGHT, INDICES.reshape(3, 4)]),
    "2-D mean": (dict(mode="mean"), [WEIGHT, INDICES.reshape(4, 3)]),
    "2-D max": (dict(mode="max"), [WEIGHT, INDICES.reshape(6, 2)]),
    "2-D sum per_sample_weights padding": (dict(mode="sum", padding_idx=1), [
        WEIGHT, INDICES.reshape(3, 4), SAMPLE_WEIGHTS.reshape(3, 4)]),
    "2-D mean padding": (dict(mode="mean", padding_idx=3), [WEIGHT, INDICES.reshape(6, 2)]),
    "2-D max padding": (dict(mode="max", padding_idx=-6), [WEIGHT, INDICES.reshape(6, 2)]),
    "offsets sum": (dict(mode="sum"), [WEIGHT, INDICES, OFFSETS]),
    "offsets mean": (dict(mode="mean"), [WEIGHT, INDICES, OFFSETS]),
    "offsets max": (dict(mode="max"), [WEIGHT, INDICES, OFFSETS]),
    "offsets first bag empty": (dict(mode="max"), [WEIGHT, INDICES, np.array([0, 0, 5])]),
    "offsets sum per_sample_weights": (dict(mode="sum"), [WEIGHT, INDICES, OFFSETS,
                                                          SAMPLE_WEIGHTS]),
    "offsets sum per_sample_weights padding": (dict(mode="sum", padding_idx=3), [
        WEIGHT, INDICES, OFFSETS, SAMPLE_WEIGHTS]),
    "offsets mean padding": (dict(mode="mean", padding_idx=1), [WEIGHT, INDICES, OFFSETS]),
    # the bag [3, 1, 1] loses all its rows
    "offsets max padding": (dict(mode="max", padding_idx=1), [WEIGHT, np.array([1, 1, 1, 8, 0]),
                                                              np.array([0, 3])]),
    "offsets include_last_offset sum": (dict(mode="sum", include_last_offset=True), [
        WEIGHT, INDICES, np.array([0, 2, 2, 9, 12])]),
    "offsets include_last_offset max": (dict(mode="max", include_last_offset=True), [
        WEIGHT, INDICES, np.array([0, 5, 12])]),
    "long bags max": (dict(mode="max"), [WEIGHT, LONG_INDICES, LONG_OFFSETS]),
    "long bags mean padding": (dict(mode="mean", padding_idx=4), [WEIGHT, LONG_INDICES,
                                                                  LONG_OFFSETS]),
    "2-D max ties and nan": (dict(mode="max"), [TIED, np.array([[0, 1], [1, 2], [2, 0],
                                                                [1, 0]])]),
    "empty input max": (dict(mode="max"), [WEIGHT, np.zeros(0, np.int64), np.array([0, 0])]),
}


def _call(library_function, options):
    def call(weight, input, offsets=None, per_sample_weights=None):
        if input.ndim == 2:  # (its third array is per_sample_weights)
            offsets, per_sample_weights = None, offsets
        return library_function(input, weight, offsets, per_sample_weights=per_sample_weights,
                                **options)
    return call


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name, traced, dtype):
    options, arrays = CASES[name]
    arrays = [a.astype(dtype) if a.dtype.kind == "f" else a for a in arrays]
    compare_with_torch(_call(F.embedding_bag, options), _call(TF.embedding_bag, options), arrays,
                       traced=traced)


def test_offsets_are_runtime_values_of_one_compiled_function():
    weight = tr.tensor(WEIGHT, requires_grad=True)

    @tr.trace
    def bags(input, offsets):
        weight.grad = None
        result = F.embedding_bag(input, weight, offsets, mode="max")
        (result * result).sum().backward()
        return result

    for offsets in (OFFSETS, np.array([0, 0, 6, 6, 11]), np.array([0, 12, 12, 12, 12])):
        theirs = torch.tensor(WEIGHT, requires_grad=True)
        expected = TF.embedding_bag(torch.tensor(INDICES), theirs, torch.tensor(offsets),
                                    mode="max")
        (expected * expected).sum().backward()
        np.testing.assert_allclose(bags(INDICES, offsets).numpy(), expected.detach().numpy(),
                                   rtol=1e-14)
        np.testing.assert_allclose(weight.grad.numpy(), theirs.grad.numpy(), rtol=1e-14)
    assert bags.cache_info().misses == 1


def test_module_matches_torch_and_trains_traced():
    """EmbeddingBag and a linear head trained by a traced Adam step for three steps, as torch's."""
    torch.manual_seed(0)
    theirs = torch.nn.EmbeddingBag(9, 4, mode="mean", padding_idx=2).double()
    torch_head = torch.nn.Linear(4, 1).double()
    ours = tr.nn.EmbeddingBag(9, 4, mode="mean", padding_idx=2, dtype=tr.float64)
    head = tr.nn.Linear(4, 1, dtype=tr.float64)
    ours.load_state_dict(theirs.state_dict())
    head.load_state_dict(torch_head.state_dict())
    optimizer = tr.optim.Adam([*ours.parameters(), *head.parameters()], lr=0.1)
    torch_optimizer = torch.optim.Adam([*theirs.parameters(), *torch_head.parameters()], lr=0.1)

    @tr.trace
    def step(input, offsets, target):
        optimizer.zero_grad()
        loss = F.mse_loss(head(ours(input, offsets)), target)
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(3):
        input, target = rng.integers(0, 9, 12), rng.standard_normal((5, 1))
        torch_optimizer.zero_grad()
        loss = TF.mse_loss(torch_head(theirs(torch.tensor(input), torch.tensor(OFFSETS))),
                           torch.tensor(target))
        loss.backward()
        torch_optimizer.step()
        np.testing.assert_allclose(step(input, OFFSETS, target).item(), loss.item(), rtol=1e-12)
        np.testing.assert_allclose(ours.weight.detach().numpy(), theirs.weight.detach().numpy(),
                                   rtol=1e-12, atol=1e-14)
    assert step.cache_info().misses == 1


def test_module_parameters_and_initialization():
    module = tr.nn.EmbeddingBag(1000, 20, padding_idx=-3)
    assert module.padding_idx == 997 and [n for n, _ in module.named_parameters()] == ["weight"]
    weight = module.weight.detach().numpy()
    assert weight.shape == (1000, 20) and weight.dtype == np.float32
    np.testing.assert_array_equal(weight[997], 0)
    np.testing.assert_allclose([weight.mean(), weight.std()], [0, 1], atol=0.03)
    given = tr.nn.EmbeddingBag(2, 3, _weight=tr.ones(2, 3), mode="sum")
    np.testing.assert_array_equal(given(tr.tensor([[0, 1]])).detach().numpy(), [[2, 2, 2]])


WEIGHTS = tr.tensor(WEIGHT)


@pytest.mark.parametrize("call, message", [
    (lambda: F.embedding_bag(tr.tensor(INDICES), WEIGHTS, tr.tensor(OFFSETS), sparse=True),
     "sparse=False"),
    (lambda: F.embedding_bag(tr.tensor(INDICES), WEIGHTS, tr.tensor(OFFSETS), mode="max",
                             scale_grad_by_freq=True), "scale_grad_by_freq"),
    (lambda: tr.nn.EmbeddingBag(9, 4, sparse=True), "sparse=False"),
    (lambda: tr.nn.EmbeddingBag(9, 4, mode="median"), "'sum', 'mean', 'max'"),
    (lambda: tr.nn.EmbeddingBag(9, 4, padding_idx=9), "padding_idx must be within"),
    (lambda: F.embedding_bag(tr.tensor(INDICES.reshape(3, 4)), WEIGHTS, tr.tensor(OFFSETS)),
     "offsets has to be None"),
    (lambda: F.embedding_bag(tr.tensor(INDICES), WEIGHTS), "needs offsets"),
    (lambda: F.embedding_bag(tr.tensor(INDICES), WEIGHTS, tr.tensor([1, 3])),
     r"offsets\[0\] has to be 0"),
    (lambda: F.embedding_bag(tr.tensor(INDICES), WEIGHTS, tr.tensor([0, 13])),
     r"offsets\[-1\] can not be greater than the input's length 12"),
    (lambda: F.embedding_bag(tr.tensor(INDICES), WEIGHTS, tr.tensor([0, 5, 3])), "decrease"),
    (lambda: F.embedding_bag(tr.tensor(INDICES), WEIGHTS, tr.tensor([0, 5, 10]),
                             include_last_offset=True), "CSR"),
    (lambda: F.embedding_bag(tr.tensor(INDICES), WEIGHTS, tr.tensor(OFFSETS), mode="mean",
                             per_sample_weights=tr.tensor(SAMPLE_WEIGHTS)), "only supported for "
                                                                            "mode='sum'"),
    (lambda: F.embedding_bag(tr.tensor(INDICES), WEIGHTS, tr.tensor(OFFSETS), mode="sum",
                             per_sample_weights=tr.tensor(SAMPLE_WEIGHTS[:5])), "must be equal"),
    (lambda: F.embedding_bag(tr.tensor(INDICES + 1), WEIGHTS, tr.tensor(OFFSETS)),
     "out of bounds"),
    (lambda: F.embedding_bag(tr.tensor(INDICES.reshape(2, 2, 3)), WEIGHTS), "1-D or 2-D"),
    (lambda: F.embedding_bag(tr.tensor(INDICES), tr.tensor(WEIGHT[0]), tr.tensor(OFFSETS)),
     "weight has to be 2-D"),
    (lambda: F.embedding_bag(tr.tensor(INDICES.astype(np.float64)), WEIGHTS, tr.tensor(OFFSETS)),
     "int64 indices"),
])
def test_bad_arguments_are_clear_errors(call, message):
    with pytest.raises(tr.TracerError, match=message) as caught:
        call()
    assert "test_nn_embedding_bag.py" in str(caught.value)  # the user's line
