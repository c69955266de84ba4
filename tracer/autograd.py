"""Eager-mode autograd: the tape of nodes recorded by operations, and the backward engine.

A Node is one recorded primitive (or custom Function) with the arrays its VJP needs and an edge to
whatever produced each input: another node's output, or the accumulator of a leaf tensor.

This is also `tr.autograd`, whose public names are PyTorch's (`tr.autograd.grad`, `.backward`,
`.Function`, `.gradcheck`, `.gradgradcheck`, ...): they live in the modules that define them, above
this one, and are imported on first use (see `__getattr__` at the end).
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Callable, Sequence

import numpy as np

from tracer.ir.builder import ArrayBuilder
from tracer.ir.types import TensorType
from tracer.ir.vjp import (VALUES_READ, CustomRule, accumulate, apply_vjp, materialize,
                          through_hooks)
from tracer.context import enable_grad, no_grad, state
from tracer.errors import FunctionBackwardError, InplaceError, TracerError
from tracer.tensor import Tensor

ARRAYS = ArrayBuilder()


class LeafAccumulator:
    """The end of every gradient path into a leaf tensor: adds the gradient into `.grad`."""

    __slots__ = ("tensor", "hooks")

    def __init__(self, tensor: Tensor):
        self.tensor = tensor
        self.hooks: list[Callable] = []  # Tensor.register_hook on the leaf


def edge_of(tensor: Tensor):
    """Where a gradient for `tensor` goes: (node, output index), a LeafAccumulator, or None."""
    if not tensor.requires_grad:
        return None
    if tensor._node is not None:
        return (tensor._node, tensor._output_index)
    if tensor._accumulator is None:
        tensor._accumulator = LeafAccumulator(tensor)
    return tensor._accumulator


def values_read(primitive: str, needs: list[bool]) -> tuple[list[bool], bool]:
    """(which operands, whether the result) the VJP rule of `primitive` (ir/vjp.py) reads when it
    computes the gradients `needs`: its row of VALUES_READ."""
    return VALUES_READ[primitive](list(needs))


def changed_for_backward(dtype, shape, name: str, where: str) -> InplaceError:
    """The error of a backward that needs a value changed in place since (eager and traced)."""
    return InplaceError(f"a {dtype} tensor of shape {list(shape)} needed to compute the gradient "
                        f"of {name} was changed in place at {where}; change a clone of it instead "
                        f"(x = x.clone())")


class Node:
    """One recorded operation of the eager tape."""

    __slots__ = ("primitive", "attributes", "inputs", "outputs", "edges", "saved", "name", "freed",
                 "reads_output", "changed", "hooks", "__weakref__")

    def __init__(self, primitive: str, attributes: dict, input_tensors: Sequence[Tensor],
                 inputs: list[np.ndarray], outputs: list[np.ndarray], name: str | None = None,
                 edges: list | None = None):
        self.primitive = primitive
        self.attributes = attributes
        self.inputs = inputs
        self.outputs = outputs
        self.edges = [edge_of(t) for t in input_tensors] if edges is None else edges
        # The VJP of a non-linear primitive reads some operands (and maybe its result): remember
        # their versions, so that an in-place change before backward is an error rather than a
        # silently wrong gradient -- and only theirs, so that `y.mul_(2)` stays allowed (PyTorch).
        reads_inputs, self.reads_output = values_read(
            primitive, [t.requires_grad for t in input_tensors])
        self.saved: list[weakref.ref] = []
        # (dtype, shape, where) of a saved tensor changed in place: an error at backward, even
        # if the tensor is gone by then
        self.changed: tuple | None = None
        self.save([t for t, read in zip(input_tensors, reads_inputs) if read])
        self.name = name or primitive
        self.freed = False
        self.hooks: dict[int, list[Callable]] | None = None  # by output: Tensor.register_hook

    def save(self, tensors: Sequence[Tensor]) -> None:
        """Track `tensors`, which the VJP reads: each tells this node when it changes in place
        (Tensor._mark_changed, the one place a version counter moves)."""
        for t in tensors:
            # a view-copy stands for its base, whose in-place change a PyTorch view would share
            shares = t._view_shares_version and t._view_base is not None
            tracked_tensors = (t, t._view_base) if shares else (t,)
            if t._base is not None:  # a detach() alias: PyTorch's shares its original's version
                tracked_tensors += (t._base,)
            for tracked in tracked_tensors:
                self.saved.append(weakref.ref(tracked))
                # (the nodes gone since are dropped: a weight read by every step would otherwise
                # collect one reference per step, each walked by every in-place update)
                tracked._saved_by = [r for r in tracked._saved_by if r() is not None]
                tracked._saved_by.append(weakref.ref(self))

    def save_outputs(self, tensors: Sequence[Tensor]) -> None:
        """Called with the result tensors once they exist: track them if the VJP reads them."""
        if self.reads_output:
            self.save(tensors)

    def forget(self, tensor: Tensor) -> None:
        """Stop tracking `tensor` (the node keeps a copy of the value it read)."""
        self.saved = [reference for reference in self.saved if reference() is not tensor]

    def note_change(self, tensor: Tensor) -> None:
        """`tensor` is being changed in place: an error at backward if this node reads it."""
        if self.changed is None and any(reference() is tensor for reference in self.saved):
            self.changed = (tensor.dtype, tensor.shape, tensor._changed_at)

    def check_saved(self) -> None:
        if self.changed is not None:
            dtype, shape, where = self.changed
            raise changed_for_backward(dtype, shape, self.name, where)

    def apply(self, cotangents: list, builder=ARRAYS) -> list:
        """The gradients of the inputs from the cotangents of the outputs: arrays, or with a
        recording builder (create_graph) tensors whose own computation is on the tape."""
        if self.freed:
            raise TracerError(
                "backward through a graph a second time, after its saved values were freed; "
                "pass retain_graph=True to the first backward()")
        self.check_saved()
        needs = [edge is not None for edge in self.edges]
        inputs, outputs = ((self.inputs, self.outputs) if builder is ARRAYS
                           else builder.operands_of(self))
        return apply_vjp(builder, self.primitive, self.attributes, inputs, outputs, cotangents,
                         needs)


def custom_node(name: str, rule, outputs: list[np.ndarray], inputs: list[np.ndarray],
                input_edges: list) -> Node:
    """The tape node of a `custom_vjp` over `outputs` whose gradient `rule` (an ir.CustomRule)
    computes for `inputs`, which send their gradients along `input_edges`."""
    attributes = {"num_outputs": len(outputs), "rule": rule}
    return Node("custom_vjp", attributes, [], list(outputs) + list(inputs), list(outputs),
                name=f"{name}Backward", edges=[None] * len(outputs) + list(input_edges))


def record_call(name: str, backward: Callable[[list[Tensor]], list[Tensor | None]],
                outputs: Sequence[Tensor], inputs: Sequence[Tensor],
                saved: Sequence[Tensor], reached: Sequence[frozenset[int]]) -> None:
    """Make the eager `outputs` the results of one call on the tape, whose gradients
    `backward(cotangents)` computes: one cotangent tensor per output (zeros where none flows) in,
    one gradient tensor (or None) per input out. A tensor in `saved` changed in place before the
    backward runs is an error then. `reached[j]` holds the outputs (positions) that depend on
    input j: its gradient is None where none of them has a cotangent, as PyTorch's where the
    nodes between them never run (a parameter only an unused result reads keeps .grad None, so
    an optimizer leaves it alone), where `backward` computes zeros."""
    # (the types only: the rule is held by the outputs' node, and holding them would make a
    # cycle that keeps what `backward` holds alive until the collector runs)
    types = [(o.shape, o.dtype) for o in outputs]

    def rule(builder, cotangents: list, needs: list[bool]) -> list:
        seeds = [c if isinstance(c, Tensor) else Tensor._make(
            np.zeros(shape, dtype) if c is None else c, None, False)
            for (shape, dtype), c in zip(types, cotangents)]
        gradients = [None if g is None or not any(cotangents[k] is not None for k in dependents)
                     else g for g, dependents in zip(backward(seeds), reached, strict=True)]
        if builder is ARRAYS:
            return [None if g is None else g._handle for g in gradients]
        # create_graph: the compiled backward is not differentiable again
        return delayed_error(name, f"the compiled backward of the traced function {name}",
                             gradients, inputs)

    node = custom_node(name, CustomRule(name, rule), [o._handle for o in outputs],
                       [t._handle for t in inputs], [edge_of(t) for t in inputs])
    node.save(saved)
    for index, output in enumerate(outputs):
        attach(output, node, index)


def delayed_error(label: str, what: str, gradients: Sequence[Tensor | None], sources: Sequence[Tensor]
                  ) -> list[Tensor | None]:
    """`gradients`, computed by a backward that is not differentiable again (`what`), made the
    outputs of one call whose own gradient is an error (PyTorch's DelayedError): a second-order
    gradient through them raises instead of silently missing their part. The call's inputs are
    `sources` (the inputs of the Function), so that a gradient for them reaches it. Eager or
    traced, whichever `gradients` are."""
    def refuse(builder, cotangents, needs):
        raise FunctionBackwardError(
            f"{what} cannot be differentiated again (it is once_differentiable), but a "
            f"second-order gradient (create_graph=True, or a nested tr.grad) goes through it; "
            f"write that backward with differentiable tensor operations instead")

    present = [g for g in gradients if g is not None]
    sources = [s for s in sources if s.requires_grad]
    if not present:
        return list(gradients)
    rule = CustomRule(f"{label}.once_differentiable", refuse)
    trace = present[0]._trace
    if trace is None:
        node = custom_node(rule.label, rule, [g._handle for g in present],
                           [s._handle for s in sources], [edge_of(s) for s in sources])
        made = [Tensor._make(g._handle, None, True, node, index, leaf=False)
                for index, g in enumerate(present)]
    else:
        handles = trace.builder.emit(
            "custom_vjp", [g._handle for g in present] + [trace.handle_of(s) for s in sources],
            {"num_outputs": len(present), "rule": rule})
        made = [Tensor._make(h, trace, True, leaf=False) for h in handles]
    replaced = iter(made)
    return [None if g is None else next(replaced) for g in gradients]


def _topological_order(roots: list) -> list[Node]:
    """Nodes reachable from `roots`, each after every node that consumes its outputs."""
    order: list[Node] = []
    visited: set[int] = set()
    stack: list[tuple[Node, bool]] = [(node, False) for node in roots]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for edge in node.edges:
            if isinstance(edge, tuple) and id(edge[0]) not in visited:
                stack.append((edge[0], False))
    return order[::-1]


@contextlib.contextmanager
def _creating_graph():
    """The state of a create_graph backward: the VJPs record onto the tape."""
    previous = state.creating_graph
    state.creating_graph = True
    try:
        with enable_grad():
            yield
    finally:
        state.creating_graph = previous


def _needed(nodes: list[Node], wanted) -> set[int]:
    """Ids of the `nodes` (consumers first) from which a gradient reaches an edge `wanted(edge)`
    is true of: the others need not run."""
    needed: set[int] = set()
    for node in reversed(nodes):
        if any(edge is not None and (wanted(edge) or (isinstance(edge, tuple)
                                                      and id(edge[0]) in needed))
               for edge in node.edges):
            needed.add(id(node))
    return needed


def ordered(hooks: list[Callable]) -> list[Callable]:
    """Tensor hooks in the order they run: retain_grad's last, as in PyTorch (it keeps the
    gradient the other hooks made)."""
    return sorted(hooks, key=lambda hook: getattr(hook, "retains_grad", False))


def _run_hooks(hooks, gradient, builder):
    """Tensor.register_hook: each hook sees the gradient (a tensor) and may return another."""
    for hook in ordered(hooks):
        wrapped = gradient if isinstance(gradient, Tensor) else Tensor._make(gradient, None, False)
        result = hook(wrapped)
        if result is not None:
            gradient = result if builder is not ARRAYS else result._eager_array("a hook's result")
    return gradient


def run_backward(roots: Sequence[tuple[Tensor, object]], retain_graph: bool = False,
                 builder=ARRAYS, capture: Sequence[Tensor] | None = None) -> list:
    """Propagate `roots` (tensor, cotangent) back through the tape. Without `capture`: (leaf, its
    gradient) for every leaf reached, which `Tensor.backward` accumulates into `.grad`. With it:
    the gradient of each tensor of `capture` (a leaf or not), None where none flows, and only the
    nodes on a path to them run (`tr.autograd.grad`). Gradients are arrays; with a recording
    builder (create_graph) they are tensors, computed on the tape themselves."""
    cotangents: dict[tuple[int, int], object] = {}
    leaf_gradients: dict[int, tuple[Tensor, object]] = {}
    captured_edges = {}
    if capture is not None:
        for position, tensor in enumerate(capture):
            edge = edge_of(tensor)
            key = id(edge.tensor) if isinstance(edge, LeafAccumulator) else (id(edge[0]), edge[1])
            captured_edges.setdefault(key, []).append(position)
    captured: list = [None] * len(capture or ())

    def send(edge, gradient) -> None:
        # Sums go through the builder: numpy's `+` of two 0-d arrays is a numpy scalar, which a
        # VJP rule would take for a Python number.
        if edge is None or gradient is None:
            return
        if isinstance(edge, LeafAccumulator):
            key = id(edge.tensor)
            if capture is not None and key not in captured_edges:
                return
            previous = leaf_gradients.get(key, (None, None))[1]
            leaf_gradients[key] = (edge.tensor, accumulate(builder, previous, gradient))
        else:
            node, index = edge
            key = (id(node), index)
            cotangents[key] = accumulate(builder, cotangents.get(key), gradient)

    for tensor, gradient in roots:
        send(edge_of(tensor), gradient)
    nodes = _topological_order([edge[0] for edge in (edge_of(t) for t, _ in roots)
                                if isinstance(edge, tuple)])
    needed = None
    if capture is not None:
        needed = _needed(nodes, lambda edge: (
            id(edge.tensor) if isinstance(edge, LeafAccumulator) else (id(edge[0]), edge[1])
        ) in captured_edges)
    with no_grad() if builder is ARRAYS else _creating_graph():
        for node in nodes:
            outgoing = [cotangents.pop((id(node), i), None) for i in range(len(node.outputs))]
            for index, hooks in (node.hooks or {}).items():
                if outgoing[index] is not None:
                    outgoing[index] = through_hooks(
                        builder, outgoing[index], _type_of(node.outputs[index]),
                        lambda gradient, hooks=hooks: _run_hooks(hooks, gradient, builder))
            for index, gradient in enumerate(outgoing):
                for position in captured_edges.get((id(node), index), ()):
                    captured[position] = materialize(builder, gradient,
                                                     _type_of(node.outputs[index]))
            if needed is not None and id(node) not in needed:
                continue
            for edge, gradient in zip(node.edges, node.apply(outgoing, builder)):
                send(edge, gradient)
            if not retain_graph:  # (and a custom rule, with what it holds: a compiled
                # function's saved values, runtime/differentiable.py)
                node.inputs = node.outputs = ()
                node.attributes = {}
                node.freed = True
    results = []
    for leaf, gradient in leaf_gradients.values():
        gradient = materialize(builder, gradient, _type_of(leaf._handle))
        accumulator = leaf._accumulator
        if accumulator is not None and accumulator.hooks:
            gradient = _run_hooks(accumulator.hooks, gradient, builder)
        results.append((leaf, gradient))
        for position in captured_edges.get(id(leaf), ()):
            captured[position] = gradient
    return results if capture is None else captured


def _type_of(array: np.ndarray) -> TensorType:
    return TensorType(array.shape, array.dtype)


def attach(tensor: Tensor, node: Node | None, index: int) -> None:
    """Make `tensor` output `index` of `node` (None when traced: the graph holds the link): it
    requires grad and is no longer a leaf."""
    tensor._node, tensor._output_index = node, index
    tensor._requires_grad, tensor._leaf = True, False



# tr.autograd's public names (PyTorch's), by the module that defines each: those import this one.
_PUBLIC = {"grad": "tracer.gradients", "backward": "tracer.gradients",
           "Function": "tracer.function", "FunctionCtx": "tracer.function",
           "once_differentiable": "tracer.function", "gradcheck": "tracer.gradcheck",
           "gradgradcheck": "tracer.gradcheck", "no_grad": "tracer.context",
           "enable_grad": "tracer.context", "set_grad_enabled": "tracer.context",
           "inference_mode": "tracer.context"}


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'tracer.autograd' has no attribute {name!r}")
