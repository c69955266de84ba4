"""Convolution, padding and pooling (tracer/nn/convolution.py, pooling.py) against
torch.nn.functional: values and gradients of every input, float64 and float32, eager and traced,
odd sizes, and a property test over stride / padding / dilation / groups combinations."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer as tr
import tracer.nn.functional as F
from torch_oracle import compare_with_torch

rng = np.random.default_rng(18)
IMAGES = rng.standard_normal((2, 6, 7, 9))
SIGNALS = rng.standard_normal((3, 4, 11))


def _weights(*shape):
    return rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))


CASES = [
    ("conv2d", lambda x, w, b: F.conv2d(x, w, b), lambda x, w, b: TF.conv2d(x, w, b),
     [IMAGES, _weights(5, 6, 3, 3), rng.standard_normal(5)]),
    ("conv2d stride padding dilation groups",
     lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
     lambda x, w, b: TF.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
     [IMAGES, _weights(4, 3, 3, 2), rng.standard_normal(4)]),
    ("conv2d depthwise", lambda x, w: F.conv2d(x, w, padding=1, groups=6),
     lambda x, w: TF.conv2d(x, w, padding=1, groups=6), [IMAGES, _weights(6, 1, 3, 3)]),
    ("conv2d depthwise multiplier", lambda x, w: F.conv2d(x, w, stride=2, groups=6),
     lambda x, w: TF.conv2d(x, w, stride=2, groups=6), [IMAGES, _weights(12, 1, 2, 3)]),
    ("conv2d same even kernel", lambda x, w: F.conv2d(x, w, padding="same", dilation=(2, 1)),
     lambda x, w: TF.conv2d(x, w, padding="same", dilation=(2, 1)), [IMAGES, _weights(3, 6, 2, 4)]),
    ("conv2d valid 1x1", lambda x, w: F.conv2d(x, w, padding="valid"),
     lambda x, w: TF.conv2d(x, w, padding="valid"), [IMAGES, _weights(2, 6, 1, 1)]),
    ("conv1d", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=3, dilation=2),
     lambda x, w, b: TF.conv1d(x, w, b, stride=2, padding=3, dilation=2),
     [SIGNALS, _weights(5, 4, 3), rng.standard_normal(5)]),
    ("conv1d same groups", lambda x, w: F.conv1d(x, w, padding="same", groups=2),
     lambda x, w: TF.conv1d(x, w, padding="same", groups=2), [SIGNALS, _weights(6, 2, 4)]),
    ("conv_transpose2d", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1,
                                                            output_padding=1),
     lambda x, w, b: TF.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
     [IMAGES, _weights(6, 3, 3, 3), rng.standard_normal(3)]),
    ("conv_transpose2d groups dilation large padding",
     lambda x, w: F.conv_transpose2d(x, w, stride=(2, 3), padding=(3, 2), output_padding=(1, 0),
                                     groups=3, dilation=(2, 1)),
     lambda x, w: TF.conv_transpose2d(x, w, stride=(2, 3), padding=(3, 2), output_padding=(1, 0),
                                      groups=3, dilation=(2, 1)),
     [IMAGES, _weights(6, 2, 3, 2)]),
    ("pad constant crop", lambda x: F.pad(x, (1, -2, 0, 3), value=1.5),
     lambda x: TF.pad(x, (1, -2, 0, 3), value=1.5), [IMAGES]),
    ("pad reflect", lambda x: F.pad(x, (2, 3, 1, 0), mode="reflect"),
     lambda x: TF.pad(x, (2, 3, 1, 0), mode="reflect"), [IMAGES]),
    ("pad replicate", lambda x: F.pad(x, (4, 1), mode="replicate"),
     lambda x: TF.pad(x, (4, 1), mode="replicate"), [SIGNALS]),
    ("pad circular", lambda x: F.pad(x, (2, 1, 3, 3), mode="circular"),
     lambda x: TF.pad(x, (2, 1, 3, 3), mode="circular"), [IMAGES]),
    ("max_pool2d", lambda x: F.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2), [IMAGES]),
    ("max_pool2d indices padding ceil dilation",
     lambda x: F.max_pool2d(x, (3, 2), (2, 2), 1, (1, 2), ceil_mode=True, return_indices=True),
     lambda x: TF.max_pool2d(x, (3, 2), (2, 2), 1, (1, 2), ceil_mode=True, return_indices=True),
     [IMAGES]),
    # after a ReLU most windows tie at 0: the gradient goes to the first, as PyTorch's
    ("max_pool2d ties", lambda x: F.max_pool2d(x.relu(), 3, 1, return_indices=True),
     lambda x: TF.max_pool2d(x.relu(), 3, 1, return_indices=True), [IMAGES - 1]),
    ("max_pool2d unbatched", lambda x: F.max_pool2d(x, 3, 2, 1),
     lambda x: TF.max_pool2d(x, 3, 2, 1), [IMAGES[0]]),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 3, 2, 1), lambda x: TF.avg_pool2d(x, 3, 2, 1),
     [IMAGES]),
    ("avg_pool2d ceil exclude padding",
     lambda x: F.avg_pool2d(x, (2, 3), (2, 2), (1, 1), ceil_mode=True, count_include_pad=False),
     lambda x: TF.avg_pool2d(x, (2, 3), (2, 2), (1, 1), ceil_mode=True, count_include_pad=False),
     [IMAGES]),
    ("avg_pool2d ceil include padding", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
     lambda x: TF.avg_pool2d(x, 3, 2, 1, ceil_mode=True), [IMAGES]),
    ("avg_pool2d divisor_override", lambda x: F.avg_pool2d(x, 2, divisor_override=3),
     lambda x: TF.avg_pool2d(x, 2, divisor_override=3), [IMAGES]),
    ("adaptive_avg_pool2d uneven", lambda x: F.adaptive_avg_pool2d(x, (3, 4)),
     lambda x: TF.adaptive_avg_pool2d(x, (3, 4)), [IMAGES]),
    ("adaptive_avg_pool2d global", lambda x: F.adaptive_avg_pool2d(x, 1),
     lambda x: TF.adaptive_avg_pool2d(x, 1), [IMAGES]),
    ("adaptive_avg_pool2d None larger", lambda x: F.adaptive_avg_pool2d(x, (None, 12)),
     lambda x: TF.adaptive_avg_pool2d(x, (None, 12)), [IMAGES]),
    ("flatten", lambda x: F.flatten(x, 1, 2), lambda x: torch.flatten(x, 1, 2), [IMAGES]),
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("name, ours, theirs, arrays", CASES, ids=[c[0] for c in CASES])
def test_against_torch(name, ours, theirs, arrays, traced, dtype):
    compare_with_torch(ours, theirs, [a.astype(dtype) for a in arrays], traced=traced)


@st.composite
def convolutions(draw):
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    channels = groups * draw(st.integers(1, 3))
    out_channels = groups * draw(st.integers(1, 3))
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = draw(st.one_of(st.tuples(st.integers(0, 3), st.integers(0, 3)),
                             st.just("valid"), st.just("same")))
    if padding == "same":
        stride = (1, 1)
    reach = [d * (k - 1) + 1 for d, k in zip(dilation, kernel)]
    size = [draw(st.integers(max(1, r - 2 * (p if isinstance(p, int) else 0)), r + 6))
            for r, p in zip(reach, padding if isinstance(padding, tuple) else (0, 0))]
    shape = (draw(st.integers(1, 3)), channels, *size)
    return shape, (out_channels, channels // groups, *kernel), dict(
        stride=stride, padding=padding, dilation=dilation, groups=groups)


def _convolution_case(case, traced, seed=0):
    shape, weight_shape, options = case
    generator = np.random.default_rng(seed)
    arrays = [generator.standard_normal(shape), generator.standard_normal(weight_shape),
              generator.standard_normal(weight_shape[0])]
    compare_with_torch(lambda x, w, b: F.conv2d(x, w, b, **options),
                       lambda x, w, b: TF.conv2d(x, w, b, **options), arrays, traced=traced)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(convolutions())
def test_conv2d_property_eager(case):
    _convolution_case(case, traced=False)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(convolutions())
def test_conv2d_property_traced(case):
    _convolution_case(case, traced=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(convolutions(), st.integers(0, 2))
def test_conv_transpose2d_property_eager(case, extra):
    shape, (out_channels, group_in, *kernel), options = case
    if options["padding"] in ("same", "valid"):
        options["padding"] = (0, 0)
    stride, dilation = options["stride"], options["dilation"]
    output_padding = tuple(min(extra, max(s, d) - 1) for s, d in zip(stride, dilation))
    groups = options["groups"]
    channels = shape[1]
    generator = np.random.default_rng(1)
    weight = generator.standard_normal((channels, out_channels // groups, *kernel))
    height = [(size - 1) * s - 2 * p + d * (k - 1) + o + 1 for size, s, p, d, k, o in zip(
        shape[2:], stride, options["padding"], dilation, kernel, output_padding)]
    if min(height) < 1:
        return  # PyTorch refuses an empty output too
    options = dict(options, output_padding=output_padding)
    compare_with_torch(lambda x, w: F.conv_transpose2d(x, w, **options),
                       lambda x, w: TF.conv_transpose2d(x, w, **options),
                       [generator.standard_normal(shape), weight])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3),
       st.integers(0, 2), st.integers(1, 2), st.booleans(), st.integers(0, 6), st.integers(0, 6))
def test_pooling_property_eager(kh, kw, sh, sw, padding, dilation, ceil_mode, extra_h, extra_w):
    padding = min(padding, kh // 2, kw // 2)
    shape = (2, 3, dilation * (kh - 1) + 1 + extra_h, dilation * (kw - 1) + 1 + extra_w)
    x = np.random.default_rng(2).standard_normal(shape).round(1)  # ties
    options = dict(kernel_size=(kh, kw), stride=(sh, sw), padding=padding, ceil_mode=ceil_mode)
    compare_with_torch(lambda x: F.max_pool2d(x, dilation=dilation, return_indices=True,
                                              **options),
                       lambda x: TF.max_pool2d(x, dilation=dilation, return_indices=True,
                                               **options), [x])
    for include in (True, False):
        compare_with_torch(lambda x, include=include: F.avg_pool2d(x, count_include_pad=include,
                                                                   **options),
                           lambda x, include=include: TF.avg_pool2d(
                               x, count_include_pad=include, **options), [x])


def test_max_pool2d_propagates_nan():
    x = IMAGES.copy()
    x[0, 0, 1, 1] = np.nan
    compare_with_torch(lambda x: F.max_pool2d(x, 3, return_indices=True),
                       lambda x: TF.max_pool2d(x, 3, return_indices=True), [x])


@pytest.mark.parametrize("call, message", [
    (lambda: F.conv2d(tr.zeros(1, 4, 5, 5), tr.zeros(2, 3, 3, 3)), "channels"),
    (lambda: F.conv2d(tr.zeros(1, 4, 5, 5), tr.zeros(2, 4, 3, 3), stride=2, padding="same"),
     "same"),
    (lambda: F.conv2d(tr.zeros(1, 4, 2, 2), tr.zeros(2, 4, 3, 3)), "larger"),
    (lambda: F.conv2d(tr.zeros(1, 4, 5, 5), tr.zeros(2, 4, 3, 3, dtype=tr.float64)), "dtype"),
    (lambda: F.max_pool2d(tr.zeros(1, 4, 5, 5), 2, padding=2), "half"),
    (lambda: F.pad(tr.zeros(1, 4), (4, 0), mode="reflect"), "reflect"),
])
def test_bad_input_is_a_tracer_error(call, message):
    with pytest.raises(tr.TracerError, match=message):
        call()


def test_windows_are_indexed_by_loop_counters():
    """The im2col kernel (a gather stored as a matrix) loops over the windows' dimensions: no
    division of a flat offset inside its inner loops (ir/schedule_index.py's refined_nest)."""
    from tracer.ir.schedule_index import refinement
    assert refinement((36, 50), (4, 3, 3, 2, 5, 5)) == [(4, 3, 3), (2, 5, 5)]
    assert refinement((6, 4), (4, 6)) is None
    assert refinement((6, 1), (2, 3, 1)) == [(2, 3, 1), ()]
    traced = tr.trace(lambda x, w: F.conv2d(x, w, padding=1, stride=2))
    x, w = tr.randn(2, 4, 9, 9), tr.randn(3, 4, 3, 3)
    np.testing.assert_allclose(traced(x, w).numpy(),
                               TF.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()),
                                         padding=1, stride=2).numpy(), rtol=1e-5, atol=1e-5)
    loops = traced.ir(x, w, stage="loops")
    kernel = loops[loops.index("f32[36,50]") - 200:].split("  kernel_", 2)[1]
    assert kernel.count("for ") == 4, kernel  # the split first dimension, then N, OH, OW
    inner = kernel[kernel.index("for ", kernel.index("for ") + 1):]
    assert " div " not in inner and " rem " not in inner, kernel


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("options", [
    dict(), dict(stride=2, padding=1, output_padding=1), dict(stride=(1, 2), dilation=2, groups=2),
    dict(stride=3, padding=(0, 2))], ids=["plain", "strided", "dilated groups", "gaps"])
def test_conv_transpose2d_gradient_with_an_infinite_cotangent(options, traced):
    """An overflowing loss (exp of a large output) gives an infinite cotangent: the weight's
    gradient is finite wherever no infinite element is read, as PyTorch's (its col2im scheme).
    Spreading the input with zeros and convolving multiplied those zeros by the infinity (nan;
    found by the long random-program run: an SGD step after exp(conv_transpose2d(x, w)))."""
    generator = np.random.default_rng(7)
    x = generator.standard_normal((2, 2, 3, 4)).astype(np.float32)
    w = generator.standard_normal((2, 2 if options.get("groups") else 3, 2, 3)).astype(np.float32)
    shape = TF.conv_transpose2d(torch.tensor(x), torch.tensor(w), **options).shape
    cotangent = generator.standard_normal(shape).astype(np.float32)
    cotangent[0, 1, 1, 2] = np.inf

    def gradients(lib, x, w):
        def step(x, w):
            y = lib.nn.functional.conv_transpose2d(x, w, **options)
            (y * lib.tensor(cotangent)).sum().backward()
        (tr.trace(step) if traced and lib is tr else step)(x, w)
        return x.grad.numpy(), w.grad.numpy()

    ours = gradients(tr, tr.tensor(x, requires_grad=True), tr.tensor(w, requires_grad=True))
    theirs = gradients(torch, torch.tensor(x, requires_grad=True),
                       torch.tensor(w, requires_grad=True))
    for mine, reference in zip(ours, theirs):
        assert np.isfinite(reference).any() and not np.isfinite(reference).all()
        np.testing.assert_array_equal(np.isnan(mine), np.isnan(reference))
        np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-5)
