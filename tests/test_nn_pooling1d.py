"""1-d pooling and adaptive max pooling (tracer/nn/pooling1d.py, pooling_modules.py) against
torch.nn.functional and torch.nn: values, indices and gradients, float64 and float32, eager and
traced, every option; the modules' attributes and reprs; errors; a traced training step."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tracer as tr
import tracer.nn.functional as F
from torch_oracle import compare_with_torch

rng = np.random.default_rng(31)
SIGNALS = rng.standard_normal((3, 4, 11))
IMAGES = rng.standard_normal((2, 3, 7, 9))


def both(name, *args, **kwargs):
    """The case `name(x, *args, **kwargs)` in both libraries' functional modules."""
    return (lambda x: getattr(F, name)(x, *args, **kwargs),
            lambda x: getattr(TF, name)(x, *args, **kwargs))


CASES = [
    ("max_pool1d", both("max_pool1d", 3), [SIGNALS]),
    ("max_pool1d all options", both("max_pool1d", 3, 2, 1, 2, ceil_mode=True,
                                    return_indices=True), [SIGNALS]),
    ("max_pool1d ceil stride", both("max_pool1d", 2, 3, ceil_mode=True, return_indices=True),
     [SIGNALS]),
    # after a ReLU most windows tie at 0: the value and the gradient are the first's
    ("max_pool1d ties", (lambda x: F.max_pool1d(x.relu(), 4, 1, return_indices=True),
                         lambda x: TF.max_pool1d(x.relu(), 4, 1, return_indices=True)),
     [SIGNALS - 1]),
    ("max_pool1d unbatched", both("max_pool1d", (2,), (1,), (1,)), [SIGNALS[0]]),
    ("avg_pool1d", both("avg_pool1d", 3), [SIGNALS]),
    ("avg_pool1d padding ceil exclude", both("avg_pool1d", 4, 3, 2, ceil_mode=True,
                                             count_include_pad=False), [SIGNALS]),
    ("avg_pool1d padding ceil include", both("avg_pool1d", 3, 2, 1, ceil_mode=True),
     [SIGNALS]),
    ("avg_pool1d unbatched", both("avg_pool1d", 2, 1, 1), [SIGNALS[0]]),
    ("adaptive_avg_pool1d uneven", both("adaptive_avg_pool1d", 4), [SIGNALS]),
    ("adaptive_avg_pool1d larger", both("adaptive_avg_pool1d", 15), [SIGNALS]),
    ("adaptive_avg_pool1d unbatched global", both("adaptive_avg_pool1d", 1), [SIGNALS[0]]),
    ("adaptive_max_pool1d", both("adaptive_max_pool1d", 4, return_indices=True), [SIGNALS]),
    ("adaptive_max_pool1d larger unbatched", both("adaptive_max_pool1d", (14,), True),
     [SIGNALS[0]]),
    ("adaptive_max_pool2d", both("adaptive_max_pool2d", (3, 4)), [IMAGES]),
    ("adaptive_max_pool2d indices", both("adaptive_max_pool2d", (4, 5), return_indices=True),
     [IMAGES]),
    ("adaptive_max_pool2d ties", (lambda x: F.adaptive_max_pool2d(x.relu(), 2, True),
                                  lambda x: TF.adaptive_max_pool2d(x.relu(), 2, True)),
     [IMAGES - 1]),
    ("adaptive_max_pool2d None larger", both("adaptive_max_pool2d", (None, 12), True),
     [IMAGES]),
    ("adaptive_max_pool2d global unbatched", both("adaptive_max_pool2d", 1, True), [IMAGES[0]]),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name, functions, arrays", CASES, ids=[c[0] for c in CASES])
def test_against_torch(name, functions, arrays, traced, dtype):
    compare_with_torch(*functions, [a.astype(dtype) for a in arrays], traced=traced)


def test_nan_and_infinities_are_pytorchs():
    """The last nan of a window is taken, a window of -inf takes its first element; values,
    indices and gradients as PyTorch's."""
    signal = np.array([[[1.0, np.nan, 2.0, np.nan, -np.inf, -np.inf, -np.inf, np.inf, 3.0]]])
    for ours, theirs in [both("max_pool1d", 3, 1, 1, return_indices=True),
                         both("adaptive_max_pool1d", 4, True),
                         both("adaptive_max_pool2d", (1, 3), True)]:
        arrays = [signal] if "2d" not in ours.__code__.co_names else [signal[None]]
        compare_with_torch(ours, theirs, arrays)


MODULES = [
    ("MaxPool1d", (3,), dict(stride=2, padding=1, dilation=2, ceil_mode=True), SIGNALS),
    ("MaxPool1d", (2,), dict(return_indices=True), SIGNALS),
    ("AvgPool1d", (3,), dict(padding=1, count_include_pad=False), SIGNALS),
    ("AvgPool1d", (4, 2), dict(ceil_mode=True), SIGNALS[0]),
    ("AdaptiveAvgPool1d", (5,), {}, SIGNALS),
    ("AdaptiveMaxPool1d", (5,), dict(return_indices=True), SIGNALS),
    ("AdaptiveMaxPool2d", ((2, None),), {}, IMAGES),
    ("AdaptiveMaxPool2d", (3,), dict(return_indices=True), IMAGES[0]),
]


@pytest.mark.parametrize("name, args, kwargs, array", MODULES, ids=[m[0] for m in MODULES])
def test_modules_are_pytorchs(name, args, kwargs, array):
    ours, theirs = getattr(tr.nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == []
    for attribute in ("kernel_size", "stride", "padding", "output_size", "return_indices"):
        assert getattr(ours, attribute, None) == getattr(theirs, attribute, None), attribute
    compare_with_torch(ours, theirs, [array])


@pytest.mark.parametrize("call, message", [
    (lambda: F.max_pool1d(tr.zeros(2, 3, 4, 5), 2), "max_pool1d needs a 2-d"),
    (lambda: F.max_pool1d(tr.zeros(2, 3, 4), 2, padding=2), "at most half"),
    (lambda: F.max_pool1d(tr.zeros(2, 3, 4), 5), "too small"),
    (lambda: F.max_pool1d(tr.zeros(2, 3, 4), (2, 2)), "kernel_size takes an int or 1 ints"),
    (lambda: F.avg_pool1d(tr.zeros(2, 3, 4), 0), "must be positive"),
    (lambda: F.avg_pool1d(tr.zeros(2, 3, 4, dtype=tr.int64), 2), "needs a float tensor"),
    (lambda: F.adaptive_avg_pool1d(tr.zeros(2, 3), (2, 2)), "takes an int or 1 ints"),
    (lambda: F.adaptive_max_pool1d(tr.zeros(2, 3), 0), "output size 0"),
    (lambda: F.adaptive_max_pool2d(tr.zeros(2, 3), 2), "3-d (C, H, W) or 4-d"),
    (lambda: F.adaptive_max_pool2d(tr.zeros(1, 2, 3), (1, 2, 3)), "output size of 2 numbers"),
])
def test_bad_arguments_are_tracer_errors(call, message):
    with pytest.raises(tr.TracerError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_torch_refuses_what_tracer_refuses():
    # (an adaptive output size of 0 is PyTorch's empty result; tracer refuses it, as its
    # adaptive_avg_pool2d does)
    for call in (lambda: TF.max_pool1d(torch.zeros(2, 3, 4, 5), 2),
                 lambda: TF.max_pool1d(torch.zeros(2, 3, 4), 2, padding=2),
                 lambda: TF.max_pool1d(torch.zeros(2, 3, 4), 5)):
        with pytest.raises(RuntimeError):
            call()


def _network(library, seed_weights=None):
    nn = library.nn
    model = nn.Sequential(nn.Conv1d(4, 6, 3, padding=1), nn.MaxPool1d(2, ceil_mode=True),
                          nn.AvgPool1d(3, 1, 1), nn.AdaptiveMaxPool1d(4),
                          nn.AdaptiveAvgPool1d(2), nn.Flatten(), nn.Linear(12, 3))
    if seed_weights is not None:
        with torch.no_grad():
            for mine, reference in zip(seed_weights.parameters(), model.parameters()):
                reference.copy_(torch.tensor(mine.detach().numpy()))
    return model


def test_traced_training_step_compiles_once_and_matches_torch():
    tr.manual_seed(0)
    ours = _network(tr).double()
    theirs = _network(torch, ours).double()
    optimizers = (tr.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9),
                  torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9))

    @tr.trace
    def step(x, labels):
        optimizers[0].zero_grad()
        loss = F.cross_entropy(ours(x), labels)
        loss.backward()
        optimizers[0].step()
        return loss

    for _ in range(4):
        x = rng.standard_normal((5, 4, 13))
        labels = rng.integers(0, 3, 5)
        loss = step(tr.tensor(x), tr.tensor(labels))
        optimizers[1].zero_grad()
        expected = TF.cross_entropy(theirs(torch.tensor(x)), torch.tensor(labels))
        expected.backward()
        optimizers[1].step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
    for mine, reference in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=1e-11, atol=1e-13)
    assert step.cache_info().misses == 1
