"""Indexing and index assignment with ints, slices, None, `...`, boolean masks and integer index
tensors (or lists). The basic part (ints, slices, None) is built from the slice, pad, reshape and
select primitives; integer index tensors from gather and scatter, with PyTorch's placement of the
indexed dimensions: where the index tensors stand next to each other in the key (ints aside), their
broadcast shape replaces them in place, otherwise it comes first."""
from __future__ import annotations

import numbers

import numpy as np

from tracer.ir.primitives import slice_as_pad, slice_length

from tracer.context import state
from tracer.errors import ArgumentError, IndexOutOfRangeError, ShapeMismatchError, TracingError
from tracer.arithmetic import where
from tracer.creation import full, tensor
from tracer.dispatch import apply, as_tensor
from tracer.dtypes import int64
from tracer.dtypes import bool as bool_
from tracer.gathering import checked
from tracer.layout import expanded, reshaped, shapes_broadcast
from tracer.tensor import Tensor, mark_view


class _Region:
    """What a basic index selects: a strided box of the tensor, and how the result is shaped. (This
    class and _Advanced are not dataclasses: making their methods took ~2 ms of `import tracer`.)"""

    def __init__(self, starts: list[int], stops: list[int], steps: list[int],
                 box_shape: list[int], result_shape: list[int]):
        self.starts, self.stops, self.steps = starts, stops, steps
        self.box_shape = box_shape  # the selected box, integer-indexed dimensions kept as size 1
        self.result_shape = result_shape  # what x[key] returns: integer dimensions dropped, None inserted


def _index_tensor(entry) -> Tensor:
    """An index entry that is a tensor, list or array, as an int64 or bool Tensor."""
    if not isinstance(entry, Tensor):
        entry = tensor(entry, dtype=int64 if np.size(entry) == 0 else None)
    if entry.dtype not in (int64, bool_):
        raise ArgumentError(f"tensors used as indices must be int64 or bool, got {entry.dtype}")
    return entry


def _normalize_key(key) -> tuple:
    key = key if isinstance(key, tuple) else (key,)
    key = tuple(_index_tensor(entry) if isinstance(entry, (Tensor, list, np.ndarray)) else entry
                for entry in key)
    for entry in key:
        if isinstance(entry, Tensor):
            continue
        if isinstance(entry, (bool, np.bool_)):
            raise ArgumentError("indexing with a Python bool (x[True]) is not supported; use None "
                                "to add a dimension")
        if not (entry is None or entry is Ellipsis or isinstance(entry, (slice, numbers.Integral))):
            raise ArgumentError(f"cannot index with {type(entry).__name__}")
    return key


def _full_key(shape: tuple[int, ...], key) -> tuple:
    """The key with its `...` expanded and slices added for the trailing dimensions; a boolean
    mask stands for as many dimensions as it has."""
    key = _normalize_key(key)
    if sum(entry is Ellipsis for entry in key) > 1:
        raise ArgumentError("an index can only have a single ellipsis ('...')")
    indexed = sum(entry.ndim if isinstance(entry, Tensor) and entry.dtype == bool_ else 1
                  for entry in key if entry is not None and entry is not Ellipsis)
    if indexed > len(shape):
        raise ShapeMismatchError(f"too many indices ({indexed}) for a tensor of shape {list(shape)}")
    at = next((k for k, entry in enumerate(key) if entry is Ellipsis), None)
    if at is not None:  # found by identity: `in` would compare tensors elementwise
        return key[:at] + (slice(None),) * (len(shape) - indexed) + key[at + 1:]
    return key + (slice(None),) * (len(shape) - indexed)


def _region(shape: tuple[int, ...], key: tuple) -> _Region:
    """What the full basic `key` (ints, slices and None) selects."""
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
                raise IndexOutOfRangeError(
                    f"index {index} is out of bounds for dimension {dim} with size {size}")
            start, stop, step, count = index % size, index % size + 1, 1, 1
        region.starts.append(start)
        region.stops.append(stop)
        region.steps.append(step)
        region.box_shape.append(count)
        dim += 1
    return region


def _is_everything(key: tuple) -> bool:
    return all(isinstance(entry, slice) and entry == slice(None) for entry in key)


def _basic_getitem(x: Tensor, key: tuple) -> Tensor:
    region = _region(x.shape, key)
    full_box = all(start == 0 and stop == size and step == 1 for start, stop, step, size
                   in zip(region.starts, region.stops, region.steps, x.shape))
    box = x if full_box else apply("slice", [x], starts=region.starts, stops=region.stops,
                                   steps=region.steps)
    result = reshaped(box, tuple(region.result_shape))
    if result is x:
        result = apply("reshape", [x], shape=x.shape)  # x[...] is a new tensor, as in PyTorch
    return result


class _Advanced:
    """A key with index tensors: first the basic key (each index tensor replaced by a full slice),
    then a gather of its result along `axes` at `indices`, whose broadcast dimensions
    `permutation` (if any) moves to where the index tensors stood."""

    def __init__(self, basic_key: tuple, indices: list[Tensor], axes: tuple[int, ...],
                 permutation: tuple[int, ...] | None):
        self.basic_key, self.indices, self.axes, self.permutation = (basic_key, indices, axes,
                                                                     permutation)


def _mask_indices(mask: Tensor, shape: tuple[int, ...], dim: int) -> list[Tensor]:
    """The int64 index tensors of the True elements of `mask` (eager only: their number is the
    result's size)."""
    if state.trace is not None or mask._trace is not None:
        raise TracingError(
            "x[mask] with a boolean mask has as many elements as the mask has True values, which "
            "a traced function cannot know before it runs; keep the shape with "
            "tr.where(mask, x, 0) or x.masked_fill(~mask, 0) (and sum or count with the mask), "
            "or assign through it (x[mask] = value), which keeps x's shape")
    if mask.ndim == 0:
        raise ArgumentError("indexing with a 0-d boolean tensor is not supported; use None to add "
                            "a dimension")
    if mask.shape != shape[dim:dim + mask.ndim]:
        raise ShapeMismatchError(
            f"the shape of the mask {list(mask.shape)} at index {dim} does not match the shape "
            f"{list(shape[dim:dim + mask.ndim])} of the indexed tensor there")
    return [tensor(positions) for positions in np.nonzero(mask._eager_array("x[mask]"))]


def _advanced(shape: tuple[int, ...], key: tuple) -> _Advanced | None:
    """The gather that a full key with index tensors stands for, or None for a basic key."""
    if not any(isinstance(entry, Tensor) for entry in key):
        return None
    entries, dim = [], 0
    for entry in key:
        if isinstance(entry, Tensor) and entry.dtype == bool_:
            entries.extend(_mask_indices(entry, shape, dim))
            dim += entry.ndim
        else:
            entries.append(entry)
            dim += entry is not None
    basic_key, indices, axes, position = [], [], [], 0
    for entry in entries:
        if isinstance(entry, Tensor):
            basic_key.append(slice(None))
            indices.append(entry)
            axes.append(position)
        else:
            basic_key.append(entry)
        # ints drop their dimension (PyTorch applies them first); None, slices and tensors keep one
        position += not isinstance(entry, numbers.Integral)
    # A 0-d index tensor is an int to PyTorch: it drops its dimension before the other index
    # tensors are placed (and add nothing to their broadcast shape).
    scalars = [axis for axis, index in zip(axes, indices) if index.ndim == 0]
    placed = [axis - sum(s < axis for s in scalars) for axis, index in zip(axes, indices)
              if index.ndim]
    permutation = None
    if placed and placed == list(range(placed[0], placed[0] + len(placed))) and placed[0] > 0:
        # Next to each other: the broadcast index dimensions stand where the index tensors did.
        count = len(shapes_broadcast(*(t.shape for t in indices)))
        rest = position - len(axes)
        permutation = (*range(count, count + placed[0]), *range(count),
                       *range(count + placed[0], count + rest))
    return _Advanced(tuple(basic_key), indices, tuple(axes), permutation)


def getitem(x: Tensor, key) -> Tensor:
    key = _full_key(x.shape, key)
    advanced = _advanced(x.shape, key)
    if advanced is None:
        return mark_view(_basic_getitem(x, key), x, "indexing")
    box = x if _is_everything(advanced.basic_key) else _basic_getitem(x, advanced.basic_key)
    # As in PyTorch, indexing with tensors gives a new tensor, not a view.
    indices = checked(box, advanced.indices, advanced.axes, wrap=True)
    result = apply("gather", [box, *indices], axes=advanced.axes)
    if advanced.permutation is not None:
        result = apply("transpose", [result], permutation=advanced.permutation)
    if not any(index.ndim for index in advanced.indices):
        # only 0-d index tensors, ints to PyTorch: its result is a view, so this copy is one too
        # (changing it in place is refused, as for x[0])
        return mark_view(result, x, "indexing")
    return result


def _mask_assignment(x: Tensor, mask: Tensor, value) -> Tensor:
    if mask.shape != x.shape[:mask.ndim]:
        raise ShapeMismatchError(
            f"a boolean mask of shape {list(mask.shape)} cannot index a tensor of shape "
            f"{list(x.shape)}; its shape must match the leading dimensions")
    if isinstance(value, Tensor) and value.numel() != 1:  # (one element: masked_fill converts)
        _check_same_dtype(x, value, "x[mask] = value")
    value = as_tensor(value, accept_data=True)
    if value.ndim > 0 and value.numel() == 1 and value.shape != x.shape:
        value = value.reshape(())  # PyTorch's masked_fill_ takes any one-element shape
    if value.ndim > 0 and value.shape != x.shape:
        if state.trace is None:  # eagerly: one value per True element, as in PyTorch
            return _advanced_setitem(x, _advanced(x.shape, _full_key(x.shape, mask)), value,
                                     one_mask=True)
        raise ShapeMismatchError(
            "x[mask] = value takes a scalar (or a tensor of x's own shape) here; the number of "
            "selected elements is only known at run time")
    mask = reshaped(mask, mask.shape + (1,) * (x.ndim - mask.ndim))
    return where(mask, value.to(x.dtype), x)


def _check_same_dtype(x: Tensor, value, what: str) -> None:
    """PyTorch's index_put_ and index_add_ take a source tensor of x's own dtype only (a Python
    number or list is converted; basic assignment, a copy_, converts a tensor too)."""
    if isinstance(value, Tensor) and value.dtype != x.dtype:
        raise ArgumentError(f"{what}: the value is {value.dtype}, the tensor {x.dtype}; PyTorch "
                            f"needs the same dtype here: convert it with .to({x.dtype})")


def _advanced_setitem(x: Tensor, advanced: _Advanced, value, one_mask: bool = False) -> Tensor:
    """A scatter into what the basic key selects; of repeated indices, the last write stays."""
    everything = _is_everything(advanced.basic_key)
    box = x if everything else _basic_getitem(x, advanced.basic_key)
    index_shape = shapes_broadcast(*(t.shape for t in advanced.indices))
    layout = index_shape + tuple(d for i, d in enumerate(box.shape) if i not in advanced.axes)
    selected = layout if advanced.permutation is None else tuple(
        layout[p] for p in advanced.permutation)
    # 0-d index tensors alone act as ints (a copy, which converts); one boolean mask with a value
    # of one element is PyTorch's masked_fill_, which converts too
    if one_mask and isinstance(value, Tensor) and value.numel() == 1:
        value = value.reshape(())  # masked_fill_ takes any one-element shape
    elif any(index.ndim for index in advanced.indices):
        _check_same_dtype(x, value, "x[indices] = value")
    value = as_tensor(value, accept_data=True).to(x.dtype)
    try:
        value = expanded(value, selected)
    except ShapeMismatchError:
        raise ShapeMismatchError(f"cannot assign a value of shape {list(value.shape)} to an "
                                 f"index selecting shape {list(selected)}") from None
    if advanced.permutation is not None:
        inverse = sorted(range(len(selected)), key=lambda i: advanced.permutation[i])
        value = value.permute(*inverse)
    indices = checked(box, advanced.indices, advanced.axes, wrap=True)
    box = apply("scatter", [box, value, *indices], axes=advanced.axes, accumulate=False)
    return box if everything else setitem(x, advanced.basic_key, box)


def setitem(x: Tensor, key, value) -> Tensor:
    """The new value of `x` after `x[key] = value` (the caller assigns it in place)."""
    if isinstance(key, Tensor) and key.dtype.kind == "b":
        return _mask_assignment(x, key, value)
    entries = [e for e in (key if isinstance(key, tuple) else (key,))
               if isinstance(e, (Tensor, list, np.ndarray))]
    one_mask = len(entries) == 1 and isinstance(entries[0], Tensor) and entries[0].dtype == bool_
    key = _full_key(x.shape, key)
    advanced = _advanced(x.shape, key)
    if advanced is not None:
        return _advanced_setitem(x, advanced, value, one_mask)
    region = _region(x.shape, key)
    value = as_tensor(value, accept_data=True).to(x.dtype)
    try:
        value = reshaped(expanded(value, region.result_shape), region.box_shape)
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
