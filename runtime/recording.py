"""Tracing one call of a function: a proxy tensor for every argument leaf, the function run on them
(with the tensors it reads from outside captured, see Trace.capture), its gradients expanded, and
what it changed of its arguments and captured tensors, to be written back after each call."""
from __future__ import annotations

import numbers
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tracer import ir
from tracer.ir.types import TensorType
from tracer.runtime.arguments import flatten, parameter_name
from tracer.runtime.guards import (Reached, captured_names, reachable, recording_names,
                                   stored_tensors)
from tracer.errors import ArgumentError, SpecializationNeeded, TracingError
from tracer.creation import from_numpy
from tracer.tensor import Tensor, check_current
from tracer.tracing import Trace, tracing


@dataclass
class Recording:
    """A traced call, its gradients expanded."""
    function: ir.Function
    result_structure: tuple
    result_leaves: list           # the result's leaves, traced
    # (leaf index, "data" | "grad", output index) for every value written back; leaf indices
    # past the arguments' leaves are the captured tensors'
    writebacks: list[tuple[int, str, int]]
    cleared: list[int]            # leaves whose .grad the function set to None
    sources: list[tuple[str, int]]  # where each parameter comes from (see Entry)
    captured: list[Tensor]
    reached: Reached              # what the function could reach before tracing
    used: set[str] | None         # the names of the code run while tracing (see guards_for)
    stages: dict[str, str]        # "traced"
    unexpanded: ir.Function | None  # before the autodiff pass, kept for check_grads
    rules: list = field(default_factory=list)
    seconds: float = 0.0          # tracing time, without the autodiff pass


class Specialize(Exception):
    """Trace again with the int arguments at these paths static."""

    def __init__(self, paths: frozenset[str]):
        super().__init__(", ".join(sorted(paths)))
        self.paths = paths


def record(function: Callable, name: str, leaves: Sequence, rebuild: Callable,
           static_objects: Sequence[tuple[str, Any]], keep_unexpanded: bool) -> Recording:
    """Trace `function` on proxies of the argument `leaves` ((value, path) pairs), which
    `rebuild(proxies)` turns into its (args, kwargs); `static_objects` are the named arguments
    that are objects. Raises Specialize when an int argument must be static."""
    started = time.perf_counter()
    trace = Trace(name if name.isidentifier() else "function")
    proxies: list = []
    sources: list[tuple[str, int]] = []
    seen: dict[int, Any] = {}
    # (leaf index, what stands for it in the trace, its data and .grad handles on entry)
    stand_ins: list[tuple[int, Tensor, Any, Any]] = []
    reached = reachable(function, static_objects)
    with tracing(trace), recording_names() as used:
        try:
            for index, (value, path) in enumerate(leaves):
                if id(value) in seen and not isinstance(value, numbers.Number):
                    proxies.append(seen[id(value)])
                    continue
                proxy = _proxy(trace, value, parameter_name(path), index, sources)
                seen[id(value)] = proxy
                proxies.append(proxy)
                if isinstance(value, Tensor):
                    trace.arguments[id(value)] = proxy  # also read through a global name
                if not proxy._weak:  # a tensor or array (not a number)
                    grad = proxy._grad
                    stand_ins.append((index, proxy, proxy._handle,
                                      None if grad is None else grad._handle))
            args, kwargs = rebuild(proxies)
            try:
                result = function(*args, **kwargs)
            except SpecializationNeeded as error:
                raise _specialization(error, leaves, proxies) from None
            result_leaves: list = []
            result_structure = flatten(result, result_leaves, "result")
            outputs = [_result_value(trace, value) for value, _ in result_leaves]
            _check_nothing_stored(trace, reachable(function, static_objects))
            stand_ins += [(len(leaves) + k, c.tensor, c.value, c.grad)
                          for k, c in enumerate(trace.captured) if not c.constant]
            writebacks, cleared = _writebacks(trace, stand_ins, outputs)
            traced = trace.function
            _name_captured(traced, trace.captured, reached)
            traced.outputs = outputs
            stages = {"traced": ir.format_function(traced)}
            seconds = time.perf_counter() - started
            # the autodiff pass rewrites the graph: the check evaluates the traced one
            unexpanded = traced.copy() if keep_unexpanded else None
            # The traced text names custom rules (@MyReLU.0) that parse back only while they are
            # alive; the autodiff pass drops them from the graph, so the entry keeps them.
            rules = [i.attributes["rule"] for i in traced.instructions
                     if isinstance(i.attributes.get("rule"), ir.CustomRule)]
            ir.verify(traced)
            ir.expand_gradients(traced)  # (a custom backward may capture tensors too)
        finally:
            trace.release()
    for k, captured in enumerate(trace.captured):
        sources += [("leaf", len(leaves) + k)] + [("grad", len(leaves) + k)] * (
            captured.grad is not None)
    return Recording(traced, result_structure, [v for v, _ in result_leaves], writebacks, cleared,
                     sources, [c.tensor for c in trace.captured], reached, used, stages,
                     unexpanded, rules, seconds)


def _name_captured(function: ir.Function, captured: list, reached: Reached) -> None:
    """Name the parameters of captured tensors after the first path to them (%self_layer_w)."""
    taken = {value.name for value in function.parameters}
    for entry, name in zip(captured, captured_names(reached, [c.tensor for c in captured])):
        name = re.sub(r"\W+", "_", name.removeprefix("global ").removeprefix(
            "closure variable ")).strip("_")
        grad_name = f"{name}_grad"
        if entry.constant or name in taken or grad_name in taken or not name.isidentifier():
            continue
        taken.update((name, grad_name))
        entry.value.name = name
        if entry.grad is not None:
            entry.grad.name = grad_name


def _proxy(trace: Trace, value, name: str, index: int, sources: list) -> Tensor:
    if isinstance(value, numbers.Number):
        dtype = ir.types.int64 if isinstance(value, numbers.Integral) else ir.types.float64
        handle = trace.parameter(name, TensorType((), dtype))
        sources.append(("number", index))
        proxy = Tensor._make(handle, trace, False)
        proxy._weak = True  # a Python number: it does not widen float32 tensors
        return proxy
    handle = trace.parameter(name, TensorType(value.shape, value.dtype))
    sources.append(("leaf", index))
    requires_grad = isinstance(value, Tensor) and value.requires_grad
    proxy = Tensor._make(handle, trace, requires_grad, leaf=True)
    grad = value._grad if isinstance(value, Tensor) else None
    if grad is not None:
        grad_handle = trace.parameter(f"{name}_grad", TensorType(grad.shape, grad.dtype))
        sources.append(("grad", index))
        proxy._grad = Tensor._make(grad_handle, trace, False)
    return proxy


def _result_value(trace: Trace, value):
    if isinstance(value, Tensor):
        check_current(value)
        return trace.handle_of(value)
    if isinstance(value, np.ndarray):
        return trace.handle_of(from_numpy(value))
    raise ArgumentError(f"a traced function returns tensors (or static values), "
                        f"got a {type(value).__name__}; return it as a tensor")


def _check_nothing_stored(trace: Trace, reached: Reached) -> None:
    stored = stored_tensors(reached, trace, [c.tensor for c in trace.captured if not c.constant])
    if stored:
        producer = stored[0][1]._handle.producer  # the line that made the first one
        raise TracingError(
            f"the traced function stored tensors it computed in "
            f"{', '.join(path for path, _ in stored)}; the compiled code cannot store them there "
            f"on later calls. Create such state before the call (in __init__, or by one eager "
            f"call) and update it in place (.copy_(), .mul_(), ...), or return the tensors. "
            f"(This trace left them there: take them out.)",
            line=producer.location if producer is not None else None)


def _writebacks(trace: Trace, stand_ins: list, outputs: list) -> tuple[list, list]:
    """What the traced function changed of the tensors standing for its arguments and captured
    tensors: (leaf index, "data" | "grad", output index) of every value to write back, each
    appended to `outputs`, and the leaves whose .grad it set to None."""
    writebacks, cleared = [], []
    for index, tensor, original_data, original_grad in stand_ins:
        if tensor._handle is not original_data:
            writebacks.append((index, "data", len(outputs)))
            outputs.append(tensor._handle)
        if tensor._grad is None:
            if original_grad is not None:
                cleared.append(index)
        elif tensor._grad._handle is not original_grad:
            writebacks.append((index, "grad", len(outputs)))
            outputs.append(trace.handle_of(tensor._grad))
    return writebacks, cleared


def _specialization(error: SpecializationNeeded, leaves: Sequence, proxies: Sequence) -> Exception:
    """What to do when the trace needed the Python value of a traced tensor: if it is computed
    from number arguments alone, trace again with the int ones static, or, if floats are among
    them, an error that names them; else (it depends on tensors) the error itself."""
    sources, stack, seen = set(), [error.value], set()
    while stack:  # the parameters the value was computed from
        value = stack.pop()
        if id(value) not in seen:
            seen.add(id(value))
            if value.producer is None:
                sources.add(id(value))
            else:
                stack += value.producer.inputs
    used = [(value, path) for (value, path), proxy in zip(leaves, proxies)
            if isinstance(value, numbers.Number) and id(proxy._handle) in sources]
    if not used or len(used) < len(sources):
        return error
    floats = [path for value, path in used if not isinstance(value, numbers.Integral)]
    if not floats:
        return Specialize(frozenset(path for _, path in used))
    return TracingError(
        f"{error.what} needs the value of the float argument {', '.join(floats)}, a Python "
        f"number passed to the traced function, which is a runtime input; name its position in "
        f"tr.trace(f, static_argnums=...) to bake it in (one compilation per value)",
        line=error.line)
