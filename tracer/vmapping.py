"""`vmap` as torch.func and JAX do it: the function traced once on one element's shapes, its
gradients expanded, then replayed for the whole batch by the batching pass (ir/batching.py)
through `dispatch.apply`. Eagerly the replay runs on numpy arrays and records onto the tape;
inside `@trace` it records into the enclosing graph, whose size then does not grow with the batch.
One pass both ways, so eager and traced results agree. A function the pass cannot batch (Python
that needs the values, a draw of random numbers, an in-place change of an argument, a custom
Function differentiated outside vmap) runs once per element instead, and the reason is logged
(logger "tracer.vmap", e.g. TRACER_LOG=info)."""
from __future__ import annotations

import functools
import logging
from typing import Callable, Sequence

from tracer.ir.batching import CannotBatch, batch_function, prepare
from tracer.ir.types import TensorType
from tracer.context import is_grad_enabled, state
from tracer.dispatch import from_data
from tracer.errors import ArgumentError, TracingError
from tracer.functional import stack
from tracer.graph_builder import TENSORS, TensorBuilder
from tracer.tensor import Tensor
from tracer.tracing import Trace, tracing
from tracer.transforms import tree_leaves, tree_map

LOG = logging.getLogger("tracer.vmap")


class _ElementTrace(Trace):
    """The trace of one element of a vmap: every tensor from outside it (the enclosing trace's
    too, or one computed from tensors that require grad) is an unbatched input, replayed as the
    tensor itself."""

    refuses_computed = False

    def __init__(self, name: str, outer: Trace | None):
        super().__init__(name)
        self.outer = outer
        # the parameters for arguments computed from tensors that require grad: no leaves, yet
        # a gradient flows from them into the caller's autograd
        self.computed_arguments: list = []

    def gradient_sources(self, leaving_out: frozenset[int] = frozenset()) -> list:
        return super().gradient_sources(leaving_out) + self.computed_arguments

    def handle_of(self, tensor: Tensor):
        if tensor._trace is not self and self.outer is not None:
            tensor = self.outer.arguments.get(id(tensor), tensor)
        if tensor._trace is self:
            return super().handle_of(tensor)
        return self.capture(tensor)


class _LocatedTensors(TensorBuilder):
    """Tensors through `apply`, recorded (inside `@trace`) at `location()`: the line of the mapped
    function that the instruction replayed comes from, not the line that calls vmap."""

    def __init__(self):
        self.location = lambda: ""

    def emit(self, primitive, inputs, attributes):
        trace = state.trace
        if trace is None:
            return super().emit(primitive, inputs, attributes)
        previous, trace.builder.location = trace.builder.location, self.location
        try:
            return super().emit(primitive, inputs, attributes)
        finally:
            trace.builder.location = previous


def _dims_tree(value, dims, what: str):
    """`dims` spread over the structure of `value` (a prefix of it, as torch.func reads in_dims and
    out_dims): one dimension or None per leaf, in tree_leaves order."""
    if dims is None or (isinstance(dims, int) and not isinstance(dims, bool)):
        return tree_map(lambda _: dims, value)
    if isinstance(dims, (list, tuple)) and isinstance(value, (list, tuple)) \
            and len(dims) == len(value):
        return [_dims_tree(v, d, what) for v, d in zip(value, dims)]
    if isinstance(dims, dict) and isinstance(value, dict) and dims.keys() == value.keys():
        return [_dims_tree(value[key], dims[key], what) for key in value]
    raise ArgumentError(f"vmap: {what} {dims!r} does not match the structure of a "
                        f"{type(value).__name__} (give one int or None, or a tuple, list or dict "
                        f"shaped like it)")


def _size(leaves: list, dims: list) -> int:
    sizes = set()
    for leaf, dim in zip(leaves, dims):
        if dim is None:
            continue
        if not isinstance(leaf, Tensor):
            raise ArgumentError(f"vmap: in_dims {dim} for a {type(leaf).__name__}; only "
                                f"tensors can be mapped over (use None)")
        if not -leaf.ndim <= dim < leaf.ndim:
            raise ArgumentError(f"vmap: in_dims {dim} is out of range for a tensor of shape "
                                f"{list(leaf.shape)}")
        sizes.add(leaf.shape[dim])
    if len(sizes) != 1:
        raise ArgumentError(f"vmap: the mapped dimensions have sizes {sorted(sizes)}; they must "
                            f"all have one size" if sizes else
                            "vmap: at least one argument must be mapped (in_dims not all None)")
    return sizes.pop()


def _output_dims(result, out_dims) -> list:
    return tree_leaves(_dims_tree(result, out_dims, "out_dims"))


def _looped(f: Callable, args: tuple, kwargs: dict, leaves: list, dims: list, size: int,
            out_dims) -> object:
    """`f` once per element, the results stacked: inside `@trace` the loop unrolls."""
    results = []
    for index in range(size):
        taken = iter([leaf if dim is None else leaf[(slice(None),) * (dim % leaf.ndim) + (index,)]
                      for leaf, dim in zip(leaves, dims)])
        results.append(f(*tree_map(lambda _, taken=taken: next(taken), args), **kwargs))
    per_element = [tree_leaves(result) for result in results]
    stacked = iter([per_element[0][k] if dim is None else
                    stack([outputs[k] for outputs in per_element], dim=dim)
                    for k, dim in enumerate(_output_dims(results[0], out_dims))])
    return tree_map(lambda _: next(stacked), results[0])


def _trace_element(f: Callable, args: tuple, kwargs: dict, leaves: list, dims: list):
    """`f` traced on one element: its Function (outputs set), its result, and what each of its
    parameters stands for in the caller's world, with the mapped dimension or None."""
    sub = _ElementTrace(getattr(f, "__name__", "vmapped"), state.trace)
    sources: dict[int, tuple[Tensor, int | None]] = {}
    proxies = []
    for index, (leaf, dim) in enumerate(zip(leaves, dims)):
        if not isinstance(leaf, Tensor):
            proxies.append(leaf)
            continue
        shape = list(leaf.shape)
        if dim is not None:
            dim %= leaf.ndim
            del shape[dim]
        value = sub.parameter(f"arg{index}", TensorType(tuple(shape), leaf.dtype))
        proxies.append(Tensor._make(value, sub, leaf.requires_grad, leaf=leaf.is_leaf))
        if leaf.requires_grad and not leaf.is_leaf:
            sub.computed_arguments.append(value)
        sources[id(value)] = (leaf, dim)
    taken = iter(proxies)
    try:
        with tracing(sub):
            result = f(*tree_map(lambda _: next(taken), args), **kwargs)
            outputs = tree_leaves(result)
            for output in outputs:
                if not isinstance(output, Tensor):
                    raise CannotBatch(f"it returns a {type(output).__name__}")
            sub.function.outputs = [sub.handle_of(output) for output in outputs]
            changed, cleared, _ = sub.writebacks([], 0)
    except TracingError as error:
        raise CannotBatch(f"tracing one element needs its values: {error}") from None
    finally:
        sub.release()
    if changed or cleared or any(isinstance(p, Tensor) and (p._handle.producer is not None or
                                                            p._grad is not None) for p in proxies):
        raise CannotBatch("it changes an argument, a tensor it reads or a .grad in place")
    if sub.gradient_hooks:
        raise CannotBatch("a gradient hook runs Python for each element")
    for captured in sub.captured:
        tensor = from_data(captured.tensor._handle) if captured.constant else captured.tensor
        sources[id(captured.value)] = (tensor, None)
        if captured.grad is not None:
            sources[id(captured.grad)] = (captured.tensor._grad, None)
    return sub.function, result, sources


def _batched(f: Callable, args: tuple, kwargs: dict, leaves: list, dims: list, size: int,
             out_dims) -> object:
    function, result, sources = _trace_element(f, args, kwargs, leaves, dims)
    parameters = [sources[id(p)] for p in function.parameters]
    differentiable = [p for p, (tensor, _) in zip(function.parameters, parameters)
                      if tensor.requires_grad and is_grad_enabled()]
    prepare(function, differentiable)
    arguments = [(tensor, False) if dim is None else (TENSORS.transpose(
        tensor, (dim, *(d for d in range(tensor.ndim) if d != dim))), True)
        for tensor, dim in parameters]
    outputs = batch_function(_LocatedTensors(), function, arguments, size)
    moved = []
    for (output, batched), dim in zip(outputs, _output_dims(result, out_dims)):
        if dim is None:
            if batched:
                raise ArgumentError("vmap: out_dims None for an output that differs between "
                                    "elements")
            moved.append(output)
            continue
        if not batched:
            output = TENSORS.op("broadcast", output, shape=(size, *output.shape))
        if not -output.ndim <= dim < output.ndim:
            raise ArgumentError(f"vmap: out_dims {dim} is out of range for a result of "
                                f"{output.ndim} dimensions")
        dim %= output.ndim
        output = TENSORS.transpose(output, (*range(1, dim + 1), 0, *range(dim + 1, output.ndim)))
        if any(output is tensor for tensor, _ in parameters):
            output = output.clone()  # (a new tensor, as the stacked result would be)
        moved.append(output)
    flowing = iter(moved)
    return tree_map(lambda _: next(flowing), result)


def vmap(f: Callable, in_dims: int | None | Sequence = 0, out_dims: int | Sequence = 0
         ) -> Callable:
    """`f` mapped over a dimension of its arguments (as torch.func.vmap): `in_dims` says which of
    each argument (None: the same for every element; an int for a list, tuple or dict applies to
    every tensor in it, or give a tuple, list or dict shaped like it), `out_dims` where the
    mapped dimension goes in each output. Keyword arguments are not mapped. `f` is traced once
    and batched by a rule per primitive, so it composes with every transform (per-sample
    gradients: `vmap(grad(loss), in_dims=(None, 0, 0))`), and inside `@trace` the graph does
    not grow with the batch."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        dims = (in_dims,) * len(args) if in_dims is None or isinstance(in_dims, int) \
            else tuple(in_dims)
        if len(dims) != len(args):
            raise ArgumentError(f"vmap: in_dims has {len(dims)} entries for {len(args)} arguments")
        leaves = tree_leaves(args)
        leaf_dims = tree_leaves(_dims_tree(list(args), list(dims), "in_dims"))
        size = _size(leaves, leaf_dims)
        try:
            return _batched(f, args, kwargs, leaves, leaf_dims, size, out_dims)
        except CannotBatch as reason:
            LOG.info("vmap of %s runs once per element: %s", getattr(f, "__name__", f), reason)
            return _looped(f, args, kwargs, leaves, leaf_dims, size, out_dims)
    return wrapper
