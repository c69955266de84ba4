"""The results of a traced function are differentiable by eager autograd, as with
torch.compile: each call gives its results one node on the eager tape whose backward computes
their gradients: from what the call's forward saved (runtime/split_code.py), or, for a function
that cannot be split so, by running the function again through a traced, compiled
vector-Jacobian product."""
from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from tracer.autograd import record_call
from tracer.context import enable_grad
from tracer.errors import FunctionBackwardError
from tracer.runtime.arguments import copy_arrays, flatten
from tracer.runtime.guards import captured_change
from tracer.runtime.split_code import gradient_inputs
from tracer.backward import traced_gradients
from tracer.buffers import buffer_of
from tracer.creation import ones_like
from tracer.tensor import Tensor

if TYPE_CHECKING:
    from tracer.runtime.entry import Entry
    from tracer.runtime.traced_function import TracedFunction


def record_backward(traced: "TracedFunction", entry: "Entry", args, kwargs, leaves,
                    results: list[Tensor], values: list, arrays: list[np.ndarray],
                    outputs: list[np.ndarray], entered: list[np.ndarray] | None) -> None:
    """Give the results a node on the eager tape whose backward computes the gradients, so
    `traced(x).sum().backward()` works as with torch.compile. `values` are the call's argument
    leaves and captured tensors, which the function's writebacks index, `arrays` what the
    compiled code was given and `outputs` what it returned.

    Where the signature is split (`entry.split`), `outputs` hold what the backward reads, and it
    runs on them. Otherwise the backward runs the function again: where it changes state, that
    run reads the data of `entry.replayed` as it was on entry (`entered`, copied before the
    call) and what it changes is put back after (Recording.stale says which results are not
    differentiated)."""
    inputs = gradient_inputs([v for v, _ in leaves], entry.captured)
    differentiated = [results[i] for i in entry.differentiable]
    name = traced._name
    split = entry.split
    if split is not None:
        # The backward reads these tensors' data as the call left it: changing one in place
        # first is an error, as PyTorch's for a saved tensor (a captured tensor that does not
        # require grad too: a buffer, a frozen weight).
        saved = [values[leaf] for leaf in split.leaves if isinstance(values[leaf], Tensor)]
        saved += [results[i] for i in split.saved_results]
        record_call(name, functools.partial(split.gradients_of, split.read(arrays, values),
                                            split.residuals(outputs)),
                    differentiated, inputs, saved, entry.reached)
        return
    written = {index for index, _, _ in entry.writebacks}
    # The backward reads the arguments and captured tensors again: changing one in place first
    # is an error (also a captured one that requires no grad: its change would silently change
    # the gradient). (not the tensors the call writes: the backward reads those as they were on
    # entry, or not at all, so a second call or the user changing them before the backward is
    # no error)
    saved = [v for index, v in enumerate([*(v for v, _ in leaves), *entry.captured])
             if isinstance(v, Tensor) and index not in written]
    captured = [t for t in entry.captured if t.requires_grad]
    # (numpy arrays the call overwrote, as the call found them)
    as_entered = None
    if entry.writebacks:
        as_entered = {id(values[index]): array for index, array in zip(entry.replayed, entered or ())
                      if not isinstance(values[index], Tensor)}
    args, kwargs = copy_arrays((args, kwargs), as_entered)

    def backward(cotangents: list[Tensor]) -> list[Tensor | None]:
        changed = captured_change(entry)
        if changed:  # (the run below would trace the changed code: another function's gradient)
            raise FunctionBackwardError(
                f"the backward of the traced function {name} runs it again, and what it reads "
                f"changed since the call: {changed}; call backward() before changing it "
                f"(model.train() or model.eval(), an attribute the function reads), or call the "
                f"function again after the change")
        if entry.backward is None:
            entry.backward = type(traced)(_vector_jacobian_product(
                traced.python_function, entry.differentiable, captured))
        with enable_grad(), _restoring(entry, values, entered):  # (no_grad in the engine)
            return entry.backward(cotangents, *args, **kwargs)

    record_call(name, backward, differentiated, inputs, saved, entry.reached)


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
