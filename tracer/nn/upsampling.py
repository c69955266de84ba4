"""`tr.nn`'s resampling modules: Upsample, UpsamplingNearest2d, UpsamplingBilinear2d, with
PyTorch's attributes (scale factors kept as floats) and reprs."""
from __future__ import annotations

import builtins

from tracer.nn.interpolation import interpolate
from tracer.nn.modules import Module
from tracer.tensor import Tensor


class Upsample(Module):
    def __init__(self, size=None, scale_factor=None, mode: str = "nearest",
                 align_corners: builtins.bool | None = None,
                 recompute_scale_factor: builtins.bool | None = None) -> None:
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        if isinstance(scale_factor, tuple):
            self.scale_factor = tuple(float(factor) for factor in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor else None
        self.mode, self.align_corners = mode, align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input: Tensor) -> Tensor:
        return interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                           recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self) -> str:
        if self.scale_factor is not None:
            return f"scale_factor={self.scale_factor!r}, mode={self.mode!r}"
        return f"size={self.size!r}, mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    def __init__(self, size=None, scale_factor=None) -> None:
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """Bilinear with align_corners=True, as PyTorch's."""

    def __init__(self, size=None, scale_factor=None) -> None:
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)
