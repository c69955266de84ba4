"""A compiled signature: what a call of it needs (`Entry`), and how one trace of the function
becomes one (`compile_entry`: gradients expanded, optimized, compiled, guarded)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tracer import ir
from tracer.runtime.arguments import parameter_arrays
from tracer.runtime.check_grads import check_custom_backwards
from tracer.runtime.compiled import compile_function
from tracer.runtime.floats import compile_reader
from tracer.runtime.guards import captured_names, captured_state, compile_check, guards_for
from tracer.runtime.pipeline import STAGES
from tracer.runtime.recording import record
from tracer.errors import ArgumentError
from tracer.tensor import Tensor


@dataclass
class Entry:
    """What a call of one compiled signature needs."""
    structure: tuple                      # of the results
    executable: Any
    result_count: int
    # (argument leaf index, "data" | "grad", output index) for every value written back.
    writebacks: list[tuple[int, str, int]]
    cleared_grads: list[int]              # argument leaves whose .grad the function set to None
    # Where each parameter comes from: ("leaf" | "number" | "grad", leaf index).
    parameter_sources: list[tuple[str, int]]
    captured: list[Tensor]    # tensors read from outside: leaves after the arguments' leaves
    captured_state: list[tuple]  # their shape, dtype, requires_grad and .grad when traced
    # Argument leaves and captured tensors whose .grad on entry the trace did not read: whether
    # they have one is no part of the signature (see Trace.writebacks).
    unread: frozenset[int] = frozenset()
    unread_captured: list[bool] = field(default_factory=list)
    # Floats read from outside (runtime/floats.py): the values after the captured tensors, read
    # by `read_floats()` on every call.
    floats: list = field(default_factory=list)
    read_floats: Callable[[], list] | None = None
    stages: dict[str, str] = field(default_factory=dict)
    leaf_names: dict[int, str] = field(default_factory=dict)  # leaf index -> its path
    # Paths to what the function reads from its globals, closure and objects, with the value
    # when traced: a tensor, array or number there that changes means tracing again (see
    # runtime/guards.py).
    guards: list[tuple] = field(default_factory=list)
    # True while the guards hold and the captured tensors are as traced (runs on every call)
    check: Callable[[], bool] = lambda: True
    captured_names: list[str] = field(default_factory=list)  # what messages call them
    rules: list = field(default_factory=list)  # custom rules the stage texts name, kept alive
    # Results through which eager autograd can differentiate the call (a pure function of
    # arguments that require grad), and the traced forward+backward that does it, made on demand.
    differentiable: list[int] = field(default_factory=list)
    backward: Any = None  # (a TracedFunction)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per front-end stage
    reason: str = ""  # why this signature compiled (see runtime/signatures.py)


def compile_entry(python_function: Callable, name: str, leaves: Sequence, rebuild: Callable,
                  static_objects: Sequence[tuple[str, Any]], check_grads: bool,
                  static_floats: frozenset[str] = frozenset()) -> Entry:
    """Trace `python_function` once (see `record`, which takes `leaves`, `rebuild`,
    `static_objects` and `static_floats`), expand its gradients, optimize it and compile it: the
    entry of its signature. `check_grads` checks every custom backward against finite
    differences first."""
    started = time.perf_counter()
    recording = record(python_function, name, leaves, rebuild, static_objects, check_grads,
                       static_floats)
    function, stages, sources = recording.function, recording.stages, recording.sources
    timings = {"trace": recording.seconds}
    ir.verify(function)
    stages["grad"] = ir.format_function(function)
    timings["grad"] = time.perf_counter() - started - sum(timings.values())
    optimized = ir.optimize(function)
    ir.verify(optimized)
    stages["optimized"] = ir.format_function(optimized)
    timings["optimize"] = time.perf_counter() - started - sum(timings.values())
    captured = recording.captured
    if recording.unexpanded is not None:
        check_custom_backwards(recording.unexpanded, parameter_arrays(
            sources, [value for value, _ in leaves] + captured
            + [np.array(float_input.value) for float_input in recording.floats]))
        timings["check_grads"] = time.perf_counter() - started - sum(timings.values())
    # Updated data and .grad are written straight into the argument's buffer where that is safe.
    parameter_of = {(kind, index): position for position, (kind, index) in enumerate(sources)}
    write_into = {output: parameter_of[("leaf" if kind == "data" else "grad", index)]
                  for index, kind, output in recording.writebacks
                  if ("leaf" if kind == "data" else "grad", index) in parameter_of}
    executable = compile_function(optimized, write_into=write_into)
    timings["backend"] = time.perf_counter() - started - sum(timings.values())
    entry = Entry(recording.result_structure, executable, len(recording.result_leaves),
                  recording.writebacks, recording.cleared, sources, captured,
                  captured_state(captured), stages=stages, rules=recording.rules)
    if not recording.writebacks and not recording.cleared:
        entry.differentiable = [i for i, value in enumerate(recording.result_leaves)
                                if isinstance(value, Tensor) and value.requires_grad]
    entry.unread = frozenset(recording.unread)
    entry.unread_captured = [len(leaves) + k in entry.unread for k in range(len(captured))]
    entry.floats, entry.read_floats = recording.floats, compile_reader(recording.floats)
    entry.guards = guards_for(recording.reached, captured, recording.used,
                              [i.name for i in recording.floats])
    entry.check = compile_check(entry.guards, captured, entry.unread_captured, recording.floats)
    entry.captured_names = captured_names(recording.reached, captured)
    entry.leaf_names = {index: path for index, (_, path) in enumerate(leaves)}
    entry.leaf_names.update({len(leaves) + k: name
                             for k, name in enumerate(entry.captured_names)})
    entry.timings = timings
    return entry


def stage_text(entry: Entry, stage: str) -> str:
    """The text of one pipeline stage of a compiled signature."""
    if stage in entry.stages:
        return entry.stages[stage]
    if stage not in STAGES:
        raise ArgumentError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    return entry.executable.stage_text(stage)
