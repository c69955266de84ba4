"""The compiler's pipeline, top to bottom: one call of a traced function becomes the native code of
its signature, stage by stage, each timed and printable (`f.ir(*args, stage=...)`, TRACER_DUMP,
the compile report).

    compile_signature   trace → grad → optimize (→ check_grads) (→ split) → back end → its Entry
    compile_graph       fuse → rows → memory → (disk cache) → schedule → render → llvm → load

(Schedule and render go kernel by kernel, and a kernel module's LLVM compile starts, in the
compile worker, as soon as its text is certain: the `llvm` step times what is left of it once
every module is rendered.)

The other modules each do one of these steps and return here: runtime/recording.py records,
ir/ transforms, codegen/ renders, runtime/kernels.py and runtime/jit.py make object code,
runtime/compiled.py loads and calls it, runtime/entry.py builds the entry and its guards.

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
from tracer.codegen.bounds import RECORD_BYTES
from tracer.errors import ArgumentError, BoundsError
from tracer.ir.fusion import FusedFunction, fuse
from tracer.ir.graph import Graph, gc_paused
from tracer.ir.index_checks import can_fail
from tracer.ir.memory import MemoryPlan, arena_overflow, plan_memory
from tracer.ir.rows import group_rows
from tracer.ir.text import format_function
from tracer.runtime import native
from tracer.runtime.arena import AHEAD_BYTES, ArenaAhead
from tracer.runtime.arguments import parameter_arrays
from tracer.runtime.cache import cache_directory, cache_key, open_entry, unpack_objects
from tracer.runtime.code_settings import CodeSettings
from tracer.runtime.compiled import CompiledFunction
from tracer.runtime.entry import Entry, StageTexts, build_entry, differentiable_results
from tracer.runtime.recording import Recorder, Recording
from tracer.runtime.split_code import (SplitCode, gradient_positions, reached_results,
                                        split_signature)

if TYPE_CHECKING:
    from tracer.codegen.bounds import Sites
    from tracer.codegen.module import GeneratedCode, KernelModule
    from tracer.ir.loops import LoopKernel, LoopProgram

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

    def __init__(self):
        self.timings: dict[str, float] = {}

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
    with step("optimize"):
        optimized = ir.optimize(recording.function)  # (a copy: `expanded` stays the grad stage)
        ir.verify(optimized)
    if check_grads:
        with step("check_grads", pause_collector=False):
            from tracer.runtime.check_grads import check_custom_backwards
            check_custom_backwards(unexpanded, parameter_arrays(recording.sources, [
                *(value for value, _ in leaves), *recording.captured,
                *(np.array(float_input.value) for float_input in recording.floats)]))
    # A call that will be differentiated runs the forward that also returns what its backward
    # reads (runtime/split_code.py), the backward compiled at the first backward.
    split, compiled, reached = None, optimized, []
    differentiable = differentiable_results(recording)
    if differentiable and is_grad_enabled():
        with step("split"):
            values = [*(value for value, _ in leaves), *recording.captured]
            wrt = gradient_positions(recording, values)
            reached = reached_results(expanded, wrt, differentiable)
            split = split_signature(recording, expanded, wrt, differentiable, ir.optimize)
            if split is not None:
                compiled = split.forward
                ir.verify(compiled)
    with step("backend"):
        executable = compile_function(compiled, write_into=_written_in_place(recording))
    stages = StageTexts({"traced": unexpanded, "grad": expanded, "optimized": optimized})
    entry = build_entry(recording, executable, leaves, stages, step.timings)
    entry.reached = reached
    if split is not None:
        entry.split = SplitCode(split, wrt, entry.result_count, recording.sources,
                                compile_function)
    return entry


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
    with _compiled_lock:
        compiled = _compiled.get(key)
    if compiled is not None:
        native.LOG.debug("%s: in-memory hit, the same optimized graph was compiled before",
                      function.name)
        return compiled
    compiled = compile_graph(function, write_into, settings, program)
    with _compiled_lock:
        return _compiled.setdefault(key, compiled)


def program_text(function: Graph, write_into: dict[int, int], settings: CodeSettings) -> str:
    """What the object code of `function` is made from: its text without the user's lines (which
    only the table of checked accesses names, made when needed: moved code still hits the disk
    cache), the in-place pairs and the settings."""
    return "\n".join([format_function(function, locations=False),
                      f"write_into={sorted(write_into.items())}", repr(settings)])


def compile_graph(function: Graph, write_into: dict[int, int] | None = None,
                  settings: CodeSettings | None = None, program: str | None = None) -> CompiledFunction:
    """The back end: `function` (optimized) fused, its memory planned, and its object code loaded
    from the disk cache or scheduled, rendered and compiled, then loaded.

    `write_into={output index: parameter index}` asks for outputs written directly into the
    buffers of parameters (an in-place update; see CompiledFunction); `program` is its
    program_text if the caller has it."""
    settings = settings or CodeSettings.current()
    if program is None:
        program = program_text(function, dict(write_into or {}), settings)
    host = native.host()  # (the disk key is known before fusing: a miss may start the worker)
    disk_key = cache_key(program, host.triple, host.cpu, host.features, settings.checked,
                         host.llvm_version)
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
    back_end.compile_steps = tuple(back_end.timings)
    return compiled


class BackEnd:
    """What the back end makes of one optimized Function, and the printed form of each of its
    stages. The fused kernels and the memory plan are made at once: calling the code needs the
    plan (the outputs, the arena, the in-place pairs). The loop IR and the LLVM text are made when
    first asked for: compiling asks at once, while a disk-cache hit runs the object code without
    them (they are made for `stage_text`, the report or a bounds failure's message)."""

    stages = BACK_END_STAGES  # what `stage_text` prints

    def __init__(self, function: Graph, write_into: dict[int, int] | None,
                 settings: CodeSettings, disk_key: bytes):
        self.function, self.settings, self.disk_key = function, settings, disk_key
        self.host = native.host()
        self.step = Steps()
        self.timings = self.step.timings
        self.compile_steps: tuple[str, ...] = ()  # the steps of compiling, set when it ends
        self._stages: dict[str, str] = {}
        with self.step("fuse"):
            fused = fuse(function, matmul_updates=settings.blas)
        with self.step("rows"):
            self.fused: FusedFunction = group_rows(fused)
        # Whether the code keeps an error record after the arena's temporaries (bounds-checked,
        # an index that may be out of range, or a host callback): decided once, here, for the code
        # that writes it and the runtime that sizes the arena and reads it.
        self.error_record: bool = settings.checked or any(
            can_fail(i) for kernel in self.fused.kernels for i in kernel.instructions)
        with self.step("memory"):
            self.plan: MemoryPlan = plan_memory(self.fused, write_into)
            # checked code keeps its error record after the temporaries
            self.arena_size = self.plan.arena_size + (RECORD_BYTES if self.error_record else 0)
            # The kernels check offsets relative to each buffer's pointer; that the temporaries
            # lie inside the arena is a fact of the plan, checked here once.
            overflow = arena_overflow(self.fused, self.plan) if settings.checked else None
            if overflow is not None:
                raise BoundsError(f"compiling {function.name}: {overflow}")

    def load(self, objects: list[bytes], path: str) -> CompiledFunction | None:
        """The CompiledFunction of `objects` from the disk cache; None if LLVM refuses them (an
        entry this user's processes wrote, so only a bug of ours: the caller compiles again)."""
        try:
            compiled = CompiledFunction(self, objects, from_disk_cache=True)
        except RuntimeError as error:
            native.LOG.warning("%s: could not load the disk cache entry %s (%s); compiling it again",
                            self.function.name, path, error)
            return None
        native.count("disk_hits")
        native.LOG.debug("disk cache hit: %s", path)
        return compiled

    @functools.cached_property
    def loops(self) -> LoopProgram:
        """The `loops` stage: the fused kernels scheduled on the plan, verified."""
        from tracer.ir.schedule import unscheduled_program
        program = unscheduled_program(self.fused, self.plan)
        for _ in self._scheduled(program):
            pass  # (each kernel appended to `program`)
        return program

    def _scheduled(self, program: LoopProgram) -> Iterator[LoopKernel]:
        """Each kernel scheduled and verified in turn (the `schedule` step), appended to
        `program`, then `loops` once they all are."""
        from tracer.ir.offsets import shift_constant_offsets
        from tracer.ir.schedule import schedule_kernels
        from tracer.ir.verify_loops import verify_kernel
        kernels = schedule_kernels(self.fused, self.plan, self.settings.threads)
        while True:
            with self.step("schedule"):
                kernel = next(kernels, None)
                if kernel is not None:
                    # (checked code checks each offset against its buffer's start and size)
                    if not self.settings.checked:
                        kernel = shift_constant_offsets(kernel)
                    verify_kernel(kernel)
            if kernel is None:
                self.__dict__["loops"] = program  # (the cached property's value)
                return
            program.kernels.append(kernel)
            yield kernel

    @functools.cached_property
    def code(self) -> GeneratedCode:
        """The LLVM modules rendered from the loops: the entry's and one per distinct kernel."""
        return self.render()

    def render(self, on_kernel: Callable[[KernelModule], None] | None = None) -> GeneratedCode:
        """`code`, rendered now, each new kernel module handed to `on_kernel` as soon as its text
        is certain (codegen.module.generate_module). Unless `loops` was made before (printed), each
        kernel is rendered as soon as it is scheduled: the compile worker starts on the first
        modules while the scheduler goes on (the GPT step's schedule took 100-130 ms, during which
        the worker waited)."""
        from tracer.codegen.module import Scheduling, generate_module
        from tracer.runtime import template_cache
        template_cache.install()
        if "loops" in self.__dict__:
            program, scheduling = self.loops, None
        else:
            from tracer.ir.schedule import unscheduled_program
            program = unscheduled_program(self.fused, self.plan)
            scheduling = Scheduling(self._scheduled(program),
                                    frozenset(kernel.kind for kernel in self.fused.kernels))
        scheduled = self.timings.get("schedule", 0.0)
        with self.step("render"):
            settings = self.settings
            self.code = generate_module(program, self.plan, self.host.triple, settings.blas,
                                        settings.layout, settings.profile, settings.checked,
                                        self.error_record, on_kernel, scheduling)
        # the render step's time without the scheduling it waited for
        self.timings["render"] -= self.timings.get("schedule", 0.0) - scheduled
        return self.code

    @property
    def llvm_ir(self) -> str:
        """The LLVM IR text of every module, rendered from the loops (before LLVM's optimizer)."""
        return self.code.text

    @property
    def sites(self) -> Sites | None:
        """The checked accesses (codegen.bounds.Sites): the bounds-checked mode's, and the index
        checks of gather and scatter; None when there are none."""
        return self.code.sites

    def stage_text(self, stage: str) -> str:
        """The printed form of a back-end stage: "fused", "loops", "llvm" (optimized, each module
        as runtime/kernels.py compiles it) or "asm"."""
        if stage not in BACK_END_STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of "
                             f"{', '.join(BACK_END_STAGES)}")
        if stage not in self._stages:
            if stage == "fused":
                from tracer.ir.fusion_text import format_fused
                text = format_fused(self.fused)
            elif stage == "loops":
                from tracer.ir.loop_printing import format_program
                text = format_program(self.loops)
            else:
                from tracer.runtime import jit
                from tracer.runtime.kernels import ENTRY_OPTIONS, kernel_options
                printer = jit.optimized_ir if stage == "llvm" else jit.assembly
                code = self.code
                text = "\n".join([printer(code.entry, **ENTRY_OPTIONS),
                                  *(printer(kernel.text, **kernel_options(kernel.text))
                                    for kernel in code.kernels)])
            self._stages[stage] = text
        return self._stages[stage]
