"""Batch normalization: `tr.nn.functional.batch_norm` (the BatchNorm modules are in layers.py).

In training the input is normalized by its own statistics over every dimension but the channels
(dimension 1): the mean and the biased variance. The running statistics, if given, are updated in
place, as PyTorch's: running = (1 - momentum) * running + momentum * batch statistic, where the
variance is the unbiased one (n / (n - 1) times the biased). In eval the running statistics
normalize, and the whole layer is one multiply-add per element that fuses into the loop writing
the convolution's output. Traced, the running statistics are runtime inputs updated in place like
any tensor a traced function reads from a module (and num_batches_tracked counts on the same way).
"""
from __future__ import annotations

import builtins

from tracer.ir import types as irtypes
from tracer.context import no_grad
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.tensor import Tensor


def _along_channels(value: Tensor, ndim: int) -> Tensor:
    """A per-channel vector shaped to broadcast along dimension 1 of an ndim-d input."""
    return value.reshape(value.shape[0], *(1,) * (ndim - 2))


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None,
               training: builtins.bool = False, momentum=0.1, eps: float = 1e-5) -> Tensor:
    """PyTorch's F.batch_norm over an input (N, C, ...); `momentum` may be a 0-d tensor (what
    BatchNorm with momentum=None passes: 1 / num_batches_tracked)."""
    if input.ndim < 2:
        raise ShapeMismatchError(f"batch_norm needs an input (N, C, ...), got shape "
                                 f"{list(input.shape)}")
    if not irtypes.is_float(input.dtype):
        raise ArgumentError(f"batch_norm needs a float input, got {input.dtype}")
    channels = input.shape[1]
    for name, value in (("running_mean", running_mean), ("running_var", running_var),
                        ("weight", weight), ("bias", bias)):
        if value is not None and value.shape != (channels,):
            raise ShapeMismatchError(f"batch_norm: {name} of shape {list(value.shape)} for an "
                                     f"input of {channels} channels (shape {list(input.shape)})")
    axes = (0, *range(2, input.ndim))
    if training:
        count = input.numel() // max(channels, 1)
        if count <= 1:
            raise ShapeMismatchError(f"batch_norm: expected more than 1 value per channel when "
                                     f"training, got input of shape {list(input.shape)}")
        mean = input.mean(axes, keepdim=True)
        centered = input - mean
        variance = (centered * centered).mean(axes, keepdim=True)
        if running_mean is not None or running_var is not None:
            _update_running(running_mean, running_var, mean.reshape(channels),
                            variance.reshape(channels) * (count / (count - 1)), momentum)
    else:
        if running_mean is None or running_var is None:
            raise ArgumentError("batch_norm in eval mode (training=False) needs running_mean "
                                "and running_var")
        centered = input - _along_channels(running_mean, input.ndim)
        variance = _along_channels(running_var, input.ndim)
    result = centered * (1.0 / (variance + eps).sqrt())
    if weight is not None:
        result = result * _along_channels(weight, input.ndim)
    if bias is not None:
        result = result + _along_channels(bias, input.ndim)
    return result


def _update_running(running_mean, running_var, mean: Tensor, unbiased: Tensor,
                    momentum) -> None:
    """PyTorch's update: momentum * statistic + (1 - momentum) * running, in place."""
    with no_grad():
        for running, statistic in ((running_mean, mean), (running_var, unbiased)):
            if running is not None:
                statistic = statistic.detach().to(running.dtype)
                running.copy_(momentum * statistic + (1 - momentum) * running)
