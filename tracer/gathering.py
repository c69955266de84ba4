"""PyTorch's dimension-wise index operations, composed from the gather and scatter primitives:
index_select, gather, take_along_dim, index_add_, scatter_ and scatter_add_."""
from __future__ import annotations

import numbers

from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.creation import iota
from tracer.dimensions import as_dim as _as_dim
from tracer.dimensions import normalize_dim as _normalize_dim
from tracer.dispatch import apply, as_tensor
from tracer.dtypes import int64
from tracer.layout import reshaped, shapes_broadcast
from tracer.tensor import Tensor


def _index(index, what: str, max_ndim: int | None = None) -> Tensor:
    if not isinstance(index, Tensor) or index.dtype != int64:
        kind = index.dtype if isinstance(index, Tensor) else type(index).__name__
        raise ArgumentError(f"{what} takes an int64 index tensor, got {kind}")
    if max_ndim is not None and index.ndim > max_ndim:
        raise ShapeMismatchError(f"{what} takes an index of at most {max_ndim} dimension(s), got "
                                 f"shape {list(index.shape)}")
    return index


def checked(x: Tensor, indices, axes, wrap: bool) -> list[Tensor]:
    """Each index tensor checked whole against the dimension of `x` it indexes (the check_index
    primitive): PyTorch refuses an out-of-range index even where the result reads none of it (an
    empty or sliced result, one never used). With `wrap`, negative indices count from the end
    (PyTorch's `x[i]`); without, they are out of range (its index_select, gather, index_add_)."""
    return [apply("check_index", [index], size=x.shape[axis], axis=axis, wrap=wrap)
            for index, axis in zip(indices, axes)]


def _scalar(x: Tensor) -> Tensor:
    """A one-element result as a 0-d tensor: a new tensor, as PyTorch's (Tensor.reshape would
    make it a view-copy, whose change in place is refused)."""
    return apply("reshape", [x], shape=())


def _move_first_to(x: Tensor, dim: int) -> Tensor:
    """x with its first dimension moved to position `dim` (the others keep their order)."""
    if dim == 0:
        return x
    order = list(range(1, dim + 1)) + [0] + list(range(dim + 1, x.ndim))
    return apply("transpose", [x], permutation=order)


def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """The slices of x along `dim` at the positions in the 1-D `index` (repeats allowed)."""
    dim = _normalize_dim(_as_dim(dim), x.ndim)
    index = reshaped(_index(index, "index_select", max_ndim=1), -1)
    if x.ndim == 0:
        x, dim = x.reshape(1), 0
        return _scalar(apply("gather", [x, *checked(x, [index], (0,), False)], axes=(0,)))
    return _move_first_to(apply("gather", [x, *checked(x, [index], (dim,), False)], axes=(dim,)),
                          dim)


def _gather_along(x: Tensor, dim: int, index: Tensor, wrap: bool = False) -> Tensor:
    """out[i...] = x[i... with i[dim] replaced by index[i...]], for an index of x's rank whose
    other dimensions are no larger than x's (the iotas along them need no check)."""
    (index,) = checked(x, [index], (dim,), wrap)
    indices = [index if axis == dim else iota(index.shape, axis) for axis in range(x.ndim)]
    return apply("gather", [x, *indices], axes=tuple(range(x.ndim)))


def gather(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """PyTorch's gather: out[i][j] = x[index[i][j]][j] for dim 0 (and so on)."""
    index = _index(index, "gather")
    if x.ndim == 0 and index.ndim == 0:
        _normalize_dim(_as_dim(dim), 0)
        return _scalar(_gather_along(x.reshape(1), 0, index.reshape(1)))
    dim = _normalize_dim(_as_dim(dim), x.ndim)
    if index.ndim != x.ndim or any(i > s for axis, (i, s) in enumerate(zip(index.shape, x.shape))
                                   if axis != dim):
        raise ShapeMismatchError(
            f"gather: an index of shape {list(index.shape)} does not fit a tensor of shape "
            f"{list(x.shape)} along dimension {dim}; it needs as many dimensions, each no larger "
            f"except dimension {dim}")
    return _gather_along(x, dim, index)


def take_along_dim(x: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """numpy's take_along_axis with broadcasting (PyTorch's take_along_dim); without `dim`, of
    the flattened tensor."""
    indices = _index(indices, "take_along_dim")
    if dim is None:
        return _gather_along(x.reshape(-1), 0, indices.reshape(-1))
    dim = _normalize_dim(_as_dim(dim), x.ndim)
    if indices.ndim != x.ndim:
        raise ShapeMismatchError(f"take_along_dim: indices of shape {list(indices.shape)} for a "
                                 f"tensor of shape {list(x.shape)}; they need as many dimensions")
    others = shapes_broadcast(*(tuple(t.shape[:dim] + (1,) + t.shape[dim + 1:])
                                for t in (x, indices)))
    x = x.expand(*others[:dim], x.shape[dim], *others[dim + 1:])
    indices = indices.expand(*others[:dim], indices.shape[dim], *others[dim + 1:])
    return _gather_along(x, dim, indices, wrap=True)  # as PyTorch's, only with a dim


def index_add(x: Tensor, dim: int, index: Tensor, source, alpha=1) -> Tensor:
    """The new value of x after `x.index_add_(dim, index, source, alpha=alpha)`: the slices of
    `source` along `dim` added into x at the positions in `index` (repeats add up)."""
    dim = _normalize_dim(_as_dim(dim), x.ndim)
    index = _index(index, "index_add_", max_ndim=1).reshape(-1)
    source = as_tensor(source)
    if source.dtype != x.dtype:
        raise ArgumentError(f"index_add_: the source is {source.dtype}, the tensor {x.dtype}; "
                            f"PyTorch needs the same dtype: convert it with .to({x.dtype})")
    if isinstance(alpha, Tensor) or not (isinstance(alpha, numbers.Number) and alpha == 1):
        source = source * alpha
    source = source.to(x.dtype)
    expected = x.shape[:dim] + index.shape + x.shape[dim + 1:] if x.ndim else index.shape
    if source.shape != expected:
        raise ShapeMismatchError(f"index_add_: a source of shape {list(source.shape)} for "
                                 f"{index.shape[0]} indices into a tensor of shape "
                                 f"{list(x.shape)} along dimension {dim}; expected "
                                 f"{list(expected)}")
    if x.ndim == 0:
        x = x.reshape(1)
        return _scalar(apply("scatter", [x, source, *checked(x, [index], (0,), False)],
                             axes=(0,), accumulate=True))
    updates = source if dim == 0 else source.permute(dim, *(d for d in range(x.ndim) if d != dim))
    return apply("scatter", [x, updates, *checked(x, [index], (dim,), False)], axes=(dim,),
                 accumulate=True)


def _scattered(x: Tensor, dim: int, index: Tensor, source, what: str) -> tuple:
    """(x, the index tensors of every axis, the updates) of PyTorch's scatter and scatter_add:
    `source` a tensor of x's rank and dtype no smaller than the index (the part the index covers
    is written), or for scatter a number (written at every index); 0-d operands as 1-D ones."""
    index = _index(index, what)
    # (a Python number passed to a traced function arrives as a weak 0-d tensor: still a number)
    from_tensor = isinstance(source, Tensor) and not source._weak
    if from_tensor and source.dtype != x.dtype:
        raise ArgumentError(f"{what}: the source is {source.dtype}, the tensor {x.dtype}; "
                            f"PyTorch needs the same dtype: convert it with .to({x.dtype})")
    for name, operand in (("tensor", x), ("source", source if from_tensor else index)):
        if index.ndim != operand.ndim:
            raise ShapeMismatchError(f"{what}: an index of {index.ndim} dimension(s) for a "
                                     f"{name} of {operand.ndim}; they need as many")
    if x.ndim == 0:
        _normalize_dim(_as_dim(dim), 0)
        x, dim, index = x.reshape(1), 0, index.reshape(1)
        source = source.reshape(1) if from_tensor else source
    dim = _normalize_dim(_as_dim(dim), x.ndim)
    if from_tensor:
        if any(i > s for i, s in zip(index.shape, source.shape)) or any(
                i > s for axis, (i, s) in enumerate(zip(index.shape, x.shape)) if axis != dim):
            raise ShapeMismatchError(
                f"{what}: an index of shape {list(index.shape)} needs to be no larger than the "
                f"tensor {list(x.shape)} apart from dimension {dim} and no larger than the source "
                f"{list(source.shape)}")
        updates = source[tuple(slice(0, size) for size in index.shape)]
    else:
        updates = as_tensor(source).to(x.dtype).expand(*index.shape)
    (index,) = checked(x, [index], (dim,), False)
    indices = [index if axis == dim else iota(index.shape, axis) for axis in range(x.ndim)]
    return x, indices, updates


def scatter(x: Tensor, dim: int, index: Tensor, src=None, *, value=None,
            reduce: str | None = None) -> Tensor:
    """The new value of x after `x.scatter_(dim, index, src)`: for dim 0, x[index[i][j]][j] =
    src[i][j] (and so on), or the number `value` there. Of repeated indices, the last one's value
    is written (PyTorch leaves it unspecified); each source element gets the gradient of the
    position it went to, and x none there, as PyTorch's."""
    if reduce is not None:
        raise ArgumentError(f"scatter with reduce={reduce!r} (deprecated in PyTorch) is not "
                            f"supported; use scatter_add, or scatter_reduce in PyTorch")
    if (src is None) == (value is None):
        raise ArgumentError("scatter takes either a source tensor src or a number value")
    scalar = x.ndim == 0
    x, indices, updates = _scattered(x, dim, index, value if src is None else src, "scatter")
    result = apply("scatter", [x, updates, *indices], axes=tuple(range(x.ndim)),
                   accumulate=False)
    return _scalar(result) if scalar else result


def scatter_add(x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """The new value of x after `x.scatter_add_(dim, index, src)`: for dim 0, src[i][j] added
    to x[index[i][j]][j] (and so on; repeated indices add up)."""
    if not isinstance(src, Tensor):
        raise ArgumentError(f"scatter_add takes a source tensor, got {type(src).__name__}")
    scalar = x.ndim == 0
    x, indices, updates = _scattered(x, dim, index, src, "scatter_add")
    result = apply("scatter", [x, updates, *indices], axes=tuple(range(x.ndim)), accumulate=True)
    return _scalar(result) if scalar else result
