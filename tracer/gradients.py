"""`tr.autograd.grad` and `tr.autograd.backward`: PyTorch's functional entry points to the backward
engine, eager and inside `@trace`, to any order (`create_graph=True`)."""
from __future__ import annotations

import builtins
from tracer.backward import gradients_of
from tracer.creation import ones_like, zeros_like
from tracer.dispatch import as_tensor
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.tensor import Tensor


def _tensors(value, what: str) -> list[Tensor]:
    values = [value] if isinstance(value, Tensor) else list(value)
    for position, tensor in enumerate(values):
        if not isinstance(tensor, Tensor):
            raise ArgumentError(f"{what} {position} is a {type(tensor).__name__}, not a Tensor")
    return values


def _seeds(outputs: list[Tensor], grad_outputs) -> list[Tensor]:
    """One cotangent per output: ones for a one-element output without one, as PyTorch."""
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    grad_outputs = list(grad_outputs)
    if len(grad_outputs) != len(outputs):
        raise ArgumentError(f"grad_outputs has {len(grad_outputs)} entries for {len(outputs)} "
                            f"outputs; give one per output (None for a one-element output)")
    seeds = []
    for position, (output, seed) in enumerate(zip(outputs, grad_outputs)):
        if seed is None:
            if output.numel() != 1:
                raise ArgumentError(f"output {position} has shape {list(output.shape)}: a "
                                    f"gradient can only be implied for one-element outputs; "
                                    f"pass grad_outputs")
            seed = ones_like(output)
        seed = as_tensor(seed, accept_data=True).to(output.dtype)
        if seed.shape != output.shape:
            raise ShapeMismatchError(f"grad_outputs[{position}] has shape {list(seed.shape)} for "
                                     f"an output of shape {list(output.shape)}")
        seeds.append(seed)
    return seeds


def grad(outputs, inputs, grad_outputs=None, retain_graph: builtins.bool | None = None,
         create_graph: builtins.bool = False, only_inputs: builtins.bool = True,
         allow_unused: builtins.bool | None = None, is_grads_batched: builtins.bool = False,
         materialize_grads: builtins.bool = False) -> tuple[Tensor | None, ...]:
    """The gradients of `outputs` (weighted by `grad_outputs`) with respect to `inputs`, as
    torch.autograd.grad: nothing's `.grad` changes; with `create_graph` the results are
    differentiable again. An input the outputs do not depend on is an error, or None with
    `allow_unused` (zeros with `materialize_grads`). `only_inputs` (ignored by PyTorch too) and
    `is_grads_batched` hold their places in PyTorch's order, so that a positional allow_unused
    means what it means there."""
    if is_grads_batched:
        raise ArgumentError("is_grads_batched=True is not supported; use tr.vmap over a function "
                            "that calls tr.autograd.grad")
    outputs = _tensors(outputs, "output")
    inputs = _tensors(inputs, "input")
    allow_unused = materialize_grads if allow_unused is None else allow_unused
    if materialize_grads and not allow_unused:
        raise ArgumentError("materialize_grads=True needs allow_unused True or None")
    for position, output in enumerate(outputs):
        if not output.requires_grad:
            raise ArgumentError(f"output {position} does not require grad (it was computed "
                                f"from no tensor that requires grad, or under no_grad)")
    retain_graph = create_graph if retain_graph is None else retain_graph
    gradients = gradients_of(outputs, _seeds(outputs, grad_outputs), inputs, retain_graph,
                             create_graph, "tr.autograd.grad")
    results = []
    for position, (tensor, gradient) in enumerate(zip(inputs, gradients)):
        if gradient is None:
            if not allow_unused:
                raise ArgumentError(f"input {position} (shape {list(tensor.shape)}) was not used "
                                    f"to compute the outputs; pass allow_unused=True to get None "
                                    f"for it")
            results.append(zeros_like(tensor) if materialize_grads else None)
        elif isinstance(gradient, Tensor):
            results.append(gradient)
        else:
            results.append(Tensor._make(gradient.astype(tensor.dtype, copy=False), None, False))
    return tuple(results)


def backward(tensors, grad_tensors=None, retain_graph: builtins.bool | None = None,
             create_graph: builtins.bool = False, inputs=None) -> None:
    """torch.autograd.backward: `.backward()` of several tensors at once."""
    tensors = _tensors(tensors, "tensor")
    seeds = _seeds(tensors, grad_tensors)
    if len(tensors) == 1:
        tensors[0].backward(seeds[0], retain_graph, create_graph, inputs)
        return
    total = None
    for tensor, seed in zip(tensors, seeds):
        term = (tensor * seed).sum()
        total = term if total is None else total + term
    total.backward(None, retain_graph, create_graph, inputs)
