"""Embedding's and EmbeddingBag's options against PyTorch's: max_norm (the rows looked up scaled
down in place first, for several norm types), scale_grad_by_freq (each row's gradient divided by
its index's count), from_pretrained (the buffer shared, frozen or trained), eagerly and traced, in
values, gradients and the weight after the call; a traced training step of a model using them;
sparse gradients refused. Also convolutions with padding 'same' or 'valid' in every padding_mode
(PyTorch pads in the mode, then convolves), Conv1d and Conv2d, values and gradients."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tracer as tr
import tracer.nn.functional as F
from torch_oracle import compare_with_torch

rng = np.random.default_rng(5)
# rows of norms around 1..3: some above each max_norm below, some under
WEIGHT = rng.standard_normal((7, 4)) * np.array([[0.2], [1.0], [0.4], [2.0], [0.3], [1.5], [0.1]])
INDICES = np.array([[3, 1, 1, 0], [5, 3, 6, 3]])  # repeated indices, rows 2 and 4 never looked up


def _weight_after(function, torch_function, dtype, traced: bool):
    """The weight after one call of `function(weight)` and of `torch_function` on a copy."""
    ours = tr.tensor(WEIGHT.astype(dtype), requires_grad=True)
    theirs = torch.tensor(WEIGHT.astype(dtype), requires_grad=True)
    (tr.trace(function) if traced else function)(ours)
    torch_function(theirs)
    return ours.detach().numpy(), theirs.detach().numpy()


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_max_norm_renormalizes_the_rows_looked_up_in_place_as_pytorch(norm_type, dtype, traced):
    indices = tr.tensor(INDICES)
    torch_indices = torch.tensor(INDICES)

    def ours(weight):
        return F.embedding(indices, weight, max_norm=1.0, norm_type=norm_type) * 2

    def theirs(weight):
        return TF.embedding(torch_indices, weight, max_norm=1.0, norm_type=norm_type) * 2

    compare_with_torch(ours, theirs, [WEIGHT.astype(dtype)], traced=traced)
    after, expected = _weight_after(ours, theirs, dtype, traced)
    np.testing.assert_allclose(after, expected, rtol=1e-6 if dtype == np.float32 else 1e-13)
    changed = ~np.isclose(expected, WEIGHT.astype(dtype)).all(axis=1)
    assert changed.any() and not changed.all()  # the case renormalizes some rows, not others
    np.testing.assert_array_equal(after[[2, 4]], WEIGHT.astype(dtype)[[2, 4]])


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_scale_grad_by_freq_divides_each_rows_gradient_by_its_count(padding_idx, traced):
    indices = tr.tensor(INDICES)
    torch_indices = torch.tensor(INDICES)
    compare_with_torch(
        lambda w: F.embedding(indices, w, padding_idx, scale_grad_by_freq=True).tanh(),
        lambda w: TF.embedding(torch_indices, w, padding_idx, scale_grad_by_freq=True).tanh(),
        [WEIGHT], traced=traced)
    # by hand: row 3 is looked up three times, row 1 twice; with weights of ones each of their
    # gradients is the mean of their three or two ones-rows, 1
    weight = tr.tensor(WEIGHT, requires_grad=True)
    F.embedding(indices, weight, scale_grad_by_freq=True).sum().backward()
    np.testing.assert_array_equal(weight.grad.numpy()[:, 0], [1, 1, 0, 1, 0, 1, 1])


def _torch_bags(indices, weight, offsets, mode: str, by_frequency: bool):
    """PyTorch's embedding_bag of the documented semantics: torch 2.13's CPU kernel divides a
    row's gradient by another index's count where counts differ (pytorch#190063, fixed after
    2.13; its CUDA and MPS kernels and F.embedding divide by the row's own), so the oracle with
    scale_grad_by_freq is F.embedding's rows summed or averaged per bag."""
    if not by_frequency:
        return TF.embedding_bag(indices, weight, offsets, max_norm=1.5, mode=mode)
    rows = TF.embedding(indices, weight, max_norm=1.5, scale_grad_by_freq=True)
    if offsets is None:
        return rows.sum(1) if mode == "sum" else rows.mean(1)
    ends = [*offsets.tolist()[1:], len(indices)]
    bags = [rows[start:end].sum(0) if mode == "sum" or end == start else rows[start:end].mean(0)
            for start, end in zip(offsets.tolist(), ends)]
    return torch.stack(bags)


@pytest.mark.parametrize("traced", [False, True])
def test_scale_grad_by_freq_second_derivative_divides_once_as_pytorch(traced):
    """The gradient of the sum of the scaled gradient (create_graph): PyTorch's double backward
    of the embedding's backward does not scale again, so a row's second derivative is divided
    by its count once; by hand, -sin of each row looked up."""
    indices = INDICES.reshape(-1)

    def ours(weight):
        rows = F.embedding(tr.tensor(indices), weight, scale_grad_by_freq=True)
        (gradient,) = tr.autograd.grad(rows.sin().sum(), weight, create_graph=True)
        return gradient.sum()

    def theirs(weight):
        rows = TF.embedding(torch.tensor(indices), weight, scale_grad_by_freq=True)
        (gradient,) = torch.autograd.grad(rows.sin().sum(), weight, create_graph=True)
        return gradient.sum()

    compare_with_torch(ours, theirs, [WEIGHT], traced=traced)
    weight = tr.tensor(WEIGHT, requires_grad=True)
    (tr.trace(ours) if traced else ours)(weight).backward()
    looked_up = np.isin(np.arange(7), indices)[:, None]
    np.testing.assert_allclose(weight.grad.numpy(), np.where(looked_up, -np.sin(WEIGHT), 0),
                               rtol=1e-13)


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("mode, offsets", [("sum", None), ("mean", None),
                                           ("mean", np.array([0, 3, 3])),
                                           ("sum", np.array([0, 5])),
                                           ("max", np.array([0, 5]))])
def test_embedding_bag_max_norm_and_scale_grad_by_freq_as_pytorch(mode, offsets, traced):
    indices = INDICES if offsets is None else INDICES.reshape(-1)
    by_frequency = mode != "max"  # (PyTorch refuses it with max)
    ours_offsets = None if offsets is None else tr.tensor(offsets)
    torch_offsets = None if offsets is None else torch.tensor(offsets)

    def ours(weight):
        return F.embedding_bag(tr.tensor(indices), weight, ours_offsets, max_norm=1.5,
                               scale_grad_by_freq=by_frequency, mode=mode)

    def theirs(weight):
        return _torch_bags(torch.tensor(indices), weight, torch_offsets, mode, by_frequency)

    compare_with_torch(ours, theirs, [WEIGHT], traced=traced)
    after, expected = _weight_after(ours, theirs, np.float64, traced)
    np.testing.assert_allclose(after, expected, rtol=1e-13)


def test_embedding_bag_scale_grad_by_freq_by_hand():
    """Ones for weights, one bag summing rows 3, 1, 1, 0, 5, 3, 6, 3: each looked-up row's
    gradient is its count times 1 / its count (torch 2.13's CPU kernel gives 1.5 for row 3 and
    1/3 for rows 5 and 6: pytorch#190063)."""
    weight = tr.ones(7, 1, dtype=tr.float64, requires_grad=True)
    F.embedding_bag(tr.tensor(INDICES.reshape(-1)), weight, tr.tensor([0]), mode="sum",
                    scale_grad_by_freq=True).sum().backward()
    np.testing.assert_array_equal(weight.grad.numpy()[:, 0], [1, 1, 0, 1, 0, 1, 1])


def test_a_traced_training_step_with_max_norm_and_frequency_scaling_matches_pytorch():
    """Three SGD steps of an Embedding(max_norm, scale_grad_by_freq) + Linear model: loss,
    and every parameter after each step."""
    tr.manual_seed(0)
    ours = tr.nn.Sequential(tr.nn.Embedding(7, 4, max_norm=1.0, scale_grad_by_freq=True),
                            tr.nn.Flatten(), tr.nn.Linear(16, 3))
    theirs = torch.nn.Sequential(torch.nn.Embedding(7, 4, max_norm=1.0, scale_grad_by_freq=True),
                                 torch.nn.Flatten(), torch.nn.Linear(16, 3)).double()
    ours.to(tr.float64)
    with torch.no_grad(), tr.no_grad():
        for (_, mine), (_, reference) in zip(ours.named_parameters(), theirs.named_parameters()):
            mine.copy_(tr.tensor(reference.numpy() * 2))  # (rows of norms above 1)
            reference.mul_(2)
    optimizer = tr.optim.SGD(ours.parameters(), lr=0.5)
    torch_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.5)
    labels = np.array([0, 2])

    @tr.trace
    def step(indices, targets):
        optimizer.zero_grad()
        loss = F.cross_entropy(ours(indices), targets)
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(3):
        loss = step(tr.tensor(INDICES), tr.tensor(labels))
        torch_optimizer.zero_grad()
        expected = TF.cross_entropy(theirs(torch.tensor(INDICES)), torch.tensor(labels))
        expected.backward()
        torch_optimizer.step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
        for mine, reference in zip(ours.parameters(), theirs.parameters()):
            np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                       rtol=1e-12, atol=1e-14)
    assert step.cache_info().misses == 1


@pytest.mark.parametrize("module", ["Embedding", "EmbeddingBag"])
@pytest.mark.parametrize("freeze", [True, False])
def test_from_pretrained_holds_the_given_table_frozen_or_trained(module, freeze):
    table = tr.tensor(WEIGHT)
    layer = getattr(tr.nn, module).from_pretrained(table, freeze=freeze)
    reference = getattr(torch.nn, module).from_pretrained(torch.tensor(WEIGHT), freeze=freeze)
    assert layer.weight.requires_grad == reference.weight.requires_grad == (not freeze)
    np.testing.assert_allclose(layer(tr.tensor(INDICES)).detach().numpy(),
                               reference(torch.tensor(INDICES)).detach().numpy(), rtol=1e-15)
    with tr.no_grad():
        table[0, 0] = 42.0  # the buffer is shared, as PyTorch's Parameter(embeddings) shares it
    assert layer.weight[0, 0].item() == 42.0


@pytest.mark.parametrize("call, message", [
    (lambda: tr.nn.Embedding(7, 4, sparse=True), "sparse=False"),
    (lambda: F.embedding(tr.tensor(INDICES), tr.tensor(WEIGHT), sparse=True), "sparse=False"),
    (lambda: tr.nn.Embedding(7, 4, padding_idx=7), "padding_idx must be within"),
    (lambda: tr.nn.Embedding(7, 4, _weight=tr.ones(3, 4)), "_weight of shape"),
    (lambda: tr.nn.Embedding.from_pretrained(tr.ones(3)), "2-D"),
])
def test_options_refused_with_a_clear_error(call, message):
    with pytest.raises(tr.TracerError, match=message):
        call()


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("padding_mode", ["reflect", "replicate", "circular", "zeros"])
@pytest.mark.parametrize("padding, kernel, dilation", [("same", 3, 1), ("same", 4, 1),
                                                       ("same", 3, 2), ("valid", 3, 1)])
@pytest.mark.parametrize("spatial", [1, 2])
def test_convolutions_pad_same_and_valid_in_every_mode(spatial, padding, kernel, dilation,
                                                       padding_mode, traced):
    name = f"Conv{spatial}d"
    tr.manual_seed(1)
    ours = getattr(tr.nn, name)(3, 2, kernel, padding=padding, dilation=dilation,
                                padding_mode=padding_mode, dtype=tr.float64)
    theirs = getattr(torch.nn, name)(3, 2, kernel, padding=padding, dilation=dilation,
                                     padding_mode=padding_mode).double()
    theirs.load_state_dict({key: torch.tensor(value.numpy())
                            for key, value in ours.state_dict().items()})
    image = rng.standard_normal((2, 3, *[7] * spatial))
    compare_with_torch(lambda x: ours(x), lambda x: theirs(x), [image], traced=traced)


def test_same_padding_of_a_strided_convolution_is_refused():
    with pytest.raises(tr.TracerError, match="strided"):
        tr.nn.Conv2d(3, 2, 3, stride=2, padding="same", padding_mode="reflect")(tr.ones(1, 3, 6, 6))
