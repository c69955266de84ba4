"""`Tensor.backward`, eager and inside `@trace`; the traced side of every gradient (a `gradient`
directive that the autodiff pass expands when the trace is compiled); and `zero_grad`."""
from __future__ import annotations

import builtins
from typing import Iterable, Sequence

import numpy as np

from tracer.ir.autodiff import gradient_path, reaches, trace_directive
from tracer.autograd import changed_for_backward, run_backward, values_read
from tracer.context import state
from tracer.creation import ones
from tracer.dispatch import as_tensor
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.tensor import Tensor
from tracer.tracing import current_tensor, escaped_error


def traced_gradients(output: Tensor, seed: Tensor, wrt: Sequence[Tensor]) -> list[Tensor | None]:
    """Record a `gradient` directive (the autodiff pass puts its backward in place when the trace
    is compiled) and return the gradients of `wrt`, None where no gradient flows. A leaf changed
    in place under no_grad has held several values: its gradient sums theirs."""
    trace = output._trace
    groups = [trace.leaf_values(t) for t in wrt]
    values = [v for group in groups for v in group]
    _check_unchanged(trace, output, values)
    operands = [output._handle, trace.handle_of(seed), *values]
    directive_outputs = trace.builder.emit("gradient", operands, {})
    flowing = trace_directive(trace.function, directive_outputs[0].producer)
    gradients = iter(zip(directive_outputs, flowing))
    totals = []
    for group in groups:
        total = None
        for value, flows in (next(gradients) for _ in group):
            if flows is not None:
                total = value if total is None else trace.builder.add(total, value)
        totals.append(None if total is None else Tensor._make(total, trace, False))
    return totals


def _check_unchanged(trace, output: Tensor, wrt_values: list) -> None:
    """As eager backward would now: a value that the backward reads must not have been changed in
    place since it was used (a saved tensor of a Function, or an operand of a primitive)."""
    instructions = trace.function.instructions
    path = gradient_path(instructions, output._handle, wrt_values)
    for ctx, values in trace.custom_calls:
        if any(id(v) in path for v in values):
            ctx.check_saved()
    for instruction in instructions:
        if not any(id(v) in path for v in instruction.outputs):
            continue
        reads_inputs, reads_outputs = values_read(
            instruction.primitive, [id(x) in path for x in instruction.inputs])
        read = [x for x, flag in zip(instruction.inputs, reads_inputs) if flag]
        read += instruction.outputs if reads_outputs else []
        for value in read:
            changed = trace.changed_since(value)
            if changed is not None and changed[2] is not instruction:
                changed_value, where, _ = changed
                raise changed_for_backward(changed_value.type.dtype, changed_value.type.shape,
                                           instruction.primitive, where)


def traced_leaf_gradients(output: Tensor, gradient: Tensor) -> list[tuple[Tensor, Tensor]]:
    """`output.backward(gradient)` inside a trace: (leaf, its gradient) for every traced leaf that
    `output` depends on (but those for which a custom backward returned None)."""
    trace = output._trace
    if state.trace is not trace:
        raise escaped_error()
    leaves = list({id(t): t for t in trace.leaves if t.requires_grad}.values())
    groups = [trace.leaf_values(t) for t in leaves]
    flags = iter(reaches(trace.function.instructions, output._handle,
                         [v for group in groups for v in group]))
    leaves = [t for t, group in zip(leaves, groups) if any([next(flags) for _ in group])]
    if not leaves:
        return []
    return [(leaf, grad) for leaf, grad in zip(leaves, traced_gradients(output, gradient, leaves))
            if grad is not None]


# Callbacks to run once when the next `.backward()` has filled every `.grad` (PyTorch's
# `Variable._execution_engine.queue_callback`): DistributedDataParallel averages gradients there.
_after_backward: list = []


def after_backward(callback) -> None:
    """Run `callback()` once, right after the next `.backward()` (eager or traced) has
    accumulated its gradients; queuing the same callback again before then runs it once."""
    if not any(callback == queued for queued in _after_backward):
        _after_backward.append(callback)


def accumulate_grad(leaf: Tensor, gradient: np.ndarray | Tensor) -> None:
    """Add `gradient` (eagerly an array from the tape, traced a tensor of the leaf's trace) into
    `leaf.grad`, or make it `leaf.grad` if there is none: the one place where backward() writes
    `.grad`."""
    grad = leaf.grad
    if isinstance(gradient, np.ndarray):
        gradient = gradient.astype(leaf.dtype, copy=False)
        if grad is None:
            leaf.grad = Tensor._make(np.array(gradient, copy=True), None, False)
        else:  # into its buffer, as PyTorch: whoever holds the .grad tensor sees the sum
            np.add(grad._handle, gradient, out=grad._handle)
            grad._mark_changed()
    elif grad is None:
        leaf.grad = gradient
    else:
        grad._assign(grad + gradient, "gradient accumulation")


class BackwardMethods:
    """Tensor.backward (given to Tensor by tracer/methods.py)."""

    def backward(self, gradient=None, retain_graph: builtins.bool = False) -> None:
        """Accumulate the gradient of this tensor into the `.grad` of the leaves it depends on."""
        if not self.requires_grad:
            raise ArgumentError("backward() on a tensor that does not require grad (no input "
                                "requires grad, or it was computed under no_grad)")
        if gradient is None:
            if self.numel() != 1:
                raise ArgumentError(f"backward() without a gradient needs a one-element tensor, "
                                    f"this one has shape {list(self.shape)}; pass gradient=")
            gradient = ones(*self.shape, dtype=self.dtype)
        gradient = as_tensor(gradient).to(self.dtype)
        if gradient.shape != self.shape:
            raise ShapeMismatchError(f"backward(gradient=...) of shape {list(gradient.shape)} for "
                                     f"a tensor of shape {list(self.shape)}")
        if self._trace is not None:
            gradients = traced_leaf_gradients(self, gradient)
        else:
            gradients = run_backward([(self, gradient._eager_array("backward"))],
                                     retain_graph=retain_graph)
        for leaf, value in gradients:
            accumulate_grad(leaf, value)
        while _after_backward:
            _after_backward.pop(0)()


def clear_grads(tensors: Iterable[Tensor], set_to_none: bool = True) -> None:
    """`zero_grad` of modules and optimizers: each tensor's `.grad` (its stand-in's, when tracing)
    set to None, or zeroed in place."""
    for tensor in tensors:
        tensor = current_tensor(tensor)
        if tensor.grad is None:
            continue
        if set_to_none:
            tensor.grad = None
        else:
            tensor.grad.zero_()
