"""PyTorch's named products beyond matmul/mm/bmm: outer, dot and addmm, each a matrix product or
a broadcast multiplication (tracer/layout.py has matmul)."""
from __future__ import annotations

from tracer.dispatch import tensor_operand
from tracer.errors import ShapeMismatchError
from tracer.layout import broadcast_shapes_or_none
from tracer.tensor import Tensor


def outer(x: Tensor, other) -> Tensor:
    """The outer product of two 1-d tensors: x[i] * other[j] (PyTorch promotes, as `*`)."""
    other = tensor_operand(other, "outer")
    if x.ndim != 1 or other.ndim != 1:
        raise ShapeMismatchError(f"outer needs two 1-d tensors, got {x.ndim}-d and {other.ndim}-d")
    return x.unsqueeze(1) * other.unsqueeze(0)


def dot(x: Tensor, other) -> Tensor:
    """The inner product of two 1-d tensors of one size and dtype, as a 0-d tensor."""
    other = tensor_operand(other, "dot")
    if x.ndim != 1 or other.ndim != 1 or x.shape != other.shape:
        raise ShapeMismatchError(f"dot needs two 1-d tensors of one size, got shapes "
                                 f"{list(x.shape)} and {list(other.shape)}")
    return x.matmul(other)


def addmm(x: Tensor, mat1, mat2, *, beta=1, alpha=1) -> Tensor:
    """beta * x + alpha * (mat1 @ mat2), x broadcast to the product's shape; with beta = 0, x is
    not read (its nan and inf do not reach the result), as PyTorch's."""
    mat1, mat2 = tensor_operand(mat1, "addmm"), tensor_operand(mat2, "addmm")
    product = mat1.mm(mat2)
    product = product if isinstance(alpha, (int, float)) and alpha == 1 else product * alpha
    if broadcast_shapes_or_none(x.shape, product.shape) != product.shape:
        raise ShapeMismatchError(f"addmm: an input of shape {list(x.shape)} does not broadcast "
                                 f"to the product's shape {list(product.shape)}")
    if isinstance(beta, (int, float)) and beta == 0:
        return product
    return (x if isinstance(beta, (int, float)) and beta == 1 else x * beta) + product


METHODS = {"outer": outer, "ger": outer, "dot": dot, "addmm": addmm}
for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)
Tensor.addmm_ = lambda self, *args, **kwargs: self._assign(self.addmm(*args, **kwargs), "addmm_")

FUNCTIONS = dict(METHODS)
