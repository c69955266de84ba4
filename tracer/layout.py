"""Tensor's layout operations: reshape, permute, transpose, expand and the like, which PyTorch
makes views and which are copies here (`mark_view` refuses what would tell the difference), and
the matrix product."""
from __future__ import annotations

import functools

import numpy as np

from tracer.ir.primitives import ShapeError, broadcast_shapes
from tracer.dimensions import normalize_dim, shape_arguments
from tracer.dispatch import apply, as_tensor, tensor_operand
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.symbolic_zeros import zero_kept
from tracer.tensor import Tensor, mark_view


def shapes_broadcast(*shapes) -> tuple[int, ...]:
    """The broadcast shape, or a ShapeMismatchError (for the user) naming the shapes."""
    try:
        return broadcast_shapes(*shapes)
    except ShapeError as error:
        raise ShapeMismatchError(str(error)) from None


def broadcast_shapes_or_none(*shapes):
    try:
        return broadcast_shapes(*shapes)
    except ShapeError:
        return None


def _view_operation(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        if result is self and method.__name__ == "flatten":
            return result  # (PyTorch's too, where no dimensions merge)
        if result is self:  # a view that changes nothing is still a tensor of its own in PyTorch:
            # a gradient with respect to it, or its requires_grad_(), is not the tensor's
            result = apply("reshape", [self], shape=self.shape)
        # PyTorch's reshape of a view (say of a transpose) may be a copy with a version of its
        # own; of a tensor that is no view, it is a view.
        shares = method.__name__ not in ("reshape", "flatten") or self._view_base is None
        mark_view(result, self, f"{method.__name__}()", shares)
        return result
    wrapper.__doc__ = (method.__doc__ or "") + " (A copy here: see mark_view.)"
    return wrapper


def _target_shape(x: Tensor, shape) -> tuple[int, ...]:
    """The shape `x.reshape(*shape)` makes: its -1 worked out."""
    shape = list(shape_arguments(shape))
    if shape.count(-1) > 1:
        raise ShapeMismatchError("reshape: only one dimension can be -1")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if known == 0 or x.numel() % known:
            raise ShapeMismatchError(f"cannot reshape {list(x.shape)} to {shape}")
        shape[shape.index(-1)] = x.numel() // known
    return tuple(shape)


# For the library's own use: x itself where the shape is x's already (a user's reshape() or
# expand() is a tensor of its own even then, see _view_operation, which costs a copy eagerly).
def reshaped(x: Tensor, *shape) -> Tensor:
    return x if _target_shape(x, shape) == x.shape else x.reshape(*shape)


def expanded(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    return x if x.shape == tuple(shape) else x.expand(*shape)


def fresh(tensor: Tensor) -> Tensor:
    """`tensor`, a result that merely used a view operation on the way: not a view-copy itself."""
    tensor._view_of = tensor._view_base = None
    tensor._view_shares_version = False
    return tensor


class LayoutMethods:
    """Tensor's shape and layout methods (given to Tensor by tracer/methods.py)."""

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[normalize_dim(dim, self.ndim)]

    def nelement(self) -> int:
        return self.numel()

    def element_size(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    def stride(self, dim: int | None = None):
        """The strides, in elements, of the row-major layout every tensor has here (see
        contiguous())."""
        # (a dimension of size 0 counts as 1, as in PyTorch)
        strides = tuple(int(np.prod([max(d, 1) for d in self.shape[i + 1:]], dtype=np.int64))
                        for i in range(self.ndim))
        return strides if dim is None else strides[normalize_dim(dim, self.ndim)]

    def is_contiguous(self, memory_format=None) -> bool:
        return True

    @_view_operation
    def reshape(self, *shape) -> Tensor:
        shape = _target_shape(self, shape)
        return self if shape == self.shape else apply("reshape", [self], shape=shape)

    view = reshape

    @_view_operation
    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """The dimensions start_dim .. end_dim (inclusive) merged into one."""
        if self.ndim == 0:
            normalize_dim(start_dim, 0), normalize_dim(end_dim, 0)
            return self.reshape(1)
        start, end = normalize_dim(start_dim, self.ndim), normalize_dim(end_dim, self.ndim)
        if start > end:
            raise ArgumentError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
        if start == end:
            return self
        merged = int(np.prod(self.shape[start:end + 1], dtype=np.int64))
        return self.reshape(self.shape[:start] + (merged,) + self.shape[end + 1:])

    @_view_operation
    def unflatten(self, dim: int, sizes) -> Tensor:
        """Dimension `dim` split into `sizes` (one of them may be -1)."""
        axis = normalize_dim(dim, self.ndim)
        sizes = list(shape_arguments((sizes,)))
        if sizes.count(-1) > 1:
            raise ShapeMismatchError("unflatten: only one size can be -1")
        known = int(np.prod([d for d in sizes if d != -1], dtype=np.int64))
        if -1 in sizes and known:
            sizes[sizes.index(-1)] = self.shape[axis] // known
        if int(np.prod(sizes, dtype=np.int64)) != self.shape[axis]:
            raise ShapeMismatchError(f"unflatten: sizes {sizes} do not multiply to dimension "
                                     f"{axis}'s size {self.shape[axis]}")
        return self.reshape(self.shape[:axis] + tuple(sizes) + self.shape[axis + 1:])

    def repeat(self, *sizes) -> Tensor:
        """The tensor tiled `sizes[i]` times along each dimension (new leading dimensions for
        sizes beyond the tensor's): a broadcast between each dimension and its repeat count."""
        sizes = shape_arguments(sizes)
        if len(sizes) < self.ndim or any(r < 0 for r in sizes):
            raise ShapeMismatchError(f"repeat: {list(sizes)} needs a non-negative count for each "
                                     f"of the tensor's {self.ndim} dimensions (and may add more)")
        shape = (1,) * (len(sizes) - self.ndim) + self.shape
        interleaved = tuple(d for pair in zip((1,) * len(shape), shape) for d in pair)
        expanded = tuple(d for pair in zip(sizes, shape) for d in pair)
        tiled = self.reshape(interleaved).expand(*expanded)
        return fresh(tiled.reshape(tuple(r * d for r, d in zip(sizes, shape))))

    @_view_operation
    def permute(self, *dims) -> Tensor:
        dims = shape_arguments(dims)
        if len(dims) != self.ndim:
            raise ShapeMismatchError(f"permute needs {self.ndim} dimensions, got {list(dims)}")
        return apply("transpose", [self], permutation=[normalize_dim(d, self.ndim) for d in dims])

    @_view_operation
    def transpose(self, dim0: int, dim1: int) -> Tensor:
        order = list(range(self.ndim))
        a, b = normalize_dim(dim0, self.ndim), normalize_dim(dim1, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self if a == b else apply("transpose", [self], permutation=order)

    @_view_operation
    def t(self) -> Tensor:
        if self.ndim > 2:
            raise ShapeMismatchError(f"t() expects a tensor of at most 2 dimensions, got {self.ndim}; "
                                     f"use transpose(dim0, dim1)")
        return self if self.ndim < 2 else self.transpose(0, 1)

    @property
    @_view_operation
    def T(self) -> Tensor:
        return self.permute(*reversed(range(self.ndim)))

    @_view_operation
    def unsqueeze(self, dim: int) -> Tensor:
        dim = dim % (self.ndim + 1) if -self.ndim - 1 <= dim <= self.ndim else None
        if dim is None:
            raise ShapeMismatchError(f"unsqueeze dimension out of range for {self.ndim} dimensions")
        return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

    @_view_operation
    def squeeze(self, dim=None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(d for d in self.shape if d != 1))
        if isinstance(dim, (tuple, list)):  # PyTorch 2's: those of the dimensions of size 1
            axes = {normalize_dim(d, self.ndim) for d in dim} if self.ndim else set()
            return self.reshape(tuple(size for axis, size in enumerate(self.shape)
                                      if axis not in axes or size != 1))
        axis = normalize_dim(dim, self.ndim)
        if self.ndim == 0 or self.shape[axis] != 1:
            return self
        return self.reshape(self.shape[:axis] + self.shape[axis + 1:])

    @_view_operation
    def expand(self, *sizes) -> Tensor:
        sizes = shape_arguments(sizes)
        if len(sizes) < self.ndim:
            raise ShapeMismatchError(f"expand: {list(sizes)} has fewer dimensions than "
                                     f"{list(self.shape)}")
        lead = len(sizes) - self.ndim
        shape = tuple(self.shape[i - lead] if d == -1 else d for i, d in enumerate(sizes))
        if any(d == -1 for d in sizes[:lead]):
            raise ShapeMismatchError("expand: -1 is not allowed for new leading dimensions")
        for i, d in enumerate(self.shape):
            if d != 1 and d != shape[lead + i]:
                raise ShapeMismatchError(f"expand: cannot expand {list(self.shape)} to {list(shape)}")
        return self if shape == self.shape else apply("broadcast", [self], shape=shape)

    @_view_operation
    def expand_as(self, other: Tensor) -> Tensor:
        return self.expand(*tensor_operand(other, "expand_as").shape)

    def matmul(self, other) -> Tensor:
        """numpy/PyTorch matmul: 1-D operands are promoted and squeezed, batch dims broadcast."""
        x, y = self, tensor_operand(other, "matmul")
        if x.dtype != y.dtype:  # PyTorch does not promote the operands of a matrix product
            raise ShapeMismatchError(f"matmul of a {x.dtype} and a {y.dtype} tensor; convert one "
                                     f"(.to(...)) so that both have the same dtype")
        if x.ndim == 0 or y.ndim == 0:
            raise ShapeMismatchError("matmul does not take 0-d tensors; use *")
        vector_x, vector_y = x.ndim == 1, y.ndim == 1
        if vector_x:
            x = x.unsqueeze(0)
        if vector_y:
            y = y.unsqueeze(1)
        batch = broadcast_shapes(x.shape[:-2], y.shape[:-2])
        if x.shape[-1] != y.shape[-2]:
            raise ShapeMismatchError(f"matmul: shapes {list(self.shape)} and "
                                     f"{list(as_tensor(other).shape)} "
                                     f"do not line up ({x.shape[-1]} != {y.shape[-2]})")
        if self.ndim > 2 and y.ndim == 2:
            # (..., m, k) @ (k, n), a linear layer on a batch, is one (... * m, k) @ (k, n)
            # product, as PyTorch folds it: one gemm, not one per batch element on a copy of y
            # broadcast in memory, and y's gradient one product, not a batch of them summed.
            rows = int(np.prod(x.shape[:-1], dtype=np.int64))
            result = apply("matmul", [x.reshape(rows, x.shape[-1]), y])
            result = result.reshape(*x.shape[:-1], y.shape[-1])
        else:
            result = apply("matmul", [expanded(x, (*batch, *x.shape[-2:])),
                                      expanded(y, (*batch, *y.shape[-2:]))])
        if vector_x:
            result = result.squeeze(-2)
        if vector_y:
            result = result.squeeze(-1)
        if vector_x and vector_y:  # (PyTorch's dot, whose backward is products, unlike mm's)
            return zero_kept(fresh(result), self, other)
        return fresh(result)

    def mm(self, other) -> Tensor:
        if self.ndim != 2 or as_tensor(other).ndim != 2:
            raise ShapeMismatchError(f"mm needs two 2-d tensors, got {self.ndim}-d and "
                                     f"{as_tensor(other).ndim}-d; use matmul")
        return self.matmul(other)

    def __matmul__(self, other): return self.matmul(other)
    def __rmatmul__(self, other): return as_tensor(other).matmul(self)
