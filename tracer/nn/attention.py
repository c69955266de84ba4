"""`tr.nn.functional.scaled_dot_product_attention`: PyTorch's attention, as the composition its
documentation gives (scores, mask, softmax, dropout, product with the values), with the two
places where PyTorch's kernels differ from that composition kept as PyTorch has them:

- a query row that may attend to no key (its boolean mask all False, or its float mask all -inf)
  gives zeros and a zero gradient, where softmax over -inf alone would give nan;
- `is_causal` masks from index comparisons computed in the kernel (key position <= query
  position, the top-left aligned lower triangle), not from a tensor of ones."""
from __future__ import annotations

import builtins
import math

from tracer.arithmetic import where
from tracer.creation import iota
from tracer.functional import cat
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.ir import types as irtypes
from tracer.layout import broadcast_shapes_or_none, shapes_broadcast
from tracer.nn.dropout import dropout
from tracer.tensor import Tensor

# Causal attention over at least 2 * CAUSAL_BLOCK_ROWS queries is cut into up to CAUSAL_BLOCKS
# blocks of rows (_causal_blocks): blocks of fewer rows make products too small to run well.
CAUSAL_BLOCK_ROWS = 32
CAUSAL_BLOCKS = 4


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: builtins.bool = False, *, scale: float | None = None,
                                 enable_gqa: builtins.bool = False) -> Tensor:
    """softmax(query @ key^T * scale + mask) @ value over the last two dimensions (..., L, E),
    (..., S, E), (..., S, Ev) -> (..., L, Ev). `attn_mask`: bool (True where a query may attend)
    or float (added to the scores), broadcast to (..., L, S); `is_causal`: query i attends to
    keys 0..i; `scale` defaults to 1 / sqrt(E); `dropout_p` drops attention weights (always, as
    PyTorch's function does, whatever a module's training flag); `enable_gqa`: each group of
    query heads (dimension -3) shares one head of key and value."""
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise ShapeMismatchError("scaled_dot_product_attention needs query, key and value of at "
                                 "least 2 dimensions (..., sequence, features)")
    if is_causal and attn_mask is not None:
        raise ArgumentError("scaled_dot_product_attention: give attn_mask or is_causal=True, not "
                            "both (PyTorch refuses both too)")
    if not 0.0 <= dropout_p <= 1.0:
        raise ArgumentError(f"dropout probability must be between 0 and 1, got {dropout_p}")
    if enable_gqa:
        key, value = _shared_heads(query, key), _shared_heads(query, value)
    if attn_mask is not None:
        _check_mask(attn_mask, query, key)
    length = query.shape[-2]
    features = query.shape[-1]  # (none: every score is 0 whatever the scale, as in PyTorch)
    factor = scale if scale is not None else 1.0 / math.sqrt(features) if features else 1.0
    if is_causal and length >= 2 * CAUSAL_BLOCK_ROWS:
        return _causal_blocks(query, key, value, dropout_p, factor)
    if is_causal:
        return _attention(query, key, value, None, dropout_p, factor, causal_from=0)
    return _attention(query, key, value, attn_mask, dropout_p, factor)


def _attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, dropout_p: float,
               factor: float, causal_from: int | None = None) -> Tensor:
    """The attention of the queries to the keys with the user's `mask` (bool: where a query may
    attend; float: added to the scores), or with the queries' first at position `causal_from`
    of a causal mask."""
    scores = (query @ key.transpose(-2, -1)) * factor
    if causal_from is not None:
        shape = scores.shape[-2:]
        scores = scores.masked_fill(iota(shape, 1) > iota(shape, 0) + causal_from, float("-inf"))
    elif mask is not None and mask.dtype == irtypes.bool_:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    elif mask is not None:
        scores = scores + mask
    # Only the user's mask can leave a query no key (a causal one keeps the first key at least).
    may_be_empty = mask is not None and scores.shape[-1] > 0
    weights = _safe_softmax(scores) if may_be_empty else scores.softmax(-1)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return weights @ value


def _safe_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last dimension, but a row with no key to attend to (all -inf) gives
    zeros, as PyTorch's kernels do: its softmax taken of zeros (finite, so that its backward
    gives 0 and not nan), then set to 0."""
    empty = scores.amax(dim=-1, keepdim=True) == float("-inf")
    return where(empty, 0.0, where(empty, 0.0, scores).softmax(-1))


def _causal_blocks(query: Tensor, key: Tensor, value: Tensor, dropout_p: float,
                   factor: float) -> Tensor:
    """Causal attention by blocks of query rows, each against the keys up to its last row only:
    the products and the softmax skip the masked blocks above the diagonal (with 4 blocks, 10 of
    16), forward and backward. Measured on the GPT step at 16x128 (6 heads of 32), two threads:
    attention's batched products 38 -> 24 ms and its row kernels 17 -> 12 ms a step; at 8x256
    (2 heads of 64), one thread, 57 -> 35 and 18 -> 12 ms (the step 253 -> 218 ms). The cost is
    kernels to compile: 4 blocks took the step from 223 to 331."""
    length, source = query.shape[-2], key.shape[-2]
    count = min(CAUSAL_BLOCKS, length // CAUSAL_BLOCK_ROWS)
    rows = -(-length // count)
    parts = []
    for first in range(0, length, rows):
        last = min(first + rows, length)
        keys = min(last, source)  # (top-left aligned: query i attends keys 0..i)
        parts.append(_attention(query[..., first:last, :], key[..., :keys, :],
                                value[..., :keys, :], None, dropout_p, factor, causal_from=first))
    return cat(parts, dim=-2)


def _check_mask(mask: Tensor, query: Tensor, key: Tensor) -> None:
    """PyTorch's refusals: a mask of another dtype (an int64 one would be added to the scores, a
    float64 one would turn a float32 result into float64) or one that would widen the output."""
    if mask.dtype not in (irtypes.bool_, irtypes.float32, query.dtype):
        raise ArgumentError(f"scaled_dot_product_attention: attn_mask must be bool or float "
                            f"({query.dtype}, the query's; float32 also does), got {mask.dtype}")
    scores = (*shapes_broadcast(query.shape[:-2], key.shape[:-2]), query.shape[-2], key.shape[-2])
    if broadcast_shapes_or_none(mask.shape, scores) != scores:
        raise ShapeMismatchError(f"scaled_dot_product_attention: attn_mask of shape "
                                 f"{list(mask.shape)} does not broadcast to the scores' shape "
                                 f"{list(scores)} (batch..., queries, keys)")


def _shared_heads(query: Tensor, other: Tensor) -> Tensor:
    """Key or value with each of its heads (dimension -3) repeated for its group of query heads."""
    if query.ndim < 3 or other.ndim < 3:
        raise ShapeMismatchError("scaled_dot_product_attention with enable_gqa=True needs heads "
                                 "in dimension -3 of query, key and value")
    heads, shared = query.shape[-3], other.shape[-3]
    if heads % shared:
        raise ShapeMismatchError(f"scaled_dot_product_attention with enable_gqa=True: {heads} "
                                 f"query heads are not a multiple of {shared} key/value heads")
    return other if heads == shared else other.repeat_interleave(heads // shared, dim=-3)
