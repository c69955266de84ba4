"""`tr.nn`'s 1-d and adaptive max pooling modules: MaxPool1d, AvgPool1d, AdaptiveAvgPool1d,
AdaptiveMaxPool1d, AdaptiveMaxPool2d, with PyTorch's attributes and reprs (AvgPool1d keeps its
sizes as 1-tuples, as PyTorch's _single does; MaxPool1d keeps them as given)."""
from __future__ import annotations

import builtins

from tracer.nn.convolution import pair
from tracer.nn.modules import Module
from tracer.nn.pooling1d import (adaptive_avg_pool1d, adaptive_max_pool1d, adaptive_max_pool2d,
                                 avg_pool1d, max_pool1d)
from tracer.tensor import Tensor


class MaxPool1d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: builtins.bool = False, ceil_mode: builtins.bool = False) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, input: Tensor):
        return max_pool1d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                          self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool1d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: builtins.bool = False,
                 count_include_pad: builtins.bool = True) -> None:
        super().__init__()
        self.kernel_size = pair(kernel_size, 1, "AvgPool1d kernel_size")
        self.stride = pair(stride if stride is not None else kernel_size, 1, "AvgPool1d stride")
        self.padding = pair(padding, 1, "AvgPool1d padding")
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, input: Tensor) -> Tensor:
        return avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                          self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool1d(Module):
    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:
        return adaptive_avg_pool1d(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveMaxPool1d(Module):
    def __init__(self, output_size, return_indices: builtins.bool = False) -> None:
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices

    def forward(self, input: Tensor):
        return adaptive_max_pool1d(input, self.output_size, self.return_indices)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveMaxPool2d(AdaptiveMaxPool1d):
    def forward(self, input: Tensor):
        return adaptive_max_pool2d(input, self.output_size, self.return_indices)
