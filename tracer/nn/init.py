"""`tr.nn.init`: PyTorch's initializations, in place under no_grad, with its fan and gain
formulas (torch/nn/init.py); the numbers come from `tr.default_generator` (seeded by
tr.manual_seed) or `generator=`, through `Tensor.uniform_` and `Tensor.normal_`."""
from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from tracer.context import no_grad
from tracer.arithmetic import where
from tracer.creation import empty_like, tensor as make_tensor
from tracer.ops import empty
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.random import Generator
from tracer.tensor import Tensor

_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "sigmoid")


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for `nonlinearity` (PyTorch's table): 1 for linear layers and
    sigmoid, 5/3 for tanh, sqrt(2) for relu, sqrt(2 / (1 + slope**2)) for leaky_relu (slope
    `param`, 0.01 by default), 3/4 for selu."""
    if nonlinearity in _LINEAR:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, numbers.Real) and not isinstance(param, bool):
            slope = param
        else:
            raise ArgumentError(f"negative_slope {param!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ArgumentError(f"unsupported nonlinearity {nonlinearity!r}")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight (out, in, *kernel): in and out times the kernel's size."""
    if tensor.ndim < 2:
        raise ShapeMismatchError(f"fan in and fan out need a tensor of at least 2 dimensions, "
                                 f"got {tensor.ndim}")
    receptive_field = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive_field, tensor.shape[0] * receptive_field


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ArgumentError(f"mode {mode!r} is not supported, use 'fan_in' or 'fan_out'")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0,
             generator: Generator | None = None) -> Tensor:
    """Fill with numbers uniform in [a, b)."""
    with no_grad():
        return tensor.uniform_(a, b, generator=generator)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0,
            generator: Generator | None = None) -> Tensor:
    """Fill with numbers from N(mean, std**2)."""
    with no_grad():
        return tensor.normal_(mean, std, generator=generator)


def constant_(tensor: Tensor, val: float) -> Tensor:
    with no_grad():
        return tensor.fill_(val)


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0.0)


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def xavier_uniform_(tensor: Tensor, gain: float = 1.0,
                    generator: Generator | None = None) -> Tensor:
    """Glorot's uniform initialization: bound gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0,
                   generator: Generator | None = None) -> Tensor:
    """Glorot's normal initialization: std gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def _kaiming_std(tensor: Tensor, a: float, mode: str, nonlinearity: str) -> float | None:
    if 0 in tensor.shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=3)
        return None
    fan = _calculate_correct_fan(tensor, mode)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu",
                     generator: Generator | None = None) -> Tensor:
    """He's uniform initialization: bound gain * sqrt(3 / fan), the gain of `nonlinearity` with
    negative slope `a`, the fan of `mode`."""
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    if std is None:
        return tensor
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu",
                    generator: Generator | None = None) -> Tensor:
    """He's normal initialization: std gain / sqrt(fan)."""
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    if std is None:
        return tensor
    return normal_(tensor, 0.0, std, generator)


def _normal_cdf(x: float) -> float:
    return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0,
                  b: float = 2.0, generator: Generator | None = None) -> Tensor:
    """Fill with numbers from N(mean, std**2) truncated to [a, b], by PyTorch 2.13's rejection
    sampling: normal draws redrawn outside [a, b] where [a, b] holds more than 0.3 of the
    distribution; else uniform draws in [a, b] accepted with probability pdf / its peak."""
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. The "
                      "distribution of values may be incorrect.", stacklevel=2)
    with no_grad():
        if _normal_cdf((b - mean) / std) - _normal_cdf((a - mean) / std) > 0.3:
            # the bounds in the tensor's dtype, so the mask agrees with the values it can hold
            low, high = (make_tensor(bound, dtype=tensor.dtype).item() for bound in (a, b))
            result = empty_like(tensor).normal_(mean, std, generator=generator)
            while (outside := (result < low) | (result > high)).any():
                result = where(outside, empty_like(tensor).normal_(mean, std,
                                                                     generator=generator), result)
            return tensor.copy_(result)
        log_peak = -0.5 * ((max(a, min(mean, b)) - mean) / std) ** 2

        def rejected(candidates: Tensor) -> Tensor:
            log_density = -0.5 * ((candidates - mean) / std) ** 2 - log_peak
            return empty_like(tensor).uniform_(generator=generator).log() > log_density

        result = empty_like(tensor).uniform_(a, b, generator=generator)
        pending = rejected(result)
        while pending.any():
            candidates = empty_like(tensor).uniform_(a, b, generator=generator)
            result = where(pending, candidates, result)
            pending = where(pending, rejected(candidates), pending)
        return tensor.copy_(result)


def orthogonal_(tensor: Tensor, gain: float = 1.0, generator: Generator | None = None) -> Tensor:
    """Fill with a (semi-)orthogonal matrix, the tensor seen as (size(0), the rest) times `gain`:
    PyTorch's construction, Q of the QR factorization of a standard normal draw, its columns'
    signs those of R's diagonal (so that Q is uniform over orthogonal matrices). The
    factorization is numpy's (LAPACK's Householder QR, as torch.linalg.qr) in float64."""
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    columns = tensor.numel() // rows
    drawn = empty(rows, columns, dtype=tensor.dtype).normal_(0, 1, generator=generator)
    matrix = drawn.numpy().astype(np.float64)
    matrix = matrix.T if rows < columns else matrix
    q, r = np.linalg.qr(matrix)
    q *= np.sign(np.diag(r))
    q = q.T if rows < columns else q
    with no_grad():
        tensor.copy_(make_tensor(q, dtype=tensor.dtype).view_as(tensor))
        tensor.mul_(gain)
    return tensor
