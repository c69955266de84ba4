"""`@trace`: record a Python function once per signature, compile it, and run it.

A call flattens its arguments (Tensors, numpy arrays, Python numbers, and lists/tuples/dicts of
them), looks the signature up in the cache, and on a miss traces the function with proxy tensors,
expands its gradients, optimizes it and compiles it (runtime/pipeline.py). Running it
returns the results and writes in-place changes and `.grad` back into the caller's tensors, as
eager mode would have; with results that require grad, it records them on the eager tape
(runtime/differentiable.py).
"""
from __future__ import annotations

import functools
import inspect
import logging
import os
import types
from collections import namedtuple
from typing import Any, Callable, Sequence

from tracer.runtime.arguments import (call_arrays, check_targets, flatten, leaf_signature,
                                     unflatten)
from tracer.runtime.entry import Entry, relate_results
from tracer.runtime.pipeline import compile_signature, stage_text
from tracer.runtime.guards import captured_change, captured_variant
from tracer.runtime.recording import Specialize
from tracer.runtime.signatures import SignatureCache
from tracer.buffers import buffer_of, call_state_of, results, write_back
from tracer.context import is_grad_enabled, state
from tracer.errors import ArgumentError
from tracer.interop import is_foreign_array
from tracer.tensor import Tensor

LOG = logging.getLogger("tracer.trace")
CacheInfo = namedtuple("CacheInfo", ["hits", "misses", "size"])


class TracedFunction:
    """The result of `@trace`: call it like the function; it compiles once per signature."""

    def __init__(self, function: Callable, static_argnums: Sequence[int] = (),
                 check_grads: bool = False):
        # a callable object's attributes are its state, not the wrapper's
        functools.update_wrapper(self, function, updated=(
            ("__dict__",) if isinstance(function, types.FunctionType) else ()))
        self.python_function = function
        self.static_argnums = tuple(static_argnums)
        # (a callable object whose own __getattr__ answers every name has no string name)
        name, qualified = (getattr(function, key, None) for key in ("__name__", "__qualname__"))
        self._name = name if isinstance(name, str) else type(function).__name__
        self._signatures = SignatureCache(qualified if isinstance(qualified, str) else self._name)
        self.check_grads = check_grads
        # TRACER_REPORT's folder, when a signature compiled since that page was written
        self._report_due: str | None = None
        # paths of the int arguments found to be used as sizes, indices or loop bounds: static
        self._specialized: frozenset[str] = frozenset()
        # paths of the floats read from outside whose values the trace needed in Python: static
        self._static_floats: frozenset[str] = frozenset()
        # whether every call takes the general path (static arguments, specialized ints)
        self._not_quick = bool(self.static_argnums)
        try:
            self._signature = inspect.signature(function)
        except (TypeError, ValueError):
            self._signature = None

    def __get__(self, instance, owner=None):
        """`@tr.trace` on a method: `model.step(x)` calls it with the instance as its first
        argument, a static one (each instance has signatures of its own; the tensors it holds
        are captured)."""
        return self if instance is None else BoundTracedFunction(self, instance)

    def cache_info(self) -> CacheInfo:
        signatures = self._signatures
        return CacheInfo(signatures.hits, signatures.misses, len(signatures.entries))

    def cache_clear(self) -> None:
        self._signatures.clear()

    # Signatures.
    def _names(self, args) -> list[str]:
        """The parameter names of the positional arguments."""
        names = [f"arg{i}" for i in range(len(args))]
        if self._signature is not None:
            parameters = [p for p in self._signature.parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            names[:len(parameters)] = [p.name for p in parameters][:len(args)]
        return names

    def _static_objects(self, args, kwargs) -> list[tuple[str, Any]]:
        """The named arguments that are static values (objects whose tensors are captured)."""
        structure, _ = self._split(args, kwargs)
        (_, (positional, (_, keywords, keyword_nodes))) = structure
        named = [*zip(self._names(args), args, positional[1]),
                 *((key, kwargs[key], node) for key, node in zip(keywords, keyword_nodes))]
        return [(name, value) for name, value, node in named if node[0] == "static"]

    def _split(self, args, kwargs):
        """(structure, runtime leaves with paths) of the call's arguments; the structure
        unflattens to (args, kwargs)."""
        names = self._names(args)
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
                positional.append(flatten(value, leaves, name, self._specialized))
        keywords = dict(sorted(kwargs.items()))
        keyword_structure = ("dict", tuple(keywords), tuple(
            flatten(v, leaves, k, self._specialized) for k, v in keywords.items()))
        return ("tuple", (("tuple", tuple(positional)), keyword_structure)), leaves

    def _key(self, args, kwargs):
        structure, leaves = self._split(args, kwargs)
        position: dict[int, int] = {}
        signature = tuple(leaf_signature(value, position) for value, _ in leaves)
        return (structure, signature, is_grad_enabled()), leaves

    def _quick_key(self, args, kwargs) -> tuple[tuple, Sequence] | None:
        """The common call -- positional tensors, numbers and objects (a method's instance), no
        tensor repeated -- keyed without flattening, with its argument leaves; None sends the call
        down the general path."""
        if kwargs or self._not_quick:
            return None
        parts: list = [state.grad_enabled]
        tensors = objects = 0
        for value in args:
            kind = type(value)
            if kind is Tensor:
                parts.append(call_state_of(value))
                tensors += 1
            elif kind is float or kind is int:
                parts.append(kind)
            elif (kind.__hash__ is object.__hash__ and not isinstance(value, Tensor)
                  and not is_foreign_array(value)):
                parts.append(value)  # a static object, compared by identity (and kept alive)
                objects += 1
            else:
                return None
        if tensors > 1 and len({id(v) for v in args if type(v) is Tensor}) < tensors:
            return None
        leaves = [v for v in args if type(v) in (Tensor, float, int)] if objects else args
        return tuple(parts), leaves

    def _lookup(self, args, kwargs, count: bool, quick_key: tuple | None
                ) -> tuple[Entry, list, list]:
        """The entry for this call (found by its full key, built if new), the values of its
        argument leaves, and the leaves with their paths. `quick_key` (see `_quick_key`), if
        the call has one, is remembered for the entry."""
        while True:
            key, leaves = self._key(args, kwargs)
            try:
                entry = self._signatures.lookup(
                    key, [path for _, path in leaves],
                    lambda reason, leaves=leaves: self._build(args, kwargs, leaves, reason),
                    captured_change, count, quick_key, captured_variant)
            except Specialize as request:
                self._specialized |= request.paths
                self._not_quick = bool(self.static_argnums or self._specialized)
                self._static_floats |= request.floats
                quick_key = None
                if request.paths:
                    LOG.info("%s: int arguments %s are used as sizes, indices or loop bounds: "
                             "static from now on", self._name, ", ".join(sorted(request.paths)))
                if request.floats:
                    LOG.info("%s: floats %s are compiled in from now on (%s): a new value "
                             "compiles again", self._name, ", ".join(sorted(request.floats)),
                             request.why)
                continue
            folder, self._report_due = self._report_due, None
            if folder:  # a signature compiled: now cached, the TRACER_REPORT page shows it
                from tracer.runtime.report import write_report_to  # (imports the templates)
                write_report_to(self, folder)
            return entry, [value for value, _ in leaves], leaves

    # Tracing and compiling.
    def _build(self, args, kwargs, leaves, reason: str) -> Entry:
        LOG.info("%s: compiling (%s)", self._name, reason)
        entry = self._compile(args, kwargs, leaves)
        entry.reason = reason
        self._log_compiled(entry)
        return entry

    def _compile(self, args, kwargs, leaves) -> Entry:
        structure, _ = self._split(args, kwargs)
        entry = compile_signature(self.python_function, self._name, leaves,
                                  lambda proxies: unflatten(structure, proxies),
                                  self._static_objects(args, kwargs), self.check_grads,
                                  self._static_floats)
        self._dump(entry)
        return entry

    def _log_compiled(self, entry: Entry) -> None:
        def times(timings: dict[str, float]) -> str:
            return ", ".join(f"{stage} {1e3 * seconds:.1f} ms" for stage, seconds in timings.items())
        LOG.info("%s: compiled in %.1f ms (%s; backend: %s)", self._name,
                 1e3 * sum(entry.timings.values()), times(entry.timings),
                 times(entry.executable.timings))
        self._report_due = os.environ.get("TRACER_REPORT") or None  # once the entry is cached

    def report(self, path: str) -> str:
        """Write the HTML compile report of every signature compiled so far to `path`; returns
        the path (see runtime/report.py)."""
        from tracer.runtime.report import write_report
        return write_report(self, path)

    def _dump(self, entry: Entry) -> None:
        folder = os.environ.get("TRACER_DUMP")
        if not folder:
            return
        os.makedirs(folder, exist_ok=True)
        number = len(self._signatures.entries)
        for stage in (*entry.stages, *entry.executable.stages):
            text = stage_text(entry, stage)
            path = os.path.join(folder, f"{self.python_function.__name__}.{number}.{stage}.txt")
            with open(path, "w") as file:
                file.write(text)

    # Calling.
    def ir(self, *args, stage: str = "traced", **kwargs) -> str:
        """The text of one pipeline stage for the signature of these arguments."""
        quick = self._quick_key(args, kwargs)
        entry, _, _ = self._lookup(args, kwargs, False, None if quick is None else quick[0])
        return stage_text(entry, stage)

    def __call__(self, *args, **kwargs):
        if state.trace is not None:
            return self.python_function(*args, **kwargs)  # inside another trace: inline it
        quick = self._quick_key(args, kwargs)
        entry = None if quick is None else self._signatures.quick(quick[0], True)
        if entry is not None:  # the common call: its leaves are its tensor and number arguments
            values, leaves = quick[1], None
        else:
            entry, values, leaves = self._lookup(args, kwargs, True,
                                                 None if quick is None else quick[0])
        if entry.captured or entry.floats:
            values = [*values, *entry.captured]
            if entry.read_floats is not None:
                values += entry.read_floats()
        arrays = call_arrays(entry, values)
        if entry.writebacks:
            check_targets(entry, values, arrays)
        differentiated = bool(entry.differentiable) and state.grad_enabled
        # (the data on entry that the results' backward reads, where the call overwrites it and
        # the backward runs the function again)
        entered = ([buffer_of(values[index]).copy() for index in entry.replayed]
                   if entry.replayed and differentiated and entry.split is None else None)
        executable = entry.executable
        outputs = executable.run(arrays, entry.shares_outputs)
        # the arguments' arrays, where an output may be one of them (see buffers.owned)
        inputs = None if executable.fresh_results else set(map(id, arrays))
        if entry.writebacks or entry.cleared_grads:
            write_back(values, entry.writebacks, entry.cleared_grads, outputs, inputs)
        if entry.related:  # `return x`, `x.grad`, `x[0]`, `y, y`: as eager mode's results
            tensors = results(outputs[:entry.result_count], inputs, entry.returned_as_is)
            relate_results(entry, tensors, values)
        else:
            tensors = results(outputs[:entry.result_count], inputs)
        if differentiated:
            if leaves is None:  # (the argument leaves: `values` then holds the captured tensors)
                leaves = [(value, None) for value in quick[1]]
            # (imported here: a process whose results are not differentiated never needs it)
            from tracer.runtime.differentiable import record_backward
            record_backward(self, entry, args, kwargs, leaves, tensors, values, arrays, outputs,
                            entered)
        if entry.structure == ("leaf",):
            return tensors[0]
        return unflatten(entry.structure, tensors)


class BoundTracedFunction:
    """A traced method looked up on an instance, as a bound method is: calls pass the instance
    first; `ir` too; anything else (`cache_info`, `report`, ...) is the traced function's."""

    def __init__(self, traced: TracedFunction, instance):
        self.__func__, self.__self__ = traced, instance

    def __call__(self, *args, **kwargs):
        return self.__func__(self.__self__, *args, **kwargs)

    def ir(self, *args, stage: str = "traced", **kwargs) -> str:
        return self.__func__.ir(self.__self__, *args, stage=stage, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.__func__, name)


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


