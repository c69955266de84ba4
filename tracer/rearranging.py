"""PyTorch's functions that rearrange elements without computing new ones: flip, roll, narrow,
select, unbind, movedim/swapaxes/swapdims, mT, view_as/reshape_as, diagonal, diag,
repeat_interleave, meshgrid, and cat's other names (concat, concatenate, hstack, vstack). Each is
slices, pads, reshapes, transposes or a gather of an iota (no check needed: its indices are in
range by construction), so gradients are the primitives' own. What PyTorch returns as views are
copies here, marked as the core view operations mark theirs (tracer/layout.py)."""
from __future__ import annotations

import numbers

import numpy as np

from tracer.creation import iota, zeros
from tracer.dimensions import as_dim, normalize_dim, normalize_dims, number_argument
from tracer.dispatch import apply, as_tensor, from_data, tensor_operand
from tracer.errors import ArgumentError, IndexOutOfRangeError, ShapeMismatchError
from tracer.functional import cat
from tracer.gathering import index_select
from tracer.layout import fresh
from tracer.symbolic_zeros import zero_kept
from tracer.tensor import Tensor, mark_view


def _dims_argument(dims) -> list:
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        return list(dims[0])
    return list(dims)


def flip(x: Tensor, *dims) -> Tensor:
    """The order of the elements reversed along each of `dims` (a copy, as in PyTorch)."""
    axes = normalize_dims(_dims_argument(dims), x.ndim)
    if not axes or x.numel() == 0:
        return x.clone()
    indices = [x.shape[a] - 1 - iota(x.shape, a) if a in axes else iota(x.shape, a)
               for a in range(x.ndim)]
    return apply("gather", [x, *indices], axes=tuple(range(x.ndim)))


def roll(x: Tensor, shifts, dims=None) -> Tensor:
    """Elements shifted by `shifts` along `dims`, those pushed off one end coming back at the
    other; without `dims`, along the flattened tensor (its shape kept)."""
    shifts = [number_argument(s) for s in (shifts if isinstance(shifts, (tuple, list)) else [shifts])]
    if dims is None:
        if len(shifts) != 1:
            raise ArgumentError(f"roll without dims takes one shift, got {shifts}")
        return fresh(roll(x.flatten(), shifts, 0).reshape(x.shape))
    dims = list(dims) if isinstance(dims, (tuple, list)) else [dims]
    if len(shifts) != len(dims):
        raise ArgumentError(f"roll: {len(shifts)} shifts and {len(dims)} dimensions; give one "
                            f"shift per dimension")
    result = x
    for shift, dim in zip(shifts, dims):
        axis = normalize_dim(as_dim(dim), x.ndim)
        size = x.shape[axis] if x.ndim else 1
        cut = size - int(shift) % size if size else 0
        if cut in (0, size):
            continue
        result = cat([narrow(result, axis, cut, size - cut), narrow(result, axis, 0, cut)], axis)
    return result if result is not x else x.clone()


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    """Elements start .. start + length - 1 along `dim` (start may count from the end)."""
    axis = normalize_dim(as_dim(dim), x.ndim)
    start, length = int(number_argument(start)), int(number_argument(length))
    size = x.shape[axis]
    if not -size <= start <= size:
        raise IndexOutOfRangeError(f"narrow: start {start} is out of range for dimension {axis} "
                                   f"of size {size}")
    start += size if start < 0 else 0
    if length < 0 or start + length > size:
        raise ShapeMismatchError(f"narrow: start ({start}) + length ({length}) exceeds dimension "
                                 f"{axis}'s size ({size})")
    return x[(slice(None),) * axis + (slice(start, start + length),)]


def select(x: Tensor, dim: int, index: int) -> Tensor:
    """The slice at `index` along `dim` (one dimension fewer)."""
    axis = normalize_dim(as_dim(dim), x.ndim)
    index = number_argument(index)
    if x.ndim == 0:
        raise ShapeMismatchError("select() cannot be applied to a 0-d tensor")
    if not isinstance(index, numbers.Integral) or not -x.shape[axis] <= index < x.shape[axis]:
        raise IndexOutOfRangeError(f"select: index {index} is out of range for dimension {axis} "
                                   f"of size {x.shape[axis]}")
    return x[(slice(None),) * axis + (int(index),)]


def unbind(x: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices along `dim`, each without that dimension."""
    axis = normalize_dim(as_dim(dim), x.ndim)
    if x.ndim == 0:
        raise ShapeMismatchError("unbind() cannot be applied to a 0-d tensor")
    return tuple(select(x, axis, i) for i in range(x.shape[axis]))


def movedim(x: Tensor, source, destination) -> Tensor:
    """The dimensions `source` moved to the positions `destination`, the others in order."""
    sources = list(source) if isinstance(source, (tuple, list)) else [source]
    destinations = list(destination) if isinstance(destination, (tuple, list)) else [destination]
    if len(sources) != len(destinations):
        raise ArgumentError(f"movedim: {len(sources)} source and {len(destinations)} destination "
                            f"dimensions; give as many of each")
    sources = [normalize_dim(as_dim(d), x.ndim) for d in sources]
    destinations = [normalize_dim(as_dim(d), x.ndim) for d in destinations]
    if len(set(sources)) != len(sources) or len(set(destinations)) != len(destinations):
        raise ArgumentError(f"movedim: a dimension repeats in {source} or {destination}")
    order = [None] * x.ndim
    for s, d in zip(sources, destinations):
        order[d] = s
    rest = iter(d for d in range(x.ndim) if d not in sources)
    return x.permute([d if d is not None else next(rest) for d in order]) if x.ndim else x


def swapaxes(x: Tensor, axis0: int, axis1: int) -> Tensor:
    return x.transpose(axis0, axis1)


def matrix_transpose(x: Tensor) -> Tensor:
    """`x.mT`: the last two dimensions swapped."""
    if x.ndim < 2:
        raise ShapeMismatchError(f"x.mT needs a matrix or a batch of matrices, got a {x.ndim}-d "
                                 f"tensor")
    return x.transpose(-2, -1)


def view_as(x: Tensor, other) -> Tensor:
    return x.view(tensor_operand(other, "view_as").shape)


def reshape_as(x: Tensor, other) -> Tensor:
    return x.reshape(tensor_operand(other, "reshape_as").shape)


def diagonal(x: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The `offset`-th diagonal of the matrices in dimensions dim1 and dim2, as the last
    dimension (above the main diagonal for a positive offset)."""
    first, second = normalize_dim(as_dim(dim1), x.ndim), normalize_dim(as_dim(dim2), x.ndim)
    if x.ndim < 2 or first == second:
        raise ShapeMismatchError(f"diagonal needs two different dimensions of a tensor of at "
                                 f"least 2, got {dim1} and {dim2} of a {x.ndim}-d tensor")
    row, column = max(-offset, 0), max(offset, 0)
    length = max(0, min(x.shape[first] - row, x.shape[second] - column))
    position = iota((length,), 0)
    gathered = apply("gather", [x, position + row, position + column], axes=(first, second))
    return mark_view(movedim(gathered, 0, -1), x, "diagonal()")


def diag(x: Tensor, diagonal_index: int = 0) -> Tensor:
    """A 1-d x: the square matrix with x on its `diagonal_index`-th diagonal. A 2-d x: that
    diagonal of it."""
    if x.ndim == 2:
        return diagonal(x, diagonal_index).clone()
    if x.ndim != 1:
        raise ShapeMismatchError(f"diag needs a 1-d or 2-d tensor, got {x.ndim}-d")
    n, shift = x.shape[0], abs(diagonal_index)
    if n == 0:
        return zeros(shift, shift, dtype=x.dtype)
    # x as a column padded to n + 1 columns, read row by row as n x n: x[i] lands at (i, i)
    padded = apply("pad", [x.reshape(n, 1)], low=(0, 0), high=(0, n), interior=(0, 0))
    square = padded.reshape(n * (n + 1))[:n * n].reshape(n, n)
    low = (0, shift) if diagonal_index > 0 else (shift, 0)
    # (PyTorch's backward of it is the diagonal, a view: it keeps a symbolic zero; pad does not)
    return zero_kept(apply("pad", [square], low=low, high=low[::-1], interior=(0, 0)), x)


def repeat_interleave(x: Tensor, repeats, dim: int | None = None) -> Tensor:
    """Each element repeated `repeats` times along `dim` (the flattened tensor without it):
    an int, or (eagerly) a tensor of counts, one per element along `dim`."""
    if dim is None:
        x, dim = x.flatten(), 0
    axis = normalize_dim(as_dim(dim), x.ndim)
    if isinstance(repeats, Tensor) and repeats.ndim:
        counts = repeats._eager_array("repeat_interleave with a tensor of counts")
        if counts.shape != (x.shape[axis],) and counts.shape != (1,):
            raise ShapeMismatchError(f"repeat_interleave: {counts.shape[0]} counts for a "
                                     f"dimension of size {x.shape[axis]}")
        if (counts < 0).any() or counts.dtype.kind != "i":
            raise ArgumentError("repeat_interleave needs non-negative int64 counts")
        if counts.shape == (1,):
            return repeat_interleave(x, int(counts[0]), axis)
        positions = from_data(np.repeat(np.arange(len(counts)), counts))
        return index_select(x, axis, positions) if x.ndim else x
    count = int(number_argument(repeats))
    if count < 0:
        raise ArgumentError(f"repeat_interleave needs a non-negative count, got {count}")
    if x.ndim == 0:
        return x.reshape(1).expand(count).clone()
    spread = x.unsqueeze(axis + 1).expand(*x.shape[:axis + 1], count, *x.shape[axis + 1:])
    return fresh(spread.flatten(axis, axis + 1))  # (a copy in PyTorch too: no view)


def meshgrid(*tensors, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids: output i holds tensors[i] along dimension i ("ij") or, with "xy", the
    first two dimensions swapped (NumPy's Cartesian indexing)."""
    tensors = _dims_argument(tensors)
    if indexing not in ("ij", "xy"):
        raise ArgumentError(f"meshgrid: indexing is 'ij' or 'xy', got {indexing!r}")
    if not tensors:
        raise ArgumentError("meshgrid needs at least one tensor")
    tensors = [tensor_operand(t, "meshgrid") for t in tensors]
    if any(t.ndim > 1 for t in tensors):
        raise ShapeMismatchError("meshgrid takes 0-d or 1-d tensors")
    if len({t.dtype for t in tensors}) > 1:
        raise ArgumentError("meshgrid needs tensors of one dtype, as PyTorch")
    swap = indexing == "xy" and len(tensors) > 1
    sizes = [t.numel() for t in tensors]
    if swap:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    grids = []
    for i, t in enumerate(tensors):
        position = (1 - i if i < 2 else i) if swap else i
        shape = [1] * len(tensors)
        shape[position] = -1
        grids.append(t.reshape(shape).expand(*sizes))
    return tuple(grids)


def _at_least(x: Tensor, ndim: int) -> Tensor:
    """PyTorch's atleast_1d / atleast_2d: leading dimensions of 1 added."""
    return x.reshape((1,) * (ndim - x.ndim) + x.shape) if x.ndim < ndim else x


def hstack(tensors) -> Tensor:
    """cat along the columns (along dimension 0 for 1-d tensors)."""
    tensors = [_at_least(as_tensor(t), 1) for t in tensors]
    return cat(tensors, 0 if tensors and tensors[0].ndim == 1 else 1)


def vstack(tensors) -> Tensor:
    """cat along the rows, 1-d tensors as rows."""
    return cat([_at_least(as_tensor(t), 2) for t in tensors], 0)


METHODS = {
    "flip": flip, "roll": roll, "narrow": narrow, "select": select, "unbind": unbind,
    "movedim": movedim, "moveaxis": movedim, "swapaxes": swapaxes, "swapdims": swapaxes,
    "view_as": view_as, "reshape_as": reshape_as, "diagonal": diagonal, "diag": diag,
    "repeat_interleave": repeat_interleave,
}
for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)
Tensor.mT = property(matrix_transpose)

FUNCTIONS = dict(METHODS, meshgrid=meshgrid, concat=cat, concatenate=cat, hstack=hstack,
                 vstack=vstack)
