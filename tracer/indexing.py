"""Indexing and index assignment with ints, slices, None, `...` and boolean masks, built from the
slice, pad, reshape and select primitives."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from tracer.ir.primitives import slice_as_pad, slice_length

from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.tensor import Tensor, apply, as_tensor, full, mark_view, where


@dataclass
class _Region:
    """What a basic index selects: a strided box of the tensor, and how the result is shaped."""
    starts: list[int]
    stops: list[int]
    steps: list[int]
    box_shape: list[int]       # the selected box, integer-indexed dimensions kept as size 1
    result_shape: list[int]    # what x[key] returns: integer dimensions dropped, None inserted


def _normalize_key(key) -> tuple:
    key = key if isinstance(key, tuple) else (key,)
    for entry in key:
        if isinstance(entry, Tensor) or isinstance(entry, (list,)):
            raise ArgumentError(
                "indexing with a tensor or list of indices has a data-dependent result here; "
                "use ints, slices, None and ..., or a boolean mask in an assignment "
                "(x[mask] = value), or tr.where(mask, x, 0)")
        if isinstance(entry, (bool, np.bool_)):
            raise ArgumentError("indexing with a Python bool (x[True]) is not supported; use None "
                                "to add a dimension")
        if not (entry is None or entry is Ellipsis or isinstance(entry, (slice, numbers.Integral))):
            raise ArgumentError(f"cannot index with {type(entry).__name__}")
    return key


def _region(shape: tuple[int, ...], key) -> _Region:
    key = _normalize_key(key)
    if sum(entry is Ellipsis for entry in key) > 1:
        raise ArgumentError("an index can only have a single ellipsis ('...')")
    indexed = sum(1 for entry in key if entry is not None and entry is not Ellipsis)
    if indexed > len(shape):
        raise ShapeMismatchError(f"too many indices ({indexed}) for a tensor of shape {list(shape)}")
    if Ellipsis in key:
        at = key.index(Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - indexed) + key[at + 1:]
    else:
        key = key + (slice(None),) * (len(shape) - indexed)
    region = _Region([], [], [], [], [])
    dim = 0
    for entry in key:
        if entry is None:
            region.result_shape.append(1)
            continue
        size = shape[dim]
        if isinstance(entry, slice):
            try:
                start, stop, step = entry.indices(size)
            except (TypeError, ValueError) as error:
                raise ArgumentError(f"bad slice {entry}: {error}") from None
            if step < 0:
                raise ArgumentError("negative slice steps are not supported; use a positive step")
            stop = max(stop, start)
            count = slice_length(start, stop, step)
            region.result_shape.append(count)
        else:
            index = int(entry)
            if not -size <= index < size:
                raise ShapeMismatchError(
                    f"index {index} is out of bounds for dimension {dim} with size {size}")
            start, stop, step, count = index % size, index % size + 1, 1, 1
        region.starts.append(start)
        region.stops.append(stop)
        region.steps.append(step)
        region.box_shape.append(count)
        dim += 1
    return region


def getitem(x: Tensor, key) -> Tensor:
    region = _region(x.shape, key)
    full_box = all(start == 0 and stop == size and step == 1 for start, stop, step, size
                   in zip(region.starts, region.stops, region.steps, x.shape))
    box = x if full_box else apply("slice", [x], starts=region.starts, stops=region.stops,
                                   steps=region.steps)
    result = box.reshape(tuple(region.result_shape))
    if result is x:
        result = apply("reshape", [x], shape=x.shape)  # x[...] is a new tensor, as in PyTorch
    return mark_view(result, x, "indexing")


def _mask_assignment(x: Tensor, mask: Tensor, value) -> Tensor:
    if mask.shape != x.shape[:mask.ndim]:
        raise ShapeMismatchError(
            f"a boolean mask of shape {list(mask.shape)} cannot index a tensor of shape "
            f"{list(x.shape)}; its shape must match the leading dimensions")
    mask = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
    value = as_tensor(value, accept_data=True)
    if value.ndim > 0 and value.shape != x.shape:
        raise ShapeMismatchError(
            "x[mask] = value takes a scalar (or a tensor of x's own shape) here; the number of "
            "selected elements is only known at run time")
    return where(mask, value.to(x.dtype), x)


def setitem(x: Tensor, key, value) -> Tensor:
    """The new value of `x` after `x[key] = value` (the caller assigns it in place)."""
    if isinstance(key, Tensor) and key.dtype.kind == "b":
        return _mask_assignment(x, key, value)
    region = _region(x.shape, key)
    value = as_tensor(value, accept_data=True).to(x.dtype)
    try:
        value = value.expand(*region.result_shape).reshape(tuple(region.box_shape))
    except ShapeMismatchError:
        raise ShapeMismatchError(f"cannot assign a value of shape {list(value.shape)} to an "
                                 f"index selecting shape {region.result_shape}") from None
    if 0 in region.box_shape:
        # Nothing is written, but as in PyTorch the (empty) value is on the gradient path: adding
        # its sum, exactly 0, gives it a zero gradient instead of none.
        return x + value.sum() if value.requires_grad else x.clone()
    padding = slice_as_pad(x.shape, region.starts, region.stops, region.steps)
    placed = apply("pad", [value], **padding)
    inside = apply("pad", [full(*region.box_shape, fill_value=True)], **padding)
    return where(inside, placed, x)
