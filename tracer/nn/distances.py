"""PyTorch's normalize, cosine_similarity and pairwise_distance, as compositions of norms."""
from __future__ import annotations

from tracer.arithmetic import where
from tracer.dimensions import normalize_dim
from tracer.dispatch import as_tensor
from tracer.errors import ArgumentError
from tracer.function import NativeFunction
from tracer.layout import shapes_broadcast
from tracer.tensor import Tensor


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12,
              out=None) -> Tensor:
    """`input` divided by its p-norm along `dim`, the norm at least `eps`."""
    if out is not None:
        raise ArgumentError("normalize(out=...): tracer takes no out= arguments; assign the "
                            "result")
    return input / input.norm(p, dim, keepdim=True).clamp_min(eps)


class _AtLeast(NativeFunction):
    """max(x, eps) whose gradient passes unchanged, also where x < eps: PyTorch's
    cosine_similarity clamps the norms in place under no_grad, so its autograd never sees the
    clamp."""

    @staticmethod
    def forward(ctx, x, eps):
        return x.clamp_min(eps)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


class _TwoNorm(NativeFunction):
    """linalg_vector_norm(x, 2, dim, keepdim=True) with its backward as PyTorch's:
    grad * (x / norm masked to 0 where the norm is 0), so that a nan gradient (from an infinite
    x2) stays nan at a zero x1 (Tensor.norm's gradient there is 0 whatever comes back)."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.save_for_backward(x)
        ctx.dim = dim
        return x.norm(2, dim, keepdim=True)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        norm = x.norm(2, ctx.dim, keepdim=True)  # (from x, so that a second derivative follows)
        return grad_output * where(norm == 0, 0.0, x / norm), None


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """The cosine of the angle between x1 and x2 (broadcast together) along `dim`, as PyTorch
    2.13: each divided by its 2-norm (at least `eps`) first, then their dot product, so that the
    result stays within [-1, 1] and nothing overflows."""
    x1, x2 = as_tensor(x1), as_tensor(x2)
    shape = shapes_broadcast(x1.shape, x2.shape)
    x1, x2 = x1.expand(*shape), x2.expand(*shape)
    dim = normalize_dim(dim, len(shape))
    norm1 = _AtLeast.apply(_TwoNorm.apply(x1, dim), eps)
    norm2 = _AtLeast.apply(_TwoNorm.apply(x2, dim), eps)
    return ((x1 / norm1) * (x2 / norm2)).sum(dim)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6,
                      keepdim: bool = False) -> Tensor:
    """The p-norm of x1 - x2 + eps along the last dimension (of the larger rank)."""
    x1, x2 = as_tensor(x1), as_tensor(x2)
    return (x1 - x2 + eps).norm(p, max(x1.ndim, x2.ndim) - 1, keepdim=keepdim)
