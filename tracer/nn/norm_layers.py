"""`tr.nn`'s GroupNorm, InstanceNorm1d, InstanceNorm2d and RMSNorm (their functions are in
norms.py), with PyTorch's parameters, buffers, names, defaults and extra_repr."""
from __future__ import annotations

import builtins
import warnings

from tracer.creation import ones, zeros
from tracer.dtypes import float32, int64
from tracer.errors import ShapeMismatchError
from tracer.nn.modules import Module, Parameter
from tracer.nn.norms import _shape_tuple, group_norm, instance_norm, rms_norm
from tracer.tensor import Tensor


class GroupNorm(Module):
    """Group normalization of an input (N, C, ...): weight (ones) and bias (zeros) per channel."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: builtins.bool = True, dtype=None, *, bias: builtins.bool = True) -> None:
        super().__init__()
        if num_groups <= 0 or num_channels % num_groups:
            raise ShapeMismatchError(f"GroupNorm: num_channels ({num_channels}) must be "
                                     f"divisible by num_groups ({num_groups})")
        dtype = float32 if dtype is None else dtype
        self.num_groups, self.num_channels, self.eps, self.affine = (num_groups, num_channels,
                                                                      eps, affine)
        self.weight = Parameter(ones(num_channels, dtype=dtype)) if affine else None
        self.bias = Parameter(zeros(num_channels, dtype=dtype)) if affine and bias else None

    def forward(self, input: Tensor) -> Tensor:
        return group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")


class _InstanceNorm(Module):
    """InstanceNorm's parameters and buffers, named and ordered as PyTorch's: weight (ones) and
    bias (zeros) if affine; running_mean (zeros), running_var (ones) and num_batches_tracked
    (which instance norm never counts, as in PyTorch) if track_running_stats."""

    dimensions = 3  # of a batched input; one fewer is a single sample

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: builtins.bool = False, track_running_stats: builtins.bool = False,
                 dtype=None, *, bias: builtins.bool = True) -> None:
        super().__init__()
        dtype = float32 if dtype is None else dtype
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(zeros(num_features, dtype=dtype)) if affine and bias else None
        tracked = track_running_stats
        self.register_buffer("running_mean", zeros(num_features, dtype=dtype) if tracked else None)
        self.register_buffer("running_var", ones(num_features, dtype=dtype) if tracked else None)
        self.register_buffer("num_batches_tracked", zeros((), dtype=int64) if tracked else None)

    def forward(self, input: Tensor) -> Tensor:
        if input.ndim not in (self.dimensions - 1, self.dimensions):
            raise ShapeMismatchError(f"{type(self).__name__} expects an input of "
                                     f"{self.dimensions - 1} or {self.dimensions} dimensions, got "
                                     f"shape {list(input.shape)}")
        single = input.ndim == self.dimensions - 1
        channels = input.shape[0 if single else 1]
        if channels != self.num_features and not self.affine:
            warnings.warn(f"{type(self).__name__}: the input has {channels} channels, not "
                          f"num_features={self.num_features} (unused, as affine=False)",
                          stacklevel=2)
        elif channels != self.num_features:
            raise ShapeMismatchError(f"{type(self).__name__}: the input has {channels} channels "
                                     f"(shape {list(input.shape)}), num_features is "
                                     f"{self.num_features}")
        result = instance_norm(input.unsqueeze(0) if single else input, self.running_mean,
                               self.running_var, self.weight, self.bias,
                               self.training or not self.track_running_stats,
                               0.0 if self.momentum is None else self.momentum, self.eps)
        return result.squeeze(0) if single else result

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")


class InstanceNorm1d(_InstanceNorm):
    """Instance normalization of an input (N, C, L) or (C, L)."""


class InstanceNorm2d(_InstanceNorm):
    """Instance normalization of an input (N, C, H, W) or (C, H, W)."""

    dimensions = 4


class RMSNorm(Module):
    """Root-mean-square normalization over the last dimensions `normalized_shape`, times a weight
    (ones) if elementwise_affine; eps None is the input dtype's epsilon."""

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: builtins.bool = True, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        dtype = float32 if dtype is None else dtype
        self.weight = (Parameter(ones(*self.normalized_shape, dtype=dtype))
                       if elementwise_affine else None)

    def forward(self, input: Tensor) -> Tensor:
        return rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")
