"""Element types and tensor types of the IR.

The IR knows four element types, each one numpy dtype; a tensor type is a shape and an element type.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

DTYPES = (float32, float64, int64, bool_)
FLOAT_DTYPES = (float32, float64)

# Short names used by the printed IR (and parsed back).
SHORT_NAMES = {float32: "f32", float64: "f64", int64: "i64", bool_: "bool"}
BY_SHORT_NAME = {short: dtype for dtype, short in SHORT_NAMES.items()}
# The byte alignment of every buffer the memory plan places in the arena, and of the arena's start
# (ir/memory.py, runtime/arena.py).
ALIGNMENT = 64


def as_dtype(dtype: object) -> np.dtype:
    """The IR dtype for anything numpy accepts as a dtype, or a short name like 'f32'."""
    if isinstance(dtype, str) and dtype in BY_SHORT_NAME:
        return BY_SHORT_NAME[dtype]
    result = np.dtype(dtype)
    if result not in DTYPES:
        raise TypeError(f"unsupported dtype {result}; supported: float32, float64, int64, bool")
    return result


def is_float(dtype: np.dtype) -> bool:
    return dtype in FLOAT_DTYPES


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self) -> None:
        # (the checks first: a trace makes a type per value, mostly from a tuple of ints and an
        # IR dtype already)
        if type(self.shape) is not tuple or not all(type(d) is int for d in self.shape):
            object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if not any(self.dtype is dtype for dtype in DTYPES):
            object.__setattr__(self, "dtype", as_dtype(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __str__(self) -> str:
        return f"{SHORT_NAMES[self.dtype]}[{','.join(str(d) for d in self.shape)}]"

    @staticmethod
    def of(array: np.ndarray) -> "TensorType":
        return TensorType(array.shape, array.dtype)
