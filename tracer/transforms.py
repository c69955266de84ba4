"""Gradients as functions, torch.func / JAX style: `grad`, `value_and_grad`, `vjp`, `jvp`; eager and
inside `@trace`, and nested to any order (`tr.grad(tr.grad(f))`).

Each transform runs `f` on inputs that stand for its arguments and asks the backward engine
(`tracer.backward.gradients_of`) for the gradients. An argument already differentiated by an outer
transform (or computed by the user's autograd from a tensor that requires grad) is stood for by an
identity of it, so that the inner gradient is taken with respect to this use alone (no
perturbation confusion) while the outer one still flows through; any other argument by a fresh
leaf. Where the function, or a cotangent or tangent, reaches a tensor that requires grad other
than these stand-ins -- an argument that requires grad, a weight the function closes over or takes
outside argnums, an outer transform's variable -- the backward records its own graph
(create_graph), and the results that reach one stay connected to it, as torch.func's do (so that a
gradient penalty's `backward()` reaches the weights through them); the others, and all under
no_grad, are constants.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np

from tracer.ir.primitives import DIRECTIVES, NON_DIFFERENTIABLE
from tracer.ir.types import is_float
from tracer.autograd import LeafAccumulator, edge_of
from tracer.backward import gradients_of
from tracer.context import enable_grad, is_grad_enabled, no_grad, state
from tracer.creation import ones, zeros_like
from tracer.dispatch import apply, as_tensor
from tracer.errors import ArgumentError
from tracer.tensor import Tensor, mark_view


def _argnums(argnums: int | Sequence[int], count: int) -> tuple[int, ...]:
    numbers = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for n in numbers:
        if not -count <= n < count:
            raise ArgumentError(f"argnums {n} is out of range for {count} positional arguments")
    return tuple(n % count for n in numbers)


def tree_map(function: Callable, tree):
    """`tree` (nested lists, tuples, named tuples and dicts: a pytree) with `function` applied to
    every other value in it, in order."""
    if isinstance(tree, (list, tuple)):
        items = [tree_map(function, item) for item in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    if isinstance(tree, dict):
        return type(tree)((key, tree_map(function, value)) for key, value in tree.items())
    return function(tree)


def tree_leaves(tree) -> list:
    leaves: list = []
    tree_map(leaves.append, tree)
    return leaves


class _Inputs:
    """The tensors a transform differentiates with respect to (its stand-ins), and which of its
    results stay connected to the user's autograd (or an outer transform's)."""

    def __init__(self, what: str):
        self.what = what
        self.tensors: list[Tensor] = []
        self._arguments: dict[int, Tensor] = {}  # the argument each stand-in stands for, by id
        self.grad_enabled = is_grad_enabled()
        self.inner: list[Tensor] = []  # stand-ins of the transforms this one is made of (jvp's)

    def make(self, value, position) -> Tensor:
        x = as_tensor(value, accept_data=True)
        if x.dtype.kind != "f":
            raise ArgumentError(f"{self.what}: argument {position} must be a float tensor (or a "
                                f"list, tuple or dict of them), got {x.dtype}")
        if x.requires_grad and is_grad_enabled():
            with enable_grad():  # an identity, whose gradient goes on to x
                stand_in = apply("reshape", [x], shape=x.shape)
            # torch.func's stands for x itself; this is a copy, marked as eager mode marks a
            # view's: changing it in place (which would not reach x: a wrong gradient, x
            # unchanged) or reading it, or a result that is it, after x changed is refused
            mark_view(stand_in, x, "a transform's copy of its argument")
        else:
            trace = state.trace
            handle = x._handle
            if trace is not None:  # a value of its own: a gradient with respect to x's value
                with no_grad():  # would take in the function's other uses of x (a closure's)
                    handle = trace.handle_of(apply("reshape", [x], shape=x.shape))
            stand_in = Tensor._make(handle, trace, True, leaf=True)
        self.tensors.append(stand_in)
        self._arguments[id(stand_in)] = x
        return stand_in

    def reaching_outside(self, tensors: list) -> list[bool]:
        """Whether a gradient flows from each of `tensors` into a tensor that requires grad other
        than the stand-ins: the user's autograd, or an outer transform, differentiates it again."""
        own = frozenset(id(t) for t in self.tensors + self.inner)
        unreaching: set[int] = set()  # ids of tape nodes and traced values that reach none
        sources: dict[int, set[int]] = {}  # by id of trace: the ids of its source values
        reaches = []
        for t in tensors:
            if not (isinstance(t, Tensor) and t.requires_grad):
                reaches.append(False)
            elif t._trace is None:
                reaches.append(_reaches_eagerly(edge_of(t), own, unreaching))
            else:
                if id(t._trace) not in sources:
                    sources[id(t._trace)] = {id(v) for v in t._trace.gradient_sources(own)}
                reaches.append(_reaches_traced(t._trace.handle_of(t), sources[id(t._trace)],
                                              unreaching))
        return reaches

    def rebase(self, value):
        """A result that is a view-copy of a stand-in (`x[0]`), or its detach(): a view of the
        argument, as torch.func's is (its stand-in shares the argument's memory), so changing it
        in place, or reading it after the argument changed in place, is refused as for `x[0]`."""
        view = value._base if isinstance(value, Tensor) and value._view_base is None else value
        if isinstance(view, Tensor) and id(view._view_base) in self._arguments:
            mark_view(value, self._arguments[id(view._view_base)], view._view_of,
                      view._view_shares_version)
        return value

    def gradients(self, outputs: list[Tensor], seeds: list[Tensor]) -> list[Tensor]:
        """The gradients of sum(output_i * seed_i) with respect to the inputs (zeros where none
        flows), each connected where it reaches a tensor that requires grad (`connected`)."""
        flowing = [(o, s) for o, s in zip(outputs, seeds) if o.requires_grad]
        if not flowing:
            return [zeros_like(x) for x in self.tensors]
        tensors = [tensor for pair in flowing for tensor in pair]
        reaching = self.reaching_outside(tensors) if is_grad_enabled() else []
        if not self.grad_enabled and any(reaching[1::2]):
            # torch.func's result is connected to the cotangent alone (the function's own graph
            # was not recorded); here the backward's graph would bring in the function's
            # weights too, and a constant would silently drop the cotangent's path
            raise ArgumentError(f"{self.what}_fn: a cotangent that requires grad, for a "
                                f"{self.what} taken under no_grad; take the {self.what} with "
                                f"grad enabled, or pass the cotangent detached")
        create_graph = self.grad_enabled and any(reaching)
        gradients = gradients_of([o for o, _ in flowing], [s for _, s in flowing], self.tensors,
                                 True, create_graph, self.what)
        return self.connected([zeros_like(x) if g is None else g if isinstance(g, Tensor)
                               else Tensor._make(g, None, False)
                               for x, g in zip(self.tensors, gradients)])

    def connected(self, tree):
        """`tree` with each tensor that reaches no tensor requiring grad but the stand-ins
        detached: a constant, as torch.func's is."""
        tensors = [t for t in tree_leaves(tree) if isinstance(t, Tensor)]
        kept = {id(t) for t, reaches in zip(tensors, self.reaching_outside(tensors))
                if reaches and self.grad_enabled}
        return tree_map(lambda t: t if not isinstance(t, Tensor) or id(t) in kept
                        else t.detach() if t.requires_grad else t, tree)

    def result(self, tree):
        """Results of the function (its value or aux), connected or constants, views rebased."""
        return tree_map(self.rebase, self.connected(tree))


def _reaches_eagerly(edge, own: frozenset[int], unreaching: set[int]) -> bool:
    """Whether the eager tape from `edge` reaches a leaf that requires grad, but those in `own`.
    A search stops at the first such leaf (a closed-over weight is usually a few nodes away);
    one that finds none adds the nodes it saw to `unreaching`, which the next search skips."""
    visited: set[int] = set()
    stack = [edge]
    while stack:
        edge = stack.pop()
        if isinstance(edge, LeafAccumulator):
            if id(edge.tensor) not in own:
                return True
        elif edge is not None and id(edge[0]) not in visited and id(edge[0]) not in unreaching:
            visited.add(id(edge[0]))
            stack.extend(edge[0].edges)
    unreaching |= visited
    return False


def _reaches_traced(value, targets: set[int], unreaching: set[int]) -> bool:
    """Whether a gradient flows from the traced `value` into a value whose id is in `targets`
    (a search as _reaches_eagerly's, through the values' producers)."""
    visited: set[int] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        if id(current) in targets:
            return True
        if id(current) in visited or id(current) in unreaching:
            continue
        visited.add(id(current))
        producer = current.producer
        if producer is not None and is_float(current.dtype) and (
                producer.primitive not in NON_DIFFERENTIABLE
                and producer.primitive not in DIRECTIVES):
            stack.extend(producer.inputs)
    unreaching |= visited
    return False


def _differentiate(f: Callable, argnums, has_aux: bool, args, kwargs):
    numbers = _argnums(argnums, len(args))
    args = list(args)
    inputs = _Inputs("grad")
    for n in numbers:
        args[n] = tree_map(lambda value, n=n: inputs.make(value, n), args[n])
    with enable_grad():  # (torch.func's differentiate under no_grad too)
        result = f(*args, **kwargs)
    output, aux = result if has_aux else (result, None)
    aux = tree_map(inputs.result, aux)
    if not isinstance(output, Tensor) or output.numel() != 1 or output.dtype.kind != "f":
        raise ArgumentError("grad needs a function that returns a float tensor with one element"
                            + (" (and an aux value, with has_aux=True)" if has_aux else ""))
    gradients = inputs.gradients([output], [ones(*output.shape, dtype=output.dtype)])
    # the gradient of each differentiated argument has its structure
    flowing = iter(gradients)
    trees = tuple(tree_map(lambda _: next(flowing), args[n]) for n in numbers)
    value = inputs.result(output)
    return ((value, aux) if has_aux else value), (trees[0] if isinstance(argnums, int) else trees)


def value_and_grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """`f`'s value and its gradient with respect to the arguments `argnums` (as jax.value_and_grad);
    with has_aux, `f` returns (value, aux) and this returns ((value, aux), gradient)."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return _differentiate(f, argnums, has_aux, args, kwargs)
    return wrapper


def grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The gradient of scalar-valued `f` with respect to the arguments `argnums` (as jax.grad)."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        value, gradients = _differentiate(f, argnums, has_aux, args, kwargs)
        return (gradients, value[1]) if has_aux else gradients
    return wrapper


def _float_outputs(tree, what: str) -> list[Tensor]:
    outputs = tree_leaves(tree)
    for output in outputs:
        if not isinstance(output, Tensor) or output.dtype.kind != "f":
            raise ArgumentError(f"{what} needs a function that returns float tensors (or a "
                                f"list, tuple or dict of them), got {type(output).__name__}"
                                + (f" of {output.dtype}" if isinstance(output, Tensor) else ""))
    return outputs


def vjp(f: Callable, *primals, has_aux: bool = False):
    """`(f(*primals), vjp_fn)` as torch.func.vjp: `vjp_fn(cotangents)` (one per output, in the
    output's structure) returns the gradient of sum(output * cotangent) for each primal, as a
    tuple. `vjp_fn` may be called again (the graph is kept)."""
    return _vjp(_Inputs("vjp"), f, primals, has_aux)


def _vjp(inputs: _Inputs, f: Callable, primals: tuple, has_aux: bool):
    arguments = [tree_map(lambda value, n=n: inputs.make(value, n), p)
                 for n, p in enumerate(primals)]
    with enable_grad():  # (torch.func's differentiate under no_grad too)
        result = f(*arguments)
    output, aux = result if has_aux else (result, None)
    aux = tree_map(inputs.result, aux)
    outputs = _float_outputs(output, "vjp")

    def vjp_fn(cotangents):
        seeds = tree_leaves(cotangents)
        if len(seeds) != len(outputs):
            raise ArgumentError(f"vjp_fn got {len(seeds)} cotangents for {len(outputs)} outputs")
        seeds = [as_tensor(s, accept_data=True).to(o.dtype) for o, s in zip(outputs, seeds)]
        for o, s in zip(outputs, seeds):
            if s.shape != o.shape:
                raise ArgumentError(f"vjp_fn: a cotangent of shape {list(s.shape)} for an output "
                                    f"of shape {list(o.shape)}")
        flowing = iter(inputs.gradients(outputs, seeds))
        return tuple(tree_map(lambda _: next(flowing), p) for p in arguments)

    value = tree_map(inputs.result, output)
    return (value, vjp_fn, aux) if has_aux else (value, vjp_fn)


def jvp(f: Callable, primals: Sequence, tangents: Sequence, has_aux: bool = False):
    """`(f(*primals), tangents_out)` as torch.func.jvp: the directional derivative of `f` at
    `primals` along `tangents`. Computed by transposing the vector-Jacobian product (it is linear
    in its cotangent u, so d/du <vjp(u), t> = J t): two backward passes, no forward-mode rules."""
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ArgumentError(f"jvp: {len(primals)} primals but {len(tangents)} tangents")
    for p, t in zip(tree_leaves(primals), tree_leaves(tangents)):
        if tuple(np.shape(t)) != tuple(np.shape(p)):
            raise ArgumentError(f"jvp: a tangent of shape {list(np.shape(t))} for a primal of "
                                f"shape {list(np.shape(p))}")
    transposed = _Inputs("jvp")
    with enable_grad():  # the first backward is differentiated again, by the second
        forward = _Inputs("vjp")
        result = _vjp(forward, f, primals, has_aux)
        output, vjp_fn = result[0], result[1]
        outputs = _float_outputs(output, "jvp")
        dummies = [_zeros_leaf(o) for o in outputs]
        cotangent_tree = iter(dummies)
        gradients = tree_leaves(vjp_fn(tree_map(lambda _: next(cotangent_tree), output)))
    transposed.tensors, transposed.inner = dummies, forward.tensors
    seeds = [as_tensor(t, accept_data=True).to(g.dtype) for g, t in
             zip(gradients, tree_leaves(tangents))]
    out_tangents = iter(transposed.gradients(gradients, seeds))
    tangents_out = tree_map(lambda _: next(out_tangents), output)
    value = tree_map(transposed.result, output)
    return ((value, tangents_out, tree_map(transposed.result, result[2])) if has_aux
            else (value, tangents_out))


def _zeros_leaf(like: Tensor) -> Tensor:
    """A leaf of zeros requiring grad, shaped like `like` (jvp's cotangent variable)."""
    trace = state.trace
    zeros = zeros_like(like)
    handle = zeros._handle if trace is None else trace.handle_of(zeros)
    return Tensor._make(handle, trace, True, leaf=True)
