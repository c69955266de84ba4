"""Pooling for `tr.nn.functional`: max_pool2d, avg_pool2d, adaptive_avg_pool2d.

max and average pooling gather each output's window with the same gather as the convolutions
(tracer/nn/convolution.py, laid out (N, C, out rows, out columns, kernel rows, kernel columns))
and reduce over its last two axes (max_pool2d compares the window's elements pairwise), which fuses
into one loop over the output. max_pool2d's value is the window's first maximum (the last nan if
there is one), and its gradient goes to that element alone, as PyTorch's. Adaptive average pooling is a product with an averaging matrix on each side
(each output row averages the input rows floor(i * H / OH) to ceil((i + 1) * H / OH)).
"""
from __future__ import annotations

import builtins

import numpy as np

from tracer.ir import types as irtypes
from tracer.arithmetic import where
from tracer.creation import iota, tensor, zeros
from tracer.dtypes import int64
from tracer.derivatives import gradient_to
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.function import NativeFunction
from tracer.layout import fresh
from tracer.nn.convolution import pair, windows, constant_pad
from tracer.tensor import Tensor


def _pool_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int,
                      ceil_mode: bool) -> int:
    """PyTorch's pooling_output_shape: with ceil_mode a last partial window counts, unless it
    would start in the padding after the input."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def _batched(input: Tensor, name: str) -> tuple[Tensor, bool]:
    """(N, C, H, W), and whether the input had no batch dimension (C, H, W)."""
    if input.ndim not in (3, 4):
        raise ShapeMismatchError(f"{name} needs a 3-d (C, H, W) or 4-d (N, C, H, W) input, got "
                                 f"shape {list(input.shape)}")
    if not irtypes.is_float(input.dtype):
        raise ArgumentError(f"{name} needs a float tensor, got {input.dtype}")
    return (input.unsqueeze(0), True) if input.ndim == 3 else (input, False)


def _geometry(input: Tensor, kernel_size, stride, padding, dilation, ceil_mode, name: str):
    kernel = pair(kernel_size, 2, f"{name} kernel_size")
    stride = kernel if stride is None or stride == [] else pair(stride, 2, f"{name} stride")
    padding, dilation = pair(padding, 2, f"{name} padding"), pair(dilation, 2, f"{name} dilation")
    if min(*kernel, *stride, *dilation) < 1 or min(padding) < 0:
        raise ArgumentError(f"{name}: kernel_size, stride and dilation must be positive and "
                            f"padding non-negative, got {kernel}, {stride}, {dilation}, "
                            f"{padding}")
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise ArgumentError(f"{name}: padding {list(padding)} should be at most half of the "
                            f"kernel size {list(kernel)}")
    out = tuple(_pool_output_size(input.shape[2 + k], kernel[k], stride[k], padding[k],
                                  dilation[k], ceil_mode) for k in range(2))
    if min(out) < 1:
        raise ShapeMismatchError(f"{name}: the input {list(input.shape[2:])} is too small for "
                                 f"the kernel {list(kernel)} (output size {list(out)})")
    # ceil_mode's last window may reach past the padding: pad that far too
    high = [max(p, (o - 1) * s + d * (k - 1) + 1 - size - p)
            for o, s, d, k, p, size in zip(out, stride, dilation, kernel, padding,
                                           input.shape[2:])]
    return kernel, stride, padding, dilation, out, high


class _WindowMaximum(NativeFunction):
    """The maximum of each window (the last axis) and its position, as PyTorch's kernel scans a
    window: an element greater than the maximum so far, or a nan, is taken -- the first of tied
    maxima, the last nan -- and a window of -inf only (beside its padding) points at its first
    element inside the input (`first`). Elementwise over the window's positions, combined in a
    tree (the right half's pick where it is greater or a nan: the same choice as the scan, in
    log2(k) steps, so a 16 x 16 window compiles), where a max(-1) and its argmax were a kernel
    per row of k elements (0.6 ms of a small CNN step's 2.5). The gradient goes to the taken
    element alone."""

    @staticmethod
    def forward(ctx, flat, first):
        picks = [(flat[..., position], position) for position in range(flat.shape[-1])]
        while len(picks) > 1:
            pairs = zip(picks[0::2], picks[1::2])
            combined = [_right_if_taken(left, right) for left, right in pairs]
            picks = combined + picks[len(picks) - len(picks) % 2:]
        best, offsets = picks[0]
        if isinstance(offsets, int):  # a window of one element
            best, offsets = fresh(best), zeros(best.shape, dtype=int64)
        if first is not None:
            offsets = where(best == float("-inf"), first, offsets)
        ctx.save_for_backward(offsets)
        ctx.mark_non_differentiable(offsets)
        ctx.size = flat.shape[-1]
        return best, offsets

    @staticmethod
    def backward(ctx, grad_values, grad_offsets):
        (offsets,) = ctx.saved_tensors
        chosen = iota((*offsets.shape, ctx.size), offsets.ndim) == offsets.unsqueeze(-1)
        return gradient_to(chosen, grad_values, -1), None


def _right_if_taken(left: tuple, right: tuple) -> tuple:
    (left_value, left_offset), (right_value, right_offset) = left, right
    taken = (right_value > left_value) | (right_value != right_value)
    return where(taken, right_value, left_value), where(taken, right_offset, left_offset)


def _first_inside(out, kernel, stride, padding, dilation) -> Tensor | None:
    """Each window's first position (h * kernel columns + w) inside the input, or None without
    padding (then it is position 0)."""
    if not any(padding):
        return None
    firsts = [np.maximum(0, -(-(p - np.arange(o) * s) // d))
              for o, s, p, d in zip(out, stride, padding, dilation)]
    return tensor(firsts[0][:, None] * kernel[1] + firsts[1][None, :])


def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode: builtins.bool = False, return_indices: builtins.bool = False):
    """PyTorch's F.max_pool2d; with return_indices, also each maximum's position in its
    channel's flattened (H * W) input, as PyTorch's."""
    x, unbatched = _batched(input, "max_pool2d")
    kernel, stride, padding, dilation, out, high = _geometry(
        x, kernel_size, stride, padding, dilation, ceil_mode, "max_pool2d")
    padded = constant_pad(x, [0, 0, *padding], [0, 0, *high], float("-inf"))
    cells = windows(padded, kernel, stride, dilation, out, "ncijhw")
    flat = cells.reshape(*cells.shape[:4], kernel[0] * kernel[1])
    values, offsets = _WindowMaximum.apply(
        flat, _first_inside(out, kernel, stride, padding, dilation))
    if unbatched:
        values, offsets = fresh(values.squeeze(0)), fresh(offsets.squeeze(0))
    if not return_indices:
        return values
    shape = offsets.shape
    rows = (iota(shape, len(shape) - 2) * stride[0] - padding[0]
            + (offsets // kernel[1]) * dilation[0])
    columns = (iota(shape, len(shape) - 1) * stride[1] - padding[1]
               + (offsets % kernel[1]) * dilation[1])
    return values, rows * x.shape[3] + columns


def _window_lengths(size: int, out: int, kernel: int, stride: int, padding: int,
                    count_include_pad: bool) -> Tensor:
    """How many elements each window along one dimension averages (PyTorch's avg_pool2d: the
    padding counts with count_include_pad, what lies beyond it never)."""
    start = iota((out,), 0) * stride - padding
    end = (start + kernel).clamp(max=size + padding)
    if count_include_pad:
        return end - start
    return end.clamp(max=size) - start.clamp(min=0)


def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0,
               ceil_mode: builtins.bool = False, count_include_pad: builtins.bool = True,
               divisor_override: int | None = None) -> Tensor:
    """PyTorch's F.avg_pool2d: each window's sum divided by its size (see _window_lengths), or
    by divisor_override."""
    x, unbatched = _batched(input, "avg_pool2d")
    kernel, stride, padding, _, out, high = _geometry(
        x, kernel_size, stride, padding, 1, ceil_mode, "avg_pool2d")
    padded = constant_pad(x, [0, 0, *padding], [0, 0, *high], 0)
    sums = windows(padded, kernel, stride, (1, 1), out, "ncijhw").sum((4, 5))
    if divisor_override is not None:
        if divisor_override == 0:
            raise ArgumentError("avg_pool2d: divisor_override must not be zero")
        result = sums / divisor_override
    else:
        rows, columns = (_window_lengths(x.shape[2 + k], out[k], kernel[k], stride[k],
                                         padding[k], count_include_pad) for k in range(2))
        result = sums / (rows.reshape(out[0], 1) * columns).to(x.dtype)
    return fresh(result.squeeze(0)) if unbatched else result


def _window_means(x: Tensor, axis: int, out: int) -> Tensor:
    """The means of `x` along `axis` (2 or 3) over PyTorch's adaptive windows: output i averages
    the inputs floor(i * size / out) up to ceil((i + 1) * size / out) (exclusive). Each window is
    gathered (padded to the longest by repeating its last element) and its padding is left out by
    a select, not multiplied by 0, so an inf outside a window does not make it nan."""
    size = x.shape[axis]
    starts = [(i * size) // out for i in range(out)]
    ends = [-(-((i + 1) * size) // out) for i in range(out)]
    length = max(end - start for start, end in zip(starts, ends))
    index = np.array([[min(start + j, end - 1) for j in range(length)]
                      for start, end in zip(starts, ends)], np.int64)
    inside = tensor(np.arange(length)[None, :] < (np.array(ends) - np.array(starts))[:, None])
    counts = tensor((np.array(ends) - np.array(starts)).astype(np.dtype(x.dtype)))
    if axis == 2:  # (N, C, out, length, W)
        gathered = x[:, :, tensor(index)]
        return where(inside[:, :, None], gathered, 0.0).sum(3) / counts[:, None]
    gathered = x[:, :, :, tensor(index)]  # (N, C, H, out, length)
    return where(inside, gathered, 0.0).sum(4) / counts


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """PyTorch's F.adaptive_avg_pool2d; an output size of None keeps the input's."""
    x, unbatched = _batched(input, "adaptive_avg_pool2d")
    sizes = (output_size,) * 2 if output_size is None or isinstance(output_size, int) else tuple(
        output_size)
    if len(sizes) != 2:
        raise ArgumentError(f"adaptive_avg_pool2d takes an output size of 2 numbers, got "
                            f"{output_size!r}")
    height, width = x.shape[2:]
    out = (height if sizes[0] is None else int(sizes[0]), width if sizes[1] is None
           else int(sizes[1]))
    if min(out) < 1 or min(height, width) < 1:
        raise ShapeMismatchError(f"adaptive_avg_pool2d: output size {list(out)} for an input of "
                                 f"shape {list(input.shape)}")
    if height % out[0] == 0 and width % out[1] == 0:
        # equal windows that tile the input: a mean over each tile
        tiles = x.reshape(*x.shape[:2], out[0], height // out[0], out[1], width // out[1])
        result = tiles.mean((3, 5))
    else:
        result = _window_means(_window_means(x, 3, out[1]), 2, out[0])
    return fresh(result.squeeze(0) if unbatched else result)
