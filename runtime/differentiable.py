"""The results of a traced function are differentiable by eager autograd, as with
torch.compile: each call gives its results one node on the eager tape whose backward computes
their gradients. From the first backward on, the calls run a forward that also returns what the
backward reads (AOTAutograd's scheme: ir/partition.py) and the backward runs on that alone; the
first backward, and every backward of a function that cannot be split so, runs the function again
through a traced, compiled vector-Jacobian product."""
from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from tracer.autograd import record_call
from tracer.context import enable_grad
from tracer.errors import FunctionBackwardError, TracerError
from tracer.ir.partition import Unsplittable
from tracer.runtime import native
from tracer.runtime.arguments import call_arrays, copy_arrays, flatten
from tracer.runtime.guards import captured_change
from tracer.runtime.pipeline import compile_split
from tracer.backward import traced_gradients
from tracer.buffers import buffer_of, results
from tracer.creation import ones_like
from tracer.tensor import Tensor

if TYPE_CHECKING:
    from tracer.ir.partition import Split
    from tracer.runtime.entry import Entry
    from tracer.runtime.traced_function import TracedFunction


def record_backward(traced: "TracedFunction", entry: "Entry", args, kwargs, leaves,
                    results: list[Tensor], values: list, arrays: list[np.ndarray],
                    entered: list[np.ndarray] | None, outputs: list[np.ndarray] | None) -> None:
    """Give the results a node on the eager tape whose backward computes the gradients, so
    `traced(x).sum().backward()` works as with torch.compile. `values` are the call's argument
    leaves and captured tensors, which the function's writebacks index, and `arrays` what the
    compiled code was given.

    `outputs` are those of the split forward (`entry.split`, made at the first backward), which
    returns what the backward reads: the backward then runs on them. Before the split is made, or
    where it cannot be, the backward runs the function again: where it changes state (BatchNorm's
    running statistics, the counter of the random generator a dropout draws from), that run reads
    the data of `entry.replayed` as it was on entry (`entered`, copied before the call) and what
    it changes is put back after (Recording.stale says which results are not differentiated)."""
    captured = [t for t in entry.captured if t.requires_grad]
    inputs = list({id(v): v for v, _ in leaves
                   if isinstance(v, Tensor) and v.requires_grad}.values()) + captured
    differentiated = [results[i] for i in entry.differentiable]
    name = traced._name
    written = {index for index, _, _ in entry.writebacks}
    # The backward reads the arguments again: changing one in place first is an error.
    # (not the tensors the call writes: the backward reads those as they were on entry, or not
    # at all, so a second call or the user changing them before the backward is no error)
    saved = [v for index, (v, _) in enumerate(leaves)
             if isinstance(v, Tensor) and index not in written] + captured
    if outputs is not None:
        split = entry.split
        saved += [results[i] for i in split.saved_results]
        record_call(name, functools.partial(_split_backward, split, split.read(arrays, values),
                                            outputs), differentiated, inputs, saved)
        return
    # The numpy arrays among the arguments, copied (as the call found them, where it overwrote
    # them): they have no version counter to say they changed before the backward.
    entered_arrays = {}
    if entry.writebacks:
        entered_arrays = {id(values[index]): array for index, array
                          in zip(entry.replayed, entered or ()) if not isinstance(values[index], Tensor)}
    copies = {id(v): entered_arrays[id(v)] if id(v) in entered_arrays else v.copy()
              for v in values if isinstance(v, np.ndarray)}
    values_then = [copies.get(id(v), v) for v in values]
    args, kwargs = copy_arrays((args, kwargs), copies)

    def backward(cotangents: list[Tensor]) -> list[Tensor | None]:
        changed = captured_change(entry)
        if changed:  # (the run below would trace the changed code: another function's gradient)
            raise FunctionBackwardError(
                f"the backward of the traced function {name} runs it again, and what it reads "
                f"changed since the call: {changed}; call backward() before changing it "
                f"(model.train() or model.eval(), an attribute the function reads), or call the "
                f"function again after the change")
        split = _split_of(entry, values, inputs)
        if split is not None:  # the split forward run again, for this call's residuals
            with _restoring(entry, values, entered):
                arrays_then = call_arrays(entry, values_then)
                replayed = split.forward.run(arrays_then, split.shares_outputs)
            return _split_backward(split, split.read(arrays_then, values), replayed, cotangents)
        if entry.backward is None:
            entry.backward = type(traced)(_vector_jacobian_product(
                traced.python_function, entry.differentiable, captured))
        with enable_grad(), _restoring(entry, values, entered):  # (no_grad in the engine)
            return entry.backward(cotangents, *args, **kwargs)

    record_call(name, backward, differentiated, inputs, saved)


class SplitCode:
    """A signature's forward that also returns its residuals and the backward that reads them
    (ir/partition.py), compiled."""

    def __init__(self, entry: "Entry", parts: "Split", forward, backward,
                 wrt: list[tuple[str, int] | None]):
        self.forward, self.backward = forward, backward
        self.sources = parts.sources
        # one per input of the call's tape node: the backward's output that is its gradient
        gradient_of = iter(parts.gradients)
        self.gradients = [None if position is None else next(gradient_of) for position in wrt]
        self.shapes = [p.shape for p in parts.backward.parameters]
        # results the backward reads: changing one in place before it is an error (as PyTorch's
        # tanh's output)
        self.saved_results = sorted({index for kind, index in self.sources
                                     if kind == "output" and index < entry.result_count})
        # outputs returned twice are copies, but for those the plain forward shares (an
        # argument's own tensor returned and written back); never a residual
        forward_count = len(entry.executable.function.outputs)
        self.shares_outputs = entry.shares_outputs and all(
            position < forward_count for position, _ in forward.duplicates)
        # the parameters the backward reads that are numpy arrays: copied at the call (the
        # user may change them before the backward, and they have no version counter)
        self._parameters = [index for kind, index in self.sources if kind == "parameter"]
        self._leaves = [entry.parameter_sources[p][1] for p in self._parameters]

    def read(self, arrays: list[np.ndarray], values: list) -> list[np.ndarray]:
        """Of the call's `arrays`, those the backward reads (numpy arrays copied)."""
        return [arrays[p] if isinstance(values[leaf], Tensor) else arrays[p].copy()
                for p, leaf in zip(self._parameters, self._leaves)]


def _split_of(entry: "Entry", values: list, inputs: list[Tensor]) -> SplitCode | None:
    """`entry.split`, made on the first backward; None where the backward cannot run on its own
    (it then runs the function again)."""
    if entry.split is None:
        entry.split = False
        wrt = _positions(entry, values, inputs)
        # A parameter the function also writes (weights clipped in place, then used) or a
        # .grad: the backward would read it as the call left it.
        written = {index for index, _, _ in entry.writebacks}
        try:
            parts, forward, backward = compile_split(entry, [p for p in wrt if p is not None])
        except (Unsplittable, TracerError) as reason:  # (a custom backward the trace refuses)
            native.LOG.debug("%s: the backward runs the function again: %s", entry.grad_graph.name, reason)
        else:
            reads = [entry.parameter_sources[index] for kind, index in parts.sources
                     if kind == "parameter"]
            if all(kind != "grad" and leaf not in written for kind, leaf in reads):
                entry.split = SplitCode(entry, parts, forward, backward, wrt)
        entry.grad_graph = None
    return entry.split or None


def _positions(entry: "Entry", values: list, inputs: list[Tensor]
               ) -> list[tuple[str, int] | None]:
    """What the gradient of each of `inputs` is taken with respect to: ("parameter", p) its data
    as the function reads it; ("output", i) as the function leaves it, where it changes it (a
    tensor that requires grad changed under no_grad: PyTorch differentiates its new data); None
    for one the function does not read."""
    first: dict[int, int] = {}
    for index, value in enumerate(values):
        first.setdefault(id(value), index)
    position = {source: p for p, source in enumerate(entry.parameter_sources)}
    rewritten = {index: output for index, kind, output in entry.writebacks if kind == "data"}
    result: list[tuple[str, int] | None] = []
    for tensor in inputs:
        leaf = first[id(tensor)]
        if leaf in rewritten:
            result.append(("output", rewritten[leaf]))
        elif ("leaf", leaf) in position:
            result.append(("parameter", position[("leaf", leaf)]))
        else:
            result.append(None)
    return result


def _split_backward(split: SplitCode, parameters: list[np.ndarray], outputs: list[np.ndarray],
                    cotangents: list[Tensor]) -> list[Tensor | None]:
    """The gradients of one call from its cotangents, the forward's `outputs` (its residuals)
    and the `parameters` the backward reads."""
    read = iter(parameters)
    arrays = []
    for (kind, index), shape in zip(split.sources, split.shapes):
        if kind == "cotangent":
            cotangent = buffer_of(cotangents[index])  # (the compiled code converts its type)
            arrays.append(cotangent if cotangent.shape == shape
                          else np.broadcast_to(cotangent, shape))
        elif kind == "output":
            arrays.append(outputs[index])
        else:
            arrays.append(next(read))
    gradients = split.backward.run(arrays)
    # (a gradient that is a cotangent as it came is copied)
    tensors = results(gradients, None if split.backward.fresh_results else set(map(id, arrays)))
    return [None if g is None else tensors[g] for g in split.gradients]


def _vector_jacobian_product(function: Callable, differentiable: list[int],
                             captured: list[Tensor]) -> Callable:
    """`vjp(cotangents, *args, **kwargs)`: the gradient of sum(result_i * cotangent_i) with respect
    to every argument tensor that requires grad, in the order they are flattened, then to the
    `captured` tensors (read by the function from outside, requiring grad)."""
    def vjp(cotangents, *args, **kwargs):
        result_leaves: list = []
        flatten(function(*args, **kwargs), result_leaves, "result")
        total = None
        for index, cotangent in zip(differentiable, cotangents):
            term = (result_leaves[index][0] * cotangent).sum()
            total = term if total is None else total + term
        argument_leaves: list = []
        flatten((args, dict(sorted(kwargs.items()))), argument_leaves, "argument")
        inputs = list({id(v): v for v, _ in argument_leaves
                       if isinstance(v, Tensor) and v.requires_grad}.values()) + captured
        # None (a static result) where no gradient flows: eager autograd leaves that .grad None.
        return traced_gradients(total, ones_like(total), inputs)
    vjp.__name__ = f"{getattr(function, '__name__', 'function')}_vjp"
    return vjp


@contextlib.contextmanager
def _restoring(entry: "Entry", values: list, entered: list[np.ndarray] | None) -> Iterator[None]:
    """In the block, the data of `entry.replayed` is `entered` (as the call found it); after it,
    the data of every tensor or array the function writes is put back as it was before the
    block (the backward's run of the function changes them again). (A function that changes a
    .grad has no differentiable result: Recording.stale.)"""
    saved = [(buffer_of(values[index]), buffer_of(values[index]).copy())
             for index, _, _ in entry.writebacks]
    for index, array in zip(entry.replayed, entered or ()):
        np.copyto(buffer_of(values[index]), array)
    try:
        yield
    finally:
        for buffer, copy in saved:
            np.copyto(buffer, copy)
