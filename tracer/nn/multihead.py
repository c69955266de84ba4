"""`tr.nn.MultiheadAttention`: PyTorch's module, its parameters (names, shapes, initialization)
and the computation of torch.nn.functional.multi_head_attention_forward, step for step:

- masks: a bool mask is True where a key may NOT be attended (the opposite of
  scaled_dot_product_attention's) and becomes 0 / -inf; a float mask is added to the scores; the
  key padding mask (batch, keys) is added to the attention mask of every head;
- with need_weights=True the weights are softmax(q k^T / sqrt(head_dim) + mask) (a query with no
  key to attend gives nan there, as PyTorch's), returned averaged over the heads unless
  average_attn_weights=False; with need_weights=False the attention is
  scaled_dot_product_attention's (such a query gives zeros), as PyTorch's;
- is_causal is PyTorch's hint: it needs attn_mask, and only without a key padding mask and
  weights is the mask replaced by the causal one (the same values, computed without the mask).
"""
from __future__ import annotations

import builtins
import math

from tracer.arithmetic import where
from tracer.context import no_grad
from tracer.creation import zeros
from tracer.dtypes import float32
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.functional import cat
from tracer.ir import types as irtypes
from tracer.nn import functional as F
from tracer.nn import init
from tracer.nn.modules import Linear, Module, Parameter
from tracer.tensor import Tensor


class NonDynamicallyQuantizableLinear(Linear):
    """The output projection's class, named as PyTorch's (a Linear)."""


def canonical_mask(mask: Tensor | None, name: str, dtype) -> Tensor | None:
    """PyTorch's _canonical_mask: a bool mask (True: not attended) as 0 / -inf of `dtype`; a
    float mask as it is."""
    if mask is None:
        return None
    if mask.dtype == irtypes.bool_:
        return where(mask, float("-inf"), 0.0).to(dtype)
    if not irtypes.is_float(mask.dtype):
        raise ArgumentError(f"only bool and floating types of {name} are supported, got "
                            f"{mask.dtype}")
    return mask


class MultiheadAttention(Module):
    """Attention of `num_heads` heads over embed_dim features: in_proj_weight (3 * embed_dim,
    embed_dim) or, when kdim or vdim differ from embed_dim, q/k/v_proj_weight; in_proj_bias and
    out_proj (zero biases). Inputs (L, N, E) ((N, L, E) if batch_first) or unbatched (L, E)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 bias: builtins.bool = True, add_bias_kv: builtins.bool = False,
                 add_zero_attn: builtins.bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: builtins.bool = False, device=None,
                 dtype=None) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ArgumentError(f"MultiheadAttention: embed_dim and num_heads must be greater "
                                f"than 0, got embed_dim={embed_dim} and num_heads={num_heads}")
        if embed_dim % num_heads:
            raise ArgumentError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible "
                                f"by num_heads ({num_heads})")
        if add_bias_kv:
            raise ArgumentError("MultiheadAttention(add_bias_kv=True) is not supported by tracer "
                                "(a learned key and value appended to every sequence); leave it "
                                "False, or append them to key and value yourself")
        dtype = float32 if dtype is None else dtype
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.batch_first, self.head_dim = batch_first, embed_dim // num_heads
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(zeros(3 * embed_dim, embed_dim, dtype=dtype))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = Parameter(zeros(embed_dim, embed_dim, dtype=dtype))
            self.k_proj_weight = Parameter(zeros(embed_dim, self.kdim, dtype=dtype))
            self.v_proj_weight = Parameter(zeros(embed_dim, self.vdim, dtype=dtype))
            self.register_parameter("in_proj_weight", None)
        self.in_proj_bias = Parameter(zeros(3 * embed_dim, dtype=dtype)) if bias else None
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias, dtype=dtype)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """PyTorch's: xavier_uniform_ projection weights, zero biases (the output projection's
        weight keeps Linear's initialization)."""
        names = (("in_proj_weight",) if self._qkv_same_embed_dim
                 else ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
        for name in names:
            init.xavier_uniform_(self._parameters[name])
        if self.in_proj_bias is not None:
            with no_grad():
                self._parameters["in_proj_bias"].zero_()
                self.out_proj._parameters["bias"].zero_()

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Tensor | None = None, need_weights: builtins.bool = True,
                attn_mask: Tensor | None = None, average_attn_weights: builtins.bool = True,
                is_causal: builtins.bool = False) -> tuple[Tensor, Tensor | None]:
        """(attn_output, attn_output_weights or None), as PyTorch's."""
        batched = _check_shapes(query, key, value, key_padding_mask, attn_mask, self.num_heads)
        if self.batch_first and batched:
            # (transposed keeping which of them are the same tensor: self-attention's projection
            # is one product)
            transposed = {id(x): x.transpose(1, 0) for x in {id(x): x for x in
                                                              (query, key, value)}.values()}
            query, key, value = (transposed[id(x)] for x in (query, key, value))
        output, weights = self._attention(query, key, value, key_padding_mask, need_weights,
                                          attn_mask, average_attn_weights, is_causal, batched)
        if self.batch_first and batched:
            output = output.transpose(1, 0)
        return output, weights

    def _projections(self, query: Tensor, key: Tensor, value: Tensor) -> list[Tensor]:
        bias = self.in_proj_bias
        biases = [None] * 3 if bias is None else list(bias.chunk(3))
        if not self._qkv_same_embed_dim:
            weights = [self.q_proj_weight, self.k_proj_weight, self.v_proj_weight]
            return [F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases)]
        weight = self.in_proj_weight
        if query is key and key is value:  # self-attention: one product
            packed = F.linear(query, weight, bias)
            return list(packed.unflatten(-1, (3, self.embed_dim)).unbind(-2))
        return [F.linear(x, w, b) for x, w, b in zip((query, key, value), weight.chunk(3),
                                                      biases)]

    def _attention(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                   average_attn_weights, is_causal, batched):
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        length, batch, embed_dim = query.shape
        if embed_dim != self.embed_dim:
            raise ShapeMismatchError(f"MultiheadAttention: the query has {embed_dim} features, "
                                     f"embed_dim is {self.embed_dim}")
        for name, tensor, features in (("key", key, self.kdim), ("value", value, self.vdim)):
            if tensor.shape[-1] != features or tensor.shape[1] != batch:
                raise ShapeMismatchError(f"MultiheadAttention: {name} of shape "
                                         f"{list(tensor.shape)} for a batch of {batch} and "
                                         f"{features} features")
        if key.shape[0] != value.shape[0]:
            raise ShapeMismatchError(f"MultiheadAttention: key of shape {list(key.shape)} and "
                                     f"value of shape {list(value.shape)} differ in length")
        key_padding_mask = canonical_mask(key_padding_mask, "key_padding_mask", query.dtype)
        if key_padding_mask is not None and key_padding_mask.shape != (batch, key.shape[0]):
            raise ShapeMismatchError(f"MultiheadAttention: key_padding_mask of shape "
                                     f"{list(key_padding_mask.shape)}, expected "
                                     f"{[batch, key.shape[0]]} (batch, keys)")
        if is_causal and attn_mask is None:
            raise ArgumentError("MultiheadAttention: is_causal=True is a hint that attn_mask is "
                                "the causal mask and needs it; give attn_mask too (PyTorch's "
                                "nn.Transformer.generate_square_subsequent_mask makes it)")
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None  # (scaled_dot_product_attention computes the causal mask)
        else:
            attn_mask = canonical_mask(attn_mask, "attn_mask", query.dtype)
            is_causal = is_causal and key_padding_mask is None
        heads, head_dim = self.num_heads, self.head_dim
        q, k, v = self._projections(query, key, value)
        sources = key.shape[0]
        if attn_mask is not None:
            attn_mask = _heads_mask(attn_mask, batch * heads, length, sources)
        q, k, v = (x.reshape(x.shape[0], batch * heads, head_dim).transpose(0, 1)
                   for x in (q, k, v))
        if self.add_zero_attn:  # a key and value of zeros appended to every sequence
            k, v = (cat([x, zeros(batch * heads, 1, head_dim, dtype=x.dtype)], dim=1)
                    for x in (k, v))
            attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
            key_padding_mask = (None if key_padding_mask is None
                                else F.pad(key_padding_mask, (0, 1)))
            sources += 1
        if key_padding_mask is not None:
            padding = key_padding_mask.reshape(batch, 1, 1, sources).expand(
                batch, heads, 1, sources).reshape(batch * heads, 1, sources)
            attn_mask = padding if attn_mask is None else attn_mask + padding
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            scores = (q * math.sqrt(1.0 / head_dim)) @ k.transpose(-2, -1)
            weights = (scores if attn_mask is None else scores + attn_mask).softmax(-1)
            if dropout_p > 0.0:
                weights = F.dropout(weights, dropout_p)
            output = self._output(weights @ v, length, batch)
            weights = weights.reshape(batch, heads, length, sources)
            if average_attn_weights:
                weights = weights.mean(1)
            return ((output, weights) if batched
                    else (output.squeeze(1), weights.squeeze(0)))
        if attn_mask is not None:
            attn_mask = (attn_mask.unsqueeze(0) if attn_mask.shape[0] == 1
                         else attn_mask.reshape(batch, heads, attn_mask.shape[1], sources))
        q, k, v = (x.reshape(batch, heads, x.shape[1], head_dim) for x in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
        output = self._output(attended.reshape(batch * heads, length, head_dim), length, batch)
        return (output if batched else output.squeeze(1)), None

    def _output(self, attended: Tensor, length: int, batch: int) -> Tensor:
        """The heads' results (batch * heads, L, head_dim) joined and projected: (L, N, E)."""
        joined = attended.transpose(0, 1).reshape(length * batch, self.embed_dim)
        return self.out_proj(joined).reshape(length, batch, self.embed_dim)


def _heads_mask(mask: Tensor, rows: int, length: int, sources: int) -> Tensor:
    """A 2-d mask (L, S) as (1, L, S); a 3-d one must be (N * heads, L, S)."""
    if mask.ndim == 2:
        if mask.shape != (length, sources):
            raise ShapeMismatchError(f"MultiheadAttention: the 2-D attn_mask should be of shape "
                                     f"{[length, sources]}, got {list(mask.shape)}")
        return mask.unsqueeze(0)
    if mask.shape != (rows, length, sources):
        raise ShapeMismatchError(f"MultiheadAttention: the 3-D attn_mask should be of shape "
                                 f"{[rows, length, sources]} (batch * heads, queries, keys), got "
                                 f"{list(mask.shape)}")
    return mask


def _check_shapes(query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None,
                  attn_mask: Tensor | None, heads: int) -> builtins.bool:
    """PyTorch's _mha_shape_check: whether the input is batched (3-d) or one sequence (2-d)."""
    if query.ndim not in (2, 3):
        raise ShapeMismatchError(f"MultiheadAttention: query should be unbatched 2D or batched "
                                 f"3D tensor but received {query.ndim}-D query tensor")
    batched = query.ndim == 3
    expected = query.ndim
    if key.ndim != expected or value.ndim != expected:
        raise ShapeMismatchError(f"MultiheadAttention: for a {expected}-D query, key and value "
                                 f"should be {expected}-D, got {key.ndim}-D and {value.ndim}-D")
    if key_padding_mask is not None and key_padding_mask.ndim != expected - 1:
        raise ShapeMismatchError(f"MultiheadAttention: for a {expected}-D query, "
                                 f"key_padding_mask should be {expected - 1}-D, got "
                                 f"{key_padding_mask.ndim}-D")
    if attn_mask is not None and attn_mask.ndim not in (2, 3):
        raise ShapeMismatchError(f"MultiheadAttention: attn_mask should be 2-D or 3-D, got "
                                 f"{attn_mask.ndim}-D")
    if not batched and attn_mask is not None and attn_mask.ndim == 3 and (
            attn_mask.shape[0] != heads):
        raise ShapeMismatchError(f"MultiheadAttention: for an unbatched query a 3-D attn_mask "
                                 f"should be (num_heads={heads}, L, S), got "
                                 f"{list(attn_mask.shape)}")
    return batched
