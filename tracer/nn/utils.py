"""`tr.nn.utils`: gradient clipping (PyTorch's formulas, eagerly and inside a traced step),
parameters as one vector and back, and the safetensors files PyTorch users exchange weights in
(tracer/nn/safetensors_files.py)."""
from __future__ import annotations

import builtins
import math
from typing import Iterable

from tracer.context import no_grad, state
from tracer.errors import ArgumentError, TracerError, TracingError
from tracer.functional import cat, stack
from tracer.creation import tensor as make_tensor
from tracer.nn.module_api import typename
from tracer.nn.safetensors_files import load_safetensors, save_safetensors
from tracer.tensor import Tensor
from tracer.tracing import current_tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "clip_grads_with_norm_",
           "save_safetensors", "load_safetensors", "parameters_to_vector",
           "vector_to_parameters"]


class NonFiniteNormError(TracerError, RuntimeError):
    """clip_grad_norm_(..., error_if_nonfinite=True) met a nan or infinite total norm."""


def _tensors(tensors: Tensor | Iterable[Tensor]) -> list[Tensor]:
    return [tensors] if isinstance(tensors, Tensor) else list(tensors)


def _grads(parameters) -> list[Tensor]:
    # (inside a trace, a parameter's gradient lives on its stand-in there: see current_tensor)
    return [grad for grad in (current_tensor(p).grad for p in _tensors(parameters))
            if grad is not None]


def get_total_norm(tensors: Tensor | Iterable[Tensor], norm_type: float = 2.0,
                   error_if_nonfinite: builtins.bool = False, foreach=None) -> Tensor:
    """The `norm_type`-norm of all the tensors' elements together: the norm of their norms."""
    tensors = _tensors(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return make_tensor(0.0)
    total = stack([t.norm(norm_type) for t in tensors]).norm(norm_type)
    if error_if_nonfinite:
        if state.trace is not None:
            raise TracingError("error_if_nonfinite=True needs the norm's value, which a traced "
                               "function does not have; return the norm (clip_grad_norm_'s "
                               "result) and check it after the call")
        if not math.isfinite(total.item()):
            raise NonFiniteNormError(
                f"the total norm of order {norm_type} of the gradients is non-finite, so it "
                f"cannot be clipped; to scale the gradients by it anyway, pass "
                f"error_if_nonfinite=False")
    return total


def clip_grads_with_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float,
                          total_norm: Tensor, foreach=None) -> None:
    """Scale the gradients by max_norm / (total_norm + 1e-6) where that is below 1."""
    grads = _grads(parameters)
    coefficient = (float(max_norm) / (total_norm + 1e-6)).clamp(max=1.0)
    with no_grad():
        for grad in grads:
            grad.mul_(coefficient)


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: builtins.bool = False,
                    foreach=None) -> Tensor:
    """Scale the gradients of `parameters` in place so that their total `norm_type`-norm is at
    most `max_norm` (PyTorch's formula, with its 1e-6); returns the total norm before."""
    parameters = _tensors(parameters)  # (a generator is read once, for both steps)
    with no_grad():
        total = get_total_norm(_grads(parameters), norm_type, error_if_nonfinite)
    clip_grads_with_norm_(parameters, max_norm, total)
    return total


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float,
                     foreach=None) -> None:
    """Clamp every gradient of `parameters` into [-clip_value, clip_value] in place."""
    if clip_value < 0:
        raise ArgumentError(f"clip_value must not be negative, got {clip_value}")
    with no_grad():
        for grad in _grads(parameters):
            grad.clamp_(min=-float(clip_value), max=float(clip_value))


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """The parameters flattened and concatenated into one vector (differentiable: inside a
    traced step too, a penalty on it reaches every parameter's gradient)."""
    return cat([current_tensor(parameter).view(-1) for parameter in parameters])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of `vec` into the parameters, in their order and shapes (through
    `.data`, as PyTorch; unlike PyTorch's, a parameter of vec's dtype then holds a copy of the
    slice, not a view of `vec`'s memory)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected tracer Tensor, but got: {typename(vec)}")
    pointer = 0
    for parameter in parameters:
        count = parameter.numel()
        parameter.data = vec[pointer:pointer + count].view_as(parameter).data
        pointer += count
