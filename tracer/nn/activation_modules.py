"""The activation modules around tracer/nn/activations.py's functions, with PyTorch's arguments,
attributes and printed forms (PReLU's weight is a Parameter of PyTorch's name and shape)."""
from __future__ import annotations

import builtins

from tracer.creation import full
from tracer.device import check_device
from tracer.nn import functional as F
from tracer.nn.modules import Module, Parameter
from tracer.tensor import Tensor


def _inplace_repr(inplace: builtins.bool) -> str:
    return "inplace=True" if inplace else ""


def _with_inplace(options: str, inplace: builtins.bool) -> str:
    return options + (", inplace=True" if inplace else "")


class _Elementwise(Module):
    """A function of one tensor without options (`function` is set by each subclass)."""

    def forward(self, input: Tensor) -> Tensor:
        return type(self).function(input)


class _InPlaceElementwise(Module):
    """A function of one tensor whose only option is `inplace`."""

    def __init__(self, inplace: builtins.bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        return type(self).function(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


class Sigmoid(_Elementwise):
    function = staticmethod(F.sigmoid)


class LogSigmoid(_Elementwise):
    function = staticmethod(F.logsigmoid)


class Softsign(_Elementwise):
    function = staticmethod(F.softsign)


class Tanhshrink(_Elementwise):
    function = staticmethod(F.tanhshrink)


class ReLU(_InPlaceElementwise):
    function = staticmethod(F.relu)


class SiLU(_InPlaceElementwise):
    function = staticmethod(F.silu)


class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0,
                 inplace: builtins.bool = False) -> None:
        super().__init__()
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return _with_inplace(f"min_val={self.min_val}, max_val={self.max_val}", self.inplace)


class ReLU6(Hardtanh):
    def __init__(self, inplace: builtins.bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


class SELU(_InPlaceElementwise):
    function = staticmethod(F.selu)


class Mish(_InPlaceElementwise):
    function = staticmethod(F.mish)


class Hardswish(_InPlaceElementwise):
    function = staticmethod(F.hardswish)

    def extra_repr(self) -> str:
        return ""  # (PyTorch prints Hardswish and Hardsigmoid without their inplace)


class Hardsigmoid(Hardswish):
    function = staticmethod(F.hardsigmoid)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: builtins.bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return _with_inplace(f"negative_slope={self.negative_slope}", self.inplace)


class ELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: builtins.bool = False) -> None:
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return _with_inplace(f"alpha={self.alpha}", self.inplace)


class CELU(ELU):
    def forward(self, input: Tensor) -> Tensor:
        return F.celu(input, self.alpha, self.inplace)


class Threshold(Module):
    def __init__(self, threshold: float, value: float, inplace: builtins.bool = False) -> None:
        super().__init__()
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        return _with_inplace(f"threshold={self.threshold}, value={self.value}", self.inplace)


class GLU(Module):
    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        return F.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class _AlongDim(Module):
    """softmax, log_softmax or softmin along `dim` (None: PyTorch's implicit choice)."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        return type(self).function(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(_AlongDim):
    function = staticmethod(F.softmax)


class LogSoftmax(_AlongDim):
    function = staticmethod(F.log_softmax)


class Softmin(_AlongDim):
    function = staticmethod(F.softmin)


class PReLU(Module):
    """leaky_relu with learnt slopes: one (`num_parameters=1`) or one per channel, `init` at first."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None,
                 dtype=None) -> None:
        super().__init__()
        check_device(device)
        self.num_parameters = num_parameters
        self.weight = Parameter(full((num_parameters,), init, dtype=dtype))

    def forward(self, input: Tensor) -> Tensor:
        return F.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"
