"""Index arithmetic for the scheduler (ir/schedule.py): where in a buffer an element is, and the
shape of a loop kernel's nest (one flat loop, or its last axis cut at the seams of pads).

An index is a tuple with one position per axis, each a Python int (folded at compile time) or the
register of an `IndexOp` or loop counter. `IndexBuilder` also keeps the statement being written:
`emit` appends to the innermost open loop's body.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tracer.ir.loops import IndexOp, Loop
from tracer.ir.primitives import ELEMENTWISE

if TYPE_CHECKING:
    from tracer.ir.fusion import Kernel

Index = tuple  # of registers (str) and Python ints


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


FLAT_PRIMITIVES = ELEMENTWISE | {"broadcast", "reshape", "constant", "check_index"}


def is_flat(kernel: Kernel) -> bool:
    """Whether a loop kernel can run as one flat loop over the elements: every value it touches
    has all the elements of the result (in the same row-major order) or just one."""
    if kernel.kind != "loop" or kernel.shape == ():
        return False
    count = math.prod(kernel.shape)
    for instruction in kernel.instructions:
        if instruction.primitive not in FLAT_PRIMITIVES:
            return False
        for value in (*instruction.inputs, *instruction.outputs):
            if value.type.size not in (1, count):
                return False
    return all(v.type.size in (1, count) for v in kernel.inputs)


def pad_seams(kernel: Kernel, shape: tuple[int, ...]) -> list[int]:
    """Where a loop kernel's last axis is cut so that each piece lies inside or outside each
    pad along that axis ([0, ..., size], or [] for no cut): a concatenation (DDP's gradients
    in one buffer) or its backward (the split of attention's q, k and v) then writes each part
    with its own loop, with no test per element, where a fused loop over the whole axis would
    evaluate every part at every element."""
    if not shape or shape[-1] == 1:
        return []
    points = set()
    for instruction in kernel.instructions:
        if instruction.primitive != "pad" or instruction.outputs[0].shape[-1:] != shape[-1:]:
            continue
        low, high = instruction.attributes["low"], instruction.attributes["high"]
        if any(low[:-1]) or any(high[:-1]) or any(instruction.attributes["interior"]):
            continue
        points |= {low[-1], low[-1] + instruction.inputs[0].shape[-1]}
    inner = sorted(point for point in points if 0 < point < shape[-1])
    return [0, *inner, shape[-1]] if inner else []


def refinement(shape: tuple[int, ...], finer: tuple[int, ...]) -> list[tuple[int, ...]] | None:
    """`finer`'s dimensions grouped so that group k multiplies up to shape[k] (size-1 dimensions
    join the group before them), or None when a dimension of `shape` merges no whole run of
    `finer`'s (a reshape whose row-major order would need a division to map)."""
    groups: list[tuple[int, ...]] = []
    position = 0
    for size in shape:
        group, product = [], 1
        while product < size and position < len(finer):
            group.append(finer[position])
            product *= finer[position]
            position += 1
        if product != size:
            return None
        while position < len(finer) and finer[position] == 1:
            group.append(1)
            position += 1
        groups.append(tuple(group))
    return groups if position == len(finer) else None


def broadcast_index(index: Index, shape: tuple[int, ...], operand_shape: tuple[int, ...]) -> Index:
    """The index of an operand broadcast to `shape` (size-1 axes read element 0)."""
    lead = len(shape) - len(operand_shape)
    return tuple(0 if size == 1 else index[lead + k] for k, size in enumerate(operand_shape))


class IndexBuilder:
    """Statements of one kernel body, and the index arithmetic in them (ints folded)."""

    def __init__(self) -> None:
        self.body: list = []
        self.blocks: list[list] = [self.body]  # the open loops' bodies, innermost last
        # per open block: (op, operands) -> the register computed in it, reused while it is open
        self.computed: list[dict] = [{}]
        self.counter = 0
        self.loops: dict[str, Loop] = {}  # counter -> its loop
        # counter -> [low, high) of a loop over fixed bounds: a pad tested on it may be decided
        # at compile time (a loop split at a concatenation's seams, ir/schedule.py)
        self.ranges: dict[str, tuple[int, int]] = {}

    @property
    def depth(self) -> int:
        """How many loops are open."""
        return len(self.blocks) - 1

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"%{hint}{self.counter}"

    def emit(self, statement) -> None:
        self.blocks[-1].append(statement)

    def open_loop(self, begin, end) -> str:
        """Opens a loop; returns its counter."""
        loop = Loop(self.fresh("i"), begin, end)
        self.loops[loop.counter] = loop
        if isinstance(begin, int) and isinstance(end, int):
            self.ranges[loop.counter] = (begin, end)
        self.emit(loop)
        self.blocks.append(loop.body)
        self.computed.append({})
        return loop.counter

    def open_piece(self, first: int, stop: int) -> str:
        """A loop over the part of [first, stop) in the kernel's range [begin, end) (none when
        they do not meet): a piece of the axis the range runs over. A pad tested on its counter
        is decided for the whole piece."""
        low = self.index_op("select", self.index_op("lt", "begin", first), first, "begin")
        high = self.index_op("select", self.index_op("lt", "end", stop), "end", stop)
        counter = self.open_loop(low, high)
        self.ranges[counter] = (first, stop)
        return counter

    def open_task_elements(self, blocks: int, block_elements: int, matrix_elements: int) -> str:
        """A flat loop over the elements of the tasks [begin, end) of a matmul kernel whose
        products are cut into `blocks` blocks of rows (ir/loops.Gemm: task t is block t % blocks
        of matrix t // blocks, `block_elements` elements apart, matrices `matrix_elements`
        apart); returns its counter. Task t's elements start at the offset below, and the
        tasks' range ends where task `end` would start."""
        def start(task: str):
            matrix = self.mul(self.index_op("div", task, blocks), matrix_elements)
            return self.add(matrix, self.mul(self.index_op("rem", task, blocks), block_elements))
        return self.open_loop(start("begin"), start("end"))

    def close_loop(self) -> None:
        self.blocks.pop()
        self.computed.pop()

    def known(self, key) -> str | None:
        """The register computed for `key` in an open block, if any."""
        for computed in reversed(self.computed):
            if key in computed:
                return computed[key]
        return None

    def index_op(self, op: str, *operands) -> str:
        key = (op, operands)
        target = self.known(key)
        if target is None:
            target = self.fresh("o")
            self.emit(IndexOp(target, op, operands))
            self.computed[-1][key] = target
        return target

    def add(self, a, b):
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        if a == 0:
            return b
        if b == 0:
            return a
        return self.index_op("add", a, b)

    def mul(self, a, factor: int):
        if isinstance(a, int):
            return a * factor
        if factor == 1:
            return a
        if factor == 0:
            return 0
        return self.index_op("mul", a, factor)

    def linear(self, index: Index, shape: tuple[int, ...]):
        """The element offset of `index` in a row-major buffer of `shape`."""
        offset = 0
        for position, size, stride in zip(index, shape, contiguous_strides(shape)):
            if size != 1:
                offset = self.add(offset, self.mul(position, stride))
        return offset

    def open_nest(self, shape: tuple[int, ...], split: bool) -> Index:
        """Loops over `shape` (none for size-1 dims); with `split`, the first loop runs over the
        kernel's range [begin, end) instead of the whole dimension."""
        index = []
        for size in shape:
            if size == 1:
                index.append(0)
            elif split and self.depth == 0:
                index.append(self.open_loop("begin", "end"))
            else:
                index.append(self.open_loop(0, size))
        return tuple(index)

    def refined_nest(self, shape, operand_shape, split: bool) -> tuple[Index, Index] | None:
        """For a reshape to `shape` that merges runs of the operand's dimensions (im2col's
        windows gathered (C, KH, KW, N, OH, OW) and stored as a matrix): loops over the
        operand's dimensions within each result dimension after the first, so that the
        operand's index is loop counters, not divisions of a flat offset (only the first
        dimension's counter, split across threads, is divided, outside the inner loops).
        Returns (the result's index, the operand's index), or None where nothing is merged."""
        if not shape or shape[0] == 1:  # (the threads' range is then a later dimension's)
            return None
        groups = refinement(shape, operand_shape)
        if groups is None or all(len([d for d in g if d != 1]) <= 1 for g in groups[1:]):
            return None
        (first,) = self.open_nest(shape[:1], split)
        operand = list(self.reshape_index((first,), shape[:1], groups[0]))
        index = [first]
        for group in groups[1:]:
            inner = self.open_nest(group, split=False)
            operand += inner
            index.append(self.linear(inner, group))
        return tuple(index), tuple(operand)

    def reshape_index(self, index: Index, shape, operand_shape) -> Index:
        """The operand's index of a reshape's element at `index`. The axes of both shapes (size-1
        axes aside) fall into groups of equal products, each a run of axes merged or split: an
        axis kept as it is maps to itself, merged axes become one offset, and a split axis is
        divided into the operand's positions (by constants, in its group alone, so that
        the head split of attention costs a shift and a mask, not a division of the whole
        offset). A reshape of no elements is never evaluated at run time (a loop over its shape
        runs no iteration): its operand's index is all zeros."""
        if 0 in shape or 0 in operand_shape:
            return (0,) * len(operand_shape)
        kept = [k for k, d in enumerate(shape) if d != 1]
        operand_kept = [j for j, d in enumerate(operand_shape) if d != 1]
        mapped: list = [0] * len(operand_shape)
        position, operand_position = 0, 0
        while position < len(kept):
            group, operand_group = [kept[position]], [operand_kept[operand_position]]
            size, operand_size = shape[group[0]], operand_shape[operand_group[0]]
            while size != operand_size:
                if size < operand_size:
                    position += 1
                    group.append(kept[position])
                    size *= shape[kept[position]]
                else:
                    operand_position += 1
                    operand_group.append(operand_kept[operand_position])
                    operand_size *= operand_shape[operand_kept[operand_position]]
            position += 1
            operand_position += 1
            offset = self.linear(tuple(index[k] for k in group), tuple(shape[k] for k in group))
            group_shape = tuple(operand_shape[j] for j in operand_group)
            for j, extent, stride in zip(operand_group, group_shape,
                                         contiguous_strides(group_shape)):
                if len(operand_group) == 1:
                    mapped[j] = offset
                elif isinstance(offset, int):
                    mapped[j] = offset // stride % extent
                else:
                    quotient = offset if stride == 1 else self.index_op("div", offset, stride)
                    mapped[j] = (quotient if stride * extent == size
                                 else self.index_op("rem", quotient, extent))
        return tuple(mapped)

    def pad_index(self, index: Index, sizes, out_sizes, lows, interiors):
        """The operand's index of a pad's element at `index` and the i1 register telling whether
        that element is the operand's (None: always), or (None, None) when it is known not to be.
        Outside the operand the index is clamped to 0, an element read and discarded."""
        mapped, valid = [], None
        for position, size, out_size, low, gap in zip(index, sizes, out_sizes, lows, interiors):
            if isinstance(position, int):
                shifted = position - low
                on_grid = shifted >= 0 and shifted % (gap + 1) == 0 and shifted // (gap + 1) < size
                if not on_grid:
                    return None, None
                mapped.append(shifted // (gap + 1))
                continue
            if low == 0 and gap == 0 and out_size == size:
                mapped.append(position)
                continue
            if not gap and position in self.ranges:  # decided for the loop's whole range
                first, stop = self.ranges[position]
                if stop - low <= 0 or first - low >= size:
                    return None, None
                if first - low >= 0 and stop - low <= size:
                    mapped.append(self.index_op("sub", position, low) if low else position)
                    continue
            shifted = self.index_op("sub", position, low) if low else position
            if gap:
                quotient = self.index_op("div", shifted, gap + 1)
                remainder = self.index_op("rem", shifted, gap + 1)
                ok = self.index_op("and", self.index_op("eq", remainder, 0),
                                   self.index_op("lt", quotient, size))
            else:
                quotient = shifted
                ok = self.index_op("lt", shifted, size)
            mapped.append(self.index_op("select", ok, quotient, 0))
            valid = ok if valid is None else self.index_op("and", valid, ok)
        return tuple(mapped), valid
