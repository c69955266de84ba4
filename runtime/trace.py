"""`@trace`: record a Python function once per signature, compile it, and run it.

A call flattens its arguments (Tensors, numpy arrays, Python numbers, and lists/tuples/dicts of
them), looks the signature up in the cache, and on a miss traces the function with proxy tensors,
expands its gradients, optimizes it and builds an executable. Running it returns the results and
writes in-place changes and `.grad` back into the caller's tensors, as eager mode would have.
"""
from __future__ import annotations

import functools
import inspect
import logging
import numbers
import os
import time
from collections import namedtuple
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tracer import ir
from tracer.ir.types import TensorType
from tracer.runtime.arguments import (check_targets, flatten, leaf_signature, owned,
                                     parameter_arrays, parameter_name, unflatten)
from tracer.runtime.check_grads import check_custom_backwards
from tracer.runtime.compiled import compile_function
from tracer.runtime.pipeline import STAGES
from tracer.runtime.differentiable import record_backward
from tracer.runtime.guards import captured_change, captured_types, scope_guards
from tracer.runtime.report import write_report, write_report_to
from tracer.runtime.signatures import SignatureCache
from tracer.context import is_grad_enabled, state
from tracer.errors import ArgumentError
from tracer.tensor import Tensor, check_current, from_numpy
from tracer.tracing import Trace, tracing

LOG = logging.getLogger("tracer.trace")
CacheInfo = namedtuple("CacheInfo", ["hits", "misses", "size"])




# What a compiled signature needs at call time -----------------------------------------------------
@dataclass
class Entry:
    structure: tuple                      # of the results
    executable: Any
    result_count: int
    # (argument leaf index, "data" | "grad", output index) for every value written back.
    writebacks: list[tuple[int, str, int]]
    cleared_grads: list[int]              # argument leaves whose .grad the function set to None
    # Where each parameter comes from: ("leaf" | "number" | "grad" | "captured", index).
    parameter_sources: list[tuple[str, int]]
    captured: list[Tensor]
    captured_types: list[tuple]
    stages: dict[str, str] = field(default_factory=dict)
    leaf_names: dict[int, str] = field(default_factory=dict)  # argument leaf index -> its path
    # (name, read the current value, the value when traced) of what the function reads from its
    # globals and closure: a tensor, array or number there that changes means tracing again.
    guards: list[tuple[str, Callable[[], Any], Any]] = field(default_factory=list)
    rules: list = field(default_factory=list)  # custom rules the stage texts name, kept alive
    # Results through which eager autograd can differentiate the call (a pure function of
    # arguments that require grad), and the traced forward+backward that does it, made on demand.
    differentiable: list[int] = field(default_factory=list)
    backward: "TracedFunction | None" = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per front-end stage
    reason: str = ""  # why this signature compiled (see runtime/signatures.py)


class TracedFunction:
    """The result of `@trace`: call it like the function; it compiles once per signature."""

    def __init__(self, function: Callable, static_argnums: Sequence[int] = (),
                 check_grads: bool = False):
        functools.update_wrapper(self, function)
        self.python_function = function
        self.static_argnums = tuple(static_argnums)
        self._signatures = SignatureCache(getattr(function, "__qualname__", "function"))
        self._name = getattr(function, "__name__", "function")
        self.check_grads = check_grads
        try:
            self._signature = inspect.signature(function)
        except (TypeError, ValueError):
            self._signature = None

    def cache_info(self) -> CacheInfo:
        signatures = self._signatures
        return CacheInfo(signatures.hits, signatures.misses, len(signatures.entries))

    def cache_clear(self) -> None:
        self._signatures.clear()

    # Signatures.
    def _split(self, args, kwargs):
        """(structure, runtime leaves with paths) of the call's arguments; the structure
        unflattens to (args, kwargs)."""
        names = [f"arg{i}" for i in range(len(args))]
        if self._signature is not None:
            parameters = [p for p in self._signature.parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            names[:len(parameters)] = [p.name for p in parameters][:len(args)]
        leaves: list = []
        positional = []
        static = {i + len(args) if i < 0 else i for i in self.static_argnums}
        for i, (name, value) in enumerate(zip(names, args)):
            if i in static:
                try:
                    hash(value)
                except TypeError:
                    raise ArgumentError(f"static argument {name} must be hashable") from None
                positional.append(("static", value, type(value)))
            else:
                positional.append(flatten(value, leaves, name))
        keywords = dict(sorted(kwargs.items()))
        keyword_structure = ("dict", tuple(keywords),
                             tuple(flatten(v, leaves, k) for k, v in keywords.items()))
        return ("tuple", (("tuple", tuple(positional)), keyword_structure)), leaves

    def _key(self, args, kwargs):
        structure, leaves = self._split(args, kwargs)
        position: dict[int, int] = {}
        signature = tuple(leaf_signature(value, position) for value, _ in leaves)
        return (structure, signature, is_grad_enabled()), leaves

    def _quick_key(self, args, kwargs) -> tuple | None:
        """The common call -- positional tensors and numbers, none repeated -- keyed without
        flattening; None sends the call down the general path."""
        if kwargs or self.static_argnums:
            return None
        parts: list = [is_grad_enabled()]
        tensors = 0
        for value in args:
            kind = type(value)
            if kind is Tensor:
                grad = value.grad
                parts.append((value._handle.shape, value._handle.dtype, value._requires_grad,
                              None if grad is None else (grad._handle.shape, grad._handle.dtype),
                              value._trace is None))
                tensors += 1
            elif kind is float or kind is int:
                parts.append(kind)
            else:
                return None
        if tensors > 1 and len({id(v) for v in args if type(v) is Tensor}) < tensors:
            return None
        return tuple(parts)

    def _lookup(self, args, kwargs, count: bool) -> tuple[Entry, Sequence, list | None]:
        """The entry for this call, the values of its argument leaves, and the leaves with their
        paths (None for the common call, whose leaves are the positional arguments themselves)."""
        quick = self._quick_key(args, kwargs)
        if quick is not None:
            entry = self._signatures.quick(quick, captured_change, count)
            if entry is not None:
                return entry, args, None
        key, leaves = self._key(args, kwargs)
        entry = self._signatures.lookup(key, [path for _, path in leaves],
                                        lambda reason: self._build(args, kwargs, leaves, reason),
                                        captured_change, count, quick)
        return entry, [value for value, _ in leaves], leaves

    # Tracing and compiling.
    def _build(self, args, kwargs, leaves, reason: str) -> Entry:
        LOG.info("%s: compiling (%s)", self._name, reason)
        entry = self._compile(args, kwargs, leaves)
        entry.reason = reason
        self._log_compiled(entry)
        return entry

    def _compile(self, args, kwargs, leaves) -> Entry:
        started = time.perf_counter()
        timings = {}
        name = self._name
        trace = Trace(name if name.isidentifier() else "function")
        proxies: list = []
        sources: list[tuple[str, int]] = []
        seen: dict[int, Any] = {}
        originals: dict[int, tuple] = {}  # leaf index -> (data handle, grad handle) on entry
        guards = scope_guards(self.python_function)
        with tracing(trace):
            for index, (value, path) in enumerate(leaves):
                if id(value) in seen and not isinstance(value, numbers.Number):
                    proxies.append(seen[id(value)])
                    continue
                proxy = self._proxy(trace, value, parameter_name(path), index, sources)
                seen[id(value)] = proxy
                proxies.append(proxy)
                if isinstance(value, Tensor):
                    trace.arguments[id(value)] = proxy  # also read through a global name
                originals[index] = (proxy._handle, proxy.grad._handle if proxy.grad is not None
                                    else None)
            structure, _ = self._split(args, kwargs)
            rebuilt, rebuilt_kwargs = unflatten(structure, proxies)
            result = self.python_function(*rebuilt, **rebuilt_kwargs)
            result_leaves: list = []
            result_structure = flatten(result, result_leaves, "result")
            function = trace.function
            outputs = [self._result_value(trace, value) for value, _ in result_leaves]
            writebacks, cleared = [], []
            for index, (original_data, original_grad) in originals.items():
                proxy = proxies[index]
                if not isinstance(proxy, Tensor) or proxy._weak:
                    continue
                if proxy._handle is not original_data:
                    writebacks.append((index, "data", len(outputs)))
                    outputs.append(proxy._handle)
                if proxy.grad is None:
                    if original_grad is not None:
                        cleared.append(index)
                elif proxy.grad._handle is not original_grad:
                    writebacks.append((index, "grad", len(outputs)))
                    outputs.append(trace.handle_of(proxy.grad))
            function.outputs = outputs
            stages = {"traced": ir.format_function(function)}
            timings["trace"] = time.perf_counter() - started
            # the autodiff pass rewrites the graph: the check evaluates the traced one
            unexpanded = function.copy() if self.check_grads else None
            # The traced text names custom rules (@MyReLU.0) that parse back only while they are
            # alive; the autodiff pass drops them from the graph, so the entry keeps them.
            rules = [i.attributes["rule"] for i in function.instructions
                     if isinstance(i.attributes.get("rule"), ir.CustomRule)]
            ir.verify(function)
            ir.expand_gradients(function)
        ir.verify(function)
        stages["grad"] = ir.format_function(function)
        timings["grad"] = time.perf_counter() - started - sum(timings.values())
        optimized = ir.optimize(function)
        ir.verify(optimized)
        stages["optimized"] = ir.format_function(optimized)
        timings["optimize"] = time.perf_counter() - started - sum(timings.values())
        sources += [("captured", index) for index in range(len(trace.captured))]
        if unexpanded is not None:
            check_custom_backwards(unexpanded, parameter_arrays(
                sources, [value for value, _ in leaves], [t for t, _ in trace.captured]))
            timings["check_grads"] = time.perf_counter() - started - sum(timings.values())
        # Updated data and .grad are written straight into the argument's buffer where that is safe.
        parameter_of = {(kind, index): position for position, (kind, index) in enumerate(sources)}
        write_into = {output: parameter_of[("leaf" if kind == "data" else "grad", index)]
                      for index, kind, output in writebacks
                      if ("leaf" if kind == "data" else "grad", index) in parameter_of}
        executable = compile_function(optimized, write_into=write_into)
        timings["backend"] = time.perf_counter() - started - sum(timings.values())
        entry = Entry(result_structure, executable,
                      len(result_leaves), writebacks,
                      cleared, sources, [t for t, _ in trace.captured],
                      captured_types([t for t, _ in trace.captured]), stages=stages, rules=rules)
        if not writebacks and not cleared:
            entry.differentiable = [i for i, (value, _) in enumerate(result_leaves)
                                    if isinstance(value, Tensor) and value.requires_grad]
        entry.guards = guards
        entry.leaf_names = {index: path for index, (_, path) in enumerate(leaves)}
        entry.timings = timings
        self._dump(entry)
        return entry

    def _log_compiled(self, entry: Entry) -> None:
        def times(timings: dict[str, float]) -> str:
            return ", ".join(f"{stage} {1e3 * seconds:.1f} ms" for stage, seconds in timings.items())
        LOG.info("%s: compiled in %.1f ms (%s; backend: %s)", self._name,
                 1e3 * sum(entry.timings.values()), times(entry.timings),
                 times(entry.executable.timings))
        folder = os.environ.get("TRACER_REPORT")
        if folder:
            write_report_to(self, folder)

    def report(self, path: str) -> str:
        """Write the HTML compile report of every signature compiled so far to `path`; returns
        the path (see runtime/report.py)."""
        return write_report(self, path)

    @staticmethod
    def _proxy(trace: Trace, value, name: str, index: int, sources: list):
        if isinstance(value, numbers.Number):
            dtype = ir.types.int64 if isinstance(value, numbers.Integral) else ir.types.float64
            handle = trace.parameter(name, TensorType((), dtype))
            sources.append(("number", index))
            proxy = Tensor._make(handle, trace, False)
            proxy._weak = True  # a Python number: it does not widen float32 tensors
            return proxy
        array_type = TensorType(value.shape, value.dtype)
        handle = trace.parameter(name, array_type)
        sources.append(("leaf", index))
        requires_grad = isinstance(value, Tensor) and value.requires_grad
        proxy = Tensor._make(handle, trace, requires_grad, leaf=True)
        if isinstance(value, Tensor) and value.grad is not None:
            grad_handle = trace.parameter(f"{name}_grad", TensorType(value.grad.shape, value.grad.dtype))
            sources.append(("grad", index))
            proxy.grad = Tensor._make(grad_handle, trace, False)
        return proxy

    @staticmethod
    def _result_value(trace: Trace, value):
        if isinstance(value, Tensor):
            check_current(value)
            return trace.handle_of(value)
        if isinstance(value, np.ndarray):
            return trace.handle_of(from_numpy(value))
        raise ArgumentError(f"a traced function returns tensors (or static values), "
                            f"got a {type(value).__name__}; return it as a tensor")

    def _dump(self, entry: Entry) -> None:
        folder = os.environ.get("TRACER_DUMP")
        if not folder:
            return
        os.makedirs(folder, exist_ok=True)
        number = len(self._signatures.entries)
        for stage in (*entry.stages, *entry.executable.stages):
            text = self._stage_text(entry, stage)
            path = os.path.join(folder, f"{self.python_function.__name__}.{number}.{stage}.txt")
            with open(path, "w") as file:
                file.write(text)

    @staticmethod
    def _stage_text(entry: Entry, stage: str) -> str:
        if stage in entry.stages:
            return entry.stages[stage]
        if stage not in STAGES:
            raise ArgumentError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
        return entry.executable.stage_text(stage)

    # Calling.
    def ir(self, *args, stage: str = "traced", **kwargs) -> str:
        """The text of one pipeline stage for the signature of these arguments."""
        entry, _, _ = self._lookup(args, kwargs, count=False)
        return self._stage_text(entry, stage)

    def __call__(self, *args, **kwargs):
        if state.trace is not None:
            return self.python_function(*args, **kwargs)  # inside another trace: inline it
        entry, values, leaves = self._lookup(args, kwargs, count=True)
        arrays = parameter_arrays(entry.parameter_sources, values, entry.captured)
        check_targets(entry, values, arrays)
        outputs = entry.executable(arrays)
        inputs = {id(a) for a in arrays}
        for index, kind, output in entry.writebacks:
            target = values[index]
            # an output written in place is the argument array itself: nothing to copy
            if kind == "data":
                array = target._handle if isinstance(target, Tensor) else target
                if outputs[output] is not array:
                    np.copyto(array, outputs[output])
                if isinstance(target, Tensor):
                    target._mark_changed()
            elif target.grad is None:
                target.grad = Tensor._make(owned(outputs[output], inputs), None, False)
            else:
                if outputs[output] is not target.grad._handle:
                    np.copyto(target.grad._handle, outputs[output])
                target.grad._mark_changed()
        for index in entry.cleared_grads:
            values[index].grad = None
        results = [Tensor._make(owned(a, inputs), None, False)
                   for a in outputs[:entry.result_count]]
        if entry.differentiable and is_grad_enabled():
            if leaves is None:
                leaves = [(value, None) for value in values]
            record_backward(self, entry, args, kwargs, leaves, results)
        if entry.structure == ("leaf",):
            return results[0]
        return unflatten(entry.structure, results)


def trace(function: Callable | None = None, *, static_argnums: Sequence[int] | int = (),
          check_grads: bool = False):
    """Compile `function` per signature: `@tr.trace` or `tr.trace(f, static_argnums=(1,))`.
    `check_grads=True` checks every custom Function's backward against finite differences of
    its forward when a signature compiles (see runtime/check_grads.py)."""
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if function is None:
        return lambda f: TracedFunction(f, static_argnums, check_grads)
    if isinstance(function, TracedFunction) and not check_grads:
        return function
    if isinstance(function, TracedFunction):
        function = function.python_function
    return TracedFunction(function, static_argnums, check_grads)


