"""Arrays of other libraries (PyTorch, JAX, CuPy, ...) in and out, through DLPack and `__array__`.

numpy does the DLPack work on both sides (`np.from_dlpack`, `ndarray.__dlpack__`), so a tensor
here and a CPU tensor there share one buffer: no copy either way.
"""
from __future__ import annotations

import numpy as np

from tracer.errors import ArgumentError
from tracer.creation import from_numpy, tensor
from tracer.dtypes import as_dtype
from tracer.tensor import Tensor


def is_foreign_array(value) -> bool:
    """An array object of another library: it speaks DLPack or converts with `__array__`."""
    return not isinstance(value, (Tensor, np.ndarray, np.generic)) and (
        hasattr(value, "__dlpack__") or hasattr(value, "__array__"))


def foreign_to_numpy(value, what: str) -> np.ndarray:
    """A numpy array sharing `value`'s memory (through DLPack), or -- for an object that only has
    `__array__`, which may copy -- a read-only array, so that an in-place change that could not
    reach `value` is refused instead of lost. `what` names the value in errors."""
    kind = type(value).__name__
    if hasattr(value, "__dlpack__"):
        try:
            array = np.from_dlpack(value)
        except BufferError as error:
            # e.g. a torch tensor that requires grad, or one on a GPU
            raise ArgumentError(f"{what} is a {kind} that cannot be shared with numpy ({error}); "
                                f"pass a detached CPU tensor (x.detach().cpu())") from None
        except (TypeError, ValueError, RuntimeError) as error:
            raise ArgumentError(f"{what} is a {kind} that numpy cannot import through DLPack: "
                                f"{error}") from None
    else:
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as error:
            raise ArgumentError(f"{what} is a {kind} whose __array__ failed: {error}") from None
        if array.dtype == object:
            raise ArgumentError(f"{what} is a {kind} that converts to an array of Python objects")
        array = array.view()
        array.flags.writeable = False
    try:
        as_dtype(array.dtype)
    except ArgumentError as error:
        raise ArgumentError(f"{what} is a {kind} of dtype {array.dtype}: {error}") from None
    return array


def from_dlpack(value) -> Tensor:
    """A tensor sharing memory with `value`, any object with `__dlpack__` (a CPU torch tensor, a
    JAX array, a numpy array, ...): in-place changes on either side show through the other."""
    if isinstance(value, Tensor):
        return value
    if not hasattr(value, "__dlpack__"):
        raise ArgumentError(f"from_dlpack needs an object with __dlpack__, got "
                            f"{type(value).__name__}; use tr.tensor(x) to copy other data")
    return from_numpy(foreign_to_numpy(value, "the argument of from_dlpack"))


def loaded_tensor(value, what: str) -> Tensor:
    """A value of a state_dict being loaded as a tensor: a Tensor itself; a numpy array, a
    number or nested lists copied; another library's array (a torch tensor) shared through
    DLPack. `what` names the value in errors."""
    if isinstance(value, Tensor):
        return value
    if is_foreign_array(value):
        if getattr(value, "requires_grad", False) and hasattr(value, "detach"):
            value = value.detach()  # torch's parameters themselves, not their state_dict
        return from_numpy(foreign_to_numpy(value, what))
    try:
        return tensor(value)
    except ArgumentError as error:
        raise ArgumentError(f"{what}: {error}") from None
