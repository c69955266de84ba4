"""safetensors files through the `safetensors` package's numpy API (the optional extra
`tracer[safetensors]`): weights saved from PyTorch with `safetensors.torch.save_file` load into a
tracer model, and tracer's load into PyTorch."""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from tracer.errors import ArgumentError
from tracer.creation import from_numpy
from tracer.interop import loaded_tensor
from tracer.tensor import Tensor

# The dtypes of other frameworks' files widened to the nearest one here (exactly: every value of
# the narrower type is one of the wider type); load_state_dict then casts as copy_ does.
_WIDER = {np.dtype(np.float16): np.float32, np.dtype(np.int8): np.int64,
          np.dtype(np.int16): np.int64, np.dtype(np.int32): np.int64,
          np.dtype(np.uint8): np.int64, np.dtype(np.uint16): np.int64,
          np.dtype(np.uint32): np.int64}


def _package():
    try:
        import safetensors.numpy
    except ImportError:
        raise ArgumentError("safetensors files need the safetensors package: "
                            "pip install 'tracer-compiler[safetensors]' (or pip install safetensors)"
                            ) from None
    return safetensors.numpy


def save_safetensors(state_dict: Mapping[str, Tensor], path: str | os.PathLike,
                     metadata: dict[str, str] | None = None) -> None:
    """Write the tensors of `state_dict` (tracer or torch tensors, numpy arrays) to `path`."""
    arrays = {}
    for name, value in state_dict.items():
        array = loaded_tensor(value, f"save_safetensors: {name}").detach().numpy()
        arrays[name] = np.ascontiguousarray(array)
    _package().save_file(arrays, os.fspath(path), metadata=metadata)


def load_safetensors(path: str | os.PathLike) -> dict[str, Tensor]:
    """The tensors of the safetensors file `path` by name (float16 widened to float32 and the
    smaller integers to int64; bfloat16, which numpy lacks, is refused by name)."""
    package = _package()
    try:
        arrays = package.load_file(os.fspath(path))
    except TypeError as error:
        raise ArgumentError(f"load_safetensors: {path} holds a dtype numpy lacks ({error}); save "
                            f"those tensors as float32 (tensor.float()) first") from None
    return {name: from_numpy(array.astype(_WIDER[array.dtype]) if array.dtype in _WIDER
                             else np.require(array, requirements="W"))
            for name, array in arrays.items()}
