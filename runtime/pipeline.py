"""The compiler's pipeline, top to bottom: the stages every compiled signature goes through, each
printable (`f.ir(*args, stage=...)`, `TRACER_DUMP`, the compile report).

The front end (runtime/trace.py) traces and optimizes; the back end (`back_end`, which
runtime/compiled.py runs) fuses, places the buffers in memory, schedules the loops and renders
them to LLVM IR, which LLVM optimizes and compiles.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from tracer.codegen.bounds import Sites, arena_overflow
from tracer.codegen.module import generate_module
from tracer.errors import BoundsError
from tracer.ir.fusion import FusedFunction, fuse
from tracer.ir.graph import Function, gc_paused
from tracer.ir.loops import LoopProgram
from tracer.ir.memory import MemoryPlan, plan_memory
from tracer.ir.schedule import schedule
from tracer.ir.verify import verify_loops

STAGES = (
    "traced",     # the primitives as recorded (tracer/), custom Functions inlined
    "grad",       # the autodiff pass replaced each gradient directive (ir.expand_gradients)
    "optimized",  # dce, cse, constant folding, simplification (ir.optimize)
    "fused",      # the instructions grouped into kernels (ir.fusion)
    "loops",      # the kernels as loop nests over buffers of the memory plan (ir.schedule)
    "llvm",       # the LLVM IR rendered from the loops (codegen/), after LLVM's optimizer
    "asm",        # the machine code for the host CPU
)
# The stages before "fused" are kept as text by the traced function (runtime/trace.py); these are
# printed on demand by the compiled function (runtime/compiled.py).
BACK_END_STAGES = STAGES[STAGES.index("fused"):]
REPORT_STAGES = STAGES[:STAGES.index("asm")]  # side by side in the compile report


@dataclass
class BackEnd:
    """What the back end made of one optimized Function, up to the LLVM IR text."""

    fused: FusedFunction
    plan: MemoryPlan
    loops: LoopProgram
    llvm_ir: str
    sites: Sites | None  # the checked accesses, if any (bounds-checked mode or index checks)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per step


def back_end(function: Function, write_into: dict[int, int] | None, *, blas: bool, threads: int,
             triple: str, layout: tuple[int, int] | None, profile: bool,
             checked: bool) -> BackEnd:
    """Fuse, plan memory, schedule and render `function` (the `optimized` stage)."""
    timings: dict[str, float] = {}
    started = time.perf_counter()

    def lap(step: str) -> None:
        timings[step] = time.perf_counter() - started - sum(timings.values())

    with gc_paused():  # see ir.graph.gc_paused
        fused = fuse(function, matmul_updates=blas)
        lap("fuse")
        plan = plan_memory(fused, write_into)
        lap("memory")
        # The kernels check offsets relative to each buffer's pointer; that the temporaries lie
        # inside the arena is a fact of the plan, checked here once.
        overflow = arena_overflow(fused, plan) if checked else None
        if overflow is not None:
            raise BoundsError(f"compiling {function.name}: {overflow}")
        loops = schedule(fused, plan, threads)
        verify_loops(loops)
        lap("schedule")
        llvm_ir, sites = generate_module(loops, plan, triple, blas, layout, profile, checked)
        lap("codegen")
    return BackEnd(fused, plan, loops, llvm_ir, sites, timings)
