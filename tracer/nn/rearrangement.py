"""Layers that move pixels between dimensions, for `tr.nn.functional`: pixel_shuffle,
pixel_unshuffle, channel_shuffle (reshapes and a permute), unfold (im2col: the convolutions'
window gather of tracer/nn/convolution.py) and fold (col2im: the blocks added into a zero image
with index_add, whose gradient gathers them back, as PyTorch's)."""
from __future__ import annotations

import numbers

import numpy as np

from tracer.ir import types as irtypes
from tracer.creation import tensor, zeros
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.layout import fresh
from tracer.nn.convolution import constant_pad, output_size, pair, windows
from tracer.tensor import Tensor


def _factor(value, what: str) -> int:
    if not isinstance(value, numbers.Integral) or value < 1:
        raise ArgumentError(f"{what} must be a positive int, got {value!r}")
    return int(value)


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """(*, C * r * r, H, W) -> (*, C, H * r, W * r): channel c * r * r + i * r + j goes to the
    pixel offset (i, j) of each r x r block, as PyTorch's."""
    r = _factor(upscale_factor, "pixel_shuffle: upscale_factor")
    if input.ndim < 3:
        raise ShapeMismatchError(f"pixel_shuffle expects an input of at least 3 dimensions, got "
                                 f"shape {list(input.shape)}")
    *batch, channels, height, width = input.shape
    if channels % (r * r):
        raise ShapeMismatchError(f"pixel_shuffle: the input's channel dimension {channels} is "
                                 f"not divisible by upscale_factor squared ({r * r})")
    blocks = input.reshape(-1, channels // (r * r), r, r, height, width)
    moved = blocks.permute(0, 1, 4, 2, 5, 3)  # (B, C, H, r, W, r)
    return fresh(moved.reshape(*batch, channels // (r * r), height * r, width * r))


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """The inverse of pixel_shuffle: (*, C, H * r, W * r) -> (*, C * r * r, H, W)."""
    r = _factor(downscale_factor, "pixel_unshuffle: downscale_factor")
    if input.ndim < 3:
        raise ShapeMismatchError(f"pixel_unshuffle expects an input of at least 3 dimensions, "
                                 f"got shape {list(input.shape)}")
    *batch, channels, height, width = input.shape
    if height % r or width % r:
        raise ShapeMismatchError(f"pixel_unshuffle: height {height} and width {width} must be "
                                 f"divisible by downscale_factor {r}")
    blocks = input.reshape(-1, channels, height // r, r, width // r, r)
    moved = blocks.permute(0, 1, 3, 5, 2, 4)  # (B, C, r, r, H / r, W / r)
    return fresh(moved.reshape(*batch, channels * r * r, height // r, width // r))


def channel_shuffle(input: Tensor, groups: int) -> Tensor:
    """(N, g * k, *) -> channel i * k + j moved to j * g + i: the groups interleaved."""
    groups = _factor(groups, "channel_shuffle: groups")
    if input.ndim < 3:
        raise ShapeMismatchError(f"channel_shuffle expects an input of at least 3 dimensions, "
                                 f"got shape {list(input.shape)}")
    batch, channels, *rest = input.shape
    if channels % groups:
        raise ShapeMismatchError(f"channel_shuffle: {channels} channels are not divisible by "
                                 f"groups {groups}")
    grouped = input.reshape(batch, groups, channels // groups, *rest)
    return fresh(grouped.transpose(1, 2).reshape(input.shape))


def _geometry(kernel_size, dilation, padding, stride, name: str):
    kernel, dilation = pair(kernel_size, 2, f"{name} kernel_size"), pair(dilation, 2,
                                                                          f"{name} dilation")
    padding, stride = pair(padding, 2, f"{name} padding"), pair(stride, 2, f"{name} stride")
    if min(*kernel, *dilation, *stride) < 1 or min(padding) < 0:
        raise ArgumentError(f"{name}: kernel_size, dilation and stride must be positive and "
                            f"padding non-negative, got {kernel}, {dilation}, {stride}, "
                            f"{padding}")
    return kernel, dilation, padding, stride


def _blocks(size, kernel, dilation, padding, stride) -> tuple[int, int]:
    return tuple(output_size(size[k], kernel[k], stride[k], padding[k], padding[k], dilation[k])
                 for k in range(2))


def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """PyTorch's F.unfold (im2col): (N, C, H, W) -> (N, C * kh * kw, L), L blocks in row-major
    order, each column a block's pixels in (channel, kernel row, kernel column) order."""
    kernel, dilation, padding, stride = _geometry(kernel_size, dilation, padding, stride,
                                                  "unfold")
    if input.ndim not in (3, 4):
        raise ShapeMismatchError(f"unfold needs a 3-d (C, H, W) or 4-d (N, C, H, W) input, got "
                                 f"shape {list(input.shape)}")
    x = input.unsqueeze(0) if input.ndim == 3 else input
    out = _blocks(x.shape[2:], kernel, dilation, padding, stride)
    if min(out) < 1:
        raise ShapeMismatchError(f"unfold: the kernel {list(kernel)} (dilation {list(dilation)}) "
                                 f"is larger than the padded input {list(x.shape[2:])}")
    padded = constant_pad(x, [0, 0, *padding], [0, 0, *padding], 0)
    cells = windows(padded, kernel, stride, dilation, out, "nchwij")
    columns = cells.reshape(x.shape[0], -1, out[0] * out[1])
    return fresh(columns.squeeze(0) if input.ndim == 3 else columns)


def fold(input: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """PyTorch's F.fold (col2im), unfold's adjoint: (N, C * kh * kw, L) -> (N, C, H, W), each
    block's pixels added into the image where unfold took them from."""
    kernel, dilation, padding, stride = _geometry(kernel_size, dilation, padding, stride, "fold")
    size = pair(output_size, 2, "fold output_size")
    if input.ndim not in (2, 3):
        raise ShapeMismatchError(f"fold needs a 2-d (C * kh * kw, L) or 3-d (N, C * kh * kw, L) "
                                 f"input, got shape {list(input.shape)}")
    if not irtypes.is_float(input.dtype):
        raise ArgumentError(f"fold needs a float tensor, got {input.dtype}")
    x = input.unsqueeze(0) if input.ndim == 2 else input
    batch, depth, count = x.shape
    taps = kernel[0] * kernel[1]
    out = _blocks(size, kernel, dilation, padding, stride)
    if depth % taps or min(out) < 1 or count != out[0] * out[1]:
        raise ShapeMismatchError(
            f"fold: an input of shape {list(input.shape)} for output_size {list(size)}, "
            f"kernel_size {list(kernel)}, dilation {list(dilation)}, padding {list(padding)}, "
            f"stride {list(stride)}: dimension 1 must be divisible by {taps} and the last "
            f"dimension be the number of blocks {out[0]} * {out[1]}")
    channels = depth // taps
    width = size[1] + 2 * padding[1]
    # the flat position in the padded image of each (kernel row, kernel column, block row,
    # block column), in the input's order
    rows = (np.arange(kernel[0])[:, None, None, None] * dilation[0]
            + np.arange(out[0])[None, None, :, None] * stride[0])
    columns = (np.arange(kernel[1])[None, :, None, None] * dilation[1]
               + np.arange(out[1])[None, None, None, :] * stride[1])
    positions = tensor((rows * width + columns).reshape(-1))
    image = zeros((batch, channels, (size[0] + 2 * padding[0]) * width), dtype=x.dtype)
    image = image.index_add(2, positions, x.reshape(batch, channels, taps * count))
    image = image.reshape(batch, channels, size[0] + 2 * padding[0], width)
    image = image[:, :, padding[0]:padding[0] + size[0], padding[1]:padding[1] + size[1]]
    return fresh(image.squeeze(0) if input.ndim == 2 else image)
