"""F.interpolate and the Upsample modules (tracer/nn/interpolation.py, upsampling.py) against
torch: values and gradients (PyTorch's backward adds into the source pixels) in every mode, with
size or scale_factor (recomputed or not), align_corners both ways, 3-d and 4-d inputs, float64
and float32, eager and traced; infinities next to a sampled point; reprs; errors; a traced
training step of a small U-Net-like decoder."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tracer as tr
import tracer.nn.functional as F
from torch_oracle import compare_with_torch

rng = np.random.default_rng(47)
IMAGES = rng.standard_normal((2, 3, 5, 7))
SIGNALS = rng.standard_normal((2, 3, 6))

SIZES = [dict(size=(9, 4)), dict(size=(5, 7)), dict(size=13), dict(scale_factor=2),
         dict(scale_factor=(1.7, 0.6)), dict(scale_factor=2.3, recompute_scale_factor=True),
         dict(scale_factor=(0.5, 3.1), recompute_scale_factor=False)]
# (mode, options, align_corners, input)
CASES = [(mode, options, None, IMAGES) for mode in ("nearest", "nearest-exact", "area")
         for options in SIZES]
CASES += [(mode, options, corners, IMAGES) for mode in ("bilinear", "bicubic")
          for options in SIZES for corners in (False, True)]
CASES += [(mode, options, corners, SIGNALS)
          for mode, corners in [("nearest", None), ("area", None), ("nearest-exact", None),
                                ("linear", False), ("linear", True)]
          for options in (dict(size=11), dict(size=4), dict(scale_factor=1.5), dict(size=6),
                          dict(scale_factor=0.7, recompute_scale_factor=True))]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("mode, options, corners, source", CASES,
                         ids=[f"{m}-{o}-{c}-{s.ndim}d" for m, o, c, s in CASES])
def test_against_torch(mode, options, corners, source, traced, dtype):
    compare_with_torch(lambda x: F.interpolate(x, mode=mode, align_corners=corners, **options),
                       lambda x: TF.interpolate(x, mode=mode, align_corners=corners, **options),
                       [source.astype(dtype)], traced=traced)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bicubic"])
def test_infinities_and_nan_spread_as_pytorchs(mode):
    """PyTorch multiplies its zero weights too: an inf beside a sampled point gives nan."""
    image = IMAGES[:1, :1].copy()
    image[0, 0, 1, 2], image[0, 0, 3, 3], image[0, 0, 4, 0] = np.inf, -np.inf, np.nan
    corners = None if mode.startswith("nearest") else False
    for options in (dict(size=(5, 7)), dict(size=(8, 11)), dict(scale_factor=0.5)):
        options["align_corners"] = corners
        compare_with_torch(lambda x, options=options: F.interpolate(x, mode=mode, **options),
                           lambda x, options=options: TF.interpolate(x, mode=mode, **options),
                           [image])


MODULES = [
    ("Upsample", dict(scale_factor=2)),
    ("Upsample", dict(size=(4, 9), mode="bilinear")),
    ("Upsample", dict(scale_factor=(1.5, 2), mode="bicubic", align_corners=True)),
    ("Upsample", dict(scale_factor=1.5, mode="nearest-exact", recompute_scale_factor=True)),
    ("UpsamplingNearest2d", dict(scale_factor=3)),
    ("UpsamplingBilinear2d", dict(size=(8, 3))),
]


@pytest.mark.parametrize("name, options", MODULES, ids=[m[0] for m in MODULES])
def test_modules_are_pytorchs(name, options):
    ours, theirs = getattr(tr.nn, name)(**options), getattr(torch.nn, name)(**options)
    assert repr(ours) == repr(theirs)
    for attribute in ("size", "scale_factor", "mode", "align_corners", "recompute_scale_factor"):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    compare_with_torch(ours, theirs, [IMAGES])


@pytest.mark.parametrize("call, message", [
    (lambda: F.interpolate(tr.zeros(1, 1, 2, 2)), "one of size or scale_factor"),
    (lambda: F.interpolate(tr.zeros(1, 1, 2, 2), 3, 2.0), "one of size or scale_factor"),
    (lambda: F.interpolate(tr.zeros(1, 1, 2, 2), (3, 3, 3)), "2 spatial dimensions"),
    (lambda: F.interpolate(tr.zeros(1, 1, 2, 2), scale_factor=(2, 2, 2)), "2 spatial"),
    (lambda: F.interpolate(tr.zeros(1, 1, 2, 2), 3, align_corners=True), "align_corners"),
    (lambda: F.interpolate(tr.zeros(1, 1, 2, 2), 3, mode="linear"), "needs a 3-d input"),
    (lambda: F.interpolate(tr.zeros(1, 1, 2), 3, mode="bicubic"), "needs a 4-d input"),
    (lambda: F.interpolate(tr.zeros(1, 1, 2, 2), 3, mode="trilinear"), "mode is one of"),
    (lambda: F.interpolate(tr.zeros(1, 2, 2), 3, mode="linear", antialias=True), "antialias"),
    (lambda: F.interpolate(tr.zeros(1, 1, 2, 2, 2), 3), "3-d (N, C, W) or 4-d"),
    (lambda: F.interpolate(tr.zeros(1, 1, 2, 2), 3, recompute_scale_factor=True),
     "not meaningful"),
    (lambda: F.interpolate(tr.zeros(1, 1, 2, 2), scale_factor=0.2), "output size"),
    (lambda: F.interpolate(tr.zeros(1, 1, 2, dtype=tr.int64), 3), "float tensor"),
])
def test_bad_arguments_are_tracer_errors(call, message):
    with pytest.raises(tr.TracerError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def _decoder(library):
    nn = library.nn
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Upsample(scale_factor=2, mode="bilinear"),
                         nn.Conv2d(4, 3, 3, padding=1), nn.UpsamplingNearest2d(size=(10, 12)),
                         nn.Conv2d(3, 1, 1))


def test_traced_training_step_compiles_once_and_matches_torch():
    tr.manual_seed(1)
    ours = _decoder(tr).double()
    theirs = _decoder(torch).double()
    with torch.no_grad():
        for mine, reference in zip(ours.parameters(), theirs.parameters()):
            reference.copy_(torch.tensor(mine.detach().numpy()))
    optimizers = (tr.optim.Adam(ours.parameters(), lr=0.01),
                  torch.optim.Adam(theirs.parameters(), lr=0.01))

    @tr.trace
    def step(x, target):
        optimizers[0].zero_grad()
        loss = F.mse_loss(ours(x), target)
        loss.backward()
        optimizers[0].step()
        return loss

    for _ in range(4):
        x, target = rng.standard_normal((3, 2, 8, 10)), rng.standard_normal((3, 1, 10, 12))
        loss = step(tr.tensor(x), tr.tensor(target))
        optimizers[1].zero_grad()
        expected = TF.mse_loss(theirs(torch.tensor(x)), torch.tensor(target))
        expected.backward()
        optimizers[1].step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-12)
    for mine, reference in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), reference.detach().numpy(),
                                   rtol=1e-10, atol=1e-12)
    assert step.cache_info().misses == 1
