"""`tr.nn.functional.dropout1d` and `dropout2d`: PyTorch's feature dropout, which zeroes whole
channels -- one draw per (sample, channel) from `tr.default_generator`, as tracer's dropout draws
(tracer/nn/dropout.py) -- and scales the kept ones by 1 / (1 - p), in training; outside training
(or with p = 0) the input itself."""
from __future__ import annotations

import builtins
import warnings

from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.random import default_generator
from tracer.tensor import Tensor


def _check_probability(p: float, name: str) -> None:
    if not 0.0 <= p <= 1.0:
        raise ArgumentError(f"{name}: dropout probability must be between 0 and 1, got {p}")


def _feature_dropout(input: Tensor, p: float, training: bool, inplace: bool, batched: bool,
                     name: str) -> Tensor:
    if not training or p == 0.0:
        return input
    # one number per channel: (N, C, 1, ...) batched, (C, 1, ...) for one sample
    kept = 2 if batched else 1
    shape = input.shape[:kept] + (1,) * (input.ndim - kept)
    uniform = default_generator.uniform(shape, f"{name} in training mode")
    noise = (uniform < 1.0 - p).to(input.dtype)
    if p < 1.0:
        noise = noise / (1.0 - p)  # as PyTorch: the 0/1 mask divided in the input's dtype
    result = input * noise
    return input.copy_(result) if inplace else result


def dropout1d(input: Tensor, p: float = 0.5, training: builtins.bool = True,
              inplace: builtins.bool = False) -> Tensor:
    """Channel dropout of (N, C, L) or (C, L) inputs."""
    _check_probability(p, "dropout1d")
    if input.ndim not in (2, 3):
        raise ShapeMismatchError(f"dropout1d expects a 2-d (C, L) or 3-d (N, C, L) input, got "
                                 f"shape {list(input.shape)}")
    return _feature_dropout(input, p, training, inplace, input.ndim == 3, "dropout1d")


def dropout2d(input: Tensor, p: float = 0.5, training: builtins.bool = True,
              inplace: builtins.bool = False) -> Tensor:
    """Channel dropout of (N, C, H, W) inputs. As PyTorch's, any other input of at least 2
    dimensions is taken as (N, C, ...) -- a 3-d one as (N, C, L), not (C, H, W) -- with its
    warning."""
    _check_probability(p, "dropout2d")
    if input.ndim < 2:
        raise ShapeMismatchError(f"dropout2d expects an input of at least 2 dimensions (N, C, "
                                 f"...), got shape {list(input.shape)}")
    if input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise "
                      "1D dropout behavior is desired - input is interpreted as shape (N, C, L), "
                      "as PyTorch does. Use dropout1d for (N, C, L) inputs.", stacklevel=2)
    elif input.ndim != 4:
        warnings.warn(f"dropout2d: Received a {input.ndim}-D input to dropout2d, which is "
                      f"deprecated in PyTorch; it expects 3-d or 4-d inputs", stacklevel=2)
    return _feature_dropout(input, p, training, inplace, True, "dropout2d")
