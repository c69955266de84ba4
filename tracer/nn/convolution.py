"""Convolutions and padding for `tr.nn.functional`: conv1d, conv2d, conv_transpose2d, pad.

A convolution is one matrix product of the weight with the input's windows (im2col): a single
gather reads, for every input channel, kernel offset, image and output position, the input
element under it (`windows`), laid out (channels * kernel offsets, images * output positions),
so that weight (out_channels, channels * kernel offsets) @ windows is one gemm into the BLAS
whatever the stride, padding or dilation. The gather's gradient is a scatter-add (col2im), the
weight's gradient one more gemm. The product comes out (out_channels, images, positions); the
transpose to PyTorch's (images, out_channels, positions) is computed in the loop that adds the
bias and whatever elementwise function follows (a batch norm in eval, an activation), so the
result is written once. Groups are a batch of products; a depthwise convolution (one input
channel per group) is a multiply and a sum over the kernel offsets instead, which fuse into one
loop over the output.
"""
from __future__ import annotations

import numbers

from tracer.ir import types as irtypes
from tracer.creation import iota
from tracer.dispatch import apply, as_tensor
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.arithmetic import where
from tracer.layout import fresh
from tracer.tensor import Tensor


def pair(value, count: int, what: str) -> tuple[int, ...]:
    """An int or a sequence of `count` ints (PyTorch's _pair / _single), checked."""
    values = (value,) * count if isinstance(value, numbers.Integral) else tuple(value)
    if len(values) != count or not all(isinstance(v, numbers.Integral) for v in values):
        raise ArgumentError(f"{what} takes an int or {count} ints, got {value!r}")
    return tuple(int(v) for v in values)


def output_size(size: int, kernel: int, stride: int, low: int, high: int, dilation: int) -> int:
    return (size + low + high - dilation * (kernel - 1) - 1) // stride + 1


def windows(x: Tensor, kernel, stride, dilation, out, order: str) -> Tensor:
    """The elements of x (N, C, H, W) under each kernel offset at each output position, gathered
    into the layout `order`, a string over n c h w i j (h, w: kernel offsets; i, j: output
    rows and columns), e.g. "chwnij". x is read at (i * stride + h * dilation) along H and
    likewise along W: every index lies inside x (padding is done before)."""
    sizes = {"n": x.shape[0], "c": x.shape[1], "h": kernel[0], "w": kernel[1],
             "i": out[0], "j": out[1]}
    return apply("gather", [x, *window_indices(sizes, order, stride, dilation)],
                 axes=(0, 1, 2, 3))


def window_indices(sizes: dict[str, int], order: str, stride, dilation,
                   first=(0, 0)) -> list[Tensor]:
    """The (image, channel, row, column) indices, laid out as `order` (see `windows`; `sizes`
    by letter), of the element under kernel offset (h, w) at window (i, j): row
    (i + first[0]) * stride + h * dilation, and likewise the column."""
    shape = tuple(sizes[letter] for letter in order)

    def line(letter: str) -> Tensor:
        position = order.index(letter)
        line_shape = tuple(size if k == position else 1 for k, size in enumerate(shape))
        return iota(line_shape, position)

    places = []
    for window, offset, start, step, spacing in (("i", "h", first[0], stride[0], dilation[0]),
                                                 ("j", "w", first[1], stride[1], dilation[1])):
        place = line(window) * step + line(offset) * spacing
        places.append(place + start * step if start else place)
    return [line("n"), line("c"), *places]


def constant_pad(x: Tensor, low, high, value) -> Tensor:
    """x padded with `value` by low[d] before and high[d] after dimension d; a negative amount
    crops, as PyTorch's constant padding does."""
    starts = [max(0, -a) for a in low]
    stops = [size - max(0, -b) for size, b in zip(x.shape, high)]
    if any(a or b for a, b in zip(starts, (s - t for s, t in zip(x.shape, stops)))):
        if any(start > stop for start, stop in zip(starts, stops)):
            raise ShapeMismatchError(f"pad: cropping {list(low)}/{list(high)} leaves nothing of "
                                     f"shape {list(x.shape)}")
        x = apply("slice", [x], starts=starts, stops=stops, steps=[1] * x.ndim)
    low, high = [max(0, a) for a in low], [max(0, b) for b in high]
    if not any(low) and not any(high):
        return x
    padded = apply("pad", [x], low=low, high=high, interior=[0] * x.ndim)
    if value == 0 or value is None:
        return padded
    inside = apply("pad", [as_tensor(True).expand(*x.shape)], low=low, high=high,
                   interior=[0] * x.ndim)
    return where(inside, padded, as_tensor(value).to(x.dtype))


def _source_index(mode: str, size: int, low: int, count: int) -> Tensor:
    """For each of `count` output positions along a dimension padded by `low` in front, the
    position of x it copies (reflect, replicate or circular padding)."""
    position = iota((count,), 0) - low
    if mode == "replicate":
        return position.clamp(0, size - 1)
    if mode == "circular":
        return position % size
    period = 2 * (size - 1)  # reflect: ... 2 1 | 0 1 2 ... n-1 | n-2 ...
    folded = position.abs() % max(period, 1)
    return where(folded >= size, period - folded, folded)


def pad(input: Tensor, pad, mode: str = "constant", value=None) -> Tensor:
    """PyTorch's F.pad: `pad` lists (before, after) amounts from the last dimension backwards.
    Modes: constant (with `value`; negative amounts crop), reflect, replicate, circular."""
    amounts = [int(a) for a in pad]
    if len(amounts) % 2 or len(amounts) // 2 > input.ndim:
        raise ArgumentError(f"pad takes pairs of amounts for at most {input.ndim} dimensions, "
                            f"got {list(pad)}")
    low, high = [0] * input.ndim, [0] * input.ndim
    for k in range(len(amounts) // 2):
        low[input.ndim - 1 - k], high[input.ndim - 1 - k] = amounts[2 * k], amounts[2 * k + 1]
    if not any(low) and not any(high):
        return input.clone()  # a new tensor, as PyTorch's
    if mode == "constant":
        return constant_pad(input, low, high, value)
    if mode not in ("reflect", "replicate", "circular"):
        raise ArgumentError(f"pad: mode is 'constant', 'reflect', 'replicate' or 'circular', "
                            f"got {mode!r}")
    if value not in (None, 0):
        raise ArgumentError(f"pad: a value is only for mode 'constant', not {mode!r}")
    result = input
    for axis in range(input.ndim):
        if not (low[axis] or high[axis]):
            continue
        size = input.shape[axis]
        limit = size - 1 if mode == "reflect" else size
        if min(low[axis], high[axis]) < 0 or max(low[axis], high[axis]) > limit:
            raise ArgumentError(f"pad: {mode} padding of {low[axis]} and {high[axis]} for a "
                                f"dimension of size {size}; each must lie in [0, {limit}]")
        count = size + low[axis] + high[axis]
        result = result.index_select(axis, _source_index(mode, size, low[axis], count))
    return result


def _check_operands(name: str, input: Tensor, weight: Tensor, bias, spatial: int) -> None:
    if not isinstance(input, Tensor) or not isinstance(weight, Tensor):
        raise ArgumentError(f"{name} takes tensors for input and weight")
    if input.ndim != spatial + 2 or weight.ndim != spatial + 2:
        raise ShapeMismatchError(f"{name} needs a {spatial + 2}-d input (batch, channels, ...) "
                                 f"and weight, got shapes {list(input.shape)} and "
                                 f"{list(weight.shape)}")
    if not irtypes.is_float(input.dtype) or input.dtype != weight.dtype or (
            bias is not None and bias.dtype != input.dtype):
        raise ArgumentError(f"{name}: input, weight and bias must be float tensors of one dtype, "
                            f"got {input.dtype} and {weight.dtype}; convert with .to(...)")


def padding_amounts(padding, kernel, stride, dilation, name: str) -> tuple[list[int], list[int]]:
    """(low, high) padding per spatial dimension; 'same' pads the odd one after, as PyTorch."""
    if padding == "valid":
        return [0, 0], [0, 0]
    if padding == "same":
        if stride != (1, 1):
            raise ArgumentError(f"{name}: padding='same' is not supported for strided "
                                f"convolutions (as in PyTorch); give the padding in numbers")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return [t // 2 for t in total], [t - t // 2 for t in total]
    if isinstance(padding, str):
        raise ArgumentError(f"{name}: padding is 'valid', 'same' or numbers, got {padding!r}")
    amounts = list(pair(padding, 2, f"{name} padding"))
    if min(amounts) < 0:
        raise ArgumentError(f"{name}: negative padding {amounts}")
    return amounts, amounts


def _check_bias(name: str, bias, out_channels: int) -> None:
    if bias is not None and bias.shape != (out_channels,):
        raise ShapeMismatchError(f"{name}: a bias of shape {list(bias.shape)} for "
                                 f"{out_channels} output channels")


def _convolve(input: Tensor, weight: Tensor, bias, stride, low, high, dilation, groups: int,
              name: str) -> Tensor:
    """The 2-d convolution of input (N, C, H, W) with weight (O, C / groups, KH, KW)."""
    batch, channels = input.shape[:2]
    out_channels, group_channels = weight.shape[:2]
    kernel = weight.shape[2:]
    if (not isinstance(groups, numbers.Integral) or groups < 1 or channels % groups
            or out_channels % groups or group_channels * groups != channels):
        raise ShapeMismatchError(
            f"{name}: a weight of shape {list(weight.shape)} with groups={groups} for an input "
            f"of {channels} channels (shape {list(input.shape)}): the weight needs "
            f"channels / groups in dimension 1 and out_channels divisible by groups")
    if min(*stride, *dilation) < 1:
        raise ArgumentError(f"{name}: stride and dilation must be positive, got {stride} and "
                            f"{dilation}")
    out = tuple(output_size(input.shape[2 + k], kernel[k], stride[k], low[k], high[k],
                            dilation[k]) for k in range(2))
    if min(out) < 1:
        raise ShapeMismatchError(f"{name}: the kernel {list(kernel)} (dilation {list(dilation)}) "
                                 f"is larger than the padded input {list(input.shape[2:])}")
    _check_bias(name, bias, out_channels)
    padded = constant_pad(input, [0, 0, *low], [0, 0, *high], 0)
    if group_channels == 1 and out_channels == groups:
        # depthwise: out[n, c, i, j] = sum over offsets of weight[c, h, w] * window
        cells = windows(padded, kernel, stride, dilation, out, "ncijhw")
        taps = weight.reshape(1, channels, 1, 1, kernel[0], kernel[1])
        result = (cells * taps).sum((4, 5))
    else:
        cells = windows(padded, kernel, stride, dilation, out, "chwnij")
        depth = group_channels * kernel[0] * kernel[1]
        columns = batch * out[0] * out[1]
        if groups == 1:
            product = weight.reshape(out_channels, depth).matmul(cells.reshape(depth, columns))
        else:
            product = weight.reshape(groups, out_channels // groups, depth).matmul(
                cells.reshape(groups, depth, columns))
        result = product.reshape(out_channels, batch, *out).permute(1, 0, 2, 3)
    if bias is not None:
        result = result + bias.reshape(out_channels, 1, 1)
    return fresh(result)  # a new tensor, as PyTorch's (not a view-copy of the product)


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1) -> Tensor:
    """PyTorch's F.conv2d: input (N, C, H, W), weight (O, C / groups, KH, KW)."""
    _check_operands("conv2d", input, weight, bias, 2)
    stride, dilation = pair(stride, 2, "conv2d stride"), pair(dilation, 2, "conv2d dilation")
    low, high = padding_amounts(padding, weight.shape[2:], stride, dilation, "conv2d")
    return _convolve(input, weight, bias, stride, low, high, dilation, groups, "conv2d")


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1) -> Tensor:
    """PyTorch's F.conv1d: input (N, C, L), weight (O, C / groups, K); a conv2d of height 1."""
    _check_operands("conv1d", input, weight, bias, 1)
    stride = (1, *pair(stride, 1, "conv1d stride"))
    dilation = (1, *pair(dilation, 1, "conv1d dilation"))
    if isinstance(padding, str):
        low, high = padding_amounts(padding, (1, weight.shape[2]), stride, dilation, "conv1d")
    else:
        amount = pair(padding, 1, "conv1d padding")[0]
        low = high = [0, amount]
    result = _convolve(input.unsqueeze(2), weight.unsqueeze(2), bias, stride, low, high,
                       dilation, groups, "conv1d")
    return fresh(result.squeeze(2))


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1,
                     padding=0, output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """PyTorch's F.conv_transpose2d: input (N, C, H, W), weight (C, O / groups, KH, KW).
    Computed as PyTorch computes it, the gradient of conv2d with respect to its input: one
    product of the weight with the input, each column of it added into the output positions its
    kernel offsets reach (col2im, a scatter-add), the padding then cropped. So the weight's
    gradient reads the output's gradient only where an input element reached (a gather of it),
    never a zero of a spread-out input against an infinite gradient (NaN where PyTorch's is
    finite; found by the long differential run)."""
    _check_operands("conv_transpose2d", input, weight, bias, 2)
    stride = pair(stride, 2, "conv_transpose2d stride")
    dilation = pair(dilation, 2, "conv_transpose2d dilation")
    padding = pair(padding, 2, "conv_transpose2d padding")
    output_padding = pair(output_padding, 2, "conv_transpose2d output_padding")
    batch, channels, *size = input.shape
    if weight.shape[0] != channels or groups < 1 or channels % groups:
        raise ShapeMismatchError(f"conv_transpose2d: a weight of shape {list(weight.shape)} with "
                                 f"groups={groups} for an input of {channels} channels")
    if min(*stride, *dilation) < 1 or min(padding) < 0:
        raise ArgumentError(f"conv_transpose2d: stride and dilation must be positive and padding "
                            f"not negative, got {stride}, {dilation} and {padding}")
    if any(p >= max(s, d) for p, s, d in zip(output_padding, stride, dilation)):
        raise ArgumentError(f"conv_transpose2d: output_padding {list(output_padding)} must be "
                            f"smaller than the stride or the dilation")
    kernel = weight.shape[2:]
    group_out = weight.shape[1]
    out_channels = groups * group_out
    # every position an input element reaches, before the padding is cropped
    full = [(n - 1) * s + d * (k - 1) + extra + 1
            for n, s, d, k, extra in zip(size, stride, dilation, kernel, output_padding)]
    out = [f - 2 * p for f, p in zip(full, padding)]
    if min(out) < 1:
        raise ShapeMismatchError(f"conv_transpose2d: padding {list(padding)} leaves no output of "
                                 f"an input {list(size)} with kernel {list(kernel)}")
    _check_bias("conv_transpose2d", bias, out_channels)
    # Input rows (and columns) whose every kernel offset lands in the cropped padding reach no
    # output: left out, their gradient is exactly 0 even where the weight holds a nan (F34 in
    # docs/findings.md; PyTorch's is nan there, from the padded zeros times the weight).
    first = [max(0, -(-(p - d * (k - 1)) // s))
             for p, d, k, s in zip(padding, dilation, kernel, stride)]
    stop = [min(n, -(-(o + p) // s)) for n, o, p, s in zip(size, out, padding, stride)]
    if first != [0, 0] or stop != size:
        input = apply("slice", [input], starts=[0, 0, *first], stops=[batch, channels, *stop],
                      steps=[1] * 4)
        size = stop[0] - first[0], stop[1] - first[1]
    depth = group_out * kernel[0] * kernel[1]
    pixels = batch * size[0] * size[1]
    # (C, N, H, W) as (groups, C / groups, N * H * W); weight (groups, C / groups, O/g * KH * KW)
    columns = input.permute(1, 0, 2, 3).reshape(groups, channels // groups, pixels)
    product = weight.reshape(groups, channels // groups, depth).transpose(1, 2).matmul(columns)
    # (output channel, kernel row, kernel column, image, input row, column): added at the
    # positions a convolution's windows read (see `windows`)
    order = "chwnij"
    spread = product.reshape(out_channels, *kernel, batch, *size)
    sizes = {"n": batch, "c": out_channels, "h": kernel[0], "w": kernel[1], "i": size[0],
             "j": size[1]}
    indices = window_indices(sizes, order, stride, dilation, first)
    target = as_tensor(0.0).to(input.dtype).expand(batch, out_channels, *full)
    result = apply("scatter", [target, spread, *indices], axes=(0, 1, 2, 3), accumulate=True)
    if any(padding):
        result = apply("slice", [result], starts=[0, 0, *padding],
                       stops=[batch, out_channels, *(p + n for p, n in zip(padding, out))],
                       steps=[1] * 4)
    if bias is not None:
        result = result + bias.reshape(out_channels, 1, 1)
    return fresh(result)
