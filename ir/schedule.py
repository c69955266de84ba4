"""Scheduling: the fused kernels and the memory plan become the loop IR (ir/loops.py).

A loop kernel is a loop nest over the shape of its results (one flat loop when all the values it
touches keep their elements in one order, or have one). The body asks for each result "at the
current index", and `KernelScheduler.evaluate` answers recursively: a buffer is loaded at the
index's offset, an elementwise op evaluates its operands at the broadcast-adjusted index, a layout
op maps the index (transpose permutes it, slice scales and shifts it, pad tests it), a reduction
opens an inner loop around an accumulator, and a gather reads its index operands at the index and
evaluates its operand where they point. A `check_index` wraps and checks each element
(`CheckIndex`); a gather checks an index operand itself only when it does not come from one (or
from an iota that fits). Results are memoized per (value, index), so a value shared by several
results of the kernel is computed once. An `accumulate` kernel zeroes its result and adds its
operand into it in memory order; a `scatter` kernel copies its target into its result, then stores
(or adds) each element of the updates at its checked index; a matmul kernel is a gemm, after (for a
MatmulUpdate) the loop that stores the rest of the expression (ir/schedule_matmul.py).
ir/schedule_index.py computes the indices; ir/one_hot.py and ir/loop_fusion.py then cut loops,
ir/reciprocals.py turns divisions by what a loop does not change into multiplications, and
ir/loop_split.py splits a loop that divides its counter into a quotient and a remainder loop."""
from __future__ import annotations

import math
from typing import Iterator

from tracer.ir.fusion import FusedFunction, Kernel
from tracer.ir.graph import Instruction, Value, deep_recursion
from tracer.ir.loops import (COMBINE, Accumulate, Accumulator, AllReduce, Buffer, CheckIndex,
                             Compute, HostCall, Load, LoopKernel, LoopProgram, Store,
                             initial_value, line_of, literal)
from tracer.ir.memory import MemoryPlan, shared_buffers
from tracer.ir.primitives import ELEMENTWISE, LAYOUT, REDUCE, accumulator_dtype, broadcast_shapes
from tracer.ir.index_checks import index_in_range
from tracer.ir import loop_fusion, loop_split, one_hot, reciprocals
from tracer.ir.schedule_index import Index, IndexBuilder, broadcast_index, is_flat, pad_seams
from tracer.ir.schedule_matmul import MatmulKernels, scheduled_part
from tracer.ir.schedule_reduce import ReductionKernels
from tracer.ir.schedule_threads import chunk_count, kernel_work, split_extent, thread_count
from tracer.ir.types import bool_, int64

class KernelScheduler(IndexBuilder, ReductionKernels, MatmulKernels):
    """Writes the statements of one kernel (those that reduce across rows: schedule_reduce.py;
    a matmul kernel's: schedule_matmul.py)."""

    def __init__(self, fused: FusedFunction, kernel: Kernel, buffers: dict[int, str]):
        super().__init__()
        self.fused = fused
        self.kernel = kernel
        self.buffers = buffers  # value id -> the name of the kernel's pointer to its buffer
        self.location = line_of(kernel.results[0])  # the user's line being computed
        self.own = {id(v) for v in kernel.results}
        self.flat = is_flat(kernel)
        self.memo: list[dict] = [{}]
        self.zeros: set[int] = set()  # values taken as 0 (the product a matmul update adds later)
        # a row kernel's values kept a row at a time: id -> (the row buffer's value, its name)
        self.kept: dict[int, tuple[Value, str]] = {}

    def shape_of(self, value: Value) -> tuple[int, ...]:
        return (value.type.size,) if self.flat else value.shape

    def in_memory(self, value: Value) -> bool:
        """Whether `value` is read from a buffer rather than computed here."""
        return value.producer is None or (self.fused.is_materialized(value)
                                          and id(value) not in self.own)

    # Memory -----------------------------------------------------------------------------------

    def load(self, value: Value, offset, buffer: str | None = None) -> str:
        """`value`'s element at `offset`, from its buffer (or from `buffer`)."""
        target = self.fresh("v")
        self.emit(Load(target, buffer or self.buffers[id(value)], offset, value, self.location))
        return target

    def compute(self, primitive: str, operands, in_dtypes, dtype, attributes=None) -> str:
        target = self.fresh("v")
        attributes = {"dtype": dtype} if primitive == "cast" else dict(attributes or {})
        self.emit(Compute(target, primitive, tuple(operands), tuple(in_dtypes), dtype, attributes,
                          self.location))
        return target

    # Evaluation -------------------------------------------------------------------------------

    def evaluate(self, value: Value, index: Index):
        key = (id(value), index)
        for scope in reversed(self.memo):
            if key in scope:
                return scope[key]
        result = self._evaluate(value, index)
        self.memo[-1][key] = result
        return result

    def _evaluate(self, value: Value, index: Index):
        if id(value) in self.zeros:
            return literal(0, value.dtype)
        if self.in_memory(value):
            return self.load(value, self.linear(index, self.shape_of(value)))
        loaded = self.kept_element(value, index)
        if loaded is not None:
            return loaded
        reader = self.location
        self.location = value.producer.location or reader
        result = self.element(value, index)
        self.keep_element(value, index, result)
        self.location = reader
        return result

    def element(self, value: Value, index: Index):
        """`value` at `index`, from its instruction."""
        instruction = value.producer
        primitive, attributes, inputs = (instruction.primitive, instruction.attributes,
                                         instruction.inputs)
        if primitive in ELEMENTWISE:
            shape = self.shape_of(value)
            operands = [self.evaluate(x, broadcast_index(index, shape, self.shape_of(x)))
                        for x in inputs]
            return self.compute(primitive, operands, [x.dtype for x in inputs], value.dtype,
                                attributes)
        if primitive in REDUCE:
            return self.reduce_inline(value, index)
        if primitive == "constant":
            return literal(attributes["value"], value.dtype)
        if primitive == "gather":
            x = inputs[0]
            return self.evaluate(x, self.index_position(instruction, x, index))
        if primitive == "check_index":
            (operand,) = inputs
            return self.checked_index(self.evaluate(operand, index), operand,
                                      attributes["axis"], attributes["size"], attributes["wrap"])
        if primitive == "iota":
            position = index[attributes["dimension"]]
            if isinstance(position, int):
                return literal(position, value.dtype)
            return self.compute("cast", [position], [int64], value.dtype)
        if primitive not in LAYOUT:
            raise NotImplementedError(f"{primitive} cannot be computed inside a loop kernel")
        (x,) = inputs
        if primitive == "broadcast":
            return self.evaluate(x, broadcast_index(index, self.shape_of(value), self.shape_of(x)))
        if primitive == "reshape":
            if self.flat:
                return self.evaluate(x, index)
            if self.in_memory(x):
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
        return self.pad(x, value, index, attributes)

    def index_position(self, instruction: Instruction, x: Value, index: Index) -> Index:
        """Where a gather reads x (a scatter writes its result) for the element at `index` of its
        result (of its updates): the index operands are read at the leading positions of `index`
        (and checked against their dimensions unless known in range); x's other dimensions take
        the rest, in order."""
        axes = instruction.attributes["axes"]
        operands = instruction.inputs[-len(axes):]
        index_shape = broadcast_shapes(*(v.shape for v in operands))
        leading, rest = index[:len(index_shape)], iter(index[len(index_shape):])
        mapped = {}
        for operand, axis in zip(operands, axes):
            position = self.evaluate(operand, broadcast_index(leading, index_shape,
                                                              self.shape_of(operand)))
            mapped[axis] = (position if index_in_range(operand, x.shape[axis])
                            else self.checked_index(position, operand, axis, x.shape[axis]))
        return tuple(mapped[axis] if axis in mapped else next(rest) for axis in range(len(x.shape)))

    def checked_index(self, position, operand: Value, axis: int, size: int, wrap: bool = True):
        """`position` (wrapped into [0, size) if negative, with `wrap`) once checked (once per
        open block); an index known at compile time and in range is folded (one out of range is
        still checked, so that it fails)."""
        if isinstance(position, int) and (-size if wrap else 0) <= position < size:
            return position % size
        key = ("checked_index", position, size, wrap)  # a scatter checks its gather's index
        target = self.known(key)
        if target is None:
            target = self.fresh("o")
            self.emit(CheckIndex(target, position, size, operand, axis, self.location, wrap))
            self.computed[-1][key] = target
        return target

    def pad(self, x: Value, value: Value, index: Index, attributes):
        zero = literal(0, value.dtype)
        if x.type.size == 0:
            return zero
        mapped, valid = self.pad_index(index, x.shape, value.shape, attributes["low"],
                                       attributes["interior"])
        if mapped is None:
            return zero
        element = self.evaluate(x, mapped)
        if valid is None:
            return element
        return self.compute("select", [valid, element, zero], [bool_, value.dtype, value.dtype],
                            value.dtype)

    # Reductions -------------------------------------------------------------------------------

    def reduce_inline(self, value: Value, index: Index):
        """An accumulator and the loops over the reduced axes around it: float32 sums add in
        float64 (rounded once at the end), max and min propagate nan as numpy's do."""
        instruction = value.producer
        (x,), primitive = instruction.inputs, instruction.primitive
        axes = instruction.attributes["axes"]
        dtype = x.dtype
        wide = accumulator_dtype(primitive, dtype)
        accumulator = self.fresh("acc")
        self.emit(Accumulator(accumulator, wide, initial_value(primitive, wide)))
        kept = iter(index)
        mapped, loops = [], 0
        for axis, size in enumerate(x.shape):
            if axis not in axes:
                mapped.append(next(kept))
            elif size == 1:
                mapped.append(0)
            else:
                mapped.append(self.open_loop(0, size))
                loops += 1
        self.memo.append({})
        element = self.evaluate(x, tuple(mapped))
        if wide != dtype:
            element = self.compute("cast", [element], [dtype], wide)
        self.emit(Accumulate(accumulator, COMBINE[primitive], element, wide))
        self.memo.pop()
        for _ in range(loops):
            self.close_loop()
        if wide == dtype:
            return accumulator
        return self.compute("cast", [accumulator], [wide], dtype)

    # Kernels ----------------------------------------------------------------------------------

    def loop_kernel(self, results: list[str], split: bool = True) -> None:
        shape = (math.prod(self.kernel.shape),) if self.flat else self.kernel.shape
        depth = self.depth
        # one result that reshapes a value computed here: loops over that value's dimensions
        (value, *others) = self.kernel.results
        refined = None if self.flat or others or value.producer is None or (
            value.producer.primitive != "reshape" or self.in_memory(value.producer.inputs[0])
        ) else self.refined_nest(value.shape, value.producer.inputs[0].shape, split)
        seams = pad_seams(self.kernel, shape) if refined is None else []
        if refined is not None:
            self.store_results(refined[0], shape, results, refined[1])
        elif not seams:
            self.store_results(self.open_nest(shape, split), shape, results)
        else:  # the last axis in pieces, in each of which every pad is decided
            outer = self.open_nest(shape[:-1], split)
            ranged = split and self.depth == depth  # the range runs over the last axis
            for first, stop in zip(seams, seams[1:]):
                self.memo.append({})
                counter = self.open_piece(first, stop) if ranged else self.open_loop(first, stop)
                self.store_results((*outer, counter), shape, results)
                self.close_loop()
                self.memo.pop()
        while self.depth > depth:
            self.close_loop()

    def store_results(self, index: Index, shape: tuple[int, ...], results: list[str],
                      reshaped_index: Index | None = None) -> None:
        """Each result at `index` (a reshape's result from its operand's element at
        `reshaped_index`, given), stored at its offset."""
        # Every result is computed before any is stored: a result written in place into an
        # argument (a parameter's .grad zeroed) must not be seen by another result's loads.
        elements = []
        for value in self.kernel.results:
            self.location = line_of(value)
            elements.append(self.evaluate(value, index) if reshaped_index is None
                            else self.evaluate(value.producer.inputs[0], reshaped_index))
        offset = self.linear(index, shape)
        for value, element, buffer in zip(self.kernel.results, elements, results):
            self.emit(Store(buffer, offset, element, value, line_of(value)))

    def scatter_kernel(self, buffer: str) -> None:
        """The result set to the target, then each element of the updates stored into (or,
        accumulating, added to) the result at its checked index, in order (of repeated indices
        the last store stays, as in the reference)."""
        (result,) = self.kernel.results
        instruction = result.producer
        target, updates = instruction.inputs[:2]
        for shape, copying in ((result.shape, True), (updates.shape, False)):
            # each nest has its own memo: the second sees no register the first computed
            self.memo.append({})
            index = self.open_nest(shape, split=False)
            if copying:
                self.emit(Store(buffer, self.linear(index, shape), self.evaluate(target, index),
                                result, self.location))
            else:
                element = self.evaluate(updates, index)
                offset = self.linear(self.index_position(instruction, result, index),
                                     result.shape)
                if instruction.attributes["accumulate"]:
                    dtype = result.dtype
                    old = self.load(result, offset, buffer)
                    element = self.compute("add", [old, element], [dtype, dtype], dtype)
                self.emit(Store(buffer, offset, element, result, self.location))
            while self.depth:
                self.close_loop()
            self.memo.pop()


def schedule_kernel(fused: FusedFunction, kernel: Kernel, name: str, plan: MemoryPlan,
                    threads: int, own_gemm: bool = False) -> LoopKernel:
    """The loop IR of one fused kernel; it may run on up to `threads` threads (`own_gemm`: large
    float32 products call the project's own gemm, ir/schedule_threads.gemm_blocks)."""
    shared = shared_buffers(kernel, plan)
    buffers = [Buffer(f"in{i}", v, plan.read(v)) for i, v in enumerate(kernel.inputs)]
    result_names = [f"in{shared[j]}" if j in shared else f"out{j}"
                    for j in range(len(kernel.results))]
    buffers += [Buffer(result_names[j], v, plan.write(v)) for j, v in enumerate(kernel.results)
                if j not in shared]
    names = {id(b.value): b.name for b in buffers if b.name.startswith("in")}
    blocks = 1
    if kernel.kind == "matmul":
        scheduler = KernelScheduler(fused, scheduled_part(kernel), names)
        blocks = scheduler.matmul_kernel(kernel, result_names[0], plan, threads, own_gemm)
    elif kernel.kind == "all_reduce":
        (instruction,) = kernel.instructions
        (result,) = kernel.results
        scheduler = KernelScheduler(fused, kernel, names)
        scheduler.emit(AllReduce(names[id(instruction.inputs[0])], result_names[0], result,
                                 result.type.size, result.dtype, instruction.attributes["op"],
                                 line=instruction.location))
    elif kernel.kind == "host_callback":
        (instruction,) = kernel.instructions
        scheduler = KernelScheduler(fused, kernel, names)
        scheduler.emit(HostCall(instruction.attributes["callback"],
                                [names[id(v)] for v in instruction.inputs], result_names,
                                list(instruction.inputs), list(kernel.results),
                                line=instruction.location))
    else:
        scheduler = KernelScheduler(fused, kernel, names)
        if kernel.kind == "loop":
            scheduler.loop_kernel(result_names)
        elif kernel.kind == "scatter":
            scheduler.scatter_kernel(result_names[0])
        elif kernel.kind in ("rows", "combine"):  # which read back what they wrote
            scheduler.buffers = {**names, **{id(v): n for v, n in zip(kernel.results,
                                                                      result_names)}}
            method = scheduler.rows_kernel if kernel.kind == "rows" else scheduler.combine_kernel
            method(scheduler.buffers)
        else:
            scheduler.accumulate_kernel(result_names[0])
    scheduled = LoopKernel(name, kernel.kind, buffers, scheduler.body,
                           split_extent(kernel, scheduler.flat) * blocks,
                           rows=math.prod(kernel.rows))
    work = kernel_work(kernel)
    scheduled.threads = thread_count(scheduled, work, threads)
    scheduled.chunks = chunk_count(scheduled, work)
    return scheduled


def schedule(fused: FusedFunction, plan: MemoryPlan, threads: int = 1,
             own_gemm: bool = False) -> LoopProgram:
    """The loop IR of a fused function placed in memory by `plan`: the `loops` stage."""
    program = unscheduled_program(fused, plan)
    program.kernels.extend(schedule_kernels(fused, plan, threads, own_gemm))
    return program


def unscheduled_program(fused: FusedFunction, plan: MemoryPlan) -> LoopProgram:
    """The loop program of `fused` on `plan` without its kernels yet."""
    return LoopProgram(fused.function.name, list(fused.function.parameters), list(
        plan.output_slots), [plan.write(v) for v in fused.function.outputs], plan.arena_size, [])


def schedule_kernels(fused: FusedFunction, plan: MemoryPlan, threads: int = 1,
                     own_gemm: bool = False) -> Iterator[LoopKernel]:
    """The kernels of `fused` scheduled one at a time, in order, each as the `loops` stage has it
    (the passes over its loops done): the back end renders and compiles each while it schedules
    the next (runtime/pipeline.py)."""
    for number, kernel in enumerate(fused.kernels):
        with deep_recursion(8 * len(fused.function.instructions)):  # (~5 frames an operand deep)
            scheduled = schedule_kernel(fused, kernel, f"kernel_{number}", plan, threads,
                                        own_gemm)
        # (the passes take a program: a kernel's own, each kernel's loops rewritten on their own)
        alone = LoopProgram(fused.function.name, [], [], [], plan.arena_size, [scheduled])
        yield from loop_split.split_divided_loops(reciprocals.multiply_by_reciprocals(
            loop_fusion.fuse_sibling_loops(one_hot.move_one_hot_terms(
                one_hot.shortcut_one_hot_reductions(alone))))).kernels
