"""Rendering: one kernel of the loop IR (ir/loops.py) becomes one LLVM function.

Each statement becomes its LLVM instructions: a `Compute` is its row of the lowering table
(codegen/lowering.py), a `Loop` the skeleton of templates/loops.ll.j2, a `Load` or `Store` an
`inbounds` GEP and the access, an accumulator a stack slot (promoted to a register by mem2reg), a
`Gemm` a call of the function templates/matmul.ll.j2 renders (BLAS or a loop nest). Loop IR
registers map to LLVM registers one to one, so the structure of the printed `loops` stage is that
of the function. An innermost loop that computes in float32 and in a 64-bit type (a float32 sum
accumulates in float64) asks LLVM for FLOAT32_LANES lanes: LLVM would take the lanes of the
widest type, and run the float32 work (the exponentials of a softmax) at half width.

A `CheckIndex` (a gather's or scatter's index, checked always: an index is data) wraps the index
and puts the `check` of templates/bounds.ll.j2 before its use. In the bounds-checked mode
(`sites.every_access`, TRACER_CHECK_BOUNDS=1) every access also goes through
`KernelRenderer.address`, which puts a `check` before it. Whenever a module has checks (`sites`
given), every kernel takes the error record `%bounds` as its first pointer (codegen/bounds.py).
"""
from __future__ import annotations

from tracer.codegen.bounds import Sites
from tracer.codegen.loop_shapes import divides_counter, unrolled_copies
from tracer.codegen.lowering import LLVM_TYPE, LOWERING, STORAGE_TYPE, Writer, literal
from tracer.codegen.symbols import (ALL_REDUCE_SYMBOL, HOST_CALLBACK_SYMBOL, MPI_HANDLES,
                                    MPI_HANDLES_SYMBOL)
from tracer.codegen.gemm_symbols import gemm_symbol
from tracer.codegen.template_environment import macros, render
from tracer.ir.graph import Value
from tracer.ir.loops import (INDEX_OPS, Accumulate, Accumulator, AllReduce, CheckIndex, Compute,
                             Gemm, HostCall, IndexOp, Load, Loop, LoopKernel, Store,
                             nested_statements)
from tracer.ir.types import bool_, float32, float64, int64, is_float

ALL_REDUCE_DECLARATIONS = (f"declare i32 @{ALL_REDUCE_SYMBOL}(ptr, ptr, i32, i64, i64, i64)",
                           f"@{MPI_HANDLES_SYMBOL} = external global [{len(MPI_HANDLES)} x i64]")
HOST_CALLBACK_DECLARATION = f"declare i32 @{HOST_CALLBACK_SYMBOL}(i64, ptr)"
# float32 lanes of the vectors LLVM prefers on x86-64: 256-bit AVX2 registers (also on AVX-512
# CPUs, where LLVM prefers 256 bits); elsewhere LLVM splits them into the registers there are.
FLOAT32_LANES = 8
# Loads beyond which a loop gets no hint: LLVM needs run-time pointer checks between so many
# accesses that it does not vectorize it anyway, and says so on stderr when asked to (a 16 x 16
# max pooling window: 256 loads).
HINTED_LOADS = 64
# float32 functions of templates/math.ll.j2 that compute (in part) in float64.
WIDENED_FLOAT32_MATH = frozenset({"sin", "cos", "pow"})
# A loop holding loops that fully unrolled would copy their bodies more than this many times is
# not unrolled (see KernelRenderer.loop_hint).
UNROLLED_COPIES = 16
UNROLL_DISABLE = '!{!"llvm.loop.unroll.disable"}'  # the loop property (see KernelRenderer.loop_hint)
NOT_INTERLEAVED = '!{!"llvm.loop.interleave.count", i32 1}'  # (see KernelRenderer.loop_hint)
# The float32 matmul fallback sums a row of C in float64 this many columns at a time.
MATMUL_BLOCK = 256
# Offsets never wrap (nsw lets LLVM's scalar evolution see strides); the unsigned division,
# remainder and comparison are those of a padded position (see ir/schedule_index.py).
INDEX_INSTRUCTIONS = {"add": "add nsw i64", "sub": "sub i64", "mul": "mul nsw i64",
                      "div": "udiv i64", "rem": "urem i64", "lt": "icmp ult i64",
                      "eq": "icmp eq i64", "and": "and i1"}
assert {*INDEX_INSTRUCTIONS, "select"} == set(INDEX_OPS)


def record_register(sites: Sites | None) -> list[str]:
    """The error record's register, first among a kernel's pointers whenever the module checks."""
    return [] if sites is None else ["%bounds"]


class KernelRenderer:
    """Writes the LLVM function of one loop IR kernel."""

    def __init__(self, kernel: LoopKernel, blas: bool, sites: Sites | None,
                 metadata: list[str], function_name: str):
        self.kernel = kernel
        self.function_name = function_name  # in the text; the checked sites keep kernel.name
        self.blas = blas
        self.sites = sites
        self.metadata = metadata  # the module's numbered metadata (loop hints), appended to
        self.w = Writer()
        # loop IR register -> LLVM register; the kernel's range, which index operations may read
        self.registers: dict[str, str] = {"begin": "%begin", "end": "%end"}
        self.accumulators: dict[str, tuple[str, str]] = {}  # name -> (stack slot, LLVM type)
        self.functions: list[str] = []  # the gemm function a Gemm calls
        # The registers whose value no loop changes: computed from literals and from loads at
        # fixed offsets of buffers the kernel does not write (see lowering.Writer.invariant).
        self.invariant: set[str] = set()
        self.written = {s.buffer for s in nested_statements(kernel.body) if isinstance(s, Store)}

    def is_invariant(self, operands) -> bool:
        return all(not isinstance(x, str) or x in self.invariant for x in operands)

    def operand(self, operand, dtype) -> str:
        """An operand as an LLVM value of `dtype` (an accumulator is read where it is used)."""
        if isinstance(operand, str):
            if operand in self.accumulators:
                slot, t = self.accumulators[operand]
                return self.w.value(f"load {t}, ptr {slot}")
            return self.registers[operand]
        return literal(operand, dtype)

    def bound(self, bound) -> str:
        """A loop bound: an int, the kernel's %begin or %end, or an index register."""
        if bound in ("begin", "end"):
            return f"%{bound}"
        return self.index(bound)

    def index(self, operand) -> str:
        return self.registers[operand] if isinstance(operand, str) else str(operand)

    def address(self, buffer: str, value: Value, offset, access: str, line: str) -> str:
        """A pointer to element `offset` of `buffer`: every load and store comes here, so in the
        bounds-checked mode this is where its check is emitted."""
        offset = self.index(offset)
        if self.sites is not None and self.sites.every_access:
            site = self.sites.add(self.kernel.name, value, access, line)
            check = macros("bounds.ll.j2").check
            self.w.raw(str(check(self.w.label("bounds"), site, offset, value.type.size)))
        return self.w.value(f"getelementptr inbounds {STORAGE_TYPE[value.dtype]}, ptr %{buffer}, "
                            f"i64 {offset}", "p")

    def render(self, statements: list) -> None:
        for statement in statements:
            if isinstance(statement, Loop):
                name = self.w.label("L")
                counter = f"%{name}.i"
                self.w.allocas.append(f"{counter}.addr = alloca i64")
                begin, end = (self.bound(b) for b in (statement.begin, statement.end))
                self.w.raw(macros("loops.ll.j2").loop_open(name, counter, begin, end))
                self.registers[statement.counter] = counter
                self.render(statement.body)
                self.w.raw(macros("loops.ll.j2").loop_close(name, counter,
                                                            self.loop_hint(statement)))
            elif isinstance(statement, IndexOp):
                self.registers[statement.target] = self.index_op(statement)
                if self.is_invariant(statement.operands):
                    self.invariant.add(statement.target)
            elif isinstance(statement, CheckIndex):
                self.registers[statement.target] = self.checked_index(statement)
            elif isinstance(statement, Compute):
                operands = [self.operand(x, d) for x, d in zip(statement.operands,
                                                               statement.in_dtypes)]
                self.w.invariant = self.is_invariant(statement.operands)
                self.registers[statement.target] = LOWERING[statement.primitive].emit(
                    self.w, list(statement.in_dtypes), statement.dtype, operands,
                    statement.attributes)
                if self.w.invariant:
                    self.invariant.add(statement.target)
                self.w.invariant = False
            elif isinstance(statement, Load):
                self.registers[statement.target] = self.load(statement)
                if statement.buffer not in self.written and self.is_invariant([statement.offset]):
                    self.invariant.add(statement.target)
            elif isinstance(statement, Store):
                self.store(statement)
            elif isinstance(statement, Accumulator):
                t = LLVM_TYPE[statement.dtype]
                slot = self.w.alloca(t, "acc")
                self.w.emit(f"store {t} {self.operand(statement.initial, statement.dtype)}, "
                            f"ptr {slot}")
                self.accumulators[statement.name] = (slot, t)
            elif isinstance(statement, Accumulate):
                self.accumulate(statement)
            elif isinstance(statement, Gemm):
                self.gemm(statement)
            elif isinstance(statement, AllReduce):
                self.all_reduce(statement)
            elif isinstance(statement, HostCall):
                self.host_call(statement)
            else:
                raise TypeError(f"not a loop IR statement: {statement!r}")

    def loop_hint(self, loop: Loop) -> str:
        """The loop's metadata, as the latch branch's suffix ("" if none): how far LLVM may unroll
        it, and how many lanes to vectorize it with (`vector_lanes`).

        LLVM may not unroll a loop around loops that, fully unrolled, would make many copies of
        their bodies (UNROLLED_COPIES): it unrolled the loops around a copy of the GPT step's
        heads (6 x 128 rows of 32 floats, each row a memcpy once LLVM saw it) into 72 memcpy
        calls, which took 76 ms of the kernel's 143 to compile and nothing to run. Nor, once it
        has vectorized it, an innermost loop of two vectors' iterations or more: it fully
        unrolled vectorized rows of a few hundred floats (a row of 192: 24 copies of the vector
        body): compiling the GPT step's 55 optimized kernel modules took 5.11 billion
        instructions so, 4.13 without, and no kernel ran slower. Not forbidding the unrolling before (`llvm.loop.unroll.disable` would) keeps the
        vectorizer's own choice of how many vectors to interleave, which a sum needs for its
        partial sums (with one, a float64 sum of 100,000 terms missed test_large_sum_accuracy's
        bound). Short loops and the loops around them are unrolled, vectorized across copies: a
        small CNN's pooling and convolution loops (windows of 2 to 8) ran 8% slower without,
        some kernels 2-5x; and so are loops that divide their counter (a merge of heads: a row
        of 192 read as 6 x 32), which unrolled lose their division and read whole vectors.
        Such a loop without a reduction, whose iterations are independent, runs one vector an
        iteration (NOT_INTERLEAVED): the GPT step's 65 optimized kernel modules took 3.96 billion
        instructions to compile instead of 4.31, its 114 such kernels the same time. If its
        bounds are fixed, LLVM may not unroll it before vectorizing either: it unrolled each row
        of 32 floats of a head merge (ir/loop_split.py) whole, then vectorized the loop around
        the copies, in 122 of the module's 268 ms (llvm.set_time_passes)."""
        properties = []
        if any(isinstance(statement, Loop) for statement in loop.body):
            if unrolled_copies(loop.body) > UNROLLED_COPIES:
                properties.append(self.metadata_node(UNROLL_DISABLE))
        elif not few_iterations(loop) and not divides_counter(loop):
            not_unrolled = self.metadata_node(UNROLL_DISABLE)
            properties.append(self.metadata_node(
                f'!{{!"llvm.loop.vectorize.followup_all", {not_unrolled}}}'))
            if not any(isinstance(statement, Accumulate) for statement in loop.body):
                properties.append(self.metadata_node(NOT_INTERLEAVED))
                if isinstance(loop.begin, int) and isinstance(loop.end, int):
                    properties.append(not_unrolled)
        if self.vector_lanes(loop):
            properties.append(self.metadata_node(
                f'!{{!"llvm.loop.vectorize.width", i32 {FLOAT32_LANES}}}'))
        if not properties:
            return ""
        number = len(self.metadata)
        self.metadata.append(f"!{number} = distinct !{{!{number}, {', '.join(properties)}}}")
        return f", !llvm.loop !{number}"

    def metadata_node(self, text: str) -> str:
        """`text` numbered among the module's metadata; its name (!N)."""
        self.metadata.append(f"!{len(self.metadata)} = {text}")
        return f"!{len(self.metadata) - 1}"

    def vector_lanes(self, loop: Loop) -> bool:
        """Whether to ask for FLOAT32_LANES lanes for an innermost loop that computes in float32
        and in a 64-bit type. Not for a loop with checks, which returns early, nor one of too
        many loads (HINTED_LOADS): LLVM cannot vectorize them, and reports a hinted loop it
        cannot vectorize (on stderr); nor for a loop of fewer than two vectors' iterations, where
        the hint buys nothing (the 8 columns of an 8 x 8 pooling window's gradient: LLVM could
        not vectorize it either)."""
        if (few_iterations(loop) or any(isinstance(s, (Loop, CheckIndex)) for s in loop.body)
                or (self.sites is not None and self.sites.every_access)
                or sum(isinstance(s, Load) for s in loop.body) > HINTED_LOADS):
            return False
        types = {s.dtype for s in loop.body if isinstance(s, (Compute, Accumulate))}
        types |= {s.value.dtype for s in loop.body if isinstance(s, (Load, Store))}
        types |= {float64 for s in loop.body
                  if isinstance(s, Compute) and s.primitive in WIDENED_FLOAT32_MATH}
        return float32 in types and bool(types & {float64, int64})

    def index_op(self, statement: IndexOp) -> str:
        operands = [self.index(x) for x in statement.operands]
        if statement.op == "select":
            condition, on_true, on_false = operands
            return self.w.value(f"select i1 {condition}, i64 {on_true}, i64 {on_false}", "i")
        a, b = operands
        return self.w.value(f"{INDEX_INSTRUCTIONS[statement.op]} {a}, {b}", "i")

    def checked_index(self, statement: CheckIndex) -> str:
        """The index (wrapped into [0, size) if negative, where negative indices count from the
        end) checked with one unsigned comparison, so a negative one left unwrapped fails; a failure records the index as read and returns from the kernel."""
        position, size = self.index(statement.position), statement.size
        wrapped = wrap_index(self.w, position, size) if statement.wrap else position
        site = self.sites.add_index(self.kernel.name, statement.operand, statement.axis, size,
                                    statement.line)
        self.w.raw(str(macros("bounds.ll.j2").check(self.w.label("index"), site, wrapped, size,
                                                    position)))
        return wrapped

    def load(self, statement: Load) -> str:
        value = statement.value
        pointer = self.address(statement.buffer, value, statement.offset, "read", statement.line)
        loaded = self.w.value(f"load {STORAGE_TYPE[value.dtype]}, ptr {pointer}, "
                              f"align {value.dtype.itemsize}")
        if value.dtype == bool_:  # one byte in memory, i1 in registers
            return self.w.value(f"icmp ne i8 {loaded}, 0")
        return loaded

    def store(self, statement: Store) -> None:
        value = statement.value
        register = self.operand(statement.operand, value.dtype)
        pointer = self.address(statement.buffer, value, statement.offset, "write", statement.line)
        if value.dtype == bool_:
            register = self.w.value(f"zext i1 {register} to i8")
        self.w.emit(f"store {STORAGE_TYPE[value.dtype]} {register}, ptr {pointer}, "
                    f"align {value.dtype.itemsize}")

    def accumulate(self, statement: Accumulate) -> None:
        dtype = statement.dtype
        slot, t = self.accumulators[statement.name]
        accumulated = self.w.value(f"load {t}, ptr {slot}")
        element = self.operand(statement.operand, dtype)
        if statement.primitive == "add" and is_float(dtype):
            # reassociable, so the loop vectorizer may keep several partial sums
            combined = self.w.value(f"fadd reassoc contract {t} {accumulated}, {element}")
        else:
            if is_float(dtype):
                # frozen, so that InstCombine cannot fold a select of -inf or +inf feeding the
                # maximum (a masked softmax's row max) into a select of the accumulator, which
                # the loop vectorizer does not take for a reduction: that row max ran scalar (a
                # masked softmax over 16x6x128x128 took 5.5 ms on one thread, 3.6 with the
                # freeze, which costs nothing for a value that is not poison)
                element = self.w.value(f"freeze {t} {element}")
            combined = LOWERING[statement.primitive].emit(self.w, [dtype, dtype], dtype,
                                                          [accumulated, element], {})
        self.w.emit(f"store {t} {combined}, ptr {slot}")

    def gemm(self, gemm: Gemm) -> None:
        """A call of the kernel's gemm function on the kernel's range of tasks."""
        name = f"{self.function_name}.gemm"
        buffers = {b.name: b.value for b in self.kernel.buffers}
        values = {"a": buffers[gemm.a], "b": buffers[gemm.b], "c": gemm.result}
        # a plain matmul kernel is its gemm: its accesses are named after the kernel
        site_name = f"{self.kernel.name}.gemm" if gemm.accumulate else self.kernel.name
        self.functions.append(render_matmul(name, site_name, gemm, values, self.blas, self.sites))
        pointers = record_register(self.sites) + [f"%{b}" for b in (gemm.a, gemm.b, gemm.c)]
        alpha = (f"{LLVM_TYPE[gemm.dtype]} {self.operand(gemm.alpha, gemm.dtype)}, "
                 if gemm.accumulate else "")
        arguments = "".join(f"ptr {p}, " for p in pointers)
        self.w.emit(f"call void @{name}({arguments}{alpha}i64 %begin, i64 %end)")


    def all_reduce(self, statement: AllReduce) -> None:
        """One MPI_Allreduce(source, target, count, datatype, op, MPI_COMM_WORLD)."""
        if statement.count >= 1 << 31:  # MPI's count is an int
            raise ValueError(f"all_reduce of {statement.count} elements: MPI counts to 2**31 - 1")
        handles = []
        for name in ("float32" if statement.dtype == float32 else
                     "float64" if statement.dtype == float64 else "int64", statement.op, "comm_world"):
            slot = self.w.value(f"getelementptr inbounds i64, ptr @{MPI_HANDLES_SYMBOL}, "
                                f"i64 {MPI_HANDLES.index(name)}", "p")
            handles.append(self.w.value(f"load i64, ptr {slot}", "h"))
        self.w.emit(f"call i32 @{ALL_REDUCE_SYMBOL}(ptr %{statement.source}, "
                    f"ptr %{statement.target}, i32 {statement.count}, i64 {handles[0]}, "
                    f"i64 {handles[1]}, i64 {handles[2]})")


    def host_call(self, statement: HostCall) -> None:
        """The dispatcher called with the callback's number and its buffers; a failure (the
        status, as the offset) goes to the error record through the `check` of bounds.ll.j2, so
        the entry runs no later kernel."""
        buffers = [*statement.operands, *statement.results]
        array = self.w.alloca(f"[{len(buffers)} x ptr]", "buffers")
        for position, name in enumerate(buffers):
            slot = self.w.value(f"getelementptr inbounds [{len(buffers)} x ptr], ptr {array}, "
                                f"i64 0, i64 {position}", "p")
            self.w.emit(f"store ptr %{name}, ptr {slot}, align 8")
        status = self.w.value(f"call i32 @{HOST_CALLBACK_SYMBOL}(i64 {statement.callback.number}, "
                              f"ptr {array})", "status")
        widened = self.w.value(f"zext i32 {status} to i64", "status")
        site = self.sites.add_callback(self.kernel.name, statement.callback, statement.line)
        self.w.raw(str(macros("bounds.ll.j2").check(self.w.label("callback"), site, widened, 1)))


def few_iterations(loop: Loop) -> bool:
    """Whether `loop` runs a fixed number of iterations, fewer than two vectors' worth."""
    return (isinstance(loop.begin, int) and isinstance(loop.end, int)
            and loop.end - loop.begin < 2 * FLOAT32_LANES)


def wrap_index(w: Writer, position: str, size: int) -> str:
    """`position` + `size` if `position` is negative, else `position` (an index counted from the
    end, as numpy and PyTorch allow)."""
    negative = w.value(f"icmp slt i64 {position}, 0")
    shifted = w.value(f"add i64 {position}, {size}", "i")
    return w.value(f"select i1 {negative}, i64 {shifted}, i64 {position}", "i")


def render_matmul(name: str, site_name: str, gemm: Gemm, values: dict[str, Value], blas: bool,
                  sites: Sites | None) -> str:
    """The function `name` computing c (= or += alpha *) a @ b on a range of tasks (blocks of
    rows or of columns of the batch's products)."""
    block = min(gemm.n, MATMUL_BLOCK)
    checks = None
    if sites is not None and sites.every_access:
        c_access = "read-modify-write" if gemm.accumulate else "write"
        checks = {"a": (sites.add(site_name, values["a"], "read", gemm.line), values["a"].type.size),
                  "b": (sites.add(site_name, values["b"], "read", gemm.line), values["b"].type.size),
                  "c": (sites.add(site_name, values["c"], c_access, gemm.line),
                        values["c"].type.size),
                  "accumulator": (sites.add_internal(site_name, "the float64 row accumulator",
                                                     block, "read-modify-write", gemm.line), block)}
    return render(
        "matmul.ll.j2", name=name, type=LLVM_TYPE[gemm.dtype], m=gemm.m, n=gemm.n, k=gemm.k,
        blocks=gemm.blocks, rows=max(gemm.rows, 1), columns=gemm.columns,
        size=gemm.dtype.itemsize, block=block, transpose_a=gemm.transpose_a,
        transpose_b=gemm.transpose_b, gemm=gemm_symbol(gemm) if blas else None,
        accumulate=gemm.accumulate, checks=checks, record=sites is not None)


def render_kernel(kernel: LoopKernel, blas: bool, sites: Sites | None,
                  metadata: list[str], function_name: str | None = None) -> str:
    """The LLVM function of `kernel` (and the gemm function it calls, if any), named
    `function_name` (kernel.name if not given; the checked sites name kernel.name either way);
    the metadata its loops refer to is appended to `metadata`, the module's."""
    function_name = function_name or kernel.name
    renderer = KernelRenderer(kernel, blas, sites, metadata, function_name)
    renderer.render(kernel.body)
    pointers = record_register(sites) + [f"%{b.name}" for b in kernel.buffers]
    text = str(macros("loops.ll.j2").kernel(function_name, pointers, renderer.w.allocas,
                                            "\n".join(renderer.w.lines)))
    return "\n\n".join([text, *renderer.functions])
