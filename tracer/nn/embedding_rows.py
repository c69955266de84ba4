"""What PyTorch's embedding and embedding_bag do to the rows they look up besides reading them:
`max_norm` first renormalizes, in place, the rows the input indexes (torch.embedding_renorm_),
and `scale_grad_by_freq` divides the gradient of each looked-up row by how often its index occurs
in the input."""
from __future__ import annotations

from tracer.arithmetic import where
from tracer.context import no_grad
from tracer.creation import ones, zeros
from tracer.dispatch import apply
from tracer.dtypes import float64
from tracer.errors import ArgumentError
from tracer.ir.vjp import CustomRule
from tracer.tensor import Tensor


def check_sparse(sparse: bool, name: str) -> None:
    if sparse:
        raise ArgumentError(f"{name}: sparse gradients are not supported (tracer's gradients are "
                            f"dense tensors); use sparse=False, with any optimizer but SparseAdam")


def renormalize(weight: Tensor, indices: Tensor, max_norm: float, norm_type: float) -> None:
    """PyTorch's embedding_renorm_: each row of `weight` at the flat `indices` whose
    `norm_type`-norm exceeds `max_norm` is scaled in place by max_norm / (norm + 1e-7), unseen
    by autograd; a repeated index writes the same row."""
    with no_grad():
        rows = weight.index_select(0, indices)
        # (as PyTorch's kernel: the norm in the weight's dtype, the comparison and the scale in
        # double precision)
        norms = rows.norm(norm_type, dim=1, keepdim=True).to(float64)
        scales = where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
        weight[indices] = rows * scales.to(weight.dtype)


def scaled_by_frequency(rows: Tensor, indices: Tensor, count: int) -> Tensor:
    """`rows` (looked up at the flat `indices` of a table of `count` rows), whose gradient is
    divided by how often each row's index occurs among `indices` (PyTorch's embedding_backward
    with scale_grad_by_freq); their values unchanged."""
    if not rows.requires_grad:
        return rows
    length = indices.shape[0]
    frequency = zeros(count, dtype=rows.dtype).index_add(0, indices, ones(length, dtype=rows.dtype))
    inverse = frequency.index_select(0, indices).reciprocal().reshape(length, *[1] * (rows.ndim - 1))
    rows.register_hook(lambda gradient: apply("custom_vjp", [gradient * inverse, gradient],
                                              num_outputs=1, rule=_UNSCALED))
    return rows


# The scaled gradient's own gradient is the unscaled one, as PyTorch's double backward of the
# embedding's backward (embedding_dense_double_backward) does not scale: a second derivative
# divides by the count once, where the hook's product would divide twice.
_UNSCALED = CustomRule("unscaled", lambda builder, cotangents, needs: [cotangents[0]])
