"""Checkpoints: how a Tensor pickles, and `tr.save` / `tr.load`.

A tensor pickles as its values, dtype, shape and `requires_grad` -- as PyTorch's, nothing of the
autograd tape (whose weak references cannot be pickled) and not `.grad` -- and unpickles as a
leaf of its class (Tensor or Parameter). Modules, optimizers and state_dicts then pickle as
plain Python objects holding tensors.

`tr.load(f, weights_only=True)`, PyTorch's default, unpickles through an allowlist: tensors,
containers, numbers, strings, dtypes and devices, and what `add_safe_globals` adds. Any other
class or function in the file is refused before it is called (unpickling a module or an optimizer
object needs `weights_only=False`, which runs whatever the file names: only for trusted files).
"""
from __future__ import annotations

import builtins
import collections
import io
import os
import pickle
from typing import Any, BinaryIO

import numpy as np

from tracer.device import check_device, device
from tracer.dispatch import leaf
from tracer.errors import TracerError, TracingError
from tracer.tensor import Tensor


class WeightsOnlyError(TracerError, pickle.UnpicklingError):
    """`tr.load(..., weights_only=True)` met a class or function outside the allowlist."""


def _rebuild_tensor(cls: type, data: bytes, dtype: str, shape: tuple[int, ...],
                    requires_grad: builtins.bool) -> Tensor:
    """A tensor of class `cls` (Tensor or a subclass such as Parameter) from what
    `Tensor.__reduce_ex__` saved."""
    array = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()
    if cls is Tensor:
        return leaf(array, requires_grad)
    return cls(leaf(array, False), requires_grad)


class PickleMethods:
    """Tensor's pickling (given to Tensor by tracer/methods.py)."""

    def __reduce_ex__(self, protocol):
        if self._trace is not None:
            raise TracingError("a tensor inside a traced function cannot be pickled (its value "
                               "exists only when the compiled function runs); return it and "
                               "pickle it outside")
        array = self._eager_array("pickling a tensor")
        return (_rebuild_tensor, (type(self), array.tobytes(), array.dtype.str, array.shape,
                                  self.requires_grad))


def _safe_globals() -> dict[tuple[str, str], Any]:
    safe = {(value.__module__, value.__qualname__): value
            for value in (_rebuild_tensor, Tensor, device, collections.OrderedDict, np.dtype,
                          *_tensor_classes)}
    for value in (builtins.set, builtins.frozenset, builtins.complex, builtins.slice,
                  builtins.range, builtins.bytearray):
        safe["builtins", value.__name__] = value
    # numpy 2's dtype classes (np.dtype("float32") pickles through numpy.dtype itself)
    safe.update({("numpy.dtypes", name): getattr(np.dtypes, name) for name in dir(np.dtypes)
                 if name.endswith("DType")})
    safe.update(_added)
    return safe


_added: dict[tuple[str, str], Any] = {}
_tensor_classes: list[type] = []  # Tensor's subclasses in the library (Parameter)


def allow_tensor_class(cls: type) -> type:
    """Let `tr.load(weights_only=True)` rebuild tensors of the library's Tensor subclass `cls`
    (registered where the class is defined: tr.nn, above this module, registers Parameter)."""
    _tensor_classes.append(cls)
    return cls


def add_safe_globals(safe_globals: list) -> None:
    """Allow these classes or functions in files loaded with `weights_only=True`, as PyTorch's
    `torch.serialization.add_safe_globals`."""
    for value in safe_globals:
        _added[value.__module__, value.__qualname__] = value


def get_safe_globals() -> list:
    return list(_added.values())


class _WeightsOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        safe = _safe_globals().get((module, name))
        if safe is None:
            raise WeightsOnlyError(
                f"tr.load(weights_only=True) refuses {module}.{name}: the file names a class or "
                f"function outside the allowlist of tensors, containers, numbers, dtypes and "
                f"devices, which unpickling would call. If you trust the file, load it with "
                f"weights_only=False, or allow the class with "
                f"tr.serialization.add_safe_globals([{name}])")
        return safe


def _open(f, mode: str):
    """(file object, whether to close it): a path is opened here, a file object used as it is."""
    if isinstance(f, (str, os.PathLike)):
        return open(f, mode), True
    return f, False


def save(obj, f: str | os.PathLike | BinaryIO, pickle_module=pickle,
         pickle_protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
    """Write `obj` (a state_dict, a dict of them, a tensor, a module, ...) to `f`, a path or a
    binary file object, as a pickle."""
    file, close = _open(f, "wb")
    try:
        pickle_module.dump(obj, file, protocol=pickle_protocol)
    finally:
        if close:
            file.close()


def load(f: str | os.PathLike | BinaryIO, map_location=None, pickle_module=None, *,
         weights_only: builtins.bool = True, **pickle_load_args):
    """Read what `tr.save` wrote. `weights_only` (the default, as PyTorch's) refuses any class or
    function outside the allowlist (see the module docstring); `map_location` can only name the
    CPU, where every tensor is."""
    if map_location is not None and not callable(map_location) and not isinstance(
            map_location, dict):
        check_device(map_location)
    file, close = _open(f, "rb")
    try:
        start = file.read(4) if file.seekable() else b""
        if start[:2] == b"PK":
            raise TracerError(
                "this file is a zip archive, as torch.save writes them; read it with "
                "torch.load and pass the state_dict to load_state_dict (which takes torch "
                "tensors), or exchange weights as safetensors (tr.nn.utils.load_safetensors)")
        if start:
            file.seek(-len(start), io.SEEK_CUR)
        if weights_only:
            return _WeightsOnlyUnpickler(file, **pickle_load_args).load()
        return (pickle_module or pickle).load(file, **pickle_load_args)
    finally:
        if close:
            file.close()
