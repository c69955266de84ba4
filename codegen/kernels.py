"""Kernel emission: each kernel of a fused function becomes one LLVM function, and the module gets
one entry point that calls them in order.

A loop kernel is a loop nest over the shape of its results; the body asks for each result "at the
current index", and `KernelEmitter.evaluate` answers recursively: a buffer is loaded at the index's
offset, an elementwise op evaluates its operands at the broadcast-adjusted index, a layout op maps
the index (transpose permutes it, slice scales and shifts it, pad checks it), and a reduction opens
an inner loop. Results are memoized per (value, index) so a value shared by several results of the
kernel is computed once. Loop skeletons, kernel functions, matmul and the entry point are Jinja2
templates in codegen/templates/.

In the bounds-checked mode (`sites.every_access`, TRACER_CHECK_BOUNDS=1) every buffer access goes
through `KernelEmitter.address`, which puts the `check` of templates/bounds.ll.j2 before it. The
indices of gather and scatter are checked always (`KernelEmitter.index_position`). Whenever there
are checks (`sites` given), every kernel takes the error record `%bounds` as its first pointer and
the entry stops after a kernel that failed one (codegen/bounds.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2
import numpy as np

from tracer.codegen.bounds import Sites
from tracer.codegen.lowering import (INT64_MAX, INT64_MIN, LLVM_TYPE, LOWERING, STORAGE_TYPE, Writer,
                              cast, double_hex, literal)
from tracer.ir.fusion import FusedFunction, Kernel, matmul_operand
from tracer.ir.graph import Instruction, Value
from tracer.ir.memory import Location, MemoryPlan
from tracer.ir.passes import scalar_constant
from tracer.ir.primitives import ELEMENTWISE, INDEXING
from tracer.ir.types import bool_, float32, float64, int64, is_float

ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
    undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
ENVIRONMENT.filters["d"] = double_hex
LOOPS = ENVIRONMENT.get_template("loops.ll.j2").module
BOUNDS = ENVIRONMENT.get_template("bounds.ll.j2").module

GEMM_SYMBOLS = {float32: "tracer_sgemm", float64: "tracer_dgemm"}
# The float32 matmul fallback sums a row of C in float64 this many columns at a time.
MATMUL_BLOCK = 256
# A kernel runs on several threads when it does at least this many element operations per thread
# (starting and joining a thread costs some tens of microseconds).
PARALLEL_WORK_PER_THREAD = 1 << 21
FLAT_PRIMITIVES = ELEMENTWISE | {"broadcast", "reshape", "constant"}

Index = tuple  # of LLVM i64 registers (str) and Python ints


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def line_of(value: Value) -> str:
    """The user's line that computed `value` ("" for a parameter)."""
    return "" if value.producer is None else value.producer.location


def is_flat(kernel: Kernel) -> bool:
    """Whether a loop kernel can run as one flat loop over the elements: every value it touches
    has all the elements of the result (in the same row-major order) or just one."""
    count = kernel.shape and int(np.prod(kernel.shape))
    if kernel.kind != "loop" or kernel.shape == ():
        return False
    for instruction in kernel.instructions:
        if instruction.primitive not in FLAT_PRIMITIVES:
            return False
        for value in (*instruction.inputs, *instruction.outputs):
            if value.type.size not in (1, count):
                return False
    return all(v.type.size in (1, count) for v in kernel.inputs)


class KernelEmitter:
    """Writes the body of one loop or accumulate kernel."""

    def __init__(self, fused: FusedFunction, kernel: Kernel, buffers: dict[int, str], name: str,
                 sites: Sites | None):
        self.fused = fused
        self.kernel = kernel
        self.buffers = buffers  # value id -> the kernel parameter register holding its buffer
        self.name = name
        self.sites = sites  # the checked accesses of the module, in the bounds-checked mode
        # the user's line of the instruction being computed, which a checked access names
        self.location = line_of(kernel.results[0])
        self.own = {id(v) for v in kernel.results}
        self.flat = is_flat(kernel)
        self.w = Writer()
        self.memo: list[dict] = [{}]
        self.zeros: set[int] = set()  # values taken as 0 (the product a matmul update adds later)

    # Shapes and index arithmetic (folding Python ints) ---------------------------------------

    def shape_of(self, value: Value) -> tuple[int, ...]:
        return (value.type.size,) if self.flat else value.shape

    def add(self, a, b):
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        if a == 0:
            return b
        if b == 0:
            return a
        return self.w.value(f"add nsw i64 {a}, {b}", "i")

    def mul(self, a, factor: int):
        if isinstance(a, int):
            return a * factor
        if factor == 1:
            return a
        if factor == 0:
            return 0
        return self.w.value(f"mul nsw i64 {a}, {factor}", "i")

    def linear(self, index: Index, shape: tuple[int, ...]):
        offset = 0
        for position, size, stride in zip(index, shape, contiguous_strides(shape)):
            if size != 1:
                offset = self.add(offset, self.mul(position, stride))
        return offset

    @staticmethod
    def broadcast_index(index: Index, shape: tuple[int, ...], operand_shape: tuple[int, ...]):
        lead = len(shape) - len(operand_shape)
        return tuple(0 if size == 1 else index[lead + k] for k, size in enumerate(operand_shape))

    # Memory -----------------------------------------------------------------------------------

    def address(self, buffer: str, value: Value, offset, access: str) -> str:
        """A pointer to element `offset` of the buffer `value` lives in: every load and store
        comes here, so in the bounds-checked mode this is where its check is emitted."""
        if self.sites is not None and self.sites.every_access:
            site = self.sites.add(self.name, value, access, self.location)
            self.w.raw(str(BOUNDS.check(self.w.label("bounds"), site, offset, value.type.size)))
        return self.w.value(f"getelementptr inbounds {STORAGE_TYPE[value.dtype]}, ptr {buffer}, "
                            f"i64 {offset}", "p")

    def load(self, value: Value, offset) -> str:
        pointer = self.address(self.buffers[id(value)], value, offset, "read")
        storage = STORAGE_TYPE[value.dtype]
        loaded = self.w.value(f"load {storage}, ptr {pointer}, align {value.dtype.itemsize}")
        if value.dtype == bool_:
            return self.w.value(f"icmp ne i8 {loaded}, 0")
        return loaded

    def store(self, register: str, value: Value, buffer: str, offset) -> None:
        dtype = value.dtype
        pointer = self.address(buffer, value, offset, "write")
        if dtype == bool_:
            register = self.w.value(f"zext i1 {register} to i8")
        self.w.emit(f"store {STORAGE_TYPE[dtype]} {register}, ptr {pointer}, "
                    f"align {dtype.itemsize}")

    # Loops ------------------------------------------------------------------------------------

    def open_loop(self, begin, end) -> tuple[str, str]:
        name = self.w.label("L")
        counter = f"%{name}.i"
        self.w.allocas.append(f"{counter}.addr = alloca i64")
        self.w.raw(LOOPS.loop_open(name, counter, begin, end))
        return name, counter

    def close_loop(self, loop: tuple[str, str]) -> None:
        self.w.raw(LOOPS.loop_close(*loop))

    def open_nest(self, shape: tuple[int, ...], split: bool) -> tuple[Index, list]:
        """Loops over `shape` (none for size-1 dims); with `split`, the first loop runs
        [%begin, %end) instead of the whole dimension."""
        index, loops = [], []
        for size in shape:
            if size == 1:
                index.append(0)
                continue
            if split and not loops:
                loop = self.open_loop("%begin", "%end")
            else:
                loop = self.open_loop(0, size)
            loops.append(loop)
            index.append(loop[1])
        return tuple(index), loops

    # Evaluation -------------------------------------------------------------------------------

    def evaluate(self, value: Value, index: Index) -> str:
        key = (id(value), index)
        for scope in reversed(self.memo):
            if key in scope:
                return scope[key]
        result = self._evaluate(value, index)
        self.memo[-1][key] = result
        return result

    def _evaluate(self, value: Value, index: Index) -> str:
        if id(value) in self.zeros:
            return literal(0, value.dtype)
        instruction = value.producer
        if instruction is None or (self.fused.is_materialized(value) and id(value) not in self.own):
            return self.load(value, self.linear(index, self.shape_of(value)))
        reader = self.location
        self.location = instruction.location or reader
        result = self.compute(value, index)
        self.location = reader
        return result

    def compute(self, value: Value, index: Index) -> str:
        """`value` at `index`, from its instruction (the loads are of the buffers it reads)."""
        instruction = value.producer
        primitive, attributes = instruction.primitive, instruction.attributes
        inputs = instruction.inputs
        lowering = LOWERING[primitive]
        if lowering.kind == "scalar":
            shape = self.shape_of(value)
            operands = [self.evaluate(x, self.broadcast_index(index, shape, self.shape_of(x)))
                        for x in inputs]
            if primitive == "pow":
                special = self.constant_power(inputs, operands, value.dtype)
                if special is not None:
                    return special
            return lowering.emit(self.w, [x.dtype for x in inputs], value.dtype, operands,
                                 attributes)
        if lowering.kind == "reduction":
            return self.reduce_inline(instruction, index)
        if lowering.kind == "gather":
            x = inputs[0]
            return self.evaluate(x, self.index_position(instruction, x, index))
        if lowering.kind != "index":
            raise NotImplementedError(f"{primitive} cannot be computed inside a loop kernel")
        if primitive == "constant":
            return literal(attributes["value"], value.dtype)
        if primitive == "iota":
            position = index[attributes["dimension"]]
            if isinstance(position, int):
                return literal(position, value.dtype)
            return cast(self.w, int64, value.dtype, position)
        (x,) = inputs
        if primitive == "broadcast":
            return self.evaluate(x, self.broadcast_index(index, self.shape_of(value),
                                                         self.shape_of(x)))
        if primitive == "reshape":
            if self.flat:
                return self.evaluate(x, index)
            if x.producer is None or (self.fused.is_materialized(x) and id(x) not in self.own):
                return self.load(x, self.linear(index, value.shape))
            return self.evaluate(x, self.reshape_index(index, value.shape, x.shape))
        if primitive == "transpose":
            mapped = [0] * len(index)
            for position, axis in zip(index, attributes["permutation"]):
                mapped[axis] = position
            return self.evaluate(x, tuple(mapped))
        if primitive == "slice":
            return self.evaluate(x, tuple(
                self.add(start, self.mul(position, step))
                for position, start, step in zip(index, attributes["starts"], attributes["steps"])))
        if primitive == "pad":
            return self.pad(x, value, index, attributes)
        raise NotImplementedError(primitive)

    def index_position(self, instruction: Instruction, x: Value, index: Index) -> Index:
        """Where a gather reads x (a scatter writes its result) for the element at `index` of its
        result (of its updates): the index operands are read at the leading positions, wrapped
        when negative and checked against their dimension; a failed check records the index and
        returns from the kernel before the access."""
        operands = instruction.inputs[-len(instruction.attributes["axes"]):]
        index_shape = np.broadcast_shapes(*(v.shape for v in operands))
        leading, rest = index[:len(index_shape)], iter(index[len(index_shape):])
        mapped = {}
        for operand, axis in zip(operands, instruction.attributes["axes"]):
            position = self.evaluate(operand, self.broadcast_index(leading, index_shape,
                                                                   operand.shape))
            mapped[axis] = self.checked_index(position, operand, axis, x.shape[axis])
        return tuple(mapped[axis] if axis in mapped else next(rest) for axis in range(len(x.shape)))

    def checked_index(self, position: str, operand: Value, axis: int, size: int) -> str:
        """`position` wrapped into [0, size) if negative, after checking -size <= position < size
        (one unsigned comparison of the wrapped value)."""
        negative = self.w.value(f"icmp slt i64 {position}, 0")
        shifted = self.w.value(f"add i64 {position}, {size}", "i")
        wrapped = self.w.value(f"select i1 {negative}, i64 {shifted}, i64 {position}", "i")
        site = self.sites.add_index(self.name, operand, axis, size, self.location)
        label = self.w.label("index")
        self.w.raw(str(BOUNDS.check(label, site, wrapped, size, position)))
        return wrapped

    def reshape_index(self, index: Index, shape, operand_shape) -> Index:
        kept = [(k, d) for k, d in enumerate(shape) if d != 1]
        operand_kept = [(k, d) for k, d in enumerate(operand_shape) if d != 1]
        if [d for _, d in kept] == [d for _, d in operand_kept]:
            mapped = [0] * len(operand_shape)
            for (k, _), (j, _) in zip(kept, operand_kept):
                mapped[j] = index[k]
            return tuple(mapped)
        flat = self.linear(index, shape)
        mapped = []
        for size, stride in zip(operand_shape, contiguous_strides(operand_shape)):
            if size == 1:
                mapped.append(0)
            elif isinstance(flat, int):
                mapped.append(flat // stride % size)
            else:
                quotient = flat if stride == 1 else self.w.value(f"udiv i64 {flat}, {stride}", "i")
                mapped.append(self.w.value(f"urem i64 {quotient}, {size}", "i"))
        return tuple(mapped)

    def pad(self, x: Value, value: Value, index: Index, attributes) -> str:
        zero = literal(0, value.dtype)
        if x.type.size == 0:
            return zero
        mapped, valid = [], None
        for position, size, out_size, low, gap in zip(index, x.shape, value.shape,
                                                      attributes["low"], attributes["interior"]):
            if isinstance(position, int):
                shifted = position - low
                if gap:
                    ok = shifted >= 0 and shifted % (gap + 1) == 0 and shifted // (gap + 1) < size
                    mapped.append(shifted // (gap + 1) if ok else 0)
                else:
                    ok = 0 <= shifted < size
                    mapped.append(shifted if ok else 0)
                if not ok:
                    return zero
                continue
            if low == 0 and gap == 0 and out_size == size:
                mapped.append(position)
                continue
            shifted = self.w.value(f"sub i64 {position}, {low}", "i") if low else position
            if gap:
                quotient = self.w.value(f"udiv i64 {shifted}, {gap + 1}", "i")
                remainder = self.w.value(f"urem i64 {shifted}, {gap + 1}", "i")
                on_grid = self.w.value(f"icmp eq i64 {remainder}, 0")
                inside = self.w.value(f"icmp ult i64 {quotient}, {size}")
                ok = self.w.value(f"and i1 {on_grid}, {inside}")
            else:
                quotient = shifted
                ok = self.w.value(f"icmp ult i64 {shifted}, {size}")
            # Read a clamped (in-bounds) element and discard it outside the operand.
            mapped.append(self.w.value(f"select i1 {ok}, i64 {quotient}, i64 0", "i"))
            valid = ok if valid is None else self.w.value(f"and i1 {valid}, {ok}")
        element = self.evaluate(x, tuple(mapped))
        if valid is None:
            return element
        return self.w.value(f"select i1 {valid}, {LLVM_TYPE[value.dtype]} {element}, "
                            f"{LLVM_TYPE[value.dtype]} {zero}")

    def constant_power(self, inputs: list[Value], operands: list[str], dtype) -> str | None:
        """x ** c for a few constant c, as multiplications (exact where pow is exact)."""
        c = scalar_constant(inputs[1])
        if c is None:
            return None
        x, t = operands[0], LLVM_TYPE[dtype]
        floating = is_float(dtype)
        multiply = "fmul" if floating else "mul"
        if c == 1:
            return x
        if c == 2:
            return self.w.value(f"{multiply} {t} {x}, {x}")
        if c == 3:
            square = self.w.value(f"{multiply} {t} {x}, {x}")
            return self.w.value(f"{multiply} {t} {square}, {x}")
        if floating and c in (-1, -2):
            base = x if c == -1 else self.w.value(f"fmul {t} {x}, {x}")
            return self.w.value(f"fdiv {t} {literal(1, dtype)}, {base}")
        if floating and c == 0.5:
            # pow(-0, 0.5) = +0 and pow(-inf, 0.5) = +inf, where sqrt gives -0 and nan.
            root = self.w.call(t, f"llvm.sqrt.{'f32' if dtype == float32 else 'f64'}", (t, x))
            positive = self.w.value(f"fadd {t} {root}, 0.0")
            is_minus_inf = self.w.value(f"fcmp oeq {t} {x}, {literal(-np.inf, dtype)}")
            return self.w.value(f"select i1 {is_minus_inf}, {t} {literal(np.inf, dtype)}, "
                                f"{t} {positive}")
        return None

    # Reductions -------------------------------------------------------------------------------

    @staticmethod
    def accumulator(primitive: str, dtype) -> tuple[np.dtype, str]:
        """The accumulator dtype (float32 sums accumulate in float64) and its initial value."""
        if primitive == "reduce_sum":
            accumulator = float64 if dtype == float32 else dtype
            return accumulator, literal(0, accumulator)
        if is_float(dtype):
            return dtype, literal(-np.inf if primitive == "reduce_max" else np.inf, dtype)
        return dtype, str(INT64_MIN if primitive == "reduce_max" else INT64_MAX)

    def combine(self, primitive: str, dtype, accumulated: str, element: str) -> str:
        t = LLVM_TYPE[dtype]
        if primitive == "reduce_sum":
            if is_float(dtype):
                return self.w.value(f"fadd reassoc contract {t} {accumulated}, {element}")
            return self.w.value(f"add i64 {accumulated}, {element}")
        # llvm.maximum/minimum propagate nan, as numpy's max/min do
        name = "maximum" if primitive == "reduce_max" else "minimum"
        if is_float(dtype):
            suffix = "f32" if dtype == float32 else "f64"
            return self.w.call(t, f"llvm.{name}.{suffix}", (t, accumulated), (t, element))
        return self.w.call(t, f"llvm.s{name[:3]}.i64", (t, accumulated), (t, element))

    def reduce_inline(self, instruction: Instruction, index: Index) -> str:
        (x,), primitive = instruction.inputs, instruction.primitive
        axes = instruction.attributes["axes"]
        dtype = x.dtype
        accumulator_dtype, initial = self.accumulator(primitive, dtype)
        t = LLVM_TYPE[accumulator_dtype]
        slot = self.w.alloca(t, "acc")
        self.w.emit(f"store {t} {initial}, ptr {slot}")
        kept = iter(index)
        mapped, loops = [], []
        for axis, size in enumerate(x.shape):
            if axis not in axes:
                mapped.append(next(kept))
            elif size == 1:
                mapped.append(0)
            else:
                loop = self.open_loop(0, size)
                loops.append(loop)
                mapped.append(loop[1])
        self.memo.append({})
        element = cast(self.w, dtype, accumulator_dtype, self.evaluate(x, tuple(mapped)))
        accumulated = self.w.value(f"load {t}, ptr {slot}")
        self.w.emit(f"store {t} {self.combine(primitive, accumulator_dtype, accumulated, element)}, "
                    f"ptr {slot}")
        self.memo.pop()
        for loop in reversed(loops):
            self.close_loop(loop)
        return cast(self.w, accumulator_dtype, dtype, self.w.value(f"load {t}, ptr {slot}"))

    # Kernels ----------------------------------------------------------------------------------

    def loop_kernel(self, results: list[str], split: bool = True) -> None:
        shape = (self.kernel.shape and (int(np.prod(self.kernel.shape)),)) if self.flat \
            else self.kernel.shape
        index, loops = self.open_nest(shape, split=split)
        # Every result is computed before any is stored: a result written in place into an
        # argument (a parameter's .grad zeroed) must not be seen by another result's loads.
        registers = []
        for value in self.kernel.results:
            self.location = line_of(value)
            registers.append(self.evaluate(value, index))
        for value, register, buffer in zip(self.kernel.results, registers, results):
            self.location = line_of(value)
            self.store(register, value, buffer, self.linear(index, shape))
        for loop in reversed(loops):
            self.close_loop(loop)

    def scatter_kernel(self, results: list[str]) -> None:
        """result = target, then each element of the updates stored into (or, accumulating,
        added to) the result at its checked index, in order (of repeated indices the last store
        stays, as in the reference)."""
        (result,), (buffer,) = self.kernel.results, results
        instruction = result.producer
        target, updates = instruction.inputs[:2]
        for shape, copying in ((result.shape, True), (updates.shape, False)):
            # each loop evaluates in its own scope: values computed in the first do not dominate
            # the second
            self.memo.append({})
            index, loops = self.open_nest(shape, split=False)
            if copying:
                self.store(self.evaluate(target, index), result, buffer,
                           self.linear(index, result.shape))
            else:
                element = self.evaluate(updates, index)
                position = self.index_position(instruction, result, index)
                offset = self.linear(position, result.shape)
                if instruction.attributes["accumulate"]:
                    pointer = self.address(buffer, result, offset, "read-modify-write")
                    t = LLVM_TYPE[result.dtype]
                    old = self.w.value(f"load {t}, ptr {pointer}")
                    opcode = "fadd" if is_float(result.dtype) else "add"
                    self.w.emit(f"store {t} {self.w.value(f'{opcode} {t} {old}, {element}')}, "
                                f"ptr {pointer}")
                else:
                    self.store(element, result, buffer, offset)
            for loop in reversed(loops):
                self.close_loop(loop)
            self.memo.pop()

    def accumulate_kernel(self, results: list[str]) -> None:
        (result,), (buffer,) = self.kernel.results, results
        instruction = result.producer
        (x,), primitive = instruction.inputs, instruction.primitive
        axes = instruction.attributes["axes"]
        dtype = result.dtype
        initial = literal(0, dtype) if primitive == "reduce_sum" else self.accumulator(
            primitive, dtype)[1]
        index, loops = self.open_nest((result.type.size,), split=False)
        self.store(initial, result, buffer, index[0])
        for loop in reversed(loops):
            self.close_loop(loop)
        index, loops = self.open_nest(x.shape, split=False)
        element = self.evaluate(x, index)
        offset = self.linear(tuple(p for axis, p in enumerate(index) if axis not in axes),
                             result.shape)
        pointer = self.address(buffer, result, offset, "read-modify-write")
        t = LLVM_TYPE[dtype]
        accumulated = self.w.value(f"load {t}, ptr {pointer}")
        combined = (self.w.value(f"fadd {t} {accumulated}, {element}") if primitive == "reduce_sum"
                    and is_float(dtype) else self.combine(primitive, dtype, accumulated, element))
        self.w.emit(f"store {t} {combined}, ptr {pointer}")
        for loop in reversed(loops):
            self.close_loop(loop)


@dataclass
class KernelCode:
    text: str
    name: str
    arguments: list[Value]  # buffers read, in parameter order
    results: list[Value]  # buffers written
    extent: int  # the range of the outermost loop: the call passes [0, extent)
    splittable: bool  # whether disjoint sub-ranges of [0, extent) may run on different threads
    work: int  # a rough count of element operations, for the threading threshold


def split_extent(kernel: Kernel, flat: bool) -> int:
    if kernel.kind == "matmul":
        return int(np.prod(kernel.results[0].shape[:-2], dtype=np.int64))
    shape = (kernel.results[0].type.size,) if flat else kernel.shape
    return next((size for size in shape if size != 1), 1)


def shared_buffers(kernel: Kernel, plan: MemoryPlan | None) -> dict[int, int]:
    """result position -> input position, for the results written into the buffer an input is read
    from (an in-place update): the kernel gets one pointer for both, so `noalias` stays true."""
    if plan is None:
        return {}
    reads = {plan.read(v): i for i, v in enumerate(kernel.inputs)}
    return {j: reads[plan.write(v)] for j, v in enumerate(kernel.results)
            if plan.write(v) in reads}


def render_matmul(name: str, matmul: Instruction, result: Value, gemm: bool, accumulate: bool,
                  sites: Sites | None) -> str:
    """The function `name` computing `result` (= or += alpha *) the product of `matmul`."""
    (a, transpose_a), (b, transpose_b) = map(matmul_operand, matmul.inputs)
    m, k = matmul.inputs[0].shape[-2:]
    n = matmul.inputs[1].shape[-1]
    dtype = result.dtype
    block = min(n, MATMUL_BLOCK)
    checks = None
    if sites is not None and sites.every_access:
        line = matmul.location
        checks = {"a": (sites.add(name, a, "read", line), a.type.size),
                  "b": (sites.add(name, b, "read", line), b.type.size),
                  "c": (sites.add(name, result, "read-modify-write" if accumulate else "write",
                                  line), result.type.size),
                  "accumulator": (sites.add_internal(name, "the float64 row accumulator", block,
                                                     "read-modify-write", line), block)}
    return ENVIRONMENT.get_template("matmul.ll.j2").render(
        name=name, type=LLVM_TYPE[dtype], m=m, n=n, k=k, size=dtype.itemsize, block=block,
        transpose_a=transpose_a, transpose_b=transpose_b,
        gemm=GEMM_SYMBOLS.get(dtype) if gemm else None, accumulate=accumulate, checks=checks,
        record=sites is not None)


def emit_kernel(fused: FusedFunction, kernel: Kernel, name: str, gemm: bool,
                plan: MemoryPlan | None = None, sites: Sites | None = None) -> KernelCode:
    """The code of one kernel; with `sites` (which needs `plan`), bounds-checked."""
    results = list(kernel.results)
    shared = shared_buffers(kernel, plan)
    if kernel.update is not None:
        return emit_matmul_update(fused, kernel, name, gemm, plan, shared, sites)
    if kernel.kind == "matmul":
        instruction = kernel.instructions[-1]
        operands = [matmul_operand(v)[0] for v in instruction.inputs]
        m, k = instruction.inputs[0].shape[-2:]
        n = instruction.inputs[1].shape[-1]
        text = render_matmul(name, instruction, kernel.results[0], gemm, False, sites)
        extent = split_extent(kernel, False)
        return KernelCode(text, name, operands, results, extent, False, extent * m * n * k)
    arguments = list(kernel.inputs)
    buffers = {id(v): f"%in{i}" for i, v in enumerate(arguments)}
    result_registers = [f"%in{shared[j]}" if j in shared else f"%out{j}"
                        for j in range(len(results))]
    emitter = KernelEmitter(fused, kernel, buffers, name, sites)
    if kernel.kind == "loop":
        emitter.loop_kernel(result_registers)
    elif kernel.kind == "scatter":
        emitter.scatter_kernel(result_registers)
    else:
        emitter.accumulate_kernel(result_registers)
    own_registers = [r for j, r in enumerate(result_registers) if j not in shared]
    results = [v for j, v in enumerate(results) if j not in shared]
    text = LOOPS.kernel(name, record_register(sites) + list(buffers.values()) + own_registers,
                        emitter.w.allocas, "\n".join(emitter.w.lines))
    extent = split_extent(kernel, emitter.flat)
    size = max(kernel.results[0].type.size, 1)
    if kernel.kind in ("accumulate", "scatter"):
        size = max(kernel.results[0].producer.inputs[-1].type.size, 1)
    work = size * max(1, len(kernel.instructions))
    return KernelCode(str(text), name, arguments, results, extent, kernel.kind == "loop", work)


def record_register(sites: Sites | None) -> list[str]:
    """The error record's register, first among a kernel's pointers in the bounds-checked mode."""
    return [] if sites is None else ["%bounds"]


def emit_matmul_update(fused: FusedFunction, kernel: Kernel, name: str, gemm: bool,
                       plan: MemoryPlan | None, shared: dict[int, int],
                       sites: Sites | None) -> KernelCode:
    """result = rest + alpha * a @ b: a loop stores `rest` (the result's expression with the
    product taken as 0) into the result's buffer -- skipped when rest is the parameter whose buffer
    the result is written into -- then the gemm adds alpha * a @ b (beta = 1)."""
    update = kernel.update
    (result,) = kernel.results
    product = update.matmul.outputs[0]
    a, b = (matmul_operand(v)[0] for v in update.matmul.inputs)
    m, k = update.matmul.inputs[0].shape[-2:]
    n = update.matmul.inputs[1].shape[-1]
    dtype = result.dtype
    arguments = list(kernel.inputs)
    buffers = {id(v): f"%in{i}" for i, v in enumerate(arguments)}
    output = f"%in{shared[0]}" if 0 in shared else "%out0"
    skipped = {id(update.matmul), *(id(v.producer) for v in update.matmul.inputs
                                    if matmul_operand(v)[1])}
    instructions = [i for i in kernel.instructions if id(i) not in skipped]
    read = {id(x) for i in instructions for x in i.inputs}
    rest = Kernel("loop", [result], instructions, [v for v in arguments if id(v) in read])
    emitter = KernelEmitter(fused, rest, buffers, name, sites)
    emitter.zeros.add(id(product))
    alpha = literal(1, dtype)
    for factor in update.factors:  # evaluated first: they dominate the loop and the gemm
        value = emitter.evaluate(factor, ())
        alpha = value if alpha == literal(1, dtype) else emitter.w.value(
            f"fmul {LLVM_TYPE[dtype]} {alpha}, {value}")
    if update.sign < 0:
        alpha = emitter.w.value(f"fneg {LLVM_TYPE[dtype]} {alpha}")
    in_place_rest = (update.rest_is is not None and plan is not None
                     and plan.write(result) == plan.read(update.rest_is))
    if not in_place_rest:
        emitter.loop_kernel([output], split=False)
    extent = split_extent(kernel, False)
    pointers = "".join(f"ptr {p}, " for p in record_register(sites) + [buffers[id(a)],
                                                                         buffers[id(b)], output])
    emitter.w.emit(f"call void @{name}.gemm({pointers}{LLVM_TYPE[dtype]} {alpha}, "
                   f"i64 %begin, i64 %end)")
    registers = record_register(sites) + list(buffers.values()) + ([] if 0 in shared else [output])
    text = str(LOOPS.kernel(name, registers, emitter.w.allocas, "\n".join(emitter.w.lines)))
    text += "\n\n" + render_matmul(f"{name}.gemm", update.matmul, result, gemm, True, sites)
    results = [] if 0 in shared else [result]
    return KernelCode(text, name, arguments, results, extent, False,
                      extent * m * n * k + result.type.size)


def location_register(location: Location) -> str:
    return {"parameter": "%param", "output": "%output", "arena": "%tmp"}[location.kind] + \
        f".{location.index}"


def thread_count(code: KernelCode, threads: int) -> int:
    """How many threads a kernel runs on: 1 unless it is splittable and large enough."""
    if not code.splittable or threads <= 1:
        return 1
    return max(1, min(threads, code.extent, code.work // PARALLEL_WORK_PER_THREAD))


C_CONTIGUOUS, WRITEABLE = 0x1, 0x400  # numpy's NPY_ARRAY_* flag bits


def fast_entry(plan: MemoryPlan, parameter_bytes: list[int], layout: tuple[int, int]) -> str:
    """`i32 tracer_fast(PyArrayObject *parameters..., PyArrayObject *outputs..., ptr arena)`:
    reads each array's data pointer from the object (numpy's public struct: `data` at byte
    layout[0], `flags` at layout[1]), and runs the entry if every parameter is C-contiguous and
    every parameter written in place is writeable and shares no byte with another parameter;
    otherwise it returns 1 having done nothing (the caller then takes the general path). The
    caller has checked that the objects are arrays of the right dtypes and shapes."""
    data, flags = layout
    parameters, outputs = len(parameter_bytes), len(plan.output_slots)
    count = parameters + outputs + 1
    targets = sorted(set(plan.in_place.values()))
    objects = [f"ptr %o{i}" for i in range(parameters + outputs)]
    lines = [f"define i32 @tracer_fast({', '.join(objects + ['ptr %arena'])}) #3 {{", "entry:",
             f"  %args = alloca [{count} x ptr]"]
    for i in range(parameters + outputs):
        lines += [f"  %d{i}.at = getelementptr inbounds i8, ptr %o{i}, i64 {data}",
                  f"  %d{i} = load ptr, ptr %d{i}.at, align 8",
                  f"  %a{i} = getelementptr inbounds [{count} x ptr], ptr %args, i64 0, i64 {i}",
                  f"  store ptr %d{i}, ptr %a{i}, align 8"]
    lines += [f"  %a.arena = getelementptr inbounds [{count} x ptr], ptr %args, i64 0, "
              f"i64 {count - 1}", "  store ptr %arena, ptr %a.arena, align 8"]
    checks = []
    for i in range(parameters):
        mask = C_CONTIGUOUS | (WRITEABLE if i in targets else 0)
        lines += [f"  %f{i}.at = getelementptr inbounds i8, ptr %o{i}, i64 {flags}",
                  f"  %f{i} = load i32, ptr %f{i}.at, align 4",
                  f"  %m{i} = and i32 %f{i}, {mask}",
                  f"  %ok{i} = icmp eq i32 %m{i}, {mask}"]
        checks.append(f"%ok{i}")
    for t in targets:
        if parameter_bytes[t] == 0:
            continue
        lines.append(f"  %p{t} = ptrtoint ptr %d{t} to i64")
        lines.append(f"  %e{t} = add i64 %p{t}, {parameter_bytes[t]}")
        for j in range(parameters):
            if j == t or parameter_bytes[j] == 0:
                continue
            lines += [f"  %q{t}.{j} = ptrtoint ptr %d{j} to i64",
                      f"  %r{t}.{j} = add i64 %q{t}.{j}, {parameter_bytes[j]}",
                      f"  %x{t}.{j} = icmp ult i64 %p{t}, %r{t}.{j}",
                      f"  %y{t}.{j} = icmp ult i64 %q{t}.{j}, %e{t}",
                      f"  %v{t}.{j} = and i1 %x{t}.{j}, %y{t}.{j}",
                      f"  %n{t}.{j} = xor i1 %v{t}.{j}, true"]
            checks.append(f"%n{t}.{j}")
    all_ok = "true"
    for number, check in enumerate(checks):
        lines.append(f"  %all{number} = and i1 {all_ok}, {check}")
        all_ok = f"%all{number}"
    lines += [f"  br i1 {all_ok}, label %run, label %refuse", "run:",
              "  call void @tracer_entry(ptr %args)", "  ret i32 0", "refuse:", "  ret i32 1", "}"]
    return "\n".join(lines)


def generate_module(fused: FusedFunction, plan: MemoryPlan, triple: str,
                    gemm: bool, threads: int = 1, layout: tuple[int, int] | None = None,
                    profile: bool = False,
                    checked: bool = False) -> tuple[str, list[KernelCode], Sites | None]:
    """The LLVM IR text of the whole function, a description of each kernel and, if `checked` or
    if it gathers or scatters, the table of its checked accesses (the error record is
    RECORD_BYTES at byte plan.arena_size of the arena). Large kernels whose outer loop can be split run on up to
    `threads` threads. With `profile`, the entry counts each kernel's calls and nanoseconds in
    the global @tracer_profile."""
    function = fused.function
    indexing = any(i.primitive in INDEXING for kernel in fused.kernels
                   for i in kernel.instructions)
    sites = Sites(plan, every_access=checked) if checked or indexing else None
    codes = [emit_kernel(fused, kernel, f"kernel_{number}", gemm, plan, sites)
             for number, kernel in enumerate(fused.kernels)]
    slots = [(f"%param.{i}", i) for i in range(len(function.parameters))]
    slots += [(f"%output.{i}", len(function.parameters) + i) for i in range(len(plan.output_slots))]
    slots.append(("%arena", len(function.parameters) + len(plan.output_slots)))
    arena_offsets = sorted({loc.index for loc in plan.locations.values() if loc.kind == "arena"})
    calls, parallel = [], []
    for code in codes:
        pointers = record_register(sites) + [location_register(plan.read(v))
                                             for v in code.arguments]
        pointers += [location_register(plan.write(v)) for v in code.results]
        arguments = "".join(f"ptr {p}, " for p in pointers)
        count = thread_count(code, threads)
        if count > 1:
            parallel.append(ENVIRONMENT.get_template("parallel.ll.j2").render(
                name=code.name, buffers=len(pointers), threads=count))
            calls.append(f"call void @{code.name}.parallel({arguments}i64 {code.extent})")
        else:
            calls.append(f"call void @{code.name}({arguments}i64 0, i64 {code.extent})")
    declarations = []
    if parallel:
        declarations += ["declare i32 @pthread_create(ptr, ptr, ptr, ptr) nounwind",
                         "declare i32 @pthread_join(i64, ptr) nounwind"]
    if gemm:
        for dtype, symbol in GEMM_SYMBOLS.items():
            t = LLVM_TYPE[dtype]
            declarations.append(f"declare void @{symbol}(i32, i32, i32, i64, i64, i64, {t}, ptr, "
                                f"i64, ptr, i64, {t}, ptr, i64) nounwind")
    fast = "" if layout is None else fast_entry(
        plan, [p.type.size * p.dtype.itemsize for p in function.parameters], layout)
    text = ENVIRONMENT.get_template("module.ll.j2").render(
        function_name=function.name, triple=triple, declarations=declarations,
        kernels=[c.text for c in codes] + parallel, slots=slots,
        arena_buffers=[(f"%tmp.{offset}", offset) for offset in arena_offsets], calls=calls,
        fast_entry=fast, profile=profile, checked=checked, record=sites is not None,
        record_offset=plan.arena_size)
    return text, codes, sites
