"""The dtypes (`tr.float32`, ...) and PyTorch's type promotion between tensors and Python numbers."""
from __future__ import annotations

import builtins
import numbers

import numpy as np

from tracer.ir import types as irtypes
from tracer.errors import ArgumentError
from tracer.tensor import Tensor

float32, float64, int64, bool = irtypes.float32, irtypes.float64, irtypes.int64, irtypes.bool_

# Promotion compares categories first (bool < integer < float), then sizes within one.
CATEGORY = {irtypes.bool_: 0, irtypes.int64: 1, irtypes.float32: 2, irtypes.float64: 2}
DEFAULT_OF_CATEGORY = {0: irtypes.bool_, 1: irtypes.int64, 2: irtypes.float32}
WEAK_OF_CATEGORY = {0: irtypes.bool_, 1: irtypes.int64, 2: irtypes.float64}


def as_dtype(dtype) -> np.dtype:
    """The dtype for `dtype`, or an ArgumentError naming the supported ones."""
    try:
        return irtypes.as_dtype(dtype)
    except TypeError as error:
        raise ArgumentError(str(error)) from None


def scalar_category(value) -> int:
    """The category of a Python number (ArgumentError for anything else)."""
    if isinstance(value, (builtins.bool, np.bool_)):
        return 0
    if isinstance(value, numbers.Integral):
        return 1
    if isinstance(value, numbers.Real):
        return 2
    raise ArgumentError(f"expected a Tensor or a number, got {type(value).__name__}")


def is_scalar(value) -> builtins.bool:
    return isinstance(value, numbers.Number) and not isinstance(value, Tensor)


# A dtype's place in promotion: its category, then its size within the category.
_RANK = {dtype: (category, dtype.itemsize) for dtype, category in CATEGORY.items()}


def promotion(operands) -> tuple[np.dtype, builtins.bool]:
    """`result_dtype(*operands)`, and whether the result is weak (every operand a Python number
    or a weak tensor). One pass with no key functions: every eager operation and every traced
    one with several operands comes through here."""
    best = scalar_best = None  # the widest dtype of the tensors with dimensions, of the 0-d ones
    weak_category = -1  # the highest category of the Python numbers and weak tensors
    weak = True
    for operand in operands:
        if not isinstance(operand, Tensor):
            weak_category = max(weak_category, scalar_category(operand))
            continue
        dtype = operand.dtype
        if operand._weak:
            weak_category = max(weak_category, CATEGORY[dtype])
            continue
        weak = False
        if operand.ndim:
            if best is None or _RANK[dtype] > _RANK[best]:
                best = dtype
        elif scalar_best is None or _RANK[dtype] > _RANK[scalar_best]:
            scalar_best = dtype
    # As PyTorch: tensors with dimensions decide; a 0-d tensor only when it is of a higher
    # category, and a Python number only when it is of a higher category than both.
    if best is None or (scalar_best is not None and CATEGORY[scalar_best] > CATEGORY[best]):
        best = scalar_best
    if best is None:
        return WEAK_OF_CATEGORY[weak_category], weak
    if weak_category > CATEGORY[best]:
        return DEFAULT_OF_CATEGORY[weak_category], weak
    return best, weak


def result_dtype(*operands) -> np.dtype:
    """PyTorch's promotion: a Python number (or a weak traced scalar) does not widen a tensor of
    its own category (float32 * 2.0 stays float32), but lifts one of a lower category."""
    return promotion(operands)[0]


def default_dtype(data) -> np.dtype:
    """The dtype `tr.tensor(data)` gives: float32 for Python floats (a numpy array keeps its
    float dtype), int64 for integers, bool for bools."""
    array = np.asarray(data)
    if array.dtype.kind == "f":
        return float32 if not isinstance(data, (np.ndarray, np.generic)) else as_dtype(array.dtype)
    if array.dtype.kind in "iu":
        return int64
    if array.dtype.kind == "b":
        return bool
    raise ArgumentError(f"cannot make a tensor from {type(data).__name__} of dtype {array.dtype}")
