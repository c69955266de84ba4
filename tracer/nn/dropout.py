"""`tr.nn.functional.dropout`, in a module of its own so that the layers composed of it
(tracer/nn/attention.py) import it without importing the functional module that lists them."""
from __future__ import annotations

import builtins

from tracer.errors import ArgumentError
from tracer.random import default_generator
from tracer.tensor import Tensor


def dropout(input: Tensor, p: float = 0.5, training: builtins.bool = True,
            inplace: builtins.bool = False) -> Tensor:
    """Zero each element with probability p and scale the rest by 1 / (1 - p), in training. The
    mask comes from `tr.default_generator` (seeded by tr.manual_seed), whose state advances on
    every draw, traced too (see tracer/random.py)."""
    if not 0.0 <= p <= 1.0:
        raise ArgumentError(f"dropout probability must be between 0 and 1, got {p}")
    if not training or p == 0.0:
        return input
    uniform = default_generator.uniform(input.shape, "dropout in training mode")
    noise = (uniform < 1.0 - p).to(input.dtype)
    if p < 1.0:
        noise = noise / (1.0 - p)  # as PyTorch: the 0/1 mask divided in the input's dtype
    result = input * noise
    return input.copy_(result) if inplace else result
