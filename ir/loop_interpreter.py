"""Run the loop IR (ir/loops.py) in numpy, one element at a time, without LLVM.

The program runs as the native entry does: on the parameters (copies: outputs written in place
change them), fresh output buffers and one arena of `arena_size` bytes that temporaries share as
the memory plan placed them (filled with 0xFF bytes, NaN as floats, so a read before a write
shows). Scalar primitives use the reference semantics (ir/reference.py) on numpy scalars; the index
arithmetic is that of unsigned 64-bit integers, as the generated code's. An access outside its
buffer raises IndexError. A failed `CheckIndex` stops the program as the native code does (no
later statement or kernel runs) and raises `IndexCheckFailed`, which holds what the native code
records. It is slow (a few microseconds per statement): for tests on small shapes.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tracer.ir.loops import (Accumulate, Accumulator, AllReduce, CheckIndex, Compute, Gemm,
                             HostCall, IndexOp, Load, Loop, LoopKernel, LoopProgram, Store)
from tracer.ir.memory import Location
from tracer.ir.primitives import IndexRangeError
from tracer.ir.reference import REFERENCE

MASK = (1 << 64) - 1  # i64 registers wrap, and "div", "rem" and "lt" read them unsigned


def _index_op(op: str, a, b=None, c=None):
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        return (a & MASK) // b
    if op == "rem":
        return (a & MASK) % b
    if op == "lt":
        return (a & MASK) < (b & MASK)
    if op == "eq":
        return a == b
    if op == "and":
        return a and b
    if op == "select":
        return b if a else c
    raise ValueError(f"unknown index op {op}")


class IndexCheckFailed(IndexRangeError):
    """A `CheckIndex` found its index out of range: what the native code's error record holds
    (the kernel, the check and the index as read), so a test can compare the two."""

    def __init__(self, kernel: str, check: CheckIndex, index: int):
        super().__init__(f"index {index} is out of bounds for dimension {check.axis} (index "
                         f"operand %{check.operand.name}) with size {check.size}, in {kernel}")
        self.kernel = kernel
        self.check = check
        self.index = index


class KernelRun:
    """The registers of one kernel call and the buffers it sees, as flat arrays."""

    def __init__(self, name: str, buffers: dict[str, np.ndarray], begin: int, end: int):
        self.name = name
        self.buffers = buffers
        self.range = {"begin": begin, "end": end}
        self.registers: dict[str, object] = dict(self.range)  # index operations may read them

    def operand(self, operand, dtype=None):
        """A register's value or a literal, as a numpy scalar of `dtype` if given."""
        value = self.registers[operand] if isinstance(operand, str) else operand
        return value if dtype is None else dtype.type(value)

    def offset(self, buffer: str, operand) -> int:
        offset = int(self.operand(operand))
        size = self.buffers[buffer].size
        if not 0 <= offset < size:
            raise IndexError(f"element {offset} of {buffer}, which has {size} elements")
        return offset

    def run(self, statements: list) -> None:
        for statement in statements:
            if isinstance(statement, Loop):
                begin, end = (self.range[b] if b in self.range else int(self.operand(b))
                              for b in (statement.begin, statement.end))
                for position in range(begin, end):
                    self.registers[statement.counter] = position
                    self.run(statement.body)
            elif isinstance(statement, IndexOp):
                # as Python ints: an index loaded from an int64 buffer is a numpy scalar, which
                # would overflow on the unsigned mask
                operands = [int(self.operand(x)) for x in statement.operands]
                self.registers[statement.target] = _index_op(statement.op, *operands)
            elif isinstance(statement, CheckIndex):
                position = int(self.operand(statement.position))
                if not (-statement.size if statement.wrap else 0) <= position < statement.size:
                    raise IndexCheckFailed(self.name, statement, position)
                self.registers[statement.target] = position % statement.size
            elif isinstance(statement, Compute):
                operands = [self.operand(x, d) for x, d in zip(statement.operands,
                                                               statement.in_dtypes)]
                self.registers[statement.target] = REFERENCE[statement.primitive](
                    *operands, **statement.attributes)
            elif isinstance(statement, Load):
                buffer = self.buffers[statement.buffer]
                self.registers[statement.target] = buffer[self.offset(statement.buffer,
                                                                      statement.offset)]
            elif isinstance(statement, Store):
                buffer = self.buffers[statement.buffer]
                buffer[self.offset(statement.buffer, statement.offset)] = self.operand(
                    statement.operand, buffer.dtype)
            elif isinstance(statement, Accumulator):
                self.registers[statement.name] = self.operand(statement.initial, statement.dtype)
            elif isinstance(statement, Accumulate):
                operands = [self.operand(statement.name, statement.dtype),
                            self.operand(statement.operand, statement.dtype)]
                self.registers[statement.name] = REFERENCE[statement.primitive](*operands)
            elif isinstance(statement, Gemm):
                self.gemm(statement)
            elif isinstance(statement, AllReduce):
                source = self.buffers[statement.source][:statement.count]
                self.buffers[statement.target][:statement.count] = REFERENCE["all_reduce"](
                    source, op=statement.op)
            elif isinstance(statement, HostCall):
                operands = [self.buffers[name][:v.type.size].reshape(v.shape)
                            for name, v in zip(statement.operands, statement.operand_values)]
                results = statement.callback(*operands)
                for name, value, result in zip(statement.results, statement.values, results):
                    self.buffers[name][:value.type.size] = np.asarray(result).reshape(-1)
            else:
                raise TypeError(f"not a loop IR statement: {statement!r}")

    def gemm(self, gemm: Gemm) -> None:
        begin, end = self.range["begin"], self.range["end"]
        batches = -(-end // gemm.blocks) if end > 0 else 0

        def operand(name: str, rows: int, columns: int, transposed: bool) -> np.ndarray:
            flat = self.buffers[name]
            if batches * rows * columns > flat.size:
                raise IndexError(f"tasks [{begin}, {end}) of a gemm outside {name}")
            matrices = flat[:batches * rows * columns]
            if transposed:
                return matrices.reshape(batches, columns, rows).swapaxes(-1, -2)
            return matrices.reshape(batches, rows, columns)

        a = operand(gemm.a, gemm.m, gemm.k, gemm.transpose_a)
        b = operand(gemm.b, gemm.k, gemm.n, gemm.transpose_b)
        c = operand(gemm.c, gemm.m, gemm.n, False)
        for task in range(begin, end):
            batch, block = divmod(task, gemm.blocks)
            if gemm.rows < gemm.m:
                rows, columns = slice(block * gemm.rows, (block + 1) * gemm.rows), slice(None)
            else:
                rows, columns = slice(None), slice(block * gemm.columns, (block + 1) * gemm.columns)
            product = a[batch, rows] @ b[batch][:, columns]
            if gemm.accumulate:
                c[batch, rows, columns] += self.operand(gemm.alpha, gemm.dtype) * product
            else:
                c[batch, rows, columns] = product


def run_kernel(kernel: LoopKernel, memory: dict[str, np.ndarray], begin: int = 0,
               end: int | None = None) -> None:
    """One call of `kernel` on its range [begin, end) (default: the whole range); `memory` holds
    each buffer of the kernel by name, as a flat array."""
    with np.errstate(all="ignore"):
        run = KernelRun(kernel.name, memory, begin, kernel.extent if end is None else end)
        run.run(kernel.body)


def run_program(program: LoopProgram, arguments: Sequence[np.ndarray],
                splits: int | None = None) -> list[np.ndarray]:
    """The outputs of the function, computed by running its loop IR on `arguments`. With
    `splits`, the range of each kernel that may run on threads is cut into that many chunks, run
    one after the other, as threads would run them (without, into the kernel's own chunks)."""
    parameters = [np.array(a, p.dtype, copy=True).reshape(-1)
                  for a, p in zip(arguments, program.parameters)]
    outputs = [np.empty(v.type.size, v.dtype) for v in program.output_slots]
    arena = np.full(program.arena_size, 0xFF, np.uint8)

    def buffer(location: Location, value) -> np.ndarray:
        if location.kind == "parameter":
            return parameters[location.index]
        if location.kind == "output":
            return outputs[location.index]
        size = value.type.size * value.dtype.itemsize
        return arena[location.index:location.index + size].view(value.dtype)

    for kernel in program.kernels:
        memory = {b.name: buffer(b.location, b.value)[b.shift:] for b in kernel.buffers}
        chunks = (kernel.chunks if splits is None else splits) if kernel.splittable else 1
        bounds = [kernel.extent * t // chunks for t in range(chunks + 1)]
        for begin, end in zip(bounds, bounds[1:]):
            run_kernel(kernel, memory, begin, end)
    results = []
    for location, value in zip(program.returns, _returned_values(program)):
        results.append(buffer(location, value).reshape(value.shape).copy())
    return results


def _returned_values(program: LoopProgram) -> list:
    """The value of each returned location: an output slot's, or a parameter's (in place)."""
    values = []
    for location in program.returns:
        if location.kind == "output":
            values.append(program.output_slots[location.index])
        else:
            values.append(program.parameters[location.index])
    return values
