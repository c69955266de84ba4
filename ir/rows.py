"""Row kernels: reductions along rows, what feeds them and what reads them, in one pass over memory.

A layer norm or a softmax is a few reductions along the last axis of an [R, C] tensor (a row
each) and elementwise work that reads their results broadcast along the row. Fusion
(ir/fusion.py) makes each reduction a kernel of its own and each broadcast consumer another, and
every one of them streams the whole tensor from memory. When a row fits in cache, the same
kernels can instead run one row at a time: all of them on row 0, then all of them on row 1, ...
The first reads the row from memory; the later ones find it in L1/L2. `group_rows` merges such
kernels into one `rows` kernel whose `parts` are the original kernels in order:

- a row part is a loop kernel whose shape starts with the rows: it computes its results for the
  current row (a value per row, or a loop over the rest of the row). A value per row that only
  the group reads stays in a register and never reaches memory.
- a reduction part adds up across the rows (a column sum such as a layer norm's weight and bias
  gradients, or a loss summed over the batch): each chunk of rows adds into a partial result of
  its own (float32 sums in float64), and a `combine` kernel after the row kernel adds the
  partials up in chunk order.

A row of a costly value that several parts compute (the exponentials of a softmax, which its sum,
its result and its gradient read) is kept: the first part that computes the whole row stores it
in a buffer of one row per chunk, which stays in cache, and the later parts load it.

The row kernel's range counts chunks of rows (at most ROW_CHUNKS, a number that depends on the
shape only), which the entry splits across threads; so every result has the same bits whatever
the thread count.

A kernel joins a group when it reads the values of the group's row parts only at the row it is
computing (through elementwise ops, broadcasts along the row, reductions along the row and
layout changes that keep the row axes in place: `_keeps_rows`), reads no result of the group's
reduction parts (complete only after every row), depends on no kernel between the group's first
kernel and itself that is not in the group (the group runs where its first kernel ran), and the
bytes one row of everything the group reads and writes take stay within ROW_CACHE_BYTES. A
reduction across rows before the group's first kernel joins too when everything that reads its
result runs after the group (it then runs later, with the group).
"""
from __future__ import annotations

import math

from tracer.ir.costs import TIME_COST
from tracer.ir.fusion import FusedFunction, Kernel
from tracer.ir.index_walk import reads_at_own_index
from tracer.ir.graph import Instruction, Value
from tracer.ir.primitives import ELEMENTWISE, REDUCE, accumulator_dtype
from tracer.ir.types import TensorType

# The bytes one row of every buffer a row kernel reads and writes (and of its partial results)
# may take: a quarter of the smallest L2 cache of current x86-64 cores (2 MB here), so that a row
# is still cached when the next part reads it.
ROW_CACHE_BYTES = 512 * 1024
# A row kernel's rows are cut into at most this many chunks: the units its threads take, each
# with a partial result per reduction across rows.
ROW_CHUNKS = 32
# A value that several parts compute is kept a row at a time when computing it from memory costs
# this much (ir/costs.py's TIME_COST units, a read 1): a transcendental function, a division or a
# long chain of arithmetic costs more than the store and the loads of its row in cache.
KEEP_COST = 20


class _Group:
    """Kernels (by number) that run row by row, from the `start`-th kernel's position on.
    (A plain class: @dataclass generating its methods took ~1 ms of every fresh process's
    tr.trace.)"""

    def __init__(self, rows: tuple[int, ...], start: int):
        self.rows = rows
        self.start = start
        self.members: list[int] = []
        self.row_values: set[int] = set()  # ids: results of row parts
        self.reduced: set[int] = set()  # ids: results of reduction parts
        self.bytes: dict[int, int] = {}  # id of a buffer -> its bytes per row


def _seed_rows(kernel: Kernel) -> tuple[int, ...] | None:
    """The rows of a loop kernel that reduces along its rows: a reduction over the trailing axes
    k, k+1, ... of its operand (k >= 1) in a kernel whose shape starts with the operand's first k
    dimensions (the rows)."""
    if kernel.kind != "loop":
        return None
    for instruction in kernel.instructions:
        if instruction.primitive not in REDUCE:
            continue
        operand = instruction.inputs[0]
        axes = instruction.attributes["axes"]
        k = min(axes, default=0)
        rows = operand.shape[:k]
        if k >= 1 and axes == tuple(range(k, operand.type.ndim)) and kernel.shape[:k] == rows:
            return rows
    return None


def _role(kernel: Kernel, rows: tuple[int, ...]) -> str | None:
    """"row" for a loop kernel over the rows, "reduction" for a kernel whose one result reduces
    an operand over the rows across them (and maybe along them), else None."""
    k = len(rows)
    if kernel.kind == "loop" and kernel.shape[:k] == rows:
        return "row"
    if len(kernel.results) == 1 and kernel.kind in ("loop", "accumulate"):
        instruction = kernel.results[0].producer
        if (instruction is not None and instruction.primitive in REDUCE
                and set(range(k)) <= set(instruction.attributes["axes"])
                and instruction.inputs[0].shape[:k] == rows):
            return "reduction"
    return None


def _keeps_rows(instruction: Instruction, value: Value, operand: Value, k: int) -> bool:
    """Whether computing `value` at an index reads `operand` at the same first k positions (the
    row), as the scheduler maps the index (ir/schedule.py)."""
    primitive, attributes = instruction.primitive, instruction.attributes
    same_rows = operand.type.ndim >= k and operand.shape[:k] == value.shape[:k]
    if primitive in ELEMENTWISE or primitive == "broadcast":
        # broadcasting aligns trailing axes: a lower rank moves the rows
        return operand.type.ndim == value.type.ndim and same_rows
    if primitive == "reshape":  # only size-1 axes after the rows come and go
        return same_rows and ([d for d in operand.shape[k:] if d != 1]
                              == [d for d in value.shape[k:] if d != 1])
    if primitive == "transpose":
        return tuple(attributes["permutation"][:k]) == tuple(range(k))
    if primitive == "slice":
        return same_rows and all(attributes["starts"][a] == 0 and attributes["steps"][a] == 1
                                 for a in range(k))
    if primitive == "pad":
        return same_rows and all(attributes["low"][a] == 0 and attributes["interior"][a] == 0
                                 for a in range(k))
    if primitive in REDUCE:
        return same_rows and min(attributes["axes"], default=k) >= k
    return False  # a gather reads where its indices point


def _reads_own_row(root: Value, k: int, group: _Group, own: set[int],
                   materialized: set[int]) -> bool:
    """Whether computing `root` at a row's index reads the group's row values only at that row,
    and no result of its reduction parts. The walk goes through what is computed inline (not
    stored, or a result of the kernel itself, in `own`)."""
    return reads_at_own_index(
        root, group.row_values, lambda value: id(value) in materialized and id(value) not in own,
        keeps_index=lambda instruction, value, operand: _keeps_rows(instruction, value, operand, k),
        forbidden=group.reduced, include_root=True)


def _row_bytes(value: Value, rows: tuple[int, ...]) -> int:
    """What one row of `value` takes in cache: the rest of its shape after the rows, or all of
    it when it is read the same for every row."""
    k = len(rows)
    if value.type.ndim >= k and value.shape[:k] == rows:
        return math.prod(value.shape[k:]) * value.dtype.itemsize
    return value.type.size * value.dtype.itemsize


def _admit(group: _Group, number: int, kernel: Kernel, producer: dict[int, int],
           materialized: set[int]) -> bool:
    """Add kernel `number` to `group` if it can run row by row with it (see the module's
    docstring); whether it did."""
    members = set(group.members)
    if any(producer.get(id(v), -1) >= group.start and producer[id(v)] not in members
           for v in kernel.inputs):
        return False
    role = _role(kernel, group.rows)
    if role is None:
        return False
    k = len(group.rows)
    own = {id(v) for v in kernel.results}
    roots = kernel.results if role == "row" else [kernel.results[0].producer.inputs[0]]
    if not all(_reads_own_row(root, k, group, own, materialized) for root in roots):
        return False
    added = {id(v): _row_bytes(v, group.rows) for v in kernel.inputs
             if id(v) not in group.row_values}
    if role == "row":
        added.update((id(v), _row_bytes(v, group.rows)) for v in kernel.results)
    else:
        (value,) = kernel.results
        dtype = accumulator_dtype(value.producer.primitive, value.dtype)
        added[id(value)] = value.type.size * dtype.itemsize  # its partial result
    if sum({**group.bytes, **added}.values()) > ROW_CACHE_BYTES:
        return False
    group.members.append(number)
    group.bytes.update(added)
    (group.row_values if role == "row" else group.reduced).update(own)
    return True


def _kept_rows(group: _Group, instructions: list[Instruction], parts: list[Kernel],
               fused: FusedFunction, chunks: int) -> list[tuple[Value, Value]]:
    """The values computed inline in several parts whose computing costs KEEP_COST or more
    (what they compute from a kept value costs a load), each with its buffer of a row per chunk,
    while the row bytes fit the cache bound."""
    k = len(group.rows)
    computed: dict[int, int] = {}  # value id -> how many parts compute it
    for part in parts:
        for value in {id(v) for i in part.instructions for v in i.outputs}:
            computed[value] = computed.get(value, 0) + 1
    budget = ROW_CACHE_BYTES - sum(group.bytes.values())
    kept: list[tuple[Value, Value]] = []
    costs: dict[int, int] = {}  # the cost of computing each value from memory and kept rows

    def cost(value: Value) -> int:
        if id(value) not in costs:
            if value.producer is None or fused.is_materialized(value):
                costs[id(value)] = 1
            else:
                costs[id(value)] = TIME_COST[value.producer.primitive] + sum(
                    cost(v) for v in value.producer.inputs)
        return costs[id(value)]

    for instruction in instructions:
        for value in instruction.outputs:
            size = math.prod(value.shape[k:])
            row_bytes = size * value.dtype.itemsize
            if (computed.get(id(value), 0) >= 2 and value.shape[:k] == group.rows and size > 1
                    and row_bytes <= budget and cost(value) >= KEEP_COST):
                budget -= row_bytes
                costs[id(value)] = 1
                kept.append((value, Value(f"{value.name}.row",
                                          TensorType((chunks, *value.shape[k:]), value.dtype))))
    return kept


def _merge(group: _Group, fused: FusedFunction, readers: dict[int, set[int]]) -> list[Kernel]:
    """The row kernel of `group` and, if it reduces across rows, the kernel that combines its
    partial results. Values per row that only the group reads are taken out of memory (from
    `fused.materialized`)."""
    function, kernels = fused.function, fused.kernels
    parts = [kernels[n] for n in group.members]
    members, k = set(group.members), len(group.rows)
    outputs = {id(v) for v in function.outputs}
    chunks = min(math.prod(group.rows), ROW_CHUNKS)
    position = {id(i): n for n, i in enumerate(function.instructions)}
    instructions = sorted({id(i): i for part in parts for i in part.instructions}.values(),
                          key=lambda i: position[id(i)])
    kept = _kept_rows(group, instructions, parts, fused, chunks)
    for part in parts:
        for value in part.results:
            if (id(value) in group.row_values and id(value) not in outputs
                    and readers.get(id(value), set()) <= members
                    and all(size == 1 for size in value.shape[k:])):
                fused.materialized.discard(id(value))
    produced = {id(v) for part in parts for v in part.results}
    partials = []
    for part in parts:
        (value, *_) = part.results
        if id(value) in group.reduced:
            dtype = accumulator_dtype(value.producer.primitive, value.dtype)
            partials.append((value, Value(f"{value.name}.partial",
                                          TensorType((chunks, *value.shape), dtype))))
    stored = [v for part in parts for v in part.results
              if id(v) in group.row_values and fused.is_materialized(v)]
    inputs = {id(v): v for part in parts for v in part.inputs if id(v) not in produced}
    merged = [Kernel("rows", stored + [row for _, row in kept] + [p for _, p in partials],
                     instructions, list(inputs.values()), parts=parts, rows=group.rows,
                     chunks=chunks, partials=partials, kept=kept)]
    if partials:
        merged.append(Kernel("combine", [value for value, _ in partials], [],
                             [partial for _, partial in partials], chunks=chunks,
                             partials=partials))
    return merged


def _delay_reductions(group: _Group, kernels: list[Kernel], runs_at: dict[int, int],
                      producer: dict[int, int], readers: dict[int, set[int]],
                      materialized: set[int]) -> None:
    """Takes into `group` the reductions across rows before its first kernel (a layer norm's
    weight and bias gradients, which come before the row sums of its input's gradient) that
    read a row of something the group reads: they run later, with the group, when every kernel
    that reads their results runs after the group. `runs_at`: where each grouped kernel runs
    (its group's first kernel), updated."""
    for number in range(group.start - 1, -1, -1):
        kernel = kernels[number]
        later = set().union(*(readers.get(id(v), set()) for v in kernel.results))
        if (number in runs_at or _role(kernel, group.rows) != "reduction"
                or any(runs_at.get(n, n) <= group.start for n in later)
                or not any(id(v) in group.bytes for v in kernel.inputs
                           if v.shape[:len(group.rows)] == group.rows)):
            continue
        if _admit(group, number, kernel, producer, materialized):
            group.members.insert(0, group.members.pop())  # before the parts that came first
            runs_at[number] = group.start


def group_rows(fused: FusedFunction) -> FusedFunction:
    """`fused` with its kernels that can run row by row merged into row kernels (see the
    module's docstring); the same object when there are none."""
    kernels = fused.kernels
    producer = {id(v): n for n, kernel in enumerate(kernels) for v in kernel.results}
    groups: list[_Group] = []
    for number, kernel in enumerate(kernels):
        if any(_admit(group, number, kernel, producer, fused.materialized) for group in groups):
            continue
        rows = _seed_rows(kernel)
        if rows is not None:
            group = _Group(rows, number)
            if _admit(group, number, kernel, producer, fused.materialized):
                groups.append(group)
    readers: dict[int, set[int]] = {}
    for number, kernel in enumerate(kernels):
        for value in kernel.inputs:
            readers.setdefault(id(value), set()).add(number)
    runs_at = {number: group.start for group in groups for number in group.members}
    for group in groups:
        _delay_reductions(group, kernels, runs_at, producer, readers, fused.materialized)
    groups = [group for group in groups if len(group.members) > 1]
    if not groups:
        return fused
    grouped = {number: group for group in groups for number in group.members}
    result: list[Kernel] = []
    for number, kernel in enumerate(kernels):
        group = grouped.get(number)
        if group is None:
            result.append(kernel)
        elif number == group.start:
            result += _merge(group, fused, readers)
    return FusedFunction(fused.function, result, fused.materialized)
