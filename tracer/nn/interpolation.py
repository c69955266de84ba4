"""`tr.nn.functional.interpolate`: PyTorch's resampling of (N, C, W) and (N, C, H, W) inputs in the
modes nearest, nearest-exact, linear, bilinear, bicubic and area.

Each spatial dimension is resampled on its own, the last (W) first, as PyTorch's kernels nest
their loops: an output position reads a few input positions along the dimension (index_select)
and sums them times weights, `x[i0] * w0 + x[i1] * w1 (+ ...)`. The positions and weights are
PyTorch's (computed here from the static sizes, in the arithmetic its kernels use: float for
the nearest modes, the input's dtype for the others), including its zero weights -- so an inf
next to the sampled point gives nan where PyTorch's does -- and index_select's gradient adds the
output gradient times each weight into the source pixels, as PyTorch's backward accumulates.
Area mode is adaptive average pooling, as in PyTorch.
"""
from __future__ import annotations

import builtins
import math
import numbers

import numpy as np

from tracer.ir import types as irtypes
from tracer.creation import tensor
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.layout import fresh
from tracer.nn.pooling import adaptive_avg_pool2d
from tracer.tensor import Tensor

_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "area")
_SPATIAL = {"linear": 1, "bilinear": 2, "bicubic": 2}  # the modes with one input rank
_CUBIC = -0.75  # PyTorch's (and OpenCV's) cubic convolution coefficient A


def _output_sizes(input: Tensor, size, scale_factor, recompute_scale_factor, spatial: int):
    """(output sizes, the scales the kernel is given (None: input / output size))."""
    if (size is None) == (scale_factor is None):
        raise ArgumentError("interpolate takes one of size or scale_factor")
    if size is not None:
        if recompute_scale_factor:
            raise ArgumentError("interpolate: recompute_scale_factor is not meaningful with an "
                                "explicit size")
        sizes = list(size) if isinstance(size, (list, tuple)) else [size] * spatial
        if len(sizes) != spatial or not all(isinstance(s, numbers.Integral) for s in sizes):
            raise ArgumentError(f"interpolate: size {size!r} for an input with {spatial} spatial "
                                f"dimensions {list(input.shape[2:])}; give {spatial} ints")
        return [int(s) for s in sizes], [None] * spatial
    factors = (list(scale_factor) if isinstance(scale_factor, (list, tuple))
               else [scale_factor] * spatial)
    if len(factors) != spatial:
        raise ArgumentError(f"interpolate: scale_factor {scale_factor!r} for an input with "
                            f"{spatial} spatial dimensions {list(input.shape[2:])}")
    factors = [float(f) for f in factors]
    sizes = [math.floor(n * f) for n, f in zip(input.shape[2:], factors)]
    # recomputed: the kernel sees the sizes only (scale = input / output size)
    return sizes, [None] * spatial if recompute_scale_factor else factors


def _scale(dtype, size: int, out: int, align_corners: bool, factor):
    """PyTorch's area_pixel_compute_scale in the kernel's arithmetic `dtype`."""
    if align_corners:
        return dtype(size - 1) / dtype(out - 1) if out > 1 else dtype(0)
    if factor is not None and factor > 0:
        return dtype(1.0 / factor)
    return dtype(size) / dtype(out)


def _nearest(size: int, out: int, factor, exact: bool) -> np.ndarray:
    """PyTorch's nearest_idx / nearest_exact_idx: a float32 scale (input/output or 1/factor)."""
    destination = np.arange(out)
    if not exact and out == size:
        return destination
    if not exact and out == 2 * size:
        return destination >> 1
    scale = _scale(np.float32, size, out, False, factor)
    if exact:  # (dst + 0.5) in double, times the float scale, rounded to float by floorf
        source = np.floor(((destination + 0.5) * np.float64(scale)).astype(np.float32))
    else:
        source = np.floor(destination.astype(np.float32) * scale)
    return np.minimum(source.astype(np.int64), size - 1)


def _linear(dtype, size: int, out: int, align_corners: bool, factor, cubic: bool):
    """PyTorch's source positions (out, taps) and weights (out, taps) for linear (2 taps) and
    cubic (4 taps, positions clamped into the input) interpolation."""
    destination = np.arange(out)
    if not cubic and out == size:  # PyTorch copies: weights 1 and 0 of the same position
        return np.stack([destination] * 2, 1), np.stack(
            [np.ones(out, dtype), np.zeros(out, dtype)], 1)
    scale = _scale(dtype, size, out, align_corners, factor)
    if align_corners:
        real = scale * destination.astype(dtype)
    else:
        real = scale * (destination.astype(dtype) + dtype(0.5)) - dtype(0.5)
        if not cubic:
            real = np.maximum(real, dtype(0))
    # PyTorch's guard_index_and_lambda (floorf: through float, also for double)
    first = np.minimum(np.floor(real.astype(np.float32)).astype(np.int64), size - 1)
    fraction = np.clip(real - first.astype(dtype), dtype(0), dtype(1)).astype(dtype)
    if not cubic:
        second = first + (first < size - 1)
        return np.stack([first, second], 1), np.stack([dtype(1) - fraction, fraction], 1)
    near, far = fraction, dtype(1) - fraction

    def inner(t):  # |t| <= 1
        return ((dtype(_CUBIC + 2) * t - dtype(_CUBIC + 3)) * t) * t + dtype(1)

    def outer(t):  # 1 < |t| < 2
        return ((dtype(_CUBIC) * t - dtype(5 * _CUBIC)) * t + dtype(8 * _CUBIC)) * t - dtype(
            4 * _CUBIC)

    weights = np.stack([outer(near + dtype(1)), inner(near), inner(far), outer(far + dtype(1))],
                       1).astype(dtype)
    positions = np.clip(first[:, None] + np.arange(-1, 3), 0, size - 1)
    return positions, weights


def _resample(x: Tensor, axis: int, positions: np.ndarray, weights: np.ndarray | None) -> Tensor:
    """sum over taps k of x[..., positions[:, k], ...] * weights[:, k] along `axis`."""
    total = None
    for tap in range(positions.shape[1]):
        term = x.index_select(axis, tensor(np.ascontiguousarray(positions[:, tap])))
        if weights is not None:
            weight = weights[:, tap].reshape((-1,) + (1,) * (x.ndim - 1 - axis))
            term = term * tensor(weight)
        total = term if total is None else total + term
    return total


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",
                align_corners: builtins.bool | None = None,
                recompute_scale_factor: builtins.bool | None = None,
                antialias: builtins.bool = False) -> Tensor:
    """PyTorch's F.interpolate for 3-d (N, C, W) and 4-d (N, C, H, W) inputs."""
    if mode not in _MODES:
        raise ArgumentError(f"interpolate: mode is one of {list(_MODES)} here, got {mode!r}")
    if mode in ("nearest", "nearest-exact", "area"):
        if align_corners is not None:
            raise ArgumentError("interpolate: align_corners can only be set with the "
                                "interpolating modes linear, bilinear and bicubic")
    elif align_corners is None:
        align_corners = False
    if antialias:
        raise ArgumentError("interpolate: antialias=True is not supported by tracer; resample "
                            "without it (or low-pass filter with a convolution first)")
    if not isinstance(input, Tensor) or input.ndim not in (3, 4):
        raise ShapeMismatchError("interpolate takes 3-d (N, C, W) or 4-d (N, C, H, W) inputs "
                                 "here (5-d is not supported)")
    spatial = input.ndim - 2
    if _SPATIAL.get(mode, spatial) != spatial:
        raise ShapeMismatchError(f"interpolate: got a {input.ndim}-d input, but mode {mode!r} "
                                 f"needs a {_SPATIAL[mode] + 2}-d input")
    if not irtypes.is_float(input.dtype):
        raise ArgumentError(f"interpolate needs a float tensor, got {input.dtype}")
    if mode == "area" and size is None:
        recompute_scale_factor = True
    sizes, factors = _output_sizes(input, size, scale_factor, recompute_scale_factor, spatial)
    if min(sizes) < 1 or min(input.shape[2:]) < 1:
        raise ShapeMismatchError(f"interpolate: output size {sizes} for an input of shape "
                                 f"{list(input.shape)}; both must be positive")
    if mode == "area":
        if spatial == 1:
            return fresh(adaptive_avg_pool2d(input.unsqueeze(2), (1, sizes[0])).squeeze(2))
        return adaptive_avg_pool2d(input, sizes)
    dtype = np.dtype(input.dtype).type
    result = input
    for axis in reversed(range(2, input.ndim)):
        count, out, factor = input.shape[axis], sizes[axis - 2], factors[axis - 2]
        if mode in ("nearest", "nearest-exact"):
            positions, weights = _nearest(count, out, factor, mode == "nearest-exact"), None
            positions = positions.reshape(out, 1)
        else:
            positions, weights = _linear(dtype, count, out, align_corners, factor,
                                         mode == "bicubic")
        result = _resample(result, axis, positions, weights)
    return fresh(result)
