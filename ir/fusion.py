"""Fusion: group the instructions of an optimized Function into kernels.

A kernel is one unit of native code. Fusion makes five kinds:

- `loop`: one loop nest over the shape of its results. Elementwise ops, layout changes (broadcast,
  reshape, transpose, slice, pad), sources (constant, iota) and reductions over trailing axes are
  computed inline, at the index being produced, from the buffers the kernel reads. Several results
  of the same shape share one loop nest, so common subexpressions are computed once.
- `accumulate`: a reduction that keeps the operand's last axis (a column sum, the bias gradient):
  one pass over the operand in memory order adding into the result, so the inner loop is unit-stride.
- `scatter`: a write (or accumulation) at computed indices: the target is copied into the result,
  then a loop over the updates stores each at its index; target, updates and indices are computed
  inline.
- `host_callback`: a call back into Python (ir/host.py) that writes all its results; a barrier
  that nothing fuses across.
- `matmul`: a BLAS call (or a generated loop nest). An operand that is the transpose of the last two
  axes of a buffer reads that buffer with the transpose flag instead of materializing it. A value
  that is a linear function of a matmul only it reads -- `w - lr * (x^T @ g)`, the SGD update of a
  gradient that is used for nothing else -- is one matmul kernel too: the rest of the expression
  (`w`) is stored into the result, then the gemm adds alpha * x^T @ g to it (beta = 1, alpha =
  -lr read at run time), so the gradient never reaches memory (`MatmulUpdate`).

ir/rows.py then merges kernels that can run one row at a time into `rows` kernels (each followed
by a `combine` kernel when it reduces across the rows).

Which values live in memory ("materialized") is decided first: function outputs, matmul operands and
results, the data a gather reads more elements of than it has (overlapping windows), reductions
(unless computed inline into a single same-shape elementwise consumer; a
reduction across the first axis of a tensor of two or more axes, a column or total sum, is always
stored, by a kernel of its own, which ir/rows.py can compute by chunks of rows), values that are
expensive and read at a broadcast index, and values whose inline expression grew too large or
reads several stored tensors of its size (when it has several readers).
Everything else is recomputed where it is used: that is the rematerialization of cheap forward values
in the backward. A loop kernel takes further results only while its code stays under a size bound
(MAX_KERNEL_COST), so a long chain of elementwise ops becomes several loop nests and compile time
stays linear in the size of the graph. Instructions are grouped, never renamed, so the `fused` listing diffs against
`optimized`.
"""
from __future__ import annotations

import bisect
from typing import Callable

from tracer.ir.costs import CODE_COST, EXPENSIVE
from tracer.ir.fusion_matmul import MatmulUpdate, matmul_update
from tracer.ir.graph import Graph, Instruction, Value
from tracer.ir.index_walk import reads_at_own_index
from tracer.ir.primitives import CHECKS, ELEMENTWISE, LAYOUT, REDUCE, SOURCES

# gather is a load at a computed index, so it fuses into loops like a layout change; a check is
# computed in a loop over its whole operand.
LOOP_FUSIBLE = ELEMENTWISE | LAYOUT | REDUCE | SOURCES | CHECKS | {"gather"}
# An inline expression larger than this is stored once it has a second user.
MAX_SHARED_EXPRESSION = 48
# ... and stored whatever its users once it is this large (bounds code size).
MAX_EXPRESSION = 400
# ... or once it streams this many stored tensors of its size: each reader would load them all
# again (a GPT's residual stream, summed from every block's outputs again in each layer norm).
MAX_SHARED_LOADS = 3
# Bounds on code size, in CODE_COST units, that keep compile time linear in the graph's size
# (LLVM's optimizer is superlinear in the size of one loop body): an inline expression this large
# is stored (MAX_EXPRESSION_COST), and a loop kernel whose results' expressions add up to more
# than MAX_KERNEL_COST gets no further results (the next one opens a new kernel). Values that
# cross a kernel boundary go through memory, one store and one load per element, which is cheap
# next to this much arithmetic.
MAX_EXPRESSION_COST = 1500
MAX_KERNEL_COST = 3000


def code_cost(instruction: Instruction) -> int:
    return CODE_COST[instruction.primitive]


class Kernel:
    """One unit of native code: computes `results` (stored to memory) from the buffers `inputs`.

    `instructions` are the instructions it evaluates, in program order (the inline ones and the
    ones that produce its results). (This class and FusedFunction are not dataclasses: making
    their methods took ~1 ms each of every fresh process's tr.trace.)"""

    def __init__(self, kind: str, results: list[Value], instructions: list[Instruction] | None = None,
                 inputs: list[Value] | None = None, update: MatmulUpdate | None = None,
                 parts: list[Kernel] | None = None, rows: tuple[int, ...] = (), chunks: int = 0,
                 partials: list[tuple[Value, Value]] | None = None,
                 kept: list[tuple[Value, Value]] | None = None):
        # `kind`: "loop", "accumulate", "scatter", "matmul", "all_reduce", "host_callback", or
        # (ir/rows.py) "rows", "combine"; `update`: a matmul kernel that accumulates into its result
        self.kind, self.results, self.update = kind, results, update
        self.instructions = [] if instructions is None else instructions
        self.inputs = [] if inputs is None else inputs
        # A row kernel runs its `parts` (loop and reduction kernels) on each row of shape `rows`
        # in turn, its range being `chunks` chunks of rows. `partials` pairs each value its
        # reduction parts reduce across the rows with the value holding one partial result per
        # chunk: a row kernel writes those, the combine kernel after it adds them up into the
        # values. `kept` pairs each value several parts read with its buffer of one row per chunk.
        self.parts, self.rows, self.chunks = [] if parts is None else parts, rows, chunks
        self.partials = [] if partials is None else partials
        self.kept = [] if kept is None else kept

    @property
    def shape(self) -> tuple[int, ...]:
        """The iteration shape of a loop kernel: the shape of its results."""
        return self.results[0].shape


class FusedFunction:
    """The kernels of `function`; `materialized` holds the ids of the values stored in memory
    (parameters included)."""

    def __init__(self, function: Graph, kernels: list[Kernel], materialized: set[int]):
        self.function, self.kernels, self.materialized = function, kernels, materialized

    def is_materialized(self, value: Value) -> bool:
        return id(value) in self.materialized


def matmul_operand(value: Value) -> tuple[Value, bool]:
    """The buffer a matmul reads for `value`, and whether it reads it transposed."""
    producer = value.producer
    if producer is not None and producer.primitive == "transpose":
        permutation = producer.attributes["permutation"]
        rank = len(permutation)
        if rank >= 2 and permutation == (*range(rank - 2), rank - 1, rank - 2):
            return producer.inputs[0], True
    return value, False


def reduces_across_rows(instruction: Instruction) -> bool:
    """Whether `instruction` reduces a tensor of two or more axes across its first (a column sum,
    or a total)."""
    return (instruction.primitive in REDUCE and instruction.inputs[0].type.ndim >= 2
            and 0 in instruction.attributes["axes"])


def reduction_is_inner(instruction: Instruction) -> bool:
    """Whether a reduction's axes include the operand's last axis (so the inner loop reduces)."""
    operand = instruction.inputs[0]
    return operand.type.ndim == 0 or operand.type.ndim - 1 in instruction.attributes["axes"]


def _choose_materialized(function: Graph) -> tuple[set[int], set[int]]:
    """The ids of the values stored in memory, and of those among them stored only so that their
    readers do not compute them again (which need no buffer if their readers all end up in their
    own kernel, computing them once per element)."""
    users = function.users()
    materialized = {id(p) for p in function.parameters}
    materialized.update(id(v) for v in function.outputs)
    reused: set[int] = set()

    for instruction in function.instructions:
        (output, *_) = instruction.outputs or [None]
        if instruction.primitive == "scatter":  # its operands are computed inline in its kernel
            materialized.add(id(output))
        elif instruction.primitive in CHECKS:  # stored, so that every element is checked
            materialized.add(id(output))
        elif instruction.primitive not in LOOP_FUSIBLE:
            materialized.update(id(v) for v in instruction.outputs)
            if instruction.primitive == "matmul":
                materialized.update(id(matmul_operand(v)[0]) for v in instruction.inputs)
            else:  # removed before codegen; stays correct if one slips through
                materialized.update(id(v) for v in instruction.inputs)
        elif (instruction.primitive == "gather"
              and output.type.size > instruction.inputs[0].type.size):
            # Overlapping windows (convolution's and pooling's) read each element of the data
            # several times: stored, it is computed once, and the windows' loads are affine in
            # the loop indices (a padding inlined there would select per load, a gather for
            # the vectorizer).
            materialized.add(id(instruction.inputs[0]))
        elif instruction.primitive in REDUCE:
            readers = users.get(id(output), [])
            inline = (reduction_is_inner(instruction) and len(readers) == 1
                      and readers[0].primitive in ELEMENTWISE
                      and readers[0].outputs[0].shape == output.shape
                      and not reduces_across_rows(instruction))
            if not inline:
                materialized.add(id(output))
                if reduction_is_inner(instruction) and not reduces_across_rows(instruction):
                    reused.add(id(output))

    # Bound recomputation: expensive values read at a broadcast index, and large shared expressions.
    size: dict[int, int] = {}  # of the inline expression tree: shared operands count once per use
    cost: dict[int, int] = {}
    loads: dict[int, frozenset] = {}  # (id, size) of stored tensors of its size it reads
    expensive: dict[int, bool] = {}
    for instruction in function.instructions:
        for output in instruction.outputs:
            inline_operands = [v for v in instruction.inputs if id(v) not in materialized]
            size[id(output)] = 1 + sum(size.get(id(v), 0) for v in inline_operands)
            cost[id(output)] = code_cost(instruction) + sum(cost.get(id(v), 0)
                                                            for v in inline_operands)
            expensive[id(output)] = instruction.primitive in EXPENSIVE or any(
                expensive.get(id(v), False) for v in inline_operands)
            read = {(id(v), v.type.size) for v in instruction.inputs if id(v) in materialized}
            read = read.union(*(loads.get(id(v), ()) for v in inline_operands))
            loads[id(output)] = frozenset(sorted(
                ((key, n) for key, n in read if n >= output.type.size > 1),
                key=lambda entry: -entry[1])[:MAX_SHARED_LOADS])
            readers = users.get(id(output), [])
            if id(output) in materialized:
                continue
            broadcast_read = output.type.size > 1 and any(
                reader.primitive in ELEMENTWISE | {"broadcast"}
                and reader.outputs[0].type.size > output.type.size for reader in readers)
            if ((expensive[id(output)] and broadcast_read)
                    or ((size[id(output)] > MAX_SHARED_EXPRESSION
                         or len(loads[id(output)]) >= MAX_SHARED_LOADS) and len(readers) > 1)
                    or size[id(output)] > MAX_EXPRESSION
                    or cost[id(output)] > MAX_EXPRESSION_COST):
                materialized.add(id(output))
                reused.add(id(output))
    return materialized, reused


class _Closure:
    """What a loop kernel evaluates, grown one result at a time to track its code cost: each value
    is visited once per kernel, so growing a kernel is linear in its size."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.cost = 0

    def add(self, root: Value, materialized: set[int], own: set[int]) -> None:
        """Add what `root` (in `own`, the ids of the kernel's results) needs."""
        stack = [root]
        while stack:
            value = stack.pop()
            if id(value) in self.seen:
                continue
            self.seen.add(id(value))
            if value.producer is None or (id(value) in materialized and id(value) not in own):
                continue
            self.cost += code_cost(value.producer)
            stack.extend(value.producer.inputs)


def _inline_closure(roots: list[Value], materialized: set[int], own: set[int]) -> tuple[
        set[int], list[Value]]:
    """The instructions evaluated inline for `roots` (ids) and the buffers they read, in order.

    Values in `own` (results of the same kernel) are computed in the kernel, not read."""
    instructions: set[int] = set()
    reads: dict[int, Value] = {}
    stack = list(roots)
    seen: set[int] = set()
    computed = own | {id(r) for r in roots}
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if value.producer is None or (id(value) in materialized and id(value) not in computed):
            reads[id(value)] = value
            continue
        instructions.add(id(value.producer))
        stack.extend(value.producer.inputs)
    return instructions, list(reads.values())


def _identity_reads(root: Value, materialized: set[int], targets: set[int]) -> bool:
    """Whether `root` reads the values in `targets` only at its own index within its loop, so they
    can be taken from a register."""
    return reads_at_own_index(root, targets, lambda value: id(value) in materialized)


def _matmul_updates(function: Graph, materialized: set[int]) -> dict[int, MatmulUpdate]:
    """The stored values that are linear functions of a matmul only they read, by id (their
    product is then not stored: the gemm adds it into the result)."""
    users = function.users()
    outputs = {id(v) for v in function.outputs}
    updates: dict[int, MatmulUpdate] = {}
    for instruction in function.instructions:
        for value in instruction.outputs:
            if id(value) in materialized:
                update = matmul_update(value, users, materialized, outputs)
                if update is not None:
                    updates[id(value)] = update
                    materialized.discard(id(update.matmul.outputs[0]))
    return updates


def _kernel_of(root: Value, update: MatmulUpdate | None, materialized: set[int],
               in_order: Callable[[set[int]], list[Instruction]]) -> tuple[Kernel, int]:
    """The kernel that stores `root` alone, and the code cost of what it evaluates."""
    producer = root.producer
    if update is not None:
        product = update.matmul.outputs[0]
        instruction_ids, reads = _inline_closure([root], materialized | {id(product)}, set())
        looked_through = [v.producer for v in update.matmul.inputs if matmul_operand(v)[1]]
        instruction_ids |= {id(i) for i in looked_through} | {id(update.matmul)}
        buffers = [matmul_operand(v)[0] for v in update.matmul.inputs]
        inputs = list({id(v): v for v in [*reads, *buffers] if v is not product}.values())
        return Kernel("matmul", [root], in_order(instruction_ids), inputs, update), 0
    if producer is not None and producer.primitive == "matmul":
        inputs = list({id(v): v for v in map(lambda x: matmul_operand(x)[0],
                                              producer.inputs)}.values())
        # the transposes read through by the gemm flags are shown inside the kernel
        looked_through = [v.producer for v in producer.inputs if matmul_operand(v)[1]]
        return Kernel("matmul", [root], [*looked_through, producer], inputs), 0
    if producer is not None and producer.primitive == "all_reduce":  # a call of the MPI library
        return Kernel("all_reduce", [root], [producer], list(producer.inputs)), 0
    if producer is not None and producer.primitive == "host_callback":  # Python code, which
        # writes all its results at once
        return Kernel("host_callback", list(producer.outputs), [producer],
                      list(producer.inputs)), 0
    if producer is not None and producer.primitive == "scatter":
        kind = "scatter"
    elif producer is not None and producer.primitive in REDUCE and not reduction_is_inner(
            producer) and root.type.size > 0:
        kind = "accumulate"
    else:
        kind = "loop"
    instruction_ids, inputs = _inline_closure([root], materialized, set())
    kernel = Kernel(kind, [root], in_order(instruction_ids), inputs)
    return kernel, sum(code_cost(i) for i in kernel.instructions)


def fuse(function: Graph, matmul_updates: bool = True) -> FusedFunction:
    """Group the instructions of `function` (the `optimized` stage) into kernels. With
    `matmul_updates` (the runtime passes whether a BLAS gemm is available: the generated loop nest
    would add the product onto the result one term at a time, rounding differently from the
    unfused expression), linear functions of a matmul become MatmulUpdate kernels."""
    materialized, reused = _choose_materialized(function)
    outputs = {id(v) for v in function.outputs}
    updates = _matmul_updates(function, materialized) if matmul_updates else {}
    roots: list[Value] = [p for p in function.parameters if id(p) in materialized
                          and any(p is v for v in function.outputs)]
    for instruction in function.instructions:
        roots.extend(v for v in instruction.outputs if id(v) in materialized)

    position = {id(i): n for n, i in enumerate(function.instructions)}

    def in_order(instruction_ids: set[int]) -> list[Instruction]:
        return [function.instructions[n] for n in sorted(position[i] for i in instruction_ids)]

    kernels: list[Kernel] = []
    producer_kernel: dict[int, int] = {}  # value id -> index of the kernel that stores it
    owns: list[set[int]] = []  # per kernel: ids of its results
    costs: list[int] = []  # per kernel: code cost of what it evaluates (CODE_COST units)
    closures: dict[int, _Closure] = {}  # kernel index -> what it evaluates, for merged loop kernels
    loops_by_shape: dict[tuple[int, ...], list[int]] = {}  # loop kernel indices, ascending
    for root in roots:
        if id(root) in producer_kernel:  # a further result of a host callback's kernel
            continue
        producer = root.producer
        kernel, cost = _kernel_of(root, updates.get(id(root)), materialized, in_order)
        ready = max((producer_kernel.get(id(v), -1) for v in kernel.inputs), default=-1)
        target = None
        # a reduction across rows stays alone, a part that ir/rows.py can take as it is
        merges = kernel.kind == "loop" and not (producer is not None
                                                and reduces_across_rows(producer))
        if merges:
            candidates = loops_by_shape.get(root.shape, [])
            for index in candidates[bisect.bisect_left(candidates, max(ready, 0)):]:
                if costs[index] + cost > MAX_KERNEL_COST:
                    continue  # keeps each loop body small enough to compile fast
                # Reads of the candidate's own results must be at the same index.
                if ready == index and not _identity_reads(root, materialized, owns[index]):
                    continue
                target = index
                break
        if target is None:
            kernels.append(kernel)
            owns.append({id(v) for v in kernel.results})
            costs.append(cost)
            producer_kernel.update((id(v), len(kernels) - 1) for v in kernel.results)
            if merges:
                loops_by_shape.setdefault(root.shape, []).append(len(kernels) - 1)
            continue
        merged = kernels[target]
        merged.results.append(root)
        owns[target].add(id(root))
        if target not in closures:
            closures[target] = _Closure()
            for result in merged.results[:-1]:
                closures[target].add(result, materialized, owns[target])
        closures[target].add(root, materialized, owns[target])
        costs[target] = closures[target].cost
        producer_kernel[id(root)] = target
    _finish_merged(kernels, owns, closures, materialized, reused, outputs, in_order)
    return FusedFunction(function, kernels, materialized)


def _finish_merged(kernels: list[Kernel], owns: list[set[int]], closures: dict[int, _Closure],
                   materialized: set[int], reused: set[int], outputs: set[int],
                   in_order: Callable[[set[int]], list[Instruction]]) -> None:
    """The instructions and buffers of merged kernels, computed once each (as if from scratch);
    then a value stored for its readers to reuse that no other kernel reads is computed once per
    element in its own kernel, whose readers read it at their own index (merging checked that):
    it needs no buffer, and the kernel's instructions stay as they are."""
    for index in closures:
        merged, own = kernels[index], owns[index]
        instruction_ids, inputs = _inline_closure(merged.results, materialized, own)
        merged.instructions = in_order(instruction_ids)
        merged.inputs = inputs
    read = {id(v) for kernel in kernels for v in kernel.inputs}
    for index in closures:
        for value in kernels[index].results[:]:
            if id(value) in reused and id(value) not in outputs and id(value) not in read:
                kernels[index].results.remove(value)
                materialized.discard(id(value))
