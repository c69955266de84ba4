"""pixel_shuffle / pixel_unshuffle / channel_shuffle, unfold / fold, the padding modules and
channel dropout (tracer/nn/rearrangement.py, padding_modules.py, channel_dropout.py,
image_modules.py) against torch: values and gradients, float64 and float32, eager and traced;
module reprs; errors; dropout's statistics (whole channels zeroed or scaled); a traced training
step."""
import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tracer as tr
import tracer.nn.functional as F
from torch_oracle import compare_with_torch

rng = np.random.default_rng(59)
IMAGES = rng.standard_normal((2, 8, 5, 6))
SIGNALS = rng.standard_normal((2, 3, 7))


def both(name, *args, **kwargs):
    return (lambda x: getattr(F, name)(x, *args, **kwargs),
            lambda x: getattr(TF, name)(x, *args, **kwargs))


def modules(name, *args, **kwargs):
    return getattr(tr.nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)


UNFOLD = dict(kernel_size=(2, 3), dilation=(2, 1), padding=(1, 2), stride=(2, 3))
CASES = [
    ("pixel_shuffle", both("pixel_shuffle", 2), IMAGES),
    ("pixel_shuffle 3-d", both("pixel_shuffle", 2), IMAGES[0]),
    ("pixel_shuffle 5-d", both("pixel_shuffle", 1), IMAGES[None]),
    ("pixel_unshuffle", both("pixel_unshuffle", 2), IMAGES[:, :, 1:]),
    ("pixel_unshuffle 5-d", both("pixel_unshuffle", 3), IMAGES[None, :, :, 2:, :3]),
    ("channel_shuffle", both("channel_shuffle", 4), IMAGES),
    ("channel_shuffle 3-d", both("channel_shuffle", 3), SIGNALS),
    ("unfold", both("unfold", 2), IMAGES),
    ("unfold options", both("unfold", **UNFOLD), IMAGES),
    ("unfold unbatched", both("unfold", 3, padding=1), IMAGES[0]),
    # overlapping blocks (stride 1): fold adds them up
    ("fold overlapping", both("fold", (5, 6), 2), TF.unfold(torch.tensor(IMAGES), 2).numpy()),
    ("fold options", both("fold", (5, 6), **UNFOLD),
     TF.unfold(torch.tensor(IMAGES), **UNFOLD).numpy()),
    ("fold unbatched", both("fold", 4, (2, 1), stride=(1, 2)), rng.standard_normal((6, 6))),
    ("fold unfold", (lambda x: F.fold(F.unfold(x, 3, padding=1), (5, 6), 3, padding=1),
                     lambda x: TF.fold(TF.unfold(x, 3, padding=1), (5, 6), 3, padding=1)),
     IMAGES),
]
PADDINGS = [("ZeroPad1d", (2,), SIGNALS), ("ZeroPad2d", ((1, 0, 2, 3),), IMAGES),
            ("ConstantPad1d", ((3, 1), 2.5), SIGNALS[0]),
            ("ConstantPad2d", (2, -1.0), IMAGES[0]), ("ReflectionPad1d", ((2, 3),), SIGNALS),
            ("ReflectionPad2d", (2,), IMAGES), ("ReflectionPad2d", ((1, 0, 3, 4),), IMAGES[0]),
            ("ReplicationPad1d", (4,), SIGNALS[0]),
            ("ReplicationPad2d", ((0, 5, 1, 2),), IMAGES),
            ("CircularPad1d", ((1, 2),), SIGNALS), ("CircularPad2d", (3,), IMAGES)]
CASES += [(f"{name} {args}", modules(name, *args), array) for name, args, array in PADDINGS]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name, functions, array", CASES, ids=[c[0] for c in CASES])
def test_against_torch(name, functions, array, traced, dtype):
    compare_with_torch(*functions, [array.astype(dtype)], traced=traced)


def test_fold_adds_infinities_as_pytorch():
    columns = TF.unfold(torch.tensor(IMAGES[:1, :1]), 2).numpy()
    columns[0, 0, 3], columns[0, 3, 0], columns[0, 1, 5] = np.inf, -np.inf, np.nan
    compare_with_torch(*both("fold", (5, 6), 2), [columns])


MODULES = [("PixelShuffle", (3,)), ("PixelUnshuffle", (2,)), ("ChannelShuffle", (2,)),
           ("Unfold", (2,)), ("Unfold", ((2, 3), 1, 1, 2)), ("Fold", ((4, 5), 2)),
           ("Fold", (4, 3, 2, 1, (1, 2))), ("Dropout1d", ()), ("Dropout2d", (0.2, True)),
           *[(name, args) for name, args, _ in PADDINGS]]


@pytest.mark.parametrize("name, args", MODULES, ids=[m[0] for m in MODULES])
def test_module_reprs_are_pytorchs(name, args):
    ours, theirs = modules(name, *args)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == []


@pytest.mark.parametrize("call, message", [
    (lambda: F.pixel_shuffle(tr.zeros(1, 3, 2, 2), 2), "not divisible by upscale_factor"),
    (lambda: F.pixel_shuffle(tr.zeros(4, 2), 2), "at least 3 dimensions"),
    (lambda: F.pixel_shuffle(tr.zeros(1, 4, 2, 2), 0), "positive int"),
    (lambda: F.pixel_unshuffle(tr.zeros(1, 3, 3, 2), 2), "divisible by downscale_factor"),
    (lambda: F.channel_shuffle(tr.zeros(1, 3, 2), 2), "not divisible by groups"),
    (lambda: F.unfold(tr.zeros(1, 1, 2, 2), 3), "larger than the padded input"),
    (lambda: F.unfold(tr.zeros(2, 2), 1), "3-d (C, H, W) or 4-d"),
    (lambda: F.unfold(tr.zeros(1, 1, 2, 2), 1, stride=0), "must be positive"),
    (lambda: F.fold(tr.zeros(1, 8, 5), (4, 5), 2), "number of blocks 3 * 4"),
    (lambda: F.fold(tr.zeros(1, 7, 12), (4, 5), 2), "divisible by 4"),
    (lambda: F.fold(tr.zeros(5), 4, 1), "2-d (C * kh * kw, L) or 3-d"),
    (lambda: tr.nn.ReflectionPad2d(1)(tr.zeros(2, 3)), "expects a 3-d or 4-d input"),
    (lambda: tr.nn.ZeroPad2d((1, 2, 3))(tr.zeros(2, 3)), "an int or 4 ints"),
    (lambda: F.dropout1d(tr.zeros(2, 3, 4, 5)), "2-d (C, L) or 3-d"),
    (lambda: F.dropout2d(tr.zeros(5)), "at least 2 dimensions"),
    (lambda: F.dropout2d(tr.zeros(2, 3), p=1.5), "between 0 and 1"),
    (lambda: tr.nn.Dropout1d(-0.1), "between 0 and 1"),
])
def test_bad_arguments_are_tracer_errors(call, message):
    with pytest.raises(tr.TracerError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("name, shape, kept", [("dropout1d", (40, 50, 7), 2),
                                               ("dropout1d", (500, 9), 1),
                                               ("dropout2d", (40, 50, 3, 4), 2)])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_channel_dropout_zeroes_or_scales_whole_channels(name, shape, kept, traced):
    p = 0.3
    x = tr.tensor(rng.uniform(1, 2, shape), requires_grad=True)
    call = (lambda x: getattr(F, name)(x, p)) if not traced else tr.trace(
        lambda x: getattr(F, name)(x, p))
    first, second = call(x), call(x)
    for result in (first, second):
        ratio = (result / x).detach().numpy().reshape(*shape[:kept], -1)
        zero = (ratio == 0).all(-1)
        scaled = np.isclose(ratio, 1 / (1 - p), rtol=1e-15).all(-1)
        assert (zero | scaled).all()  # each channel all zero or all scaled
        # the fraction of dropped channels: binomial, 2000 channels, 5 standard deviations
        assert abs(zero.mean() - p) < 5 * np.sqrt(p * (1 - p) / zero.size)
    assert not np.array_equal(first.detach().numpy(), second.detach().numpy())
    if traced:
        return
    (first * 2).sum().backward()
    # the gradient is the mask times 2: 0 in dropped channels, 2 / (1 - p) in the others
    np.testing.assert_allclose(x.grad.numpy(), 2 * first.detach().numpy() / x.detach().numpy(),
                               rtol=1e-14)


def test_channel_dropout_outside_training_is_the_input():
    x = tr.ones(2, 3, 4, 5)
    assert F.dropout2d(x, 0.5, training=False) is x
    sample = x[0]
    assert F.dropout1d(sample, 0.0) is sample
    module = tr.nn.Dropout2d(0.9).eval()
    assert module(x) is x
    ones = tr.tensor([[np.inf, 1.0]])
    # p = 1: every channel multiplied by 0, as PyTorch's (so an inf gives nan)
    np.testing.assert_array_equal(F.dropout1d(ones, 1.0).numpy(),
                                  TF.dropout1d(torch.tensor([[np.inf, 1.0]]), 1.0).numpy())


def test_channel_dropout_in_place_and_unbatched():
    x = tr.tensor(rng.uniform(1, 2, (30, 4)))
    before = x.numpy().copy()
    result = F.dropout1d(x, 0.5, inplace=True)
    assert result is x
    rows = x.numpy() / before
    assert ((rows == 0).all(1) | (rows == 2).all(1)).all()


def test_dropout2d_warns_for_a_3d_input_as_pytorch():
    with pytest.warns(UserWarning, match="interpreted as shape \\(N, C, L\\)"):
        result = F.dropout2d(tr.ones(20, 30, 4), 0.5)
    ratio = result.numpy()
    assert ((ratio == 0).all(-1) | (ratio == 2).all(-1)).all()  # (N, C) channels, not (C, H)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.dropout2d(tr.ones(2, 3, 4, 5), 0.5)


def _network(library):
    nn = library.nn
    return nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(2, 8, 3), nn.Dropout2d(0.25),
                         nn.PixelShuffle(2), nn.ReplicationPad2d((0, 1, 1, 0)),
                         nn.Conv2d(2, 4, 2), nn.PixelUnshuffle(2), nn.ChannelShuffle(4),
                         nn.ZeroPad2d(1), nn.Unfold(3, padding=1), nn.Fold((8, 9), 3, padding=1),
                         nn.Flatten(), nn.Linear(16 * 8 * 9, 3))


def test_traced_training_step_compiles_once_and_matches_torch():
    """Against torch with dropout in eval (its random numbers are not torch's); then in
    training, compiling once with a new mask each call."""
    tr.manual_seed(2)
    ours, theirs = _network(tr).double(), _network(torch).double()
    with torch.no_grad():
        for mine, reference in zip(ours.parameters(), theirs.parameters()):
            reference.copy_(torch.tensor(mine.detach().numpy()))
    ours.eval(), theirs.eval()
    optimizers = (tr.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9),
                  torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9))

    @tr.trace
    def step(x, labels):
        optimizers[0].zero_grad()
        loss = F.cross_entropy(ours(x), labels)
        loss.backward()
        optimizers[0].step()
        return loss

    for _ in range(3):
        x, labels = rng.standard_normal((4, 2, 6, 7)), rng.integers(0, 3, 4)
        loss = step(tr.tensor(x), tr.tensor(labels))
        optimizers[1].zero_grad()
        expected = TF.cross_entropy(theirs(torch.tensor(x)), torch.tensor(labels))
        expected.backward()
        optimizers[1].step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
    for mine, reference in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=1e-10, atol=1e-12)
    assert step.cache_info().misses == 1
    ours.train()
    x, labels = tr.tensor(rng.standard_normal((4, 2, 6, 7))), tr.tensor(rng.integers(0, 3, 4))
    losses = [step(x, labels).item() for _ in range(3)]
    assert step.cache_info().misses == 2 and len(set(losses)) == 3
