"""The compiler's pipeline, top to bottom: one call of a traced function becomes the native code of
its signature, stage by stage, each timed and printable (`f.ir(*args, stage=...)`, TRACER_DUMP,
the compile report).

    compile_signature   trace → grad (→ check_grads) → warm cache → its Entry, or on a miss
                        → optimize (→ split) → back end → its Entry
    compile_graph       fuse → rows → memory → (disk cache) → schedule → render → llvm → load

(The warm cache, runtime/warm_cache.py, finds a signature's object code by its grad stage: a
fresh process whose program an earlier one compiled neither optimizes nor fuses it.)

(Schedule and render go kernel by kernel, and a kernel module's LLVM compile starts, in the
compile worker, as soon as its text is certain: the `llvm` step times what is left of it once
every module is rendered.)

The other modules each do one of these steps and return here: runtime/recording.py records,
ir/ transforms, runtime/back_end.py fuses and plans memory, codegen/ renders, runtime/kernels.py
and runtime/jit.py make object code, runtime/compiled.py loads and calls it, runtime/entry.py
builds the entry and its guards.

What a disk-cache hit does not need -- the scheduler, the loop IR, the code generator and its
Jinja2 templates, LLVM (llvmlite), the gradient checker -- is imported where it is first used: a
fresh process that finds its program compiled imports ~100 modules fewer.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from tracer import ir
from tracer.context import is_grad_enabled
from tracer.errors import ArgumentError
from tracer.ir.graph import Graph, gc_paused
from tracer.ir.text import format_function
from tracer.runtime import native, profile_hook, warm_cache
from tracer.runtime.arena import AHEAD_BYTES, ArenaAhead
from tracer.runtime.arguments import parameter_arrays
from tracer.runtime.cache import cache_directory, cache_key, open_entry, unpack_objects
from tracer.runtime.code_settings import CodeSettings
from tracer.runtime.compiled import CompiledFunction
from tracer.runtime.entry import Entry, StageTexts, build_entry, differentiable_results
from tracer.runtime.recording import Recorder, Recording

if TYPE_CHECKING:
    from tracer.runtime.back_end import BackEnd

STAGES = (
    "traced",     # the primitives as recorded (tracer/), custom Functions inlined
    "grad",       # the autodiff pass replaced each gradient directive (ir.expand_gradients)
    "optimized",  # dce, cse, constant folding, simplification (ir.optimize)
    "fused",      # the instructions grouped into kernels (ir.fusion, ir.rows)
    "loops",      # the kernels as loop nests over buffers of the memory plan (ir.schedule)
    "llvm",       # the LLVM IR rendered from the loops (codegen/), after LLVM's optimizer
    "asm",        # the machine code for the host CPU
)
FRONT_END_STAGES = STAGES[:STAGES.index("fused")]  # kept as text by each signature's Entry
BACK_END_STAGES = STAGES[STAGES.index("fused"):]  # printed on demand by the BackEnd
REPORT_STAGES = STAGES[:STAGES.index("asm")]  # side by side in the compile report
# A trace this large starts the compile worker before the autodiff pass, which a disk-cache hit
# then stops unused (compile_worker.stop_speculative); an optimized graph this large, not in the
# disk cache, starts it before fusing if it is not running.
EARLY_WORKER = 500


class Steps:
    """Seconds per step, in the order the steps ran."""

    def __init__(self, timings: dict[str, float] | None = None):
        self.timings: dict[str, float] = {} if timings is None else timings

    @contextlib.contextmanager
    def __call__(self, name: str, pause_collector: bool = True) -> Iterator[None]:
        """Times the step `name`, with the cyclic garbage collector paused (see
        ir.graph.gc_paused) unless it runs the user's code."""
        started = time.perf_counter()
        with gc_paused() if pause_collector else contextlib.nullcontext():
            yield
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - started


def compile_signature(python_function: Callable, name: str, leaves: Sequence, rebuild: Callable,
                      static_objects: Sequence[tuple[str, Any]], check_grads: bool,
                      static_floats: frozenset[str] = frozenset()) -> Entry:
    """Trace `python_function` once (see runtime/recording.Recorder, which takes `leaves`,
    `rebuild`, `static_objects` and `static_floats`), expand its gradients, optimize and compile
    it: the entry of its signature. `check_grads` checks every custom backward against finite
    differences first. Raises recording.Specialize when the trace needs static values."""
    step = Steps()
    with Recorder(python_function, name, leaves, rebuild, static_objects, static_floats) as recorder:
        with step("trace", pause_collector=False):
            traced = recorder.trace()
            if len(traced.instructions) >= EARLY_WORKER:  # (a miss is likely: it imports LLVM)
                _compile_worker().start(CodeSettings.current().threads > 1, speculative=True)
            # the autodiff pass rewrites the graph: the `traced` stage and the check keep a copy
            with gc_paused():
                unexpanded = traced.copy()
        with step("grad", pause_collector=False):  # (traces the custom backwards)
            expanded = recorder.expand_gradients()
    recording = recorder.recording
    if check_grads:
        with step("check_grads", pause_collector=False):
            from tracer.runtime.check_grads import check_custom_backwards
            check_custom_backwards(unexpanded, parameter_arrays(recording.sources, [
                *(value for value, _ in leaves), *recording.captured,
                *(np.array(float_input.value) for float_input in recording.floats)]))
    write_into = _written_in_place(recording)
    # A call that will be differentiated runs the forward that also returns what its backward
    # reads (runtime/split_code.py), the backward compiled at the first backward. Any other is
    # looked up by its grad stage first: a warm hit neither optimizes nor fuses.
    differentiable = differentiable_results(recording)
    splits = bool(differentiable) and is_grad_enabled()
    executable = None
    if not splits:
        with step("warm"):  # (the look-up, hit or miss)
            executable = compile_warm(expanded, write_into)
        if executable is not None and len(traced.instructions) >= EARLY_WORKER:
            _compile_worker().stop_speculative()
    if executable is not None:
        # (a warm hit's optimized graph is made when first asked for: runtime/warm_cache.py)
        optimized: Graph | Callable[[], Graph] = functools.partial(
            getattr, executable.back_end, "function")
        split, reached = None, []
    else:
        with step("optimize"):
            optimized = _optimized(expanded)  # (a copy: `expanded` stays the grad stage)
        split, compiled, reached = None, optimized, []
        if splits:
            from tracer.runtime.split_code import (SplitCode, gradient_positions,
                                                   reached_results, split_signature)
            with step("split"):
                values = [*(value for value, _ in leaves), *recording.captured]
                wrt = gradient_positions(recording, values)
                reached = reached_results(expanded, wrt, differentiable)
                split = split_signature(recording, expanded, wrt, differentiable, ir.optimize)
                if split is not None:
                    compiled = split.forward
                    ir.verify(compiled)
        with step("backend"):
            executable = compile_function(compiled, write_into=write_into)
            if not splits:
                remember_warm(expanded, write_into, executable)
    stages = StageTexts({"traced": unexpanded, "grad": expanded, "optimized": optimized})
    entry = build_entry(recording, executable, leaves, stages, step.timings)
    entry.reached = reached
    if split is not None:
        entry.split = SplitCode(split, wrt, entry.result_count, recording.sources,
                                compile_function)
    return entry


def _optimized(function: Graph) -> Graph:
    """The `optimized` stage of `function` (a copy), verified."""
    optimized = ir.optimize(function)
    ir.verify(optimized)
    return optimized


def _compile_worker():
    from tracer.runtime import compile_worker  # (imports subprocess: for large graphs only)
    return compile_worker


def _written_in_place(recording: Recording) -> dict[int, int]:
    """{output: parameter}: updated data and .grad written straight into the argument's buffer
    (where the memory plan finds that safe)."""
    parameter_of = {(kind, index): position
                    for position, (kind, index) in enumerate(recording.sources)}
    return {output: parameter_of[("leaf" if kind == "data" else "grad", index)]
            for index, kind, output in recording.writebacks
            if ("leaf" if kind == "data" else "grad", index) in parameter_of}


def stage_text(entry: Entry, stage: str) -> str:
    """The text of one pipeline stage of a compiled signature."""
    if stage in entry.stages:
        return entry.stages[stage]
    if stage not in STAGES:
        raise ArgumentError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    return entry.executable.stage_text(stage)


# Shared by every traced function whose signature gives the same graph, and only while one of them
# holds it: the native code is freed with the last reference.
_compiled: weakref.WeakValueDictionary[tuple, CompiledFunction] = weakref.WeakValueDictionary()
_compiled_lock = threading.Lock()


def compile_function(function: Graph, write_into: dict[int, int] | None = None) -> CompiledFunction:
    """The CompiledFunction of `function` (the `optimized` stage), shared in memory by its program
    text, its user's lines and the settings that change the generated code while it is in use."""
    write_into = dict(write_into or {})
    settings = CodeSettings.current()
    program = program_text(function, write_into, settings)
    key = (program, tuple(i.location for i in function.instructions), cache_directory())
    compiled = _in_memory(key, function.name, "optimized graph")
    if compiled is not None:
        return compiled
    compiled = compile_graph(function, write_into, settings, program)
    with _compiled_lock:
        return _compiled.setdefault(key, compiled)


def _in_memory(key: tuple, name: str, what: str) -> CompiledFunction | None:
    """The CompiledFunction compiled before under `key` in this process (logged), or None."""
    with _compiled_lock:
        compiled = _compiled.get(key)
    if compiled is not None:
        native.LOG.debug("%s: in-memory hit, the same %s was compiled before", name, what)
    return compiled


def program_text(function: Graph, write_into: dict[int, int], settings: CodeSettings) -> str:
    """What the object code of `function` is made from: its text without the user's lines (which
    only the table of checked accesses names, made when needed: moved code still hits the disk
    cache), the in-place pairs and the settings."""
    return "\n".join([format_function(function, locations=False),
                      f"write_into={sorted(write_into.items())}", repr(settings)])


def _disk_key(program: str, settings: CodeSettings) -> bytes:
    host = native.host()
    return cache_key(program, host.triple, host.cpu, host.features, settings.checked,
                     host.llvm_version)


def _warm_key(function: Graph, write_into: dict[int, int]) -> tuple[str, tuple]:
    """The program a warm entry of `function` (a `grad` stage) is keyed by on disk (marked, so
    that it never equals an optimized program), and its key in memory (see compile_function)."""
    program = "grad stage\n" + program_text(function, write_into, CodeSettings.current())
    return program, ("grad", program, tuple(i.location for i in function.instructions),
                     cache_directory())


def compile_warm(function: Graph, write_into: dict[int, int]) -> CompiledFunction | None:
    """The CompiledFunction of `function` (the `grad` stage; `write_into` as for
    compile_function) found without optimizing it: in memory, or in the warm entry of the disk
    cache (runtime/warm_cache.py); None if neither has it."""
    program, key = _warm_key(function, write_into)
    compiled = _in_memory(key, function.name, "grad stage")
    if compiled is not None:
        return compiled
    settings = CodeSettings.current()
    found = warm_cache.load(_disk_key(program, settings))
    if found is None:
        return None
    convention, disk_key, objects, path = found
    optimized = functools.cache(lambda: _optimized(function))

    def back_end() -> BackEnd:  # (its steps are timed with the hit's: the report's "later" ones)
        from tracer.runtime.back_end import BackEnd
        made = BackEnd(optimized(), write_into, settings, disk_key, lazy.timings)
        if _disk_key(program_text(made.function, write_into, settings), settings) != disk_key:
            raise RuntimeError(f"{function.name}: optimizing its grad stage again gave another "
                               f"program than the one its warm cache entry was compiled from")
        return made
    lazy = warm_cache.LazyBackEnd(convention, settings, disk_key, BACK_END_STAGES, optimized,
                                  back_end)
    compiled = lazy.load(objects, path)
    if compiled is None:
        return None
    with _compiled_lock:
        return _compiled.setdefault(key, compiled)


def remember_warm(function: Graph, write_into: dict[int, int], compiled: CompiledFunction) -> None:
    """Keep `compiled`, the code of `function`'s grad stage, for compile_warm: in memory while in
    use, and in the disk cache."""
    program, key = _warm_key(function, write_into)
    with _compiled_lock:
        _compiled.setdefault(key, compiled)
    warm_cache.store(_disk_key(program, CodeSettings.current()), compiled.disk_key,
                     compiled.convention)


def compile_graph(function: Graph, write_into: dict[int, int] | None = None,
                  settings: CodeSettings | None = None, program: str | None = None) -> CompiledFunction:
    """The back end: `function` (optimized) fused, its memory planned, and its object code loaded
    from the disk cache or scheduled, rendered and compiled, then loaded.

    `write_into={output index: parameter index}` asks for outputs written directly into the
    buffers of parameters (an in-place update; see CompiledFunction); `program` is its
    program_text if the caller has it."""
    from tracer.runtime.back_end import BackEnd  # (and the fusion and memory passes)
    settings = settings or CodeSettings.current()
    if program is None:
        program = program_text(function, dict(write_into or {}), settings)
    disk_key = _disk_key(program, settings)  # (known before fusing: a miss may start the worker)
    cache = open_entry(disk_key)
    cached = cache.load() if cache is not None else None
    objects = unpack_objects(cached) if cached is not None else None
    early = objects is None and len(function.instructions) >= EARLY_WORKER
    if early:  # (imports subprocess: on a miss only)
        _compile_worker().start(settings.threads > 1)  # it imports LLVM while fusing
    elif len(function.instructions) >= EARLY_WORKER:
        _compile_worker().stop_speculative()
    back_end = BackEnd(function, write_into, settings, disk_key)
    compiled = None
    if objects is not None:
        with back_end.step("load"):
            compiled = back_end.load(objects, str(cache.path))
    if compiled is None:
        from tracer.runtime import compile_worker
        from tracer.runtime.kernels import ProgramCompilation  # (and llvmlite)
        arena = ArenaAhead(back_end.arena_size) if back_end.arena_size >= AHEAD_BYTES else None
        worker = None
        if early or len(back_end.fused.kernels) >= compile_worker.MIN_MODULES:
            worker = compile_worker.start()  # (it starts while the kernels are scheduled)
        with ProgramCompilation(back_end.settings.checked, worker) as compilation:
            # scheduled and rendered on a miss only, each kernel compiled from when it is rendered
            code = back_end.render(compilation.add)
            with back_end.step("llvm"):
                objects = compilation.finish(code, cache)
        with back_end.step("load"):
            compiled = CompiledFunction(back_end, objects, from_disk_cache=False, arena=arena)
        profile_hook.ahead()  # (once per disk cache: for the traces of the processes after)
    back_end.compile_steps = tuple(back_end.timings)
    return compiled
