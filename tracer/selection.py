"""PyTorch's selections whose result's shape depends on the values: `masked_select`, `nonzero`
and `argwhere`. They work eagerly only (masked_select with its gradient, which goes back to the
selected positions, through the boolean mask read `x[mask]` of tracer/indexing.py); under
`@tr.trace` they raise tr.TracingError, which names the line and the shape-keeping alternatives,
as `x[mask]` does."""
from __future__ import annotations

import builtins

import numpy as np

from tracer.ir import types as irtypes
from tracer.context import state
from tracer.creation import tensor
from tracer.dispatch import tensor_operand
from tracer.errors import ArgumentError, ShapeMismatchError, TracingError
from tracer.layout import broadcast_shapes_or_none
from tracer.tensor import Tensor


def _refuse_traced(what: str, alternatives: str, *tensors: Tensor) -> None:
    if state.trace is not None or any(t._trace is not None for t in tensors):
        raise TracingError(
            f"{what}, which a traced function cannot know before it runs (its result's shape "
            f"depends on the values); {alternatives}")


def masked_select(x: Tensor, mask) -> Tensor:
    """The elements of x where the bool `mask` holds (the two broadcast together), as a 1-D
    tensor in row-major order; the gradient goes back to those positions."""
    mask = tensor_operand(mask, "masked_select")
    _refuse_traced(
        "masked_select has as many elements as the mask has True values",
        "keep the shape with tr.where(mask, x, 0) or x * mask (and sum or count with the mask)",
        x, mask)
    if mask.dtype != irtypes.bool_:
        raise ArgumentError(f"masked_select: expected a bool mask, got {mask.dtype}")
    shape = broadcast_shapes_or_none(x.shape, mask.shape)
    if shape is None:
        raise ShapeMismatchError(f"masked_select: a mask of shape {list(mask.shape)} does not "
                                 f"broadcast with the tensor's shape {list(x.shape)}")
    # (a 0-d mask would index as None: a one-element tensor selects the same)
    shape = shape or (1,)
    return x.expand(*shape)[mask.expand(*shape)]


def nonzero(x: Tensor, *, as_tuple: builtins.bool = False):
    """The indices of the non-zero elements of x, row-major: an int64 tensor of shape
    (count, x.ndim), or with `as_tuple` one 1-D tensor per dimension (a 0-d x counting as 1-D)."""
    _refuse_traced(
        "nonzero has one index per non-zero element",
        "keep the shape with a mask (x != 0) and tr.where(x != 0, value, 0), or compute the "
        "indices outside the traced function and pass them in as an argument", x)
    values = x._eager_array("nonzero")
    if as_tuple:
        return tuple(tensor(positions.astype(np.int64))
                     for positions in np.nonzero(np.atleast_1d(values)))
    return tensor(np.argwhere(values).astype(np.int64))


def argwhere(x: Tensor) -> Tensor:
    """`x.nonzero()`: the indices of the non-zero elements, one row each."""
    _refuse_traced(
        "argwhere has one row per non-zero element",
        "keep the shape with a mask (x != 0) and tr.where(x != 0, value, 0), or compute the "
        "indices outside the traced function and pass them in as an argument", x)
    return nonzero(x)


METHODS = {"masked_select": masked_select, "nonzero": nonzero, "argwhere": argwhere}
for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)

FUNCTIONS = dict(METHODS)
