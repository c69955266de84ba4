"""`tr.nn`'s padding modules around F.pad: ZeroPad1d/2d, ConstantPad1d/2d, ReflectionPad1d/2d,
ReplicationPad1d/2d, CircularPad1d/2d. `padding` is an int or (left, right[, top, bottom]),
kept as a tuple of 2 or 4 as PyTorch's; the reflect, replicate and circular modules take the
inputs PyTorch's do: (C, L) or (N, C, L) for 1-d, (C, H, W) or (N, C, H, W) for 2-d."""
from __future__ import annotations

import numbers

from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.nn.convolution import pad
from tracer.nn.modules import Module
from tracer.tensor import Tensor


class _PadNd(Module):
    spatial = 1
    mode = "constant"

    def __init__(self, padding) -> None:
        super().__init__()
        count = 2 * self.spatial
        amounts = ((padding,) * count if isinstance(padding, numbers.Integral)
                   else tuple(padding))
        if len(amounts) != count:
            raise ArgumentError(f"{type(self).__name__} takes an int or {count} ints of padding, "
                                f"got {padding!r}")
        self.padding = amounts

    def forward(self, input: Tensor) -> Tensor:
        if self.mode != "constant" and input.ndim not in (self.spatial + 1, self.spatial + 2):
            raise ShapeMismatchError(
                f"{type(self).__name__} expects a {self.spatial + 1}-d or {self.spatial + 2}-d "
                f"input, got shape {list(input.shape)}")
        return pad(input, self.padding, self.mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPadNd(_PadNd):
    def __init__(self, padding, value: float) -> None:
        super().__init__(padding)
        self.value = value

    def forward(self, input: Tensor) -> Tensor:
        return pad(input, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    pass


class ConstantPad2d(_ConstantPadNd):
    spatial = 2


class ZeroPad1d(ConstantPad1d):
    def __init__(self, padding) -> None:
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad2d(ConstantPad2d):
    def __init__(self, padding) -> None:
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ReflectionPad1d(_PadNd):
    mode = "reflect"


class ReflectionPad2d(ReflectionPad1d):
    spatial = 2


class ReplicationPad1d(_PadNd):
    mode = "replicate"


class ReplicationPad2d(ReplicationPad1d):
    spatial = 2


class CircularPad1d(_PadNd):
    mode = "circular"


class CircularPad2d(CircularPad1d):
    spatial = 2
