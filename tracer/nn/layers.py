"""`tr.nn`'s convolution, pooling, batch-norm and embedding-bag modules: Conv1d, Conv2d,
ConvTranspose2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, BatchNorm1d, BatchNorm2d,
EmbeddingBag, with PyTorch's parameters, defaults and initialization: weight and
bias uniform in +-1/sqrt(fan_in) (kaiming_uniform with a = sqrt 5), fan_in = the weight's
dimension 1 times the kernel's size (in_channels / groups for a convolution, out_channels /
groups for a transposed one)."""
from __future__ import annotations

import builtins
import math

from tracer.context import no_grad
from tracer.creation import ones, zeros
from tracer.dtypes import float32, int64
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.layout import fresh
from tracer.nn.convolution import conv2d, conv_transpose2d, pad, padding_amounts, pair
from tracer.nn.embedding_bag import check_options, embedding_bag
from tracer.nn.embedding_rows import padding_index, pretrained_shape, table
from tracer.nn.modules import Module, Parameter, _uniform
from tracer.nn.normalization import batch_norm
from tracer.nn.pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from tracer.tensor import Tensor

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


class _ConvNd(Module):
    """Conv1d and Conv2d: weight (out_channels, in_channels / groups, *kernel_size)."""

    spatial = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: builtins.bool = True,
                 padding_mode: str = "zeros", dtype=None) -> None:
        super().__init__()
        name = type(self).__name__
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ArgumentError(f"{name}: in_channels ({in_channels}) and out_channels "
                                f"({out_channels}) must be divisible by groups ({groups})")
        if padding_mode not in _PADDING_MODES:
            raise ArgumentError(f"{name}: padding_mode is one of {list(_PADDING_MODES)}, got "
                                f"{padding_mode!r}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = pair(kernel_size, self.spatial, f"{name} kernel_size")
        self.stride = pair(stride, self.spatial, f"{name} stride")
        self.dilation = pair(dilation, self.spatial, f"{name} dilation")
        self.padding = padding if isinstance(padding, str) else pair(
            padding, self.spatial, f"{name} padding")
        self.padding_mode = padding_mode
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        self.weight = Parameter(_uniform((out_channels, in_channels // groups, *self.kernel_size),
                                         bound, dtype))
        self.bias = Parameter(_uniform((out_channels,), bound, dtype)) if bias else None

    def _as_2d(self, values: tuple[int, ...], one: int) -> tuple[int, ...]:
        return values if self.spatial == 2 else (one, *values)

    def forward(self, input: Tensor) -> Tensor:
        unbatched = input.ndim == self.spatial + 1  # PyTorch takes (C, ...) too
        x = input.unsqueeze(0) if unbatched else input
        weight, padding = self.weight, self.padding
        if self.spatial == 1:
            x, weight = x.unsqueeze(2), weight.unsqueeze(2)
        if self.padding_mode != "zeros" and padding != "valid":
            # (PyTorch pads in the mode first, then convolves without padding)
            numbers = padding if isinstance(padding, str) else self._as_2d(padding, 0)
            low, high = padding_amounts(numbers, self._as_2d(self.kernel_size, 1),
                                        self._as_2d(self.stride, 1), self._as_2d(self.dilation, 1),
                                        type(self).__name__)
            amounts = [a for before, after in zip(reversed(low), reversed(high))
                       for a in (before, after)]
            x, padding = pad(x, amounts, self.padding_mode), 0
        elif not isinstance(padding, str):
            padding = self._as_2d(padding, 0)
        result = conv2d(x, weight, self.bias, self._as_2d(self.stride, 1), padding,
                        self._as_2d(self.dilation, 1), self.groups)
        if self.spatial == 1:
            result = result.squeeze(2)
        return fresh(result.squeeze(0) if unbatched else result)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class Conv1d(_ConvNd):
    """A 1-d convolution of (N, C, L) inputs."""

    spatial = 1


class Conv2d(_ConvNd):
    """A 2-d convolution of (N, C, H, W) inputs."""


class ConvTranspose2d(Module):
    """The transposed 2-d convolution: weight (in_channels, out_channels / groups, *kernel)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: builtins.bool = True, dilation=1,
                 padding_mode: str = "zeros", dtype=None) -> None:
        super().__init__()
        if padding_mode != "zeros":
            raise ArgumentError("ConvTranspose2d only supports padding_mode='zeros' (as PyTorch)")
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ArgumentError(f"ConvTranspose2d: in_channels ({in_channels}) and out_channels "
                                f"({out_channels}) must be divisible by groups ({groups})")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = pair(kernel_size, 2, "ConvTranspose2d kernel_size")
        self.stride = pair(stride, 2, "ConvTranspose2d stride")
        self.padding = pair(padding, 2, "ConvTranspose2d padding")
        self.output_padding = pair(output_padding, 2, "ConvTranspose2d output_padding")
        self.dilation = pair(dilation, 2, "ConvTranspose2d dilation")
        fan_in = out_channels // groups * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        self.weight = Parameter(_uniform((in_channels, out_channels // groups, *self.kernel_size),
                                         bound, dtype))
        self.bias = Parameter(_uniform((out_channels,), bound, dtype)) if bias else None

    def forward(self, input: Tensor) -> Tensor:
        unbatched = input.ndim == 3
        x = input.unsqueeze(0) if unbatched else input
        result = conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)
        return fresh(result.squeeze(0) if unbatched else result)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: builtins.bool = False, ceil_mode: builtins.bool = False) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, input: Tensor):
        return max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                          self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: builtins.bool = False,
                 count_include_pad: builtins.bool = True,
                 divisor_override: int | None = None) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input: Tensor) -> Tensor:
        return avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                          self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:
        return adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class _BatchNorm(Module):
    """BatchNorm's parameters and buffers, with PyTorch's names, defaults and state_dict order:
    weight (ones), bias (zeros), running_mean (zeros), running_var (ones), num_batches_tracked."""

    dimensions: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: builtins.bool = True, track_running_stats: builtins.bool = True,
                 dtype=None) -> None:
        super().__init__()
        dtype = float32 if dtype is None else dtype
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(zeros(num_features, dtype=dtype)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", ones(num_features, dtype=dtype))
            self.register_buffer("num_batches_tracked", zeros((), dtype=int64))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            with no_grad():
                self.running_mean.zero_()
                self.running_var.fill_(1)
                self.num_batches_tracked.zero_()

    def forward(self, input: Tensor) -> Tensor:
        if input.ndim not in self.dimensions:
            raise ShapeMismatchError(f"{type(self).__name__} expects an input of "
                                     f"{' or '.join(map(str, self.dimensions))} dimensions, got "
                                     f"shape {list(input.shape)}")
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            with no_grad():
                self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative average: 1 / batches seen so far
                momentum = 1.0 / self.num_batches_tracked.to(input.dtype)
        use_batch_statistics = self.training or self.running_mean is None
        tracked = not self.training or self.track_running_stats
        return batch_norm(input, self.running_mean if tracked else None,
                          self.running_var if tracked else None, self.weight, self.bias,
                          use_batch_statistics, momentum, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalization of an input (N, C) or (N, C, L)."""

    dimensions = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalization of an input (N, C, H, W)."""

    dimensions = (4,)



class EmbeddingBag(Module):
    """Sums, means or maxima of bags of `num_embeddings` vectors (standard normal at first, the
    padding row zero): `forward(input, offsets=None, per_sample_weights=None)` as
    F.embedding_bag (sparse gradients are refused when the module is made)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm: float | None = None,
                 norm_type: float = 2.0, scale_grad_by_freq: builtins.bool = False,
                 mode: str = "mean", sparse: builtins.bool = False, _weight: Tensor | None = None,
                 include_last_offset: builtins.bool = False, padding_idx: int | None = None,
                 dtype=None) -> None:
        super().__init__()
        check_options(mode, scale_grad_by_freq, sparse)
        self.num_embeddings, self.embedding_dim, self.mode = num_embeddings, embedding_dim, mode
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse, self.include_last_offset = sparse, include_last_offset
        self.padding_idx = padding_index(padding_idx, num_embeddings, "EmbeddingBag")
        self.weight = Parameter(table(num_embeddings, embedding_dim, self.padding_idx, _weight,
                                      dtype, "EmbeddingBag"))

    @classmethod
    def from_pretrained(cls, embeddings: Tensor, freeze: builtins.bool = True,
                        max_norm: float | None = None, norm_type: float = 2.0,
                        scale_grad_by_freq: builtins.bool = False, mode: str = "mean",
                        sparse: builtins.bool = False, include_last_offset: builtins.bool = False,
                        padding_idx: int | None = None) -> "EmbeddingBag":
        """An EmbeddingBag holding the 2-D `embeddings` (its buffer), trained unless `freeze`."""
        bag = cls(*pretrained_shape(embeddings, "EmbeddingBag"), max_norm, norm_type,
                  scale_grad_by_freq, mode, sparse, embeddings, include_last_offset, padding_idx)
        bag.weight.requires_grad_(not freeze)
        return bag

    def forward(self, input: Tensor, offsets: Tensor | None = None,
                per_sample_weights: Tensor | None = None) -> Tensor:
        return embedding_bag(input, self.weight, offsets, self.max_norm, self.norm_type,
                             self.scale_grad_by_freq, self.mode,
                             per_sample_weights=per_sample_weights,
                             include_last_offset=self.include_last_offset,
                             padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"
        return text if self.padding_idx is None else f"{text}, padding_idx={self.padding_idx}"
