"""`round`: to the nearest integer, halves to the even neighbour (PyTorch's and IEEE's
nearbyint), optionally at `decimals` decimal places; its gradient is zero, as PyTorch's.

The rounding is built on floor (tracer/ops.py): with f = floor(x), d = x - f is exact wherever it
decides anything (Sterbenz's lemma for |f| >= 1; for f = -1, where 1 + x may round, it rounds to
0.5 or above only when x is above -0.5, where rounding up to 0 is right), so the comparison of d
with 0.5 is the comparison of x with the midpoint.
"""
from __future__ import annotations

from tracer.ir import types as irtypes
from tracer.arithmetic import where
from tracer.creation import zeros_like
from tracer.errors import ArgumentError
from tracer.function import NativeFunction
from tracer.ops import floor
from tracer.tensor import Tensor


def _nearest_even(x: Tensor) -> Tensor:
    lower = floor(x)
    fraction = x - lower  # nan for infinite x, where every comparison below is false
    lower_is_odd = floor(lower * 0.5) * 2 != lower
    up = (fraction > 0.5) | ((fraction == 0.5) & lower_is_odd)
    rounded = where(up, lower + 1, lower)
    # -0.4 rounds to -0.0, as nearbyint does (floor + 1 gives +0.0); x * 0 has x's sign
    return where(rounded == 0, x * 0, rounded)


class _Round(NativeFunction):
    @staticmethod
    def forward(ctx, x, decimals):
        if decimals == 0:
            return _nearest_even(x)
        # PyTorch's order: scale by the power of ten (in x's dtype), round, scale back
        scale = 10.0 ** abs(decimals)
        if decimals > 0:
            return _nearest_even(x * scale) / scale
        return _nearest_even(x / scale) * scale

    @staticmethod
    def backward(ctx, grad_output):
        return zeros_like(grad_output), None


class RoundingMethods:
    """Tensor's rounding (given to Tensor by tracer/methods.py)."""

    def round(self, decimals: int = 0) -> Tensor:
        """Each element to the nearest integer (halves to even), or to `decimals` places."""
        if not isinstance(decimals, int) or isinstance(decimals, bool):
            raise ArgumentError(f"round: decimals is an int, got {type(decimals).__name__}")
        if not irtypes.is_float(self.dtype):
            if decimals != 0:
                raise ArgumentError(f"round with decimals needs a float tensor, got {self.dtype}")
            return self.clone()
        return _Round.apply(self, decimals)

    def round_(self, decimals: int = 0) -> Tensor:
        return self._assign(self.round(decimals), "round_")
