"""1-d pooling and adaptive max pooling for `tr.nn.functional`: max_pool1d, avg_pool1d,
adaptive_avg_pool1d, adaptive_max_pool1d, adaptive_max_pool2d.

A 1-d pooling is the 2-d one (tracer/nn/pooling.py) of the signal seen as an image of height 1,
after checking the arguments as PyTorch's 1-d functions do (so that errors name the 1-d
function). Adaptive max pooling gathers each output's window -- rows floor(i * H / OH) up to
ceil((i + 1) * H / OH), the same for columns -- padded to the longest window with -inf, and takes
its first maximum (the last nan) with the window maximum of max_pool2d, so that its value, its
index and its gradient (to the taken element alone) are PyTorch's.
"""
from __future__ import annotations

import builtins

import numpy as np

from tracer.ir import types as irtypes
from tracer.arithmetic import where
from tracer.creation import tensor
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.layout import fresh
from tracer.nn.convolution import pair
from tracer.nn.pooling import (_WindowMaximum, _pool_output_size, adaptive_avg_pool2d,
                               avg_pool2d, max_pool2d)
from tracer.tensor import Tensor


def _signal(input: Tensor, name: str) -> None:
    if not isinstance(input, Tensor) or input.ndim not in (2, 3):
        shape = list(input.shape) if isinstance(input, Tensor) else type(input).__name__
        raise ShapeMismatchError(f"{name} needs a 2-d (C, L) or 3-d (N, C, L) tensor, got "
                                 f"{shape}")
    if not irtypes.is_float(input.dtype):
        raise ArgumentError(f"{name} needs a float tensor, got {input.dtype}")


def _geometry_1d(input: Tensor, kernel_size, stride, padding, dilation, ceil_mode: bool,
                 name: str) -> tuple[int, int, int, int]:
    """(kernel, stride, padding, dilation), checked as PyTorch's 1-d pooling checks them."""
    _signal(input, name)
    kernel = pair(kernel_size, 1, f"{name} kernel_size")[0]
    stride = kernel if stride is None or stride == [] else pair(stride, 1, f"{name} stride")[0]
    padding, dilation = pair(padding, 1, f"{name} padding")[0], pair(dilation, 1,
                                                                      f"{name} dilation")[0]
    if min(kernel, stride, dilation) < 1 or padding < 0:
        raise ArgumentError(f"{name}: kernel_size, stride and dilation must be positive and "
                            f"padding non-negative, got {kernel}, {stride}, {dilation}, "
                            f"{padding}")
    if 2 * padding > kernel:
        raise ArgumentError(f"{name}: padding {padding} should be at most half of the kernel "
                            f"size {kernel}")
    length = input.shape[-1]
    if _pool_output_size(length, kernel, stride, padding, dilation, ceil_mode) < 1:
        raise ShapeMismatchError(f"{name}: the input of length {length} is too small for the "
                                 f"kernel {kernel} (dilation {dilation}, padding {padding})")
    return kernel, stride, padding, dilation


def max_pool1d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode: builtins.bool = False, return_indices: builtins.bool = False):
    """PyTorch's F.max_pool1d; with return_indices, also each maximum's position along L."""
    kernel, stride, padding, dilation = _geometry_1d(input, kernel_size, stride, padding,
                                                     dilation, ceil_mode, "max_pool1d")
    result = max_pool2d(input.unsqueeze(-2), (1, kernel), (1, stride), (0, padding),
                        (1, dilation), ceil_mode, return_indices)
    if return_indices:  # (row 0: the image's flattened index is the position along L)
        values, indices = result
        return fresh(values.squeeze(-2)), fresh(indices.squeeze(-2))
    return fresh(result.squeeze(-2))


def avg_pool1d(input: Tensor, kernel_size, stride=None, padding=0,
               ceil_mode: builtins.bool = False,
               count_include_pad: builtins.bool = True) -> Tensor:
    """PyTorch's F.avg_pool1d."""
    kernel, stride, padding, _ = _geometry_1d(input, kernel_size, stride, padding, 1, ceil_mode,
                                              "avg_pool1d")
    result = avg_pool2d(input.unsqueeze(-2), (1, kernel), (1, stride), (0, padding), ceil_mode,
                        count_include_pad)
    return fresh(result.squeeze(-2))


def _output_size_1d(output_size, name: str) -> int:
    sizes = pair(output_size, 1, f"{name} output_size")
    if sizes[0] < 0:
        raise ArgumentError(f"{name}: output_size must be non-negative, got {output_size!r}")
    return sizes[0]


def adaptive_avg_pool1d(input: Tensor, output_size) -> Tensor:
    """PyTorch's F.adaptive_avg_pool1d."""
    _signal(input, "adaptive_avg_pool1d")
    out = _output_size_1d(output_size, "adaptive_avg_pool1d")
    return fresh(adaptive_avg_pool2d(input.unsqueeze(-2), (1, out)).squeeze(-2))


def _windows(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's adaptive windows along one dimension: (out, longest) positions (the last one
    repeated past a window's end) and whether each lies inside its window."""
    starts = np.array([(i * size) // out for i in range(out)])
    ends = np.array([-(-((i + 1) * size) // out) for i in range(out)])
    length = int((ends - starts).max())
    steps = np.arange(length)
    return (np.minimum(starts[:, None] + steps, ends[:, None] - 1),
            steps[None, :] < (ends - starts)[:, None])


def _adaptive_sizes(x: Tensor, output_size, name: str) -> tuple[int, int]:
    sizes = (output_size,) * 2 if output_size is None or isinstance(output_size, int) else tuple(
        output_size)
    if len(sizes) != 2:
        raise ArgumentError(f"{name} takes an output size of 2 numbers, got {output_size!r}")
    out = tuple(x.shape[2 + k] if sizes[k] is None else int(sizes[k]) for k in range(2))
    if min(out) < 1 or min(x.shape[2:]) < 1:
        raise ShapeMismatchError(f"{name}: output size {list(out)} for an input of shape "
                                 f"{list(x.shape)}; both must be positive")
    return out


def _adaptive_max(x: Tensor, out: tuple[int, int], return_indices: bool):
    """Adaptive max pooling of x (N, C, H, W) to `out`."""
    width = x.shape[3]
    (rows, rows_inside), (columns, columns_inside) = (
        _windows(x.shape[2 + k], out[k]) for k in range(2))
    cells = x[:, :, tensor(rows)][..., tensor(columns)]  # (N, C, OH, LH, OW, LW)
    cells = cells.permute(0, 1, 2, 4, 3, 5)
    inside = rows_inside[:, None, :, None] & columns_inside[None, :, None, :]
    if not inside.all():  # windows of unequal lengths
        # (outside a window: -inf, never taken -- a window of -inf takes its first element)
        cells = where(tensor(inside), cells, float("-inf"))
    flat = cells.reshape(*cells.shape[:4], -1)
    values, offsets = _WindowMaximum.apply(flat, None)
    if not return_indices:
        return values
    # (the taken element lies inside its window: row = the window's first row + offset // LW)
    length = columns.shape[1]
    row = tensor(rows[:, :1]) + offsets // length
    return values, row * width + tensor(columns[:, 0]) + offsets % length


def adaptive_max_pool2d(input: Tensor, output_size, return_indices: builtins.bool = False):
    """PyTorch's F.adaptive_max_pool2d; an output size of None keeps the input's."""
    if not isinstance(input, Tensor) or input.ndim not in (3, 4):
        raise ShapeMismatchError("adaptive_max_pool2d needs a 3-d (C, H, W) or 4-d (N, C, H, W) "
                                 "tensor")
    if not irtypes.is_float(input.dtype):
        raise ArgumentError(f"adaptive_max_pool2d needs a float tensor, got {input.dtype}")
    unbatched = input.ndim == 3
    x = input.unsqueeze(0) if unbatched else input
    result = _adaptive_max(x, _adaptive_sizes(x, output_size, "adaptive_max_pool2d"),
                           return_indices)
    results = result if return_indices else (result,)
    results = tuple(fresh(r.squeeze(0) if unbatched else r) for r in results)
    return results if return_indices else results[0]


def adaptive_max_pool1d(input: Tensor, output_size, return_indices: builtins.bool = False):
    """PyTorch's F.adaptive_max_pool1d."""
    _signal(input, "adaptive_max_pool1d")
    out = _output_size_1d(output_size, "adaptive_max_pool1d")
    if out < 1 or input.shape[-1] < 1:
        raise ShapeMismatchError(f"adaptive_max_pool1d: output size {out} for an input of shape "
                                 f"{list(input.shape)}; both must be positive")
    result = adaptive_max_pool2d(input.unsqueeze(-2), (1, out), return_indices)
    results = result if return_indices else (result,)
    results = tuple(fresh(r.squeeze(-2)) for r in results)
    return results if return_indices else results[0]
