"""Eager-mode autograd: the tape of nodes recorded by operations, and the backward engine.

A Node is one recorded primitive (or custom Function) with the arrays its VJP needs and an edge to
whatever produced each input: another node's output, or the accumulator of a leaf tensor.
"""
from __future__ import annotations

import weakref
from typing import Callable, Sequence

import numpy as np

from tracer.ir.builder import ArrayBuilder
from tracer.ir.vjp import VALUES_READ, CustomRule, apply_vjp
from tracer.context import no_grad
from tracer.errors import InplaceError, TracerError
from tracer.tensor import Tensor

ARRAYS = ArrayBuilder()


class LeafAccumulator:
    """The end of every gradient path into a leaf tensor: adds the gradient into `.grad`."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Tensor):
        self.tensor = tensor


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
                 "reads_output", "changed", "__weakref__")

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

    def save(self, tensors: Sequence[Tensor]) -> None:
        """Track `tensors`, which the VJP reads: each tells this node when it changes in place
        (Tensor._mark_changed, the one place a version counter moves)."""
        for t in tensors:
            # a view-copy stands for its base, whose in-place change a PyTorch view would share
            shares = t._view_shares_version and t._view_base is not None
            for tracked in (t, t._view_base) if shares else (t,):
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

    def apply(self, cotangents: list[np.ndarray | None]) -> list[np.ndarray | None]:
        if self.freed:
            raise TracerError(
                "backward through a graph a second time, after its saved values were freed; "
                "pass retain_graph=True to the first backward()")
        self.check_saved()
        needs = [edge is not None for edge in self.edges]
        return apply_vjp(ARRAYS, self.primitive, self.attributes, self.inputs, self.outputs,
                         cotangents, needs)


def custom_node(name: str, rule, outputs: list[np.ndarray], inputs: list[np.ndarray],
                input_edges: list) -> Node:
    """The tape node of a `custom_vjp` over `outputs` whose gradient `rule` (an ir.CustomRule)
    computes for `inputs`, which send their gradients along `input_edges`."""
    attributes = {"num_outputs": len(outputs), "rule": rule}
    return Node("custom_vjp", attributes, [], list(outputs) + list(inputs), list(outputs),
                name=f"{name}Backward", edges=[None] * len(outputs) + list(input_edges))


def record_call(name: str, backward: Callable[[list[Tensor]], list[Tensor | None]],
                outputs: Sequence[Tensor], inputs: Sequence[Tensor],
                saved: Sequence[Tensor]) -> None:
    """Make the eager `outputs` the results of one call on the tape, whose gradients
    `backward(cotangents)` computes: one cotangent tensor per output (zeros where none flows) in,
    one gradient tensor (or None) per input out. A tensor in `saved` changed in place before the
    backward runs is an error then."""
    def rule(builder, cotangents: list, needs: list[bool]) -> list:
        seeds = [Tensor._make(np.zeros(o.shape, o.dtype) if c is None else c, None, False)
                 for o, c in zip(outputs, cotangents)]
        return [None if g is None else g._handle for g in backward(seeds)]

    node = custom_node(name, CustomRule(name, rule), [o._handle for o in outputs],
                       [t._handle for t in inputs], [edge_of(t) for t in inputs])
    node.save(saved)
    for index, output in enumerate(outputs):
        attach(output, node, index)


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


def run_backward(roots: Sequence[tuple[Tensor, np.ndarray]],
                 retain_graph: bool = False) -> list[tuple[Tensor, np.ndarray]]:
    """Propagate `roots` (tensor, cotangent) back through the tape: (leaf, its gradient) for every
    leaf reached. `Tensor.backward` accumulates them into `.grad`; `tr.grad` returns some."""
    cotangents: dict[tuple[int, int], np.ndarray] = {}
    leaf_gradients: dict[int, tuple[Tensor, np.ndarray]] = {}

    def send(edge, gradient: np.ndarray) -> None:
        # Sums go through the builder: numpy's `+` of two 0-d arrays is a numpy scalar, which a
        # VJP rule would take for a Python number.
        if edge is None or gradient is None:
            return
        if isinstance(edge, LeafAccumulator):
            key = id(edge.tensor)
            previous = leaf_gradients.get(key)
            leaf_gradients[key] = (edge.tensor, gradient if previous is None
                                   else ARRAYS.add(previous[1], gradient))
        else:
            node, index = edge
            previous = cotangents.get((id(node), index))
            cotangents[(id(node), index)] = (gradient if previous is None
                                             else ARRAYS.add(previous, gradient))

    for tensor, gradient in roots:
        send(edge_of(tensor), gradient)
    nodes = _topological_order([edge[0] for edge in (edge_of(t) for t, _ in roots)
                                if isinstance(edge, tuple)])
    with no_grad():
        for node in nodes:
            outgoing = [cotangents.pop((id(node), i), None) for i in range(len(node.outputs))]
            for edge, gradient in zip(node.edges, node.apply(outgoing)):
                send(edge, gradient)
            if not retain_graph:
                node.inputs = node.outputs = ()
                node.freed = True
    return list(leaf_gradients.values())


def attach(tensor: Tensor, node: Node | None, index: int) -> None:
    """Make `tensor` output `index` of `node` (None when traced: the graph holds the link): it
    requires grad and is no longer a leaf."""
    tensor._node, tensor._output_index = node, index
    tensor._requires_grad, tensor._leaf = True, False

