"""The compiler's pipeline, top to bottom: the stages every compiled signature goes through, each
printable (`f.ir(*args, stage=...)`, `TRACER_DUMP`, the compile report).

The front end (runtime/trace.py) traces and optimizes; the back end (`BackEnd`, which
runtime/compiled.py runs) fuses, places the buffers in memory, schedules the loops and renders
them to LLVM IR, which LLVM optimizes and compiles (or a disk-cache hit replaces).
"""
from __future__ import annotations

import contextlib
import functools
import time
from typing import Iterator

from tracer.codegen.bounds import Sites, arena_overflow
from tracer.codegen.module import GeneratedCode, generate_module
from tracer.errors import BoundsError
from tracer.ir.fusion import FusedFunction, fuse
from tracer.ir.graph import Function, gc_paused
from tracer.ir.index_checks import can_fail
from tracer.ir.loops import LoopProgram
from tracer.ir.memory import MemoryPlan, plan_memory
from tracer.ir.rows import group_rows
from tracer.ir.schedule import schedule
from tracer.ir.verify_loops import verify_loops

STAGES = (
    "traced",     # the primitives as recorded (tracer/), custom Functions inlined
    "grad",       # the autodiff pass replaced each gradient directive (ir.expand_gradients)
    "optimized",  # dce, cse, constant folding, simplification (ir.optimize)
    "fused",      # the instructions grouped into kernels (ir.fusion, ir.rows)
    "loops",      # the kernels as loop nests over buffers of the memory plan (ir.schedule)
    "llvm",       # the LLVM IR rendered from the loops (codegen/), after LLVM's optimizer
    "asm",        # the machine code for the host CPU
)
# The stages before "fused" are kept as text by the traced function (runtime/trace.py); these are
# printed on demand by the compiled function (runtime/compiled.py).
BACK_END_STAGES = STAGES[STAGES.index("fused"):]
REPORT_STAGES = STAGES[:STAGES.index("asm")]  # side by side in the compile report


class BackEnd:
    """What the back end makes of one optimized Function. The fused kernels and the memory plan
    are made at once: calling the code needs the plan (the outputs, the arena, the in-place
    pairs). The loop IR and the LLVM text are made when first asked for: compiling asks at once,
    while a disk-cache hit runs the object code without them (they are made for `stage_text`, the
    report or a bounds failure's message)."""

    def __init__(self, function: Function, write_into: dict[int, int] | None, *, blas: bool,
                 threads: int, triple: str, layout: tuple[int, int] | None, profile: bool,
                 checked: bool):
        self.function = function
        self.blas, self.threads, self.triple = blas, threads, triple
        self.layout, self.profile, self.checked = layout, profile, checked
        self.timings: dict[str, float] = {}  # seconds per step, in the order they ran
        with self.step("fuse"):
            self.fused: FusedFunction = group_rows(fuse(function, matmul_updates=blas))
        # Whether the code keeps an error record after the arena's temporaries (bounds-checked,
        # an index that may be out of range, or a host callback): decided once, here, for the code
        # that writes it and the runtime that sizes the arena and reads it.
        self.error_record: bool = checked or any(
            can_fail(i) for kernel in self.fused.kernels for i in kernel.instructions)
        with self.step("memory"):
            self.plan: MemoryPlan = plan_memory(self.fused, write_into)
            # The kernels check offsets relative to each buffer's pointer; that the temporaries
            # lie inside the arena is a fact of the plan, checked here once.
            overflow = arena_overflow(self.fused, self.plan) if checked else None
            if overflow is not None:
                raise BoundsError(f"compiling {function.name}: {overflow}")

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Times the step `name` into `timings`, with the cyclic garbage collector paused."""
        started = time.perf_counter()
        with gc_paused():  # see ir.graph.gc_paused
            yield
        self.timings[name] = time.perf_counter() - started

    @functools.cached_property
    def loops(self) -> LoopProgram:
        """The `loops` stage: the fused kernels scheduled on the plan, verified."""
        with self.step("schedule"):
            loops = schedule(self.fused, self.plan, self.threads)
            verify_loops(loops)
        return loops

    @functools.cached_property
    def code(self) -> GeneratedCode:
        """The LLVM modules rendered from the loops: the entry's and one per distinct kernel."""
        loops = self.loops
        with self.step("codegen"):
            return generate_module(loops, self.plan, self.triple, self.blas, self.layout,
                                   self.profile, self.checked, self.error_record)

    @property
    def llvm_ir(self) -> str:
        """The LLVM IR text of every module, rendered from the loops (before LLVM's optimizer)."""
        return self.code.text

    @property
    def sites(self) -> Sites | None:
        """The checked accesses (codegen.bounds.Sites): the bounds-checked mode's, and the index
        checks of gather and scatter; None when there are none."""
        return self.code.sites
