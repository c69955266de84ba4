"""`Tensor.backward`, eager and inside `@trace`; the traced side of every gradient (a `gradient`
directive that the autodiff pass expands when the trace is compiled); and `zero_grad`."""
from __future__ import annotations

import builtins
from typing import Iterable, Sequence

import numpy as np

from tracer.ir.autodiff import active_values, gradient_path, reaches, trace_directive
from tracer.ir.autodiff import backward as backward_instructions
from tracer.ir.builder import GraphBuilder
from tracer.autograd import changed_for_backward, run_backward, values_read
from tracer.graph_builder import TENSORS
from tracer.hooks import hook_runners
from tracer.context import state
from tracer.creation import ones
from tracer.dispatch import as_tensor
from tracer.errors import ArgumentError, InplaceError, ShapeMismatchError
from tracer.tensor import Tensor
from tracer.tracing import current_tensor, escaped_error


def traced_gradients(output: Tensor, seed: Tensor, wrt: Sequence[Tensor],
                     create_graph: bool = False) -> list[Tensor | None]:
    """The gradients of `wrt`, None where no gradient flows. A leaf changed in place under
    no_grad has held several values: its gradient sums theirs. Recorded as a `gradient` directive
    (the autodiff pass puts its backward in place when the trace is compiled); with
    `create_graph`, the autodiff pass runs now and its instructions join the trace, where a later
    gradient differentiates them again (higher order)."""
    trace = output._trace
    groups = [trace.leaf_values(t) for t in wrt]
    values = [v for group in groups for v in group]
    # (a tensor that is no leaf has one value, and its gradient goes on through it)
    owners = [t for t, group in zip(wrt, groups) for _ in group]
    through = tuple(position for position, t in enumerate(owners) if not t.is_leaf)
    changed = changed_for_backward_error(trace, [output._handle], values)
    if changed is not None:
        raise changed
    hooks = hook_runners(trace)
    # (hooks may keep values of the backward, as retain_grad does: it joins the trace at once too)
    if create_graph or hooks:
        previous = state.creating_graph
        state.creating_graph = create_graph
        try:
            builder = GraphBuilder(trace.function, trace.location)
            flowing = backward_instructions(builder, list(trace.function.instructions),
                                            output._handle, trace.handle_of(seed), values, hooks,
                                            through)
        finally:
            state.creating_graph = previous
        pairs = iter(zip(flowing, flowing))
    else:
        operands = [output._handle, trace.handle_of(seed), *values]
        directive_outputs = trace.builder.emit("gradient", operands,
                                               {"through": through} if through else {})
        flowing = trace_directive(trace.function, directive_outputs[0].producer)
        pairs = iter(zip(directive_outputs, flowing))
    totals = []
    for group in groups:
        total = None
        for value, flows in (next(pairs) for _ in group):
            if flows is not None:
                total = value if total is None else trace.builder.add(total, value)
        totals.append(total)
    requires = _requiring_grad(trace, totals) if create_graph else [False] * len(totals)
    return [None if total is None else Tensor._make(total, trace, flag, leaf=False)
            for total, flag in zip(totals, requires)]


def _requiring_grad(trace, values: list) -> list[bool]:
    """Which of the traced `values` a gradient can flow into from a leaf that requires grad."""
    active = active_values(trace.function.instructions, trace.gradient_sources())
    return [value is not None and id(value) in active for value in values]


def changed_for_backward_error(trace, outputs: list, wrt_values: list) -> InplaceError | None:
    """What eager backward from the traced `outputs` to `wrt_values` would raise now, if a value it
    reads was changed in place since it was used (a saved tensor of a Function, or an operand of
    a primitive); None if none was."""
    instructions = trace.function.instructions
    path = gradient_path(instructions, outputs, wrt_values)
    for ctx, values in trace.custom_calls:
        if any(id(v) in path for v in values):
            try:
                ctx.check_saved()
            except InplaceError as error:
                return error
    # An instruction reads a value as it was when it ran; a change recorded before it (possible
    # only for the backward of a create_graph gradient, which reads the values the forward
    # used) is no change for it.
    positions = {id(instruction): index for index, instruction in enumerate(instructions)}
    for index, instruction in enumerate(instructions):
        if not any(id(v) in path for v in instruction.outputs):
            continue
        reads_inputs, reads_outputs = values_read(
            instruction.primitive, [id(x) in path for x in instruction.inputs])
        read = [x for x, flag in zip(instruction.inputs, reads_inputs) if flag]
        read += instruction.outputs if reads_outputs else []
        for value in read:
            changed = trace.changed_since(value)
            if changed is not None and positions.get(id(changed[2]), len(instructions)) > index:
                changed_value, where, _ = changed
                return changed_for_backward(changed_value.type.dtype, changed_value.type.shape,
                                            instruction.primitive, where)
    return None


def backward_reads_a_change(trace, results: list, stale: frozenset[int]) -> bool:
    """Whether eager backward from a result of a traced call (those requiring grad, but the
    `stale` positions) would find a value it reads changed in place after it was read (a
    softmax's result, which its backward reads, changed by the function): PyTorch's backward
    raises there. A split backward would read the values as they were computed and raise
    nothing; running the function again with its backward raises as eager mode does
    (runtime/split_code.split_signature)."""
    outputs = [value._handle for position, value in enumerate(results)
               if isinstance(value, Tensor) and value.requires_grad and value._trace is trace
               and position not in stale]
    return bool(outputs) and changed_for_backward_error(
        trace, outputs, trace.gradient_sources()) is not None


def traced_leaf_gradients(output: Tensor, gradient: Tensor, create_graph: bool = False
                          ) -> list[tuple[Tensor, Tensor]]:
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
    return [(leaf, grad) for leaf, grad in zip(
        leaves, traced_gradients(output, gradient, leaves, create_graph)) if grad is not None]


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
    elif gradient.requires_grad and gradient._trace is None:
        leaf.grad = grad + gradient  # create_graph: out of place, so the sum is differentiable too
    else:
        grad._assign(grad + gradient, "gradient accumulation")


class BackwardMethods:
    """Tensor.backward (given to Tensor by tracer/methods.py)."""

    def backward(self, gradient=None, retain_graph: builtins.bool | None = None,
                 create_graph: builtins.bool = False, inputs=None) -> None:
        """Accumulate the gradient of this tensor into the `.grad` of the leaves it depends on
        (or of `inputs` only). With `create_graph`, the backward's own computation is recorded,
        so the gradients can be differentiated again; the graph is kept unless `retain_graph`
        says otherwise (PyTorch's defaults)."""
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
        retain_graph = create_graph if retain_graph is None else retain_graph
        if inputs is not None:
            inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
            gradients = zip(inputs, gradients_of([self], [gradient], inputs, retain_graph,
                                                 create_graph, "backward(inputs=...)"))
        elif self._trace is not None:
            gradients = traced_leaf_gradients(self, gradient, create_graph)
        elif create_graph:
            gradients = run_backward([(self, gradient)], retain_graph, TENSORS)
        else:
            gradients = run_backward([(self, gradient._eager_array("backward"))],
                                     retain_graph=retain_graph)
        for leaf, value in gradients:
            if value is not None:
                accumulate_grad(leaf, value)
        while _after_backward:
            _after_backward.pop(0)()


def gradients_of(outputs: Sequence[Tensor], seeds: Sequence[Tensor], inputs: Sequence[Tensor],
                 retain_graph: bool, create_graph: bool, what: str) -> list:
    """The gradients of sum(output_i * seed_i) with respect to each of `inputs` (a leaf or not),
    None where none flows: eagerly arrays (tensors with `create_graph`), traced tensors. Only the
    backward that leads to `inputs` runs; no `.grad` changes."""
    for position, tensor in enumerate(inputs):
        if not isinstance(tensor, Tensor) or not tensor.requires_grad:
            raise ArgumentError(f"{what}: input {position} does not require grad; only tensors "
                                f"with requires_grad=True (or computed from one) can be "
                                f"differentiated with respect to")
    trace = outputs[0]._trace
    if trace is None:
        if create_graph:
            roots = list(zip(outputs, seeds))
            return run_backward(roots, retain_graph, TENSORS, capture=inputs)
        roots = [(o, s._eager_array("gradient")) for o, s in zip(outputs, seeds)]
        return run_backward(roots, retain_graph, capture=inputs)
    if state.trace is not trace:
        raise escaped_error()
    if len(outputs) == 1:
        return traced_gradients(outputs[0], seeds[0], inputs, create_graph)
    total = builtins.sum((o * s).sum() for o, s in zip(outputs, seeds))
    return traced_gradients(total, ones(dtype=total.dtype), inputs, create_graph)


def clear_grads(tensors: Iterable[Tensor], set_to_none: bool = True) -> None:
    """`zero_grad` of modules and optimizers: each tensor's `.grad` (its stand-in's, when tracing)
    set to None, or zeroed in place."""
    for tensor in tensors:
        tensor = current_tensor(tensor)
        if set_to_none:  # without reading it: a traced step that starts so ignores the .grad
            tensor.grad = None  # it is called with (see Trace.grad_read)
        elif tensor.grad is not None:
            tensor.grad.zero_()
