"""What PyTorch's embedding and embedding_bag do to the rows they look up besides reading them:
`max_norm` first renormalizes, in place, the rows the input indexes (torch.embedding_renorm_),
and `scale_grad_by_freq` divides the gradient of each looked-up row by how often its index occurs
in the input; and the table Embedding and EmbeddingBag start with."""
from __future__ import annotations

from tracer.arithmetic import where
from tracer.context import no_grad
from tracer.creation import ones, zeros
from tracer.dispatch import apply
from tracer.dtypes import float32, float64
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.ir.vjp import CustomRule
from tracer.random import randn
from tracer.tensor import Tensor


def padding_index(padding_idx: int | None, num_embeddings: int, name: str) -> int | None:
    """`padding_idx` counted from 0 (PyTorch keeps -1 as num_embeddings - 1), checked."""
    if padding_idx is not None and not -num_embeddings <= padding_idx < num_embeddings:
        raise ArgumentError(f"{name}: padding_idx must be within num_embeddings "
                            f"({num_embeddings}), got {padding_idx}")
    return None if padding_idx is None else padding_idx % num_embeddings


def table(num_embeddings: int, embedding_dim: int, padding_idx: int | None,
          given: Tensor | None, dtype, name: str) -> Tensor:
    """An embedding module's weight: `given` (`_weight`: its buffer), or standard normal with the
    padding row zero."""
    if given is not None:
        if tuple(given.shape) != (num_embeddings, embedding_dim):
            raise ShapeMismatchError(f"{name}: _weight of shape {list(given.shape)} for "
                                     f"({num_embeddings}, {embedding_dim})")
        return given
    weight = randn(num_embeddings, embedding_dim, dtype=float32 if dtype is None else dtype)
    if padding_idx is not None:
        weight[padding_idx] = 0
    return weight


def pretrained_shape(embeddings: Tensor, name: str) -> tuple[int, int]:
    """(num_embeddings, embedding_dim) of the table given to `name`.from_pretrained, 2-D."""
    if embeddings.ndim != 2:
        raise ShapeMismatchError(f"{name}.from_pretrained needs 2-D embeddings, got shape "
                                 f"{list(embeddings.shape)}")
    return embeddings.shape


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
    inverse = frequency.index_select(0, indices).reciprocal().reshape(
        length, *[1] * (rows.ndim - 1))
    rows.register_hook(lambda gradient: apply("custom_vjp", [gradient * inverse, gradient],
                                              num_outputs=1, rule=_UNSCALED))
    return rows


# The scaled gradient's own gradient is the unscaled one, as PyTorch's double backward of the
# embedding's backward (embedding_dense_double_backward) does not scale: a second derivative
# divides by the count once, where the hook's product would divide twice.
_UNSCALED = CustomRule("unscaled", lambda builder, cotangents, needs: [cotangents[0]])
