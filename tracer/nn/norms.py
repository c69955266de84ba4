"""Group, instance and RMS normalization: `tr.nn.functional.group_norm`, `instance_norm` and
`rms_norm`, with PyTorch's checks and errors (the modules are in norm_layers.py).

Group and instance norm normalize like batch norm (mean and biased variance, then 1 / sqrt(var +
eps)) over other dimensions: a group of channels of one sample, or one channel of one sample. The
mean is `row_mean`'s, exact for a constant row as PyTorch's (whose kernels would otherwise give
rounding noise times 1 / sqrt(eps) where they give 0). Instance norm's running statistics are
updated as PyTorch's (which runs batch norm over N * C channels and averages its N updates): by
the average over the samples of each channel's mean and unbiased variance."""
from __future__ import annotations

import builtins
import math

import numpy as np

from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.ir import types as irtypes
from tracer.layout import fresh
from tracer.nn.normalization import _along_channels, _update_running, batch_norm
from tracer.tensor import Tensor
from tracer.variance import row_mean


def _standardized(input: Tensor, axes: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor,
                                                                                 Tensor]:
    """(input - mean) / sqrt(variance + eps) over `axes`, with the mean and biased variance."""
    mean = row_mean(input, axes)
    centered = input - mean
    variance = (centered * centered).mean(axes, keepdim=True)
    return centered * (1.0 / (variance + eps).sqrt()), mean, variance


def _affine(result: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    if weight is not None:
        result = result * _along_channels(weight, result.ndim)
    return result if bias is None else result + _along_channels(bias, result.ndim)


def _check_float(input: Tensor, what: str) -> None:
    if not irtypes.is_float(input.dtype):
        raise ArgumentError(f"{what} needs a float input, got {input.dtype}")


def _check_channels(what: str, input: Tensor, **vectors: Tensor | None) -> None:
    channels = input.shape[1]
    for name, value in vectors.items():
        if value is not None and value.shape != (channels,):
            raise ShapeMismatchError(f"{what}: {name} of shape {list(value.shape)} for an input "
                                     f"of {channels} channels (shape {list(input.shape)})")


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """PyTorch's F.group_norm: the channels of an input (N, C, ...) in `num_groups` groups of
    consecutive channels, each group of each sample normalized, then a per-channel scale and
    shift."""
    if input.ndim < 2:
        raise ShapeMismatchError(f"group_norm needs an input (N, C, ...) of at least 2 "
                                 f"dimensions, got shape {list(input.shape)}")
    _check_float(input, "group_norm")
    batch, channels = input.shape[:2]
    if num_groups <= 0 or channels % num_groups:
        raise ShapeMismatchError(f"group_norm: the {channels} channels of the input (shape "
                                 f"{list(input.shape)}) are not divisible into {num_groups} groups")
    _check_channels("group_norm", input, weight=weight, bias=bias)
    # PyTorch's check, of the sizes it hands to batch norm: (N * C / G, G, *spatial)
    if batch * channels // num_groups * math.prod(input.shape[2:]) == 1:
        raise ShapeMismatchError(f"group_norm: expected more than 1 value per channel when "
                                 f"training, got input of shape {list(input.shape)}")
    per_group = channels // num_groups * math.prod(input.shape[2:])
    grouped = input.reshape(batch, num_groups, per_group)
    result = _standardized(grouped, (2,), eps)[0].reshape(input.shape)
    return fresh(_affine(result, weight, bias))  # (a new tensor, not a view-copy of the reshape)


def instance_norm(input: Tensor, running_mean: Tensor | None = None,
                  running_var: Tensor | None = None, weight: Tensor | None = None,
                  bias: Tensor | None = None, use_input_stats: builtins.bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """PyTorch's F.instance_norm: each channel of each sample of an input (N, C, ...) normalized
    over its spatial dimensions (`use_input_stats`), the running statistics if given updated in
    place; or, with use_input_stats=False, normalized by the running statistics."""
    if input.ndim < 2:
        raise ShapeMismatchError(f"instance_norm needs an input (N, C, ...), got shape "
                                 f"{list(input.shape)}")
    _check_float(input, "instance_norm")
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise ArgumentError("instance_norm with use_input_stats=False needs running_mean "
                                "and running_var")
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    count = math.prod(input.shape[2:])
    if count == 1:
        raise ShapeMismatchError(f"instance_norm: expected more than 1 spatial element when "
                                 f"training, got input of shape {list(input.shape)}")
    _check_channels("instance_norm", input, running_mean=running_mean, running_var=running_var,
                    weight=weight, bias=bias)
    axes = tuple(range(2, input.ndim))
    # in float64 for a float32 input, as PyTorch's CPU kernel (batch norm's) accumulates: its
    # gradient cancels terms of 1 / std to values 3000 times smaller at a row such as
    # (1, -89, 0.5), where float32's rounding of the terms would be the gradient's 1e-4
    work = input.double() if input.dtype == irtypes.float32 else input
    result, mean, variance = _standardized(work, axes, eps)
    result = result.to(input.dtype)
    if running_mean is not None or running_var is not None:
        channels = input.shape[1]
        unbiased = variance.reshape(-1, channels) * (count / (count - 1))
        _update_running(running_mean, running_var, mean.reshape(-1, channels).mean(0),
                        unbiased.mean(0), momentum)
    return _affine(result, weight, bias)


def _shape_tuple(normalized_shape) -> tuple[int, ...]:
    return ((normalized_shape,) if isinstance(normalized_shape, int)
            else tuple(normalized_shape))


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """PyTorch's F.rms_norm: input / sqrt(mean(input^2) + eps) over the last
    len(normalized_shape) dimensions, times `weight`; eps None is the input dtype's epsilon."""
    normalized_shape = _shape_tuple(normalized_shape)
    count = len(normalized_shape)
    if count == 0 or input.shape[input.ndim - count:] != normalized_shape:
        raise ShapeMismatchError(f"rms_norm over {list(normalized_shape)} for an input of shape "
                                 f"{list(input.shape)}: its last dimensions must match")
    _check_float(input, "rms_norm")
    if weight is not None and weight.shape != normalized_shape:
        raise ShapeMismatchError(f"rms_norm: weight of shape {list(weight.shape)} for "
                                 f"normalized_shape {list(normalized_shape)}")
    eps = float(np.finfo(input.dtype).eps) if eps is None else eps
    dims = tuple(range(input.ndim - count, input.ndim))
    result = input * (1.0 / ((input * input).mean(dims, keepdim=True) + eps).sqrt())
    return result if weight is None else result * weight
