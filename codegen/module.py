"""The LLVM module of a loop program (ir/loops.py): its kernels (codegen/render.py), the entry
point that calls them in order -- a kernel whose range is split across threads through the
templates/parallel.ll.j2 wrapper, which calls the thread pool's `tracer_parallel` (runtime/pool.py
registers it) -- and the fast entry that takes numpy array objects."""
from __future__ import annotations

from tracer.codegen.bounds import Sites
from tracer.codegen.lowering import LLVM_TYPE
from tracer.codegen.render import (ALL_REDUCE_DECLARATIONS, GEMM_SYMBOLS, record_register,
                                    render_kernel)
from tracer.codegen.rendering import render
from tracer.ir.loops import LoopProgram, checks_indices
from tracer.ir.memory import Location, MemoryPlan


def location_register(location: Location) -> str:
    return {"parameter": "%param", "output": "%output", "arena": "%tmp"}[location.kind] + \
        f".{location.index}"


C_CONTIGUOUS, WRITEABLE = 0x1, 0x400  # numpy's NPY_ARRAY_* flag bits


def fast_entry(plan: MemoryPlan, parameter_bytes: list[int], layout: tuple[int, int]) -> str:
    """`i32 tracer_fast(PyArrayObject *parameters..., PyArrayObject *outputs..., ptr arena)`:
    reads each array's data pointer from the object (numpy's public struct: `data` at byte
    layout[0], `flags` at layout[1]), and runs the entry if every parameter is C-contiguous and
    every parameter written in place is writeable and shares no byte with another parameter;
    otherwise it returns 1 having done nothing (the caller then takes the general path). The
    caller has checked that the objects are arrays of the right dtypes and shapes."""
    data, flags = layout
    written = sorted(set(plan.in_place.values()))
    return render("fast_entry.ll.j2", objects=len(parameter_bytes) + len(plan.output_slots),
                  parameters=len(parameter_bytes), parameter_bytes=parameter_bytes,
                  targets_written=written,
                  targets=[t for t in written if parameter_bytes[t]],  # an empty one overlaps nothing
                  data=data, flags=flags, contiguous=C_CONTIGUOUS, writeable=WRITEABLE)


def generate_module(program: LoopProgram, plan: MemoryPlan, triple: str, blas: bool,
                    layout: tuple[int, int] | None = None, profile: bool = False,
                    checked: bool = False, error_record: bool = False) -> tuple[str, Sites | None]:
    """The LLVM IR text of the whole function (the program scheduled on `plan`) and, with an
    `error_record` (RECORD_BYTES at byte plan.arena_size of the arena, which the runtime sizes and
    reads: the code is `checked`, every access, or may check an index), the table of its checked
    accesses.
    With `blas`, matmuls call the gemm the runtime registers. With `profile`, the entry counts
    each kernel's calls and nanoseconds in the global @tracer_profile."""
    if checks_indices(program) and not error_record:
        raise ValueError(f"{program.name} checks indices without an error record")
    sites = Sites(plan, every_access=checked) if error_record else None
    metadata: list[str] = []
    texts = [render_kernel(kernel, blas, sites, metadata) for kernel in program.kernels]
    parameters = program.parameters
    slots = [(f"%param.{i}", i) for i in range(len(parameters))]
    slots += [(f"%output.{i}", len(parameters) + i) for i in range(len(program.output_slots))]
    slots.append(("%arena", len(parameters) + len(program.output_slots)))
    arena_offsets = sorted({b.location.index for k in program.kernels for b in k.buffers
                            if b.location.kind == "arena"})
    calls, parallel = [], []
    for kernel in program.kernels:
        pointers = record_register(sites) + [location_register(b.location)
                                             for b in kernel.buffers]
        arguments = "".join(f"ptr {p}, " for p in pointers)
        if kernel.threads > 1:
            parallel.append(render(
                "parallel.ll.j2", name=kernel.name, buffers=len(pointers), threads=kernel.threads))
            calls.append(f"call void @{kernel.name}.parallel({arguments}i64 {kernel.extent})")
        else:
            calls.append(f"call void @{kernel.name}({arguments}i64 0, i64 {kernel.extent})")
    declarations = []
    if parallel:
        declarations.append("declare void @tracer_parallel(ptr, ptr, i64) nounwind")
    if any(kernel.kind == "all_reduce" for kernel in program.kernels):
        declarations.extend(ALL_REDUCE_DECLARATIONS)
    if blas:
        for dtype, symbol in GEMM_SYMBOLS.items():
            t = LLVM_TYPE[dtype]
            declarations.append(f"declare void @{symbol}(i32, i32, i32, i64, i64, i64, {t}, ptr, "
                                f"i64, ptr, i64, {t}, ptr, i64) nounwind")
    fast = "" if layout is None else fast_entry(
        plan, [p.type.size * p.dtype.itemsize for p in parameters], layout)
    text = render(
        "module.ll.j2", function_name=program.name, triple=triple, declarations=declarations,
        kernels=texts + parallel, slots=slots,
        arena_buffers=[(f"%tmp.{offset}", offset) for offset in arena_offsets], calls=calls,
        fast_entry=fast, profile=profile, checked=checked, record=sites is not None,
        record_offset=program.arena_size, metadata=metadata)
    return text, sites
