"""Tensor's reductions: sum, mean, max and min (with their indices), any and all, and the
softmaxes built on them."""
from __future__ import annotations

import builtins
import weakref
from collections import namedtuple

import numpy as np

from tracer.ir import types as irtypes
from tracer.arithmetic import where
from tracer.creation import iota, zeros
from tracer.derivatives import evenly_distributed, selected
from tracer.dimensions import as_dim, dim_or_axis, normalize_dim, normalize_dims
from tracer.dispatch import apply
from tracer.dtypes import as_dtype, bool, int64
from tracer.eager_nodes import eager_float, one_node, unchanged
from tracer.errors import ArgumentError
from tracer.function import NativeFunction
from tracer.layout import fresh
from tracer.symbolic_zeros import zeros_made
from tracer.tensor import Tensor

MaxResult = namedtuple("MaxResult", ["values", "indices"])


class ReductionMethods:
    """Tensor's reductions (given to Tensor by tracer/methods.py)."""

    def sum(self, dim=None, keepdim: builtins.bool = False, *, dtype=None, axis=None) -> Tensor:
        """The sum over `dim` (all elements by default); with `dtype`, of the input converted to
        it first, as PyTorch's (a bool or integer tensor sums to int64 without)."""
        dim = dim_or_axis(dim, axis)
        x = self.to(as_dtype(dtype)) if dtype is not None else (
            self.to(int64) if self.dtype == bool else self)
        axes = normalize_dims(dim, x.ndim)
        # A sum over no axis (of a 0-d tensor) is still a new tensor, not `x` itself.
        result = apply("reduce_sum", [x], axes=axes) if axes else x.clone()
        return result._keep(axes, self.shape) if keepdim else result

    def _keep(self, axes, shape) -> Tensor:
        return fresh(self.reshape(tuple(1 if i in axes else d for i, d in enumerate(shape))))

    def any(self, dim=None, keepdim: builtins.bool = False) -> Tensor:
        return (self != 0).to(int64).sum(dim, keepdim) > 0

    def all(self, dim=None, keepdim: builtins.bool = False) -> Tensor:
        return (self == 0).to(int64).sum(dim, keepdim) == 0

    def mean(self, dim=None, keepdim: builtins.bool = False, *, dtype=None, axis=None) -> Tensor:
        """The mean over `dim` (all elements by default) of a float tensor, or of the input
        converted to the float `dtype` first, as PyTorch's."""
        dim = dim_or_axis(dim, axis)
        if dtype is not None:
            dtype = as_dtype(dtype)
            if not irtypes.is_float(dtype):
                raise ArgumentError(f"mean: dtype must be a float dtype, got {dtype}")
            return self.to(dtype).mean(dim, keepdim)
        if not irtypes.is_float(self.dtype):
            raise ArgumentError(f"mean needs a float tensor, got {self.dtype}; use .float() or "
                                f"dtype=tr.float32")
        axes = normalize_dims(dim, self.ndim)
        count = int(np.prod([self.shape[a] for a in axes], dtype=np.int64))
        # (PyTorch's mean_backward makes zeros of a symbolic zero, a sum and a division would not)
        return zeros_made(self.sum(dim=axes, keepdim=keepdim) / count)

    def max(self, dim=None, keepdim: builtins.bool = False):
        """The maximum; with `dim`, a (values, indices) pair as in PyTorch; with a tensor,
        the elementwise maximum."""
        if isinstance(dim, Tensor):
            return self.maximum(dim)
        return self._extremum("reduce_max", dim, keepdim)

    def min(self, dim=None, keepdim: builtins.bool = False):
        """The minimum; with `dim`, a (values, indices) pair as in PyTorch."""
        if isinstance(dim, Tensor):
            return self.minimum(dim)
        return self._extremum("reduce_min", dim, keepdim)

    def _extremum(self, reduction: str, dim, keepdim: builtins.bool):
        if self.dtype == bool:  # as PyTorch: the reductions have no bool form, int64 has
            result = self.to(int64)._extremum(reduction, dim, keepdim)
            return result != 0 if dim is None else MaxResult(result.values != 0, result.indices)
        if dim is None:
            return evenly_distributed(self, reduction)
        axis = normalize_dim(as_dim(dim), self.ndim)
        if self.ndim == 0:  # a new tensor, as PyTorch's (an in-place change must not reach self)
            return MaxResult(self.clone(), zeros((), dtype=int64))
        kept = apply(reduction, [self], axes=(axis,))._keep((axis,), self.shape)
        hit = self == kept
        if irtypes.is_float(self.dtype):
            hit = hit | (self != self)  # a nan is the extremum, as in PyTorch
        # The first index holding it: the largest (size - 1 - index) among the hits.
        size = self.shape[axis]
        position = iota(self.shape, axis)
        candidates = where(hit, position * -1 + (size - 1), -1)
        indices = (size - 1) - apply("reduce_max", [candidates], axes=(axis,)).detach()
        # The value at that index, so that (as in PyTorch) its gradient goes there alone.
        chosen = position == indices._keep((axis,), self.shape)
        values = selected(self, chosen, axis)
        if keepdim:
            values, indices = values._keep((axis,), self.shape), indices._keep((axis,), self.shape)
        return MaxResult(values, indices)

    def argmax(self, dim=None, keepdim: builtins.bool = False):
        if dim is None:
            return self.reshape(-1).max(0).indices
        return self.max(dim, keepdim).indices

    def argmin(self, dim=None, keepdim: builtins.bool = False):
        if dim is None:
            return self.reshape(-1).min(0).indices
        return self.min(dim, keepdim).indices

    def _shifted_down(self, dim: int) -> Tensor:
        """self minus its maximum along `dim`: the same softmax, and exp cannot overflow. Without
        elements there is nothing to shift (and no maximum along an empty `dim`)."""
        if self.numel() == 0:
            return self
        # The maximum's values only (a constant to the gradient): not max(dim), whose indices
        # cost two more passes over the row.
        if self.ndim == 0:
            return self - self.detach()
        axis = normalize_dim(as_dim(dim), self.ndim)
        maximum = apply("reduce_max", [self], axes=(axis,))._keep((axis,), self.shape)
        return self - maximum.detach()

    def softmax(self, dim: int) -> Tensor:
        return _Softmax.apply(self, dim)

    def log_softmax(self, dim: int) -> Tensor:
        if self.ndim and eager_float(self):
            return _eager_log_softmax(self, normalize_dim(as_dim(dim), self.ndim))
        return self._composed_log_softmax(dim)

    def _composed_log_softmax(self, dim: int) -> Tensor:
        shifted = self._shifted_down(dim)
        return shifted - shifted.exp().sum(dim, keepdim=True).log()


def _eager_log_softmax(x: Tensor, axis: int) -> Tensor:
    """log_softmax as one node of the eager tape: the composition's numpy operations in its
    order (the same values to the last bit), without its 8 dispatched primitives and 6 tape
    nodes (1.0 ms at (256, 10) where torch takes 0.1). The backward is PyTorch's, from the
    result alone: g - exp(y) * sum(g)."""
    array = x._eager_array("log_softmax")
    with np.errstate(all="ignore"):  # (nan and infinities propagate, as in PyTorch)
        shifted = array - np.max(array, axis=axis, keepdims=True)
        value = shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True,
                                        dtype=array.dtype))
    version = x._version
    outputs: list[weakref.ref] = []

    def backward(cotangent: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return cotangent - np.exp(value) * np.sum(cotangent, axis=axis, keepdims=True)

    def recorded_backward(cotangent: Tensor) -> Tensor:
        # from the result, as PyTorch's double backward (x may have changed in place since: the
        # node refuses only a change of the result); if it is gone, the result again from x
        result = outputs[0]()
        if result is None:
            unchanged(x, version, "log_softmax")
            result = x._composed_log_softmax(axis)
        return cotangent - result.exp() * cotangent.sum(axis, keepdim=True)

    result = one_node("log_softmax", x, array, value, backward, recorded_backward,
                      saves_output=True)
    outputs.append(weakref.ref(result))
    return result


class _Softmax(NativeFunction):
    """softmax with PyTorch's gradient, from its output y alone: y * (g - sum(g * y)). Where y
    is stored anyway (attention's probabilities are the operand of a product with V) the
    backward reads it instead of computing the exponentials again and dividing by their sums
    twice: the GPT step's attention backward row kernel over 16x6x128x128 went from 3.0 to 0.85
    ms on one thread (torch's softmax backward alone: 0.5 ms)."""

    @staticmethod
    def forward(ctx, x, dim):
        exponentials = x._shifted_down(dim).exp()
        result = exponentials / exponentials.sum(dim, keepdim=True)
        ctx.save_for_backward(result)
        ctx.dim = dim
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return result * (grad_output - (grad_output * result).sum(ctx.dim, keepdim=True)), None


def _extreme(x: Tensor, dim, keepdim: builtins.bool, reduction: str) -> Tensor:
    if x.dtype == bool:  # (as in _extremum)
        return _extreme(x.to(int64), dim, keepdim, reduction) != 0
    axes = normalize_dims(dim, x.ndim)
    result = apply(reduction, [x], axes=axes) if axes else x.clone()
    return result._keep(axes, x.shape) if keepdim else result


def amax(x: Tensor, dim=None, keepdim: builtins.bool = False) -> Tensor:
    """The maximum over one or several dimensions (values only)."""
    return _extreme(x, dim, keepdim, "reduce_max")


def amin(x: Tensor, dim=None, keepdim: builtins.bool = False) -> Tensor:
    """The minimum over one or several dimensions (values only)."""
    return _extreme(x, dim, keepdim, "reduce_min")
