"""The back end of one optimized Function (runtime/pipeline.py's `compile_graph`): its kernels
fused, its memory planned, and on demand its loop IR, its LLVM text and the printed form of each
of these stages.

A warm hit (runtime/warm_cache.py) runs its object code without any of them; a disk hit keyed by
the optimized program (`compile_graph`) fuses and plans only.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Iterator

from tracer.codegen.bounds import RECORD_BYTES
from tracer.errors import BoundsError
from tracer.ir.fusion import FusedFunction, fuse
from tracer.ir.graph import Graph
from tracer.ir.index_checks import can_fail
from tracer.ir.memory import MemoryPlan, arena_overflow, plan_memory
from tracer.ir.rows import group_rows
from tracer.runtime import native
from tracer.runtime.code_settings import CodeSettings
from tracer.runtime.compiled import CompiledFunction
from tracer.runtime.convention import CallingConvention
from tracer.runtime.pipeline import BACK_END_STAGES, Steps

if TYPE_CHECKING:
    from tracer.codegen.bounds import Sites
    from tracer.codegen.module import GeneratedCode, KernelModule
    from tracer.ir.loops import LoopKernel, LoopProgram


class BackEnd:
    """What the back end makes of one optimized Function, and the printed form of each of its
    stages. The fused kernels and the memory plan are made at once: calling the code needs the
    plan (the outputs, the arena, the in-place pairs). The loop IR and the LLVM text are made when
    first asked for: compiling asks at once, while a disk-cache hit runs the object code without
    them (they are made for `stage_text`, the report or a bounds failure's message)."""

    stages = BACK_END_STAGES  # what `stage_text` prints

    def __init__(self, function: Graph, write_into: dict[int, int] | None,
                 settings: CodeSettings, disk_key: bytes, timings: dict[str, float] | None = None):
        self.function, self.settings, self.disk_key = function, settings, disk_key
        self.host = native.host()
        self.step = Steps(timings)
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

    @functools.cached_property
    def convention(self) -> CallingConvention:
        """How the code compiled for this plan is called (kept with it in the warm cache)."""
        return CallingConvention.of(self)

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
        kernels = schedule_kernels(self.fused, self.plan, self.settings.threads,
                                   self.settings.own_gemm)
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
