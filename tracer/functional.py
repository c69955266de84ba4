"""torch's functional spellings (`tr.exp(x)` for `x.exp()`), and `cat`/`stack`, built from pad."""
from __future__ import annotations

from typing import Sequence

from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.dimensions import normalize_dim
from tracer.dispatch import apply, as_tensor, promote
from tracer.symbolic_zeros import zero_kept
from tracer.tensor import Tensor

_METHODS = ("abs sign exp log sqrt tanh sigmoid relu sin cos neg pow clamp mm matmul t transpose "
            "permute reshape unsqueeze squeeze flatten sum mean max min argmax softmax "
            "log_softmax maximum minimum any all index_select gather take_along_dim index_add round "
            "scatter scatter_add "
            "sort argsort topk argmin").split()


def _functional(name: str):
    def function(tensor, *args, **kwargs):
        return getattr(as_tensor(tensor), name)(*args, **kwargs)
    function.__name__ = name
    function.__doc__ = f"`tr.{name}(x, ...)` is `x.{name}(...)`."
    return function


FUNCTIONS = {name: _functional(name) for name in _METHODS}


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate along `dim`: each tensor is padded to the full size and the padded tensors are
    added, so the gradient of each is the slice it came from. Float tensors are padded with -0.0
    (as -pad(-t)), the identity of IEEE addition, so that every element, a -0.0 included, comes
    through the sum unchanged."""
    tensors = promote(*tensors) if len(tensors) > 1 else [as_tensor(t) for t in tensors]
    if not tensors:
        raise ArgumentError("cat needs at least one tensor")
    first = tensors[0]
    axis = normalize_dim(dim, first.ndim)
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape))
                                       if i != axis):
            raise ShapeMismatchError(f"cat along dimension {axis}: shapes {list(first.shape)} and "
                                     f"{list(t.shape)} differ elsewhere")
    total = sum(t.shape[axis] for t in tensors)
    result, offset = None, 0
    for t in tensors:
        low, high = [0] * t.ndim, [0] * t.ndim
        low[axis], high[axis] = offset, total - offset - t.shape[axis]
        pad = {"low": low, "high": high, "interior": [0] * t.ndim}
        padded = (-apply("pad", [-t], **pad) if t.dtype.kind == "f" else apply("pad", [t], **pad))
        result = padded if result is None else (result | padded if t.dtype.kind == "b"
                                                else result + padded)
        offset += t.shape[axis]
    # (PyTorch's backward of cat, slices, keeps a symbolic zero, that of pad and neg would not)
    return zero_kept(result, *tensors)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Stack equally shaped tensors along a new dimension `dim`."""
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise ArgumentError("stack needs at least one tensor")
    if -tensors[0].ndim - 1 <= dim < 0:
        dim += tensors[0].ndim + 1
    return cat([t.unsqueeze(dim) for t in tensors], dim)
