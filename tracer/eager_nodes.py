"""One eager operation computed in numpy as a single node of the tape, for the few whose
composition of primitives costs mostly per-operation dispatch (log_softmax here, cross_entropy
and nll_loss in tracer/nn/fused_losses.py): the node's backward is numpy too, and with
create_graph a given computation on the tape, differentiable again."""
from __future__ import annotations

from typing import Callable

import numpy as np

from tracer.ir.vjp import CustomRule
from tracer.autograd import ARRAYS, attach, changed_for_backward, custom_node, edge_of
from tracer.context import is_grad_enabled, state
from tracer.dtypes import float32, float64
from tracer.tensor import Tensor


def eager_float(input: Tensor) -> bool:
    """Whether `input` is a non-empty eager float32 or float64 tensor, outside any trace."""
    return (state.trace is None and input._trace is None and 0 not in input.shape
            and input.dtype in (float32, float64))


def one_node(name: str, input: Tensor, array: np.ndarray, value: np.ndarray,
             backward: Callable[[np.ndarray], np.ndarray],
             recorded_backward: Callable[[Tensor], Tensor], saves_input: bool = False,
             saves_output: bool = False) -> Tensor:
    """The tensor holding `value`, on the tape as one node if `input` (holding `array`) requires
    grad: its gradient is `backward(cotangent)` on arrays, or with create_graph
    `recorded_backward` of the cotangent tensor. Where PyTorch's backward saves the input or the
    output (`saves_input`, `saves_output`), changing it in place before the backward is an error,
    as there."""
    result = Tensor._make(value, None, False)
    if not (is_grad_enabled() and input.requires_grad):
        return result

    def rule(builder, cotangents: list, needs: list[bool]) -> list:
        if not needs[0]:
            return [None]
        return [(backward if builder is ARRAYS else recorded_backward)(cotangents[0])]

    node = custom_node(name, CustomRule(name, rule), [value], [array], [edge_of(input)])
    attach(result, node, 0)
    node.save(([input] if saves_input else []) + ([result] if saves_output else []))
    return result


def unchanged(input: Tensor, version: int, name: str) -> None:
    """A create_graph backward that computes again from `input` needs the values the forward
    read: raise if it was changed in place since (its `version` then)."""
    if input._version != version:
        raise changed_for_backward(input.dtype, input.shape, f"{name} (create_graph)",
                                   input._changed_at)
