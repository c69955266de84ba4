"""The loss modules and Flatten / Unflatten / Identity against torch.nn's, eagerly and traced,
values and gradients; their options, buffers and repr."""
import warnings

import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn
from torch_oracle import compare_with_torch

rng = np.random.default_rng(31)
LOGITS = rng.standard_normal((6, 4)) * 2
IMAGE_LOGITS = rng.standard_normal((2, 4, 3, 3))
LABELS = np.array([0, 3, 1, -100, 2, 3])
IMAGE_LABELS = rng.integers(0, 4, (2, 3, 3))
PROBABILITIES = rng.dirichlet(np.ones(4), 6)
CLASS_WEIGHTS = np.array([0.5, 2.0, 1.0, 0.25])
TARGET = rng.standard_normal((6, 4))


def _loss_case(name, kwargs, inputs, weighted=False):
    def ours(x, target, *weight):
        module = getattr(nn, name)(*(tuple(w.detach() for w in weight) if weighted else ()),
                                  **kwargs)
        return module(x, target.long() if target.dtype == tr.int64 else target)

    def theirs(x, target, *weight):
        module = getattr(torch.nn, name)(*(tuple(w.detach() for w in weight) if weighted else ()),
                                         **kwargs)
        return module(x, target)
    return (f"{name}{kwargs}{'weighted' if weighted else ''}", ours, theirs, inputs)


CASES = [
    _loss_case("MSELoss", {}, [LOGITS, TARGET]),
    _loss_case("MSELoss", dict(reduction="sum"), [LOGITS, TARGET]),
    _loss_case("L1Loss", {}, [LOGITS, TARGET]),
    _loss_case("L1Loss", dict(reduction="none"), [LOGITS, TARGET]),
    _loss_case("CrossEntropyLoss", {}, [LOGITS, LABELS]),
    _loss_case("CrossEntropyLoss", dict(label_smoothing=0.1), [LOGITS, LABELS]),
    _loss_case("CrossEntropyLoss", dict(ignore_index=3, reduction="sum"),
               [LOGITS, np.abs(LABELS) % 4]),
    _loss_case("CrossEntropyLoss", {}, [LOGITS, LABELS, CLASS_WEIGHTS], weighted=True),
    _loss_case("CrossEntropyLoss", dict(reduction="none"), [IMAGE_LOGITS, IMAGE_LABELS]),
    _loss_case("CrossEntropyLoss", dict(label_smoothing=0.2), [LOGITS, PROBABILITIES]),
    _loss_case("NLLLoss", {}, [LOGITS, LABELS]),
    _loss_case("NLLLoss", dict(reduction="mean"), [LOGITS, LABELS, CLASS_WEIGHTS],
               weighted=True),
    ("Flatten", lambda x: nn.Flatten()(x), lambda x: torch.nn.Flatten()(x), [IMAGE_LOGITS]),
    ("Flatten 0 2", lambda x: nn.Flatten(0, 2)(x) * 2, lambda x: torch.nn.Flatten(0, 2)(x) * 2,
     [IMAGE_LOGITS]),
    ("Unflatten", lambda x: nn.Unflatten(1, (2, 2))(x), lambda x: torch.nn.Unflatten(1, (2, 2))(x),
     [LOGITS]),
    ("Identity", lambda x: nn.Identity(3, key=4)(x) * 3, lambda x: torch.nn.Identity(3, key=4)(x)
     * 3, [LOGITS]),
]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name,ours,theirs,inputs", CASES, ids=[c[0] for c in CASES])
def test_matches_torch(name, ours, theirs, inputs, traced):
    compare_with_torch(ours, theirs, inputs, traced=traced)


def test_options_buffers_and_repr_are_pytorchs():
    weight = tr.tensor(CLASS_WEIGHTS)
    loss = nn.CrossEntropyLoss(weight=weight, label_smoothing=0.1)
    reference = torch.nn.CrossEntropyLoss(weight=torch.tensor(CLASS_WEIGHTS), label_smoothing=0.1)
    assert list(loss.state_dict()) == list(reference.state_dict()) == ["weight"]
    assert list(nn.MSELoss().state_dict()) == list(torch.nn.MSELoss().state_dict()) == []
    assert loss.ignore_index == reference.ignore_index == -100
    for ours, theirs in [(nn.Flatten(), torch.nn.Flatten()), (nn.Identity(), torch.nn.Identity()),
                         (nn.Unflatten(1, (2, 3)), torch.nn.Unflatten(1, (2, 3)))]:
        assert repr(ours) == repr(theirs)
    model = nn.Sequential(nn.Flatten(), nn.Linear(9, 2), nn.Identity())
    assert model(tr.ones(4, 3, 3)).shape == (4, 2)
    with pytest.raises(tr.ArgumentError, match="reduction"):
        nn.MSELoss(reduction="average")
    with pytest.raises(tr.ArgumentError, match="deprecated"):
        nn.L1Loss(size_average=True)


@pytest.mark.parametrize("library", ["tracer", "torch"])
@pytest.mark.parametrize("name", ["mse_loss", "l1_loss"])
def test_a_target_of_another_shape_warns_as_pytorch_does(library, name):
    """A [4, 1] output against [4] labels broadcasts to a [4, 4] loss; PyTorch warns (tracer
    once did not, so a port lost the only sign of the bug). Same shapes: no warning."""
    lib = tr if library == "tracer" else torch
    loss = getattr(lib.nn.functional, name)
    prediction = lib.tensor([[1.0], [2.0], [3.0], [4.0]])
    with pytest.warns(UserWarning, match=r"target size .* different to the input size"):
        value = loss(prediction, lib.tensor([1.0, 2.0, 3.0, 4.0]))
    # the broadcast [4, 4] mean: sum over i, j of (i - j)^2 / 16 = 40 / 16; |i - j|: 20 / 16
    assert value.item() == (2.5 if name == "mse_loss" else 1.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss(prediction, prediction * 2)


@pytest.mark.parametrize("library", ["tracer", "torch"])
def test_loss_functions_keep_pytorchs_positions(library):
    """PyTorch's fourth positional argument of cross_entropy / nll_loss, and third of mse_loss /
    l1_loss, is the deprecated size_average: a positional ignore_index or reduction does not
    reach its parameter there (tracer's once did, silently computing another loss). By keyword
    both agree; tracer refuses the deprecated ones."""
    lib = tr if library == "tracer" else torch
    F = lib.nn.functional
    logits = lib.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    labels = lib.tensor([0, 2])
    by_keyword = F.cross_entropy(logits, labels, None, ignore_index=2)
    np.testing.assert_allclose(by_keyword.item(), np.log(2 + np.exp(2)) - 2, rtol=1e-6)
    np.testing.assert_allclose(F.nll_loss(logits.log_softmax(1), labels, None, ignore_index=2).item(),
                               by_keyword.item(), rtol=1e-6)
    assert F.mse_loss(logits, logits * 0, reduction="sum").item() == 8.0
    if lib is tr:
        for call in (lambda: F.cross_entropy(logits, labels, None, 2),
                     lambda: F.nll_loss(logits, labels, None, 2),
                     lambda: F.mse_loss(logits, logits, "sum"),
                     lambda: F.l1_loss(logits, logits, True)):
            with pytest.raises(tr.ArgumentError, match="deprecated"):
                call()
    else:  # PyTorch takes the positional value as size_average: both labels count, mean
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            positional = F.cross_entropy(logits, labels, None, 2)
        np.testing.assert_allclose(positional.item(), np.log(2 + np.exp(2)) - 1, rtol=1e-6)
