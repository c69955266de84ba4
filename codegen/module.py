"""The LLVM module of a loop program (ir/loops.py): its kernels (codegen/render_kernel.py), the entry
point that calls them in order -- a kernel whose range is split across threads through the
templates/parallel.ll.j2 wrapper in the entry's module, which calls the thread pool's
`tracer_parallel` (runtime/pool.py registers it) -- and the fast entry that takes numpy array
objects."""
from __future__ import annotations

import functools
import hashlib
import re
from typing import Callable, Iterable, NamedTuple

from tracer.codegen.bounds import Sites
from tracer.codegen.lowering import OUT_OF_LINE
from tracer.codegen.gemm_symbols import gemm_declarations
from tracer.codegen.render_kernel import (ALL_REDUCE_DECLARATIONS, HOST_CALLBACK_DECLARATION,
                                    record_register, render_kernel)
from tracer.codegen.symbols import LIBRARY_CALLS_MARK, QUICK_MARK
from tracer.codegen.template_environment import render
from tracer.ir.loops import (AllReduce, Buffer, CheckIndex, Gemm, HostCall, Loop, LoopKernel,
                             LoopProgram, nested_statements)
from tracer.ir.memory import Location, MemoryPlan


def buffer_register(buffer: Buffer) -> str:
    """The entry's register pointing where a kernel's buffer starts for it (its shift on)."""
    if buffer.location.kind == "arena":
        return f"%tmp.{buffer.location.index + buffer.shift * buffer.value.dtype.itemsize}"
    register = location_register(buffer.location)
    return f"{register}.from.{buffer.shift}" if buffer.shift else register


def location_register(location: Location) -> str:
    return {"parameter": "%param", "output": "%output", "arena": "%tmp"}[location.kind] + \
        f".{location.index}"


C_CONTIGUOUS, WRITEABLE = 0x1, 0x400  # numpy's NPY_ARRAY_* flag bits


def fast_entry(plan: MemoryPlan, shapes: list[tuple[int, ...]], parameter_bytes: list[int],
               layout: NamedTuple) -> str:
    """`tracer_fast`, a METH_FASTCALL function (runtime/native.py makes it a builtin, bound to
    the tuple (0, 1, list, numpy.ndarray, each parameter's dtype)), called with a list of the
    parameters' arrays, a list of the outputs' arrays and the arena's address (an int). It
    reads each array's data pointer from the object (`layout`: the byte offsets of
    runtime.code_settings.ObjectLayout) and runs the entry, with the GIL released, if the list
    holds one ndarray (not a subclass) per parameter, of its shape and of its very dtype object,
    C-contiguous, and every parameter written in place is writeable and shares no byte with
    another parameter; it returns 0, or 1 having done nothing (the caller then takes the general
    path). The outputs are the caller's own arrays of the right shapes and dtypes."""
    written = sorted(set(plan.in_place.values()))
    return render("fast_entry.ll.j2", objects=len(parameter_bytes) + len(plan.output_slots),
                  parameters=len(parameter_bytes), parameter_bytes=parameter_bytes,
                  shapes=shapes, targets_written=written,
                  targets=[t for t in written if parameter_bytes[t]],  # an empty one overlaps nothing
                  layout=layout, contiguous=C_CONTIGUOUS, writeable=WRITEABLE)


class GeneratedCode(NamedTuple):
    """A program's LLVM IR as separate modules: the entry module (`tracer_entry`, the fast entry,
    the profiling counters) and one module per distinct kernel, which the entry calls by its
    symbol. A kernel module's text does not depend on the program around it (its kernel is named
    `kernel`, its loop metadata numbered from 0), and its exported symbol is named after a hash of
    that text, so identical kernels (the same layer repeated, the same step at another batch
    size) are one module, compiled once and cached on their own (runtime/kernels.py)."""
    entry: str
    kernels: list[KernelModule]
    sites: Sites | None

    @property
    def text(self) -> str:
        """Every module's text, the entry's first (the `llvm` stage before LLVM's optimizer)."""
        return "\n".join([self.entry, *(kernel.text for kernel in self.kernels)])


class KernelModule(NamedTuple):
    symbol: str  # `void symbol(ptr buffers...)`: runs the kernel on its whole range
    text: str


KERNEL_NAME = "kernel"  # every kernel's name in its own module

# A definition of the header: a function (from `define` to the `}` that starts a line) or a
# private constant (its line and the indented lines after it: a table's rows); and a reference
# to a global name.
_DEFINITION = re.compile(r"^define [^@\n]*@(?P<function>[\w.]+)\(.*?^}\n?"
                         r"|^@(?P<constant>[\w.]+) = private [^\n]*(?:\n  [^\n]*)*\n?",
                         re.MULTILINE | re.DOTALL)
_REFERENCE = re.compile(r"@([\w.]+)")


@functools.lru_cache(maxsize=8)
def _header_parts(header: str) -> tuple[list[str | None], dict[str, tuple[int, frozenset[str]]]]:
    """`header` as pieces, each definition a None in the text that holds its place, and each
    definition's name with its piece's index and the names it refers to."""
    pieces: list[str | None] = []
    definitions: dict[str, tuple[int, frozenset[str]]] = {}
    start = 0
    for match in _DEFINITION.finditer(header):
        pieces.append(header[start:match.start()])
        name = match.group("function") or match.group("constant")
        definitions[name] = (len(pieces), frozenset(_REFERENCE.findall(match.group())))
        pieces.append(match.group())
        start = match.end()
    pieces.append(header[start:])
    return pieces, definitions


def header_for(header: str, body: str) -> str:
    """`header` with only the definitions that `body` refers to, directly or through another.
    LLVM parses and optimizes every function of a module before it drops an unused internal one:
    the 15 math functions every kernel module carried took 6% of the GPT step's kernel compile
    time (3.54 s CPU against 3.32 s without them, each module compiled both ways in turn) and 3.7
    MB of LLVM text against 1.1 MB, which a compiled signature keeps. The tables of sin and cos
    (10 KB of text) then took two thirds of what was left of most modules' text, and of the time
    LLVM took to parse them."""
    pieces, definitions = _header_parts(header)
    wanted, pending = set(), [name for name in _REFERENCE.findall(body) if name in definitions]
    while pending:
        name = pending.pop()
        if name not in wanted:
            wanted.add(name)
            pending.extend(n for n in definitions[name][1] if n in definitions)
    dropped = {definitions[name][0] for name in definitions.keys() - wanted}
    return "".join(piece for index, piece in enumerate(pieces) if index not in dropped)


# A call of a math function of templates/math.ll.j2 (`@tracer.exp.f32`), kept out of line or not.
_MATH_CALL = re.compile(rf"call [^@\n]*@(tracer\.[\w.]+)\([^\n]*\)( {OUT_OF_LINE})?$", re.MULTILINE)
# The attribute group (templates/kernel_header.ll.j2) of a math function every call of which in
# its module is kept out of line: computed once per call of the kernel (a value no loop changes),
# it is left unoptimized, compiled by LLVM's quick code generator (its callees still inlined into
# it); still free of memory effects, so that LLVM hoists its calls out of the loops, which
# vectorize. AdamW's bias corrections (`beta ** step`, a pow of float64) so took 64 ns a call
# instead of 44, with the same bits; the 6 modules of the GPT step that call it, 298 ms of LLVM's
# CPU time instead of 395.
OUT_OF_LINE_ONLY = "#5"


def unoptimized_out_of_line(text: str) -> str:
    """`text` with each math function that is only called out of line given OUT_OF_LINE_ONLY."""
    inline, out_of_line = set(), set()
    for name, kept in _MATH_CALL.findall(text):
        (out_of_line if kept else inline).add(name)
    for name in out_of_line - inline:
        text = re.sub(rf"^(define internal [^@\n]*@{re.escape(name)}\([^\n]*\)) #0 {{",
                      rf"\1 {OUT_OF_LINE_ONLY} {{", text, count=1, flags=re.MULTILINE)
    return text


def calls_libraries_only(kernel: LoopKernel, blas: bool) -> bool:
    """Whether each statement of `kernel` is a call of a library: a BLAS gemm, MPI, a host
    callback (whose code is compiled as the entry's: see symbols.LIBRARY_CALLS_MARK)."""
    return all(isinstance(statement, (AllReduce, HostCall)) or (isinstance(statement, Gemm) and blas)
               for statement in kernel.body)


# Kernels doing together at most this fraction of their program's work (counted in statements
# executed) are compiled with LLVM's quick pipeline (QUICK_MARK): the GPT step's 9 smallest
# kernel modules (0.03% of its work: AdamW's updates of 192-element parameters) took 246 ms of
# LLVM's CPU time at O3 and 95 ms so, each then running in ~13 us instead of 3 (+0.03% of the
# step). A statement of scalar code costs more than one of vectorized code: at 0.1% a small
# CNN's row kernel of 12,544 statements (0.1% of its work) ran in 12-15 us instead of 3-4 (0.4%
# of its step); at 0.05% it keeps O3, and what is left quick costs the step < 0.1%.
QUICK_FRACTION = 5e-4


def executed_statements(kernel: LoopKernel) -> int:
    """How many statements running `kernel` on its whole range executes, each loop's latch
    counted, a gemm or library call counted as one (its work is the library's), and a row
    kernel's loop over one chunk's rows (whose bounds are registers) its share of the rows."""
    def count(statements: list) -> int:
        total = 0
        for statement in statements:
            if isinstance(statement, Loop):
                bounds = [kernel.extent if bound == "end" else 0 if bound == "begin" else bound
                          for bound in (statement.begin, statement.end)]
                if any(isinstance(bound, str) for bound in bounds):
                    trips = -(-kernel.rows // max(kernel.extent, 1))
                else:
                    trips = max(bounds[1] - bounds[0], 0)
                total += trips * (1 + count(statement.body))
            else:
                total += 1
        return total
    return count(kernel.body)


def quick_kernels(program: LoopProgram) -> set[int]:
    """The positions of the kernels compiled with LLVM's quick pipeline: the least work first,
    while their work together is within QUICK_FRACTION of the program's. Their code runs slower
    (scalar, without LLVM's loop optimizations), in a part of the program's time too small to
    matter; a program whose kernels all do similar work has none."""
    return quick_positions([executed_statements(kernel) for kernel in program.kernels])


def quick_positions(work: list[int]) -> set[int]:
    """quick_kernels of the kernels doing `work` (executed_statements), in order."""
    budget, chosen = QUICK_FRACTION * sum(work), set()
    for position in sorted(range(len(work)), key=work.__getitem__):
        budget -= work[position]
        if budget < 0:
            break
        chosen.add(position)
    return chosen


def kernel_module(body: str, pointers: int, call: str, parallel: bool, metadata: list[str],
                  header: str, mark: str | None = None) -> KernelModule:
    """The module of one kernel rendered as KERNEL_NAME (`body`: its function and those it calls):
    `header` (the declarations and math functions every module has) cut to what `body` uses,
    `body`, and the exported function that makes `call` (the kernel on its whole range), named
    after the module's hash; first, if given, the line `mark` (LIBRARY_CALLS_MARK or QUICK_MARK:
    how it is compiled). A kernel split across threads (`parallel`) is the exported function,
    run on each chunk by a wrapper in the entry's module: kernels alike but for their extent or
    chunks are one module, with no wrapper (LLVM's code generator took ~1 ms for each function,
    however small: 6% of the GPT step's kernel compile). (Rendered as KERNEL_NAME: renaming each
    kernel's text by a regular expression took a third of the GPT step's render.)"""
    placeholder = "tracer_kernel_"
    if parallel:
        functions = [body.replace(f"define internal void @{KERNEL_NAME}(",
                                  f"define void @{placeholder}(", 1)]
    else:
        arguments = ", ".join(f"ptr %b{i}" for i in range(pointers))
        functions = [body, f"define void @{placeholder}({arguments}) #6 {{\nentry:\n"
                           f"  {call}\n  ret void\n}}"]
    text = unoptimized_out_of_line(
        "\n\n".join([header_for(header, body), *functions, *metadata]) + "\n")
    if mark is not None:
        text = f"{mark}\n{text}"
    symbol = placeholder + hashlib.sha256(text.encode()).hexdigest()[:32]
    return KernelModule(symbol, text.replace(f"@{placeholder}(", f"@{symbol}("))


class Scheduling(NamedTuple):
    """A program's kernels as they are scheduled (runtime/pipeline.py appends each to the
    program's list too), and what is known of them before: their kinds (the fused kernels')."""
    kernels: Iterable[LoopKernel]
    kinds: frozenset[str]


class RenderedKernel(NamedTuple):
    """The arguments of kernel_module for one kernel, but the header and its mark, and more."""
    body: str
    pointers: int
    call: str | None  # (None: a kernel split across threads is the exported function)
    parallel: bool
    metadata: list[str]
    library: bool  # calls_libraries_only: marked LIBRARY_CALLS_MARK, whatever its work
    work: int  # executed_statements
    chunks: int  # (and threads: how the entry's thread-pool wrapper splits it)
    threads: int


def module_header(triple: str, blas: bool, kinds: frozenset[str], record: bool) -> str:
    """The declarations and math functions every kernel module of a program starts from."""
    declarations = []
    if "all_reduce" in kinds:
        declarations.extend(ALL_REDUCE_DECLARATIONS)
    if "host_callback" in kinds:
        declarations.append(HOST_CALLBACK_DECLARATION)
    if blas:
        declarations.extend(gemm_declarations())
    return render("kernel_header.ll.j2", triple=triple, declarations=declarations, record=record)


def render_module_parts(kernel: LoopKernel, blas: bool, sites: Sites | None) -> RenderedKernel:
    """`kernel` rendered as KERNEL_NAME."""
    if sites is None and any(isinstance(s, CheckIndex) for s in nested_statements(kernel.body)):
        raise ValueError(f"{kernel.name} checks indices without an error record")
    metadata: list[str] = []
    body = render_kernel(kernel, blas, sites, metadata, KERNEL_NAME)
    pointers = len(record_register(sites)) + len(kernel.buffers)
    parallel = kernel.threads > 1
    call = None if parallel else (f"call void @{KERNEL_NAME}("
                                  f"{''.join(f'ptr %b{i}, ' for i in range(pointers))}"
                                  f"i64 0, i64 {kernel.extent})")
    return RenderedKernel(body, pointers, call, parallel, metadata,
                          calls_libraries_only(kernel, blas), executed_statements(kernel),
                          kernel.chunks, kernel.threads)


def generate_module(program: LoopProgram, plan: MemoryPlan, triple: str, blas: bool,
                    layout: NamedTuple | None = None, profile: bool = False,
                    checked: bool = False, error_record: bool = False,
                    on_kernel: Callable[[KernelModule], None] | None = None,
                    scheduling: Scheduling | None = None) -> GeneratedCode:
    """The LLVM IR of the whole function (the program scheduled on `plan`) and, with an
    `error_record` (RECORD_BYTES at byte plan.arena_size of the arena, which the runtime sizes and
    reads: the code is `checked`, every access, or may check an index), the table of its checked
    accesses.
    With `blas`, matmuls call the gemm the runtime registers. With `profile`, the entry counts
    each kernel's calls and nanoseconds in the global @tracer_profile.

    Each kernel is rendered in turn -- with `scheduling`, as soon as it is scheduled -- and each
    distinct kernel module handed to `on_kernel` (runtime/kernels.py compiles it meanwhile) once
    its text is certain: once its mark is. Whether a kernel is quick is the whole program's decision (quick_kernels): a kernel that might be one
    (its work within QUICK_FRACTION of the work so far, which only grows) waits for the end; one
    handed over unmarked that ends up quick (its work outweighed the program's first kernels, but
    not the whole program's) is handed over again with its mark (its first compile wasted)."""
    if scheduling is None:
        scheduling = Scheduling(program.kernels, frozenset(k.kind for k in program.kernels))
    sites = Sites(plan, every_access=checked) if error_record else None
    header = module_header(triple, blas, scheduling.kinds, sites is not None)
    rendered: list[RenderedKernel] = []
    waiting: list[int] = []  # the positions rendered whose module is not made yet
    made: dict[int, KernelModule] = {}  # the others' module, unmarked or LIBRARY_CALLS_MARK
    handed: set[str] = set()

    def hand(module: KernelModule) -> None:
        if module.symbol not in handed:
            handed.add(module.symbol)
            if on_kernel is not None:
                on_kernel(module)

    work = 0
    for kernel in scheduling.kernels:
        parts = render_module_parts(kernel, blas, sites)
        waiting.append(len(rendered))
        rendered.append(parts)
        work += parts.work
        for position in list(waiting):
            kept = rendered[position]
            if kept.library or kept.work > QUICK_FRACTION * work:
                waiting.remove(position)
                made[position] = kernel_module(*kept[:5], header, LIBRARY_CALLS_MARK
                                               if kept.library else None)
                hand(made[position])
    quick = quick_positions([parts.work for parts in rendered])
    kernels: dict[str, KernelModule] = {}
    modules = []
    for position, parts in enumerate(rendered):
        mark = LIBRARY_CALLS_MARK if parts.library else QUICK_MARK if position in quick else None
        module = made.get(position)
        if module is None or mark == QUICK_MARK:
            module = kernel_module(*parts[:5], header, mark)
            hand(module)
        kernels.setdefault(module.symbol, module)
        modules.append(module)
    entry = entry_module(program, plan, triple, layout, profile, checked, sites, rendered,
                         modules)
    return GeneratedCode(entry, list(kernels.values()), sites)


def entry_module(program: LoopProgram, plan: MemoryPlan, triple: str,
                 layout: NamedTuple | None, profile: bool, checked: bool,
                 sites: Sites | None, rendered: list[RenderedKernel],
                 modules: list[KernelModule]) -> str:
    """The entry's module: it calls each kernel's module (`modules`, in order) on its buffers, one
    split across threads through its thread-pool wrapper, which reads the extent at run time."""
    parameters = program.parameters
    slots = [(f"%param.{i}", i) for i in range(len(parameters))]
    slots += [(f"%output.{i}", len(parameters) + i) for i in range(len(program.output_slots))]
    slots.append(("%arena", len(parameters) + len(program.output_slots)))
    # (a buffer's shift, ir/offsets.py, moves its pointer on: a temporary's within the arena)
    arena_offsets = sorted({b.location.index + b.shift * b.value.dtype.itemsize
                            for k in program.kernels for b in k.buffers
                            if b.location.kind == "arena"})
    shifted = sorted({(buffer_register(b), location_register(b.location),
                       b.shift * b.value.dtype.itemsize)
                      for k in program.kernels for b in k.buffers
                      if b.shift and b.location.kind != "arena"})
    calls: list[str] = []
    declarations: dict[str, str] = {}  # by symbol
    # the thread-pool wrappers' short names and definitions, by kernel symbol, chunks and threads
    wrappers: dict[tuple[str, int, int], tuple[str, str]] = {}
    for kernel, parts, module in zip(program.kernels, rendered, modules):
        arguments = [f"ptr {pointer}" for pointer in record_register(sites)
                     + [buffer_register(b) for b in kernel.buffers]]
        types = ["ptr"] * parts.pointers
        callee = module.symbol
        if parts.parallel:  # (the kernel takes its chunk's range)
            types += ["i64", "i64"]
            split = (module.symbol, parts.chunks, parts.threads)
            if split not in wrappers:
                name = f"split.{len(wrappers)}"
                wrappers[split] = (name, render(
                    "parallel.ll.j2", name=name, kernel=module.symbol, buffers=parts.pointers,
                    chunks=parts.chunks, threads=parts.threads))
            callee = f"{wrappers[split][0]}.parallel"
            arguments.append(f"i64 {kernel.extent}")
        calls.append(f"call void @{callee}({', '.join(arguments)})")
        declarations[module.symbol] = f"declare void @{module.symbol}({', '.join(types)}) nounwind"
    if wrappers:
        declarations["tracer_parallel"] = "declare void @tracer_parallel(ptr, ptr, i64, i64) nounwind"
    fast = "" if layout is None else fast_entry(
        plan, [p.type.shape for p in parameters],
        [p.type.size * p.dtype.itemsize for p in parameters], layout)
    return render(
        "module.ll.j2", function_name=program.name, triple=triple,
        declarations=list(declarations.values()),
        definitions=[definition for _, definition in wrappers.values()],
        slots=slots,
        arena_buffers=[(f"%tmp.{offset}", offset) for offset in arena_offsets],
        shifted_buffers=shifted, calls=calls,
        fast_entry=fast, profile=profile, checked=checked, record=sites is not None,
        record_offset=program.arena_size)
