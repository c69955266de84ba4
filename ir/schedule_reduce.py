"""Scheduling the kernels that reduce across rows: `accumulate`, `rows` (ir/rows.py) and
`combine` kernels. ir/schedule.py's KernelScheduler mixes these methods in.

An accumulate kernel sets its result to the reduction's initial value, then reads its operand
once in memory order, combining each element into the result's element it reduces to.

A row kernel's range counts chunks of rows. Chunk c runs the rows [c * rows / chunks,
(c + 1) * rows / chunks) and, on each row, the kernel's parts in order: a row part computes its
results at the row -- a value per row once, in a register the later parts read (it is memoized
at the row's level), or a loop over the rest of the row storing each element -- and a
reduction part combines the row's elements into the chunk's partial result: a register when the
reduction has one element (a total), else the chunk's slice of the partial buffer, set to the
initial value before the chunk's first row. After the chunk's last row, a total's register is
stored into its slot. The combine kernel then reduces each partial buffer over its chunks, in
chunk order, into the value (rounding a float64 sum of float32 once).

A value the row kernel keeps is stored into the chunk's row of its buffer by the first part that
computes it over its whole row (each element at a loop counter running over the element's
axis), and loaded from there by the parts after it, wherever they read it in the row.
"""
from __future__ import annotations

import math

from tracer.ir.graph import Value
from tracer.ir.loops import COMBINE, Accumulate, Accumulator, Store, initial_value, line_of
from tracer.ir.schedule_index import Index


class ReductionKernels:
    """The accumulate, rows and combine kernels of KernelScheduler (ir/schedule.py), whose
    `evaluate`, `load`, `compute`, `open_nest` and index arithmetic they use, and the kept rows
    its `_evaluate` asks for (`kept_element`, `keep_element`)."""

    # While a row kernel's body is written: its chunk's counter, the current row's index and the
    # kept values a part before the current one stored (or the current part is storing).
    chunk = None
    row_index: tuple = ()
    kept_stored: frozenset = frozenset()
    kept_storing: frozenset = frozenset()

    def fill(self, buffer: str, value: Value, start, size: int, initial) -> None:
        """Elements [start, start + size) of `buffer` (holding `value`) set to `initial`."""
        depth = self.depth
        (position,) = self.open_nest((size,), split=False)
        self.emit(Store(buffer, self.add(start, position), initial, value, self.location))
        while self.depth > depth:
            self.close_loop()

    def combine_into(self, buffer: str, value: Value, offset, element, primitive: str) -> None:
        """buffer[offset] = combine(buffer[offset], element), in `value`'s dtype."""
        dtype = value.dtype
        accumulated = self.load(value, offset, buffer)
        combined = self.compute(COMBINE[primitive], [accumulated, element], [dtype, dtype], dtype)
        self.emit(Store(buffer, offset, combined, value, self.location))

    def accumulate_kernel(self, buffer: str) -> None:
        (result,) = self.kernel.results
        instruction = result.producer
        (x,), primitive = instruction.inputs, instruction.primitive
        axes = instruction.attributes["axes"]
        self.fill(buffer, result, 0, result.type.size, initial_value(primitive, result.dtype))
        index = self.open_nest(x.shape, split=False)
        offset = self.linear(tuple(p for axis, p in enumerate(index) if axis not in axes),
                             result.shape)
        self.combine_into(buffer, result, offset, self.evaluate(x, index), primitive)
        while self.depth:
            self.close_loop()

    # Row kernels ------------------------------------------------------------------------------

    def kept_offset(self, value: Value, index: Index):
        """Where `value`'s element at `index` (in the current row) is in its row buffer."""
        k = len(self.row_index)
        return self.add(self.mul(self.chunk, math.prod(value.shape[k:])),
                        self.linear(index[k:], value.shape[k:]))

    def kept_element(self, value: Value, index: Index):
        """`value`'s element at `index` from its row buffer, where a part before the current one
        stored the row; else None (then it is computed)."""
        if id(value) not in self.kept_stored or index[:len(self.row_index)] != self.row_index:
            return None
        row, buffer = self.kept[id(value)]
        return self.load(row, self.kept_offset(value, index), buffer)

    def keep_element(self, value: Value, index: Index, element) -> None:
        """Stores `element` into `value`'s row buffer if the row kernel keeps `value`, no part
        stored it yet and this evaluation goes over its whole row: at the current row, each of
        its other axes at the counter of a loop over all of it."""
        if (id(value) not in self.kept or id(value) in self.kept_stored | self.kept_storing
                or index[:len(self.row_index)] != self.row_index):
            return
        positions = [(p, size) for p, size in zip(index[len(self.row_index):],
                                                  value.shape[len(self.row_index):]) if size != 1]
        counters = {p for p, _ in positions}
        if len(counters) != len(positions) or not all(
                p in self.loops and (self.loops[p].begin, self.loops[p].end) == (0, size)
                for p, size in positions):
            return
        row, buffer = self.kept[id(value)]
        self.emit(Store(buffer, self.kept_offset(value, index), element, row, self.location))
        self.kept_storing = self.kept_storing | {id(value)}

    def chunk_start(self, chunk, rows: int, chunks: int):
        """The first row of `chunk`: chunk * rows / chunks, rounded down."""
        if rows % chunks == 0:
            return self.mul(chunk, rows // chunks)
        return self.index_op("div", self.mul(chunk, rows), chunks)

    def rows_kernel(self, names: dict[int, str]) -> None:
        """`names`: the buffer of every value the kernel reads or writes, results included."""
        kernel = self.kernel
        if kernel.chunks == 0:  # no rows: the combine kernel leaves the initial values
            return
        count = math.prod(kernel.rows)
        partials = {id(value): partial for value, partial in kernel.partials}
        self.kept = {id(value): (row, names[id(row)]) for value, row in kernel.kept}
        chunk = self.chunk = self.open_loop("begin", "end")
        totals: dict[int, str] = {}
        for value, partial in kernel.partials:
            self.location = line_of(value)
            initial = initial_value(value.producer.primitive, partial.dtype)
            if value.type.size == 1:
                totals[id(value)] = self.fresh("acc")
                self.emit(Accumulator(totals[id(value)], partial.dtype, initial))
            else:
                self.fill(names[id(partial)], partial, self.mul(chunk, value.type.size),
                          value.type.size, initial)
        row = self.open_loop(self.chunk_start(chunk, count, kernel.chunks),
                             self.chunk_start(self.add(chunk, 1), count, kernel.chunks))
        index = self.row_index = self.reshape_index((row,), (count,), kernel.rows)
        self.memo.append({})  # values per row, which every part may read
        for part in kernel.parts:
            (value, *_) = part.results
            self.location = line_of(value)
            if id(value) in partials:
                partial = partials[id(value)]
                self.reduce_row(value, partial, names[id(partial)], index, chunk,
                                totals.get(id(value)))
            else:
                self.row_part(part.results, part.shape, names, index)
            self.kept_stored, self.kept_storing = self.kept_stored | self.kept_storing, frozenset()
        self.memo.pop()
        self.close_loop()
        for value, partial in kernel.partials:
            if id(value) in totals:
                self.emit(Store(names[id(partial)], chunk, totals[id(value)], partial,
                                line_of(value)))
        self.close_loop()

    def row_part(self, results: list[Value], shape: tuple[int, ...], names: dict[int, str],
                 index: Index) -> None:
        """A row part's results at the row `index`: stored ones over the rest of the row."""
        self.own = {id(v) for v in results}
        rest = shape[len(index):]
        depth = self.depth
        looped = any(size != 1 for size in rest)
        if looped:  # what is computed in the loop is not seen after it
            self.memo.append({})
        full = index + self.open_nest(rest, split=False)
        elements = [self.evaluate(value, full) for value in results]
        for value, element in zip(results, elements):
            if self.fused.is_materialized(value):
                self.emit(Store(names[id(value)], self.linear(full, shape), element, value,
                                line_of(value)))
        while self.depth > depth:
            self.close_loop()
        if looped:
            self.memo.pop()

    def reduce_row(self, value: Value, partial: Value, buffer: str, index: Index, chunk,
                   total: str | None) -> None:
        """The row's elements of a reduction across rows combined into the chunk's partial
        result: the register `total`, or its elements in `buffer`."""
        instruction = value.producer
        (x,), primitive = instruction.inputs, instruction.primitive
        axes = instruction.attributes["axes"]
        self.own = set()
        depth = self.depth
        self.memo.append({})
        full = index + self.open_nest(x.shape[len(index):], split=False)
        element = self.evaluate(x, full)
        if partial.dtype != x.dtype:
            element = self.compute("cast", [element], [x.dtype], partial.dtype)
        if total is not None:
            self.emit(Accumulate(total, COMBINE[primitive], element, partial.dtype))
        else:
            kept = tuple(p for axis, p in enumerate(full) if axis not in axes)
            offset = self.add(self.mul(chunk, value.type.size), self.linear(kept, value.shape))
            self.combine_into(buffer, partial, offset, element, primitive)
        while self.depth > depth:
            self.close_loop()
        self.memo.pop()

    def combine_kernel(self, names: dict[int, str]) -> None:
        """Each value the row kernel reduced by chunks: its partial results reduced in chunk
        order, rounded to the value's dtype once."""
        for value, partial in self.kernel.partials:
            self.location = line_of(value)
            primitive, size = value.producer.primitive, value.type.size
            (position,) = self.open_nest((size,), split=False)
            accumulator = self.fresh("acc")
            self.emit(Accumulator(accumulator, partial.dtype,
                                  initial_value(primitive, partial.dtype)))
            depth = self.depth
            (chunk,) = self.open_nest((self.kernel.chunks,), split=False)
            element = self.load(partial, self.add(self.mul(chunk, size), position),
                                names[id(partial)])
            self.emit(Accumulate(accumulator, COMBINE[primitive], element, partial.dtype))
            while self.depth > depth:
                self.close_loop()
            result = accumulator
            if partial.dtype != value.dtype:
                result = self.compute("cast", [accumulator], [partial.dtype], value.dtype)
            self.emit(Store(names[id(value)], position, result, value, self.location))
            while self.depth:
                self.close_loop()
