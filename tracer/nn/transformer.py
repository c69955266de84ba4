"""`tr.nn`'s TransformerEncoderLayer, TransformerEncoder, TransformerDecoderLayer,
TransformerDecoder and Transformer: PyTorch's modules, submodule names (so state_dicts load both
ways), defaults and computation (post-norm or `norm_first`, dropout after attention and the feed-
forward block, the feed-forward's activation 'relu', 'gelu' or a callable).

PyTorch's fast path (a fused kernel in eval mode without autograd, and nested tensors that make
the encoder's outputs at padded positions 0) is not reproduced: the values are those of its
regular path, which PyTorch takes in training or when gradients are needed. An `is_causal=None`
mask is not compared with the causal one: detecting it would only let the attention compute the
same values without reading the mask."""
from __future__ import annotations

import builtins
import copy
from typing import Callable

from tracer.creation import full
from tracer.dtypes import float32
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.nn import functional as F
from tracer.nn import init
from tracer.nn.containers import ModuleList
from tracer.nn.modules import Dropout, LayerNorm, Linear, Module
from tracer.nn.multihead import MultiheadAttention, canonical_mask
from tracer.tensor import Tensor


def _activation(activation) -> Callable[[Tensor], Tensor]:
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    if isinstance(activation, str) or not callable(activation):
        raise ArgumentError(f"activation should be relu/gelu, not {activation}")
    return activation


class _Block(Module):
    """What the encoder and decoder layers share: the feed-forward block and the norms."""

    def _feed_forward_parts(self, d_model: int, dim_feedforward: int, dropout: float,
                            activation, layer_norm_eps: float, norms: int,
                            bias: builtins.bool, dtype) -> None:
        self.linear1 = Linear(d_model, dim_feedforward, bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias, dtype=dtype)
        for index in range(1, norms + 1):
            setattr(self, f"norm{index}", LayerNorm(d_model, layer_norm_eps, bias=bias,
                                                    dtype=dtype))
        for index in range(1, norms + 1):
            setattr(self, f"dropout{index}", Dropout(dropout))
        self.activation = _activation(activation)

    def _ff_block(self, x: Tensor, dropout: Dropout) -> Tensor:
        return dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    @staticmethod
    def _attend(attention: MultiheadAttention, x: Tensor, memory: Tensor, mask, padding,
                is_causal: builtins.bool, dropout: Dropout) -> Tensor:
        return dropout(attention(x, memory, memory, attn_mask=mask, key_padding_mask=padding,
                                 need_weights=False, is_causal=is_causal)[0])


class TransformerEncoderLayer(_Block):
    """Self-attention and a feed-forward block (d_model -> dim_feedforward -> d_model), each
    with dropout, a residual connection and a layer norm (before it with norm_first)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: builtins.bool = False, norm_first: builtins.bool = False,
                 bias: builtins.bool = True, device=None, dtype=None) -> None:
        super().__init__()
        dtype = float32 if dtype is None else dtype
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias,
                                            batch_first=batch_first, dtype=dtype)
        self._feed_forward_parts(d_model, dim_feedforward, dropout, activation, layer_norm_eps,
                                 2, bias, dtype)
        self.norm_first = norm_first

    def forward(self, src: Tensor, src_mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None,
                is_causal: builtins.bool = False) -> Tensor:
        src_key_padding_mask = canonical_mask(src_key_padding_mask, "src_key_padding_mask",
                                              src.dtype)
        src_mask = canonical_mask(src_mask, "src_mask", src.dtype)
        x = src

        def attend(y):
            return self._attend(self.self_attn, y, y, src_mask, src_key_padding_mask, is_causal,
                                self.dropout1)

        if self.norm_first:
            x = x + attend(self.norm1(x))
            return x + self._ff_block(self.norm2(x), self.dropout2)
        x = self.norm1(x + attend(x))
        return self.norm2(x + self._ff_block(x, self.dropout2))


class TransformerDecoderLayer(_Block):
    """Self-attention, attention to the encoder's output (memory) and a feed-forward block, each
    with dropout, a residual connection and a layer norm (before it with norm_first)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: builtins.bool = False, norm_first: builtins.bool = False,
                 bias: builtins.bool = True, device=None, dtype=None) -> None:
        super().__init__()
        dtype = float32 if dtype is None else dtype
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias,
                                            batch_first=batch_first, dtype=dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout, bias,
                                                 batch_first=batch_first, dtype=dtype)
        self._feed_forward_parts(d_model, dim_feedforward, dropout, activation, layer_norm_eps,
                                 3, bias, dtype)
        self.norm_first = norm_first

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: builtins.bool = False,
                memory_is_causal: builtins.bool = False) -> Tensor:
        x = tgt

        def attend_self(y):
            return self._attend(self.self_attn, y, y, tgt_mask, tgt_key_padding_mask,
                                tgt_is_causal, self.dropout1)

        def attend_memory(y):
            return self._attend(self.multihead_attn, y, memory, memory_mask,
                                memory_key_padding_mask, memory_is_causal, self.dropout2)

        if self.norm_first:
            x = x + attend_self(self.norm1(x))
            x = x + attend_memory(self.norm2(x))
            return x + self._ff_block(self.norm3(x), self.dropout3)
        x = self.norm1(x + attend_self(x))
        x = self.norm2(x + attend_memory(x))
        return self.norm3(x + self._ff_block(x, self.dropout3))


def _clones(layer: Module, count: int) -> ModuleList:
    """`count` deep copies of `layer` (independent parameters, equal at first), as PyTorch's."""
    return ModuleList([copy.deepcopy(layer) for _ in range(count)])


class TransformerEncoder(Module):
    """`num_layers` copies of `encoder_layer`, then `norm` if given. (enable_nested_tensor and
    mask_check choose PyTorch's fast path, whose values are these: accepted, no effect.)"""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int,
                 norm: Module | None = None, enable_nested_tensor: builtins.bool = True,
                 mask_check: builtins.bool = True) -> None:
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check

    def forward(self, src: Tensor, mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None,
                is_causal: builtins.bool | None = None) -> Tensor:
        src_key_padding_mask = canonical_mask(src_key_padding_mask, "src_key_padding_mask",
                                              src.dtype)
        mask = canonical_mask(mask, "mask", src.dtype)
        output = src
        for layer in self.layers:
            output = layer(output, src_mask=mask, is_causal=builtins.bool(is_causal),
                           src_key_padding_mask=src_key_padding_mask)
        return output if self.norm is None else self.norm(output)


class TransformerDecoder(Module):
    """`num_layers` copies of `decoder_layer`, each attending to `memory`, then `norm` if
    given."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int,
                 norm: Module | None = None) -> None:
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: builtins.bool | None = None,
                memory_is_causal: builtins.bool = False) -> Tensor:
        output = tgt
        for layer in self.layers:
            output = layer(output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                           tgt_key_padding_mask=tgt_key_padding_mask,
                           memory_key_padding_mask=memory_key_padding_mask,
                           tgt_is_causal=builtins.bool(tgt_is_causal),
                           memory_is_causal=memory_is_causal)
        return output if self.norm is None else self.norm(output)


class Transformer(Module):
    """PyTorch's encoder-decoder (6 + 6 layers of d_model 512 by default), each stack ending
    with a LayerNorm; every weight matrix initialized by xavier_uniform_, as PyTorch's."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", custom_encoder: Module | None = None,
                 custom_decoder: Module | None = None, layer_norm_eps: float = 1e-5,
                 batch_first: builtins.bool = False, norm_first: builtins.bool = False,
                 bias: builtins.bool = True, device=None, dtype=None) -> None:
        super().__init__()
        dtype = float32 if dtype is None else dtype
        options = dict(activation=activation, layer_norm_eps=layer_norm_eps,
                       batch_first=batch_first, norm_first=norm_first, bias=bias, dtype=dtype)
        self.encoder = custom_encoder if custom_encoder is not None else TransformerEncoder(
            TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, **options),
            num_encoder_layers, LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype))
        self.decoder = custom_decoder if custom_decoder is not None else TransformerDecoder(
            TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, **options),
            num_decoder_layers, LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype))
        for parameter in self.parameters():
            if parameter.ndim > 1:
                init.xavier_uniform_(parameter)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None,
                src_is_causal: builtins.bool | None = None,
                tgt_is_causal: builtins.bool | None = None,
                memory_is_causal: builtins.bool = False) -> Tensor:
        batch_dim = 0 if self.batch_first else 1
        if src.ndim == 3 and src.shape[batch_dim] != tgt.shape[batch_dim]:
            raise ShapeMismatchError("Transformer: the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ShapeMismatchError("Transformer: the feature number of src and tgt must be "
                                     "equal to d_model")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> Tensor:
        """A float mask (sz, sz): -inf above the diagonal (later positions), 0 elsewhere."""
        return full((sz, sz), float("-inf"), dtype=float32 if dtype is None else dtype).triu(1)
