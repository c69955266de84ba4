"""`tr.device`: every tensor lives in host memory, so the only device is the CPU. It exists so
that PyTorch code that asks for (`x.device`) or passes one (`x.to("cpu")`, `.to(device=...)`)
runs unchanged; asking for any other device is an error that says so."""
from __future__ import annotations

import builtins

from tracer.errors import ArgumentError


class device:
    """The CPU, as PyTorch's `torch.device("cpu")` (also `"cpu:0"` and `device("cpu", 0)`)."""

    __slots__ = ("type", "index")

    def __init__(self, type: "str | device", index: int | None = None) -> None:
        if isinstance(type, device):
            type, index = type.type, type.index if index is None else index
        if not isinstance(type, str):
            raise ArgumentError(f"device() takes a string such as 'cpu', got "
                                f"{builtins.type(type).__name__}")
        name, _, number = type.partition(":")
        if number:
            if index is not None:
                raise ArgumentError(f"device({type!r}, {index}): the index is given twice")
            if not number.isdigit():
                raise ArgumentError(f"device string {type!r} has an invalid index")
            index = int(number)
        if name != "cpu":
            raise ArgumentError(f"device {type!r}: tracer runs on the CPU only (its compiled code "
                                f"is generated for this machine); use 'cpu'")
        if index is not None and index != 0:
            raise ArgumentError(f"device {type!r} index {index}: there is one CPU device, 0")
        object.__setattr__(self, "type", name)
        object.__setattr__(self, "index", index)

    def __setattr__(self, name, value):
        raise AttributeError("a device is immutable")

    def __repr__(self) -> str:
        suffix = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{suffix})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other) -> bool:
        # As PyTorch's: a device equals a device (not a string) of the same type and index.
        if not isinstance(other, device):
            return NotImplemented
        return (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __reduce__(self):
        return device, (self.type, self.index)


CPU = device("cpu")


def is_device(value) -> bool:
    """Whether `value` names a device (a device, or a string such as 'cpu' or 'cuda:0') rather
    than a dtype: the first argument of `Tensor.to` may be either."""
    if isinstance(value, device):
        return True
    return isinstance(value, str) and value.partition(":")[0] in (
        "cpu", "cuda", "mps", "xpu", "meta", "hip", "xla", "vulkan", "ipu", "hpu", "mtia")


def check_device(value) -> None:
    """Raise for a device other than the CPU (`None` is no device asked for)."""
    if value is not None:
        device(value)


class DeviceMethods:
    """Tensor's device: always the CPU (given to Tensor by tracer/methods.py)."""

    @property
    def device(self) -> device:
        return CPU

    @property
    def is_cuda(self) -> builtins.bool:
        return False

    def cpu(self, memory_format=None):
        """The tensor itself, as PyTorch's `cpu()` of a tensor already on the CPU."""
        return self
