"""Batching (vmap) as an IR transform: a Function traced on one element's shapes, replayed through
any Builder on operands that carry a leading batch dimension.

`BATCHING_RULES[primitive](b, size, inputs, batched, attributes)` gets the operands (a batched one
has the batch dimension first, of length `size`; an unbatched one is the same for every element)
and emits, through `b`, the instructions that compute every element's results at once, each with
the batch dimension first. A rule is only called when some operand is batched: an instruction
whose operands are all unbatched is emitted as it is (its result is the same for every element).
Keeping the batch dimension first everywhere makes each rule a shift of attributes by one.
"""
from __future__ import annotations

from typing import Callable, Sequence

from tracer.ir.autodiff import active_values, expand_gradients
from tracer.ir.builder import Builder, Handle
from tracer.ir.graph import Graph, Instruction, Value
from tracer.ir.passes import dce
from tracer.ir.primitives import ELEMENTWISE, LAYOUT, REDUCE, SOURCES
from tracer.ir.types import int64


class CannotBatch(Exception):
    """A function the batching pass has no sound rule for; the caller runs it once per element."""


def _element_shape(b: Builder, x: Handle, batched: bool) -> tuple[int, ...]:
    shape = b.type_of(x).shape
    return shape[1:] if batched else shape


def _ranked(b: Builder, x: Handle, batched: bool, rank: int) -> Handle:
    """A batched `x` with ones inserted after its batch dimension up to `rank` element dimensions,
    so that the batch dimension stays first when numpy-style (right-aligned) broadcasting lines
    it up with operands of a higher rank; an unbatched `x` as it is."""
    if not batched:
        return x
    shape = b.type_of(x).shape
    return b.reshape(x, shape[:1] + (1,) * (rank + 1 - len(shape)) + shape[1:])


def _elementwise(primitive: str) -> Callable[..., list[Handle]]:
    def rule(b, size, inputs, batched, attributes):
        rank = max(len(_element_shape(b, x, flag)) for x, flag in zip(inputs, batched))
        aligned = [_ranked(b, x, flag, rank) for x, flag in zip(inputs, batched)]
        return b.emit(primitive, aligned, attributes)
    return rule


def _broadcast(b, size, inputs, batched, attributes):
    (x,), shape = inputs, tuple(attributes["shape"])
    return [b.broadcast(_ranked(b, x, True, len(shape)), (size, *shape))]


def _reshape(b, size, inputs, batched, attributes):
    return [b.op("reshape", inputs[0], shape=(size, *attributes["shape"]))]


def _transpose(b, size, inputs, batched, attributes):
    permutation = (0, *(p + 1 for p in attributes["permutation"]))
    return [b.op("transpose", inputs[0], permutation=permutation)]


def _slice(b, size, inputs, batched, attributes):
    return [b.op("slice", inputs[0], starts=(0, *attributes["starts"]),
                 stops=(size, *attributes["stops"]), steps=(1, *attributes["steps"]))]


def _pad(b, size, inputs, batched, attributes):
    return [b.op("pad", inputs[0], low=(0, *attributes["low"]), high=(0, *attributes["high"]),
                 interior=(0, *attributes["interior"]))]


def _reduce(primitive: str) -> Callable[..., list[Handle]]:
    def rule(b, size, inputs, batched, attributes):
        return [b.op(primitive, inputs[0], axes=tuple(a + 1 for a in attributes["axes"]))]
    return rule


def _source(primitive: str) -> Callable[..., list[Handle]]:
    # (never called by batch_function: a source has no operand, so it is never batched)
    def rule(b, size, inputs, batched, attributes):
        (result,) = b.emit(primitive, inputs, attributes)
        return [b.broadcast(result, (size, *b.type_of(result).shape))]
    return rule


def _move_first(b: Builder, x: Handle, position: int) -> Handle:
    """`x` with its dimension `position` moved to the front."""
    rank = b.type_of(x).ndim
    return b.transpose(x, (position, *(d for d in range(rank) if d != position)))


def _matmul(b, size, inputs, batched, attributes):
    left, right = inputs
    if all(batched):  # the IR's matmul takes leading batch dimensions
        return b.emit("matmul", [left, right], {})
    if batched[0]:
        # (size, *batch, m, k) @ (*batch, k, n): the elements are more rows of one product
        shape = b.type_of(left).shape
        batch, (m, k) = shape[1:-2], shape[-2:]
        rows = b.transpose(left, (*range(1, len(batch) + 1), 0, len(shape) - 2, len(shape) - 1))
        product = b.op("matmul", b.reshape(rows, (*batch, size * m, k)), right)
        n = b.type_of(product).shape[-1]
        return [_move_first(b, b.reshape(product, (*batch, size, m, n)), len(batch))]
    # (*batch, m, k) @ (size, *batch, k, n): the elements are more columns of one product
    shape = b.type_of(right).shape
    batch, (k, n) = shape[1:-2], shape[-2:]
    columns = b.transpose(right, (*range(1, len(batch) + 1), len(shape) - 2, 0, len(shape) - 1))
    product = b.op("matmul", left, b.reshape(columns, (*batch, k, size * n)))
    m = b.type_of(product).shape[-2]
    return [_move_first(b, b.reshape(product, (*batch, m, size, n)), len(batch) + 1)]


def _batch_indices(b: Builder, size: int, indices: Sequence[Handle], batched: Sequence[bool],
                   with_position: bool) -> list[Handle]:
    """Index operands whose broadcast shape is (size, *the element's index shape); with
    `with_position`, led by an index of the element's own position along the batch dimension."""
    rank = max(len(_element_shape(b, x, flag)) for x, flag in zip(indices, batched))
    aligned = [_ranked(b, x, flag, rank) for x, flag in zip(indices, batched)]
    if with_position:
        aligned.insert(0, b.op("iota", shape=(size, *(1,) * rank), dimension=0, dtype=int64))
    return aligned


def _gather(b, size, inputs, batched, attributes):
    x, *indices = inputs
    axes = tuple(attributes["axes"])
    if batched[0]:  # each element reads its own slice of x: index the batch dimension too
        indices = _batch_indices(b, size, indices, batched[1:], True)
        axes = (0, *(a + 1 for a in axes))
    else:
        indices = _batch_indices(b, size, indices, batched[1:], False)
    return b.emit("gather", [x, *indices], {"axes": axes})


def _scatter(b, size, inputs, batched, attributes):
    target, updates, *indices = inputs
    target_shape = _element_shape(b, target, batched[0])
    if not batched[0]:  # each element writes into its own copy of the target
        target = b.broadcast(target, (size, *target_shape))
    indices = _batch_indices(b, size, indices, batched[2:], True)
    axes = (0, *(a + 1 for a in attributes["axes"]))
    if not batched[1]:
        updates = b.broadcast(updates, (size, *b.type_of(updates).shape))
    return b.emit("scatter", [target, updates, *indices],
                  {"axes": axes, "accumulate": attributes["accumulate"]})


def _custom_vjp(b, size, inputs, batched, attributes):
    if attributes["rule"].elementwise:  # (PyTorch's sgn: one call on the whole batch)
        whole = [x if flag else b.broadcast(x, (size, *b.type_of(x).shape))
                 for x, flag in zip(inputs, batched)]
        return b.emit("custom_vjp", whole, attributes)
    raise CannotBatch("a custom Function whose gradient is taken outside the mapped function "
                      "(its backward is written for one element)")


def _host_callback(b, size, inputs, batched, attributes):
    raise CannotBatch("a custom Function that computes on the host (its numpy code is written for "
                      "one element)")


def _table() -> dict[str, Callable[..., list[Handle]]]:
    table: dict[str, Callable[..., list[Handle]]] = {}
    # Elementwise on each operand, so any batch layout passes through; all_reduce is elementwise
    # across processes, check_index checks each index against the (unbatched) dimension size.
    for name in ELEMENTWISE | {"stop_gradient", "all_reduce", "check_index"}:
        table[name] = _elementwise(name)
    for name in REDUCE:
        table[name] = _reduce(name)
    for name in SOURCES:
        table[name] = _source(name)
    table.update({"broadcast": _broadcast, "reshape": _reshape, "transpose": _transpose,
                  "slice": _slice, "pad": _pad, "matmul": _matmul, "gather": _gather,
                  "scatter": _scatter, "custom_vjp": _custom_vjp,
                  "host_callback": _host_callback})
    assert LAYOUT <= set(table)
    return table


# BATCHING_RULES[primitive](builder, size, inputs, batched, attributes) -> results, batch first.
BATCHING_RULES = _table()


def batch_function(b: Builder, function: Graph, arguments: Sequence[tuple[Handle, bool]],
                   size: int) -> list[tuple[Handle, bool]]:
    """Emit through `b` the instructions of `function` (traced on one element's shapes, its
    gradient directives expanded) for `size` elements at once. `arguments`: per parameter, a
    handle and whether it is batched (then its batch dimension is first). Returns per output a
    handle and whether it is batched (it is the same for every element if not)."""
    unknown = {i.primitive for i in function.instructions} - set(BATCHING_RULES)
    if unknown:
        raise CannotBatch(f"no batching rule for {', '.join(sorted(unknown))}")
    environment: dict[int, tuple[Handle, bool]] = {
        id(parameter): argument for parameter, argument in zip(function.parameters, arguments)}
    for instruction in function.instructions:
        inputs, batched = zip(*(environment[id(v)] for v in instruction.inputs)) \
            if instruction.inputs else ((), ())
        if hasattr(b, "location"):  # (the batched instructions keep the user's line)
            b.location = lambda where=instruction.location: where
        if any(batched):
            results = BATCHING_RULES[instruction.primitive](
                b, size, list(inputs), list(batched), instruction.attributes)
        else:
            results = b.emit(instruction.primitive, list(inputs), instruction.attributes)
        for value, result in zip(instruction.outputs, results):
            environment[id(value)] = (result, any(batched))
    return [environment[id(v)] for v in function.outputs]




def _replace(function: Graph, replacements: dict[int, Value], instructions) -> None:
    for instruction in instructions:
        instruction.inputs = [replacements.get(id(v), v) for v in instruction.inputs]
    function.outputs = [replacements.get(id(v), v) for v in function.outputs]


def _detach_gradients(function: Graph) -> None:
    """A `gradient` directive's results are constants to any later gradient (it was taken without
    create_graph); once expanded they are ordinary instructions, so mark them as constants."""
    index = 0
    while index < len(function.instructions):
        directive = function.instructions[index]
        index += 1
        if directive.primitive != "gradient":
            continue
        replacements = {}
        for value in directive.outputs:
            marker = Instruction("stop_gradient", [value], {}, location=directive.location)
            marker.outputs = [Value(function.new_name(), value.type, marker)]
            replacements[id(value)] = marker.outputs[0]
            function.instructions.insert(index, marker)
            index += 1
        pending = [i for emitted, _ in function.expansions.values() for i in emitted]
        _replace(function, replacements, function.instructions[index:] + pending)
        for key, (emitted, gradients) in function.expansions.items():
            function.expansions[key] = (emitted, [replacements.get(id(g), g) for g in gradients])


def prepare(function: Graph, differentiable: Sequence[Value]) -> Graph:
    """Make `function` (one element's trace) ready for `batch_function`, in place: its gradient
    directives expanded (per element, the simplest sound order: the backward is batched like any
    other instructions), dead instructions dropped, and the custom Functions' markers dropped
    where no later gradient can pass them -- a gradient from the parameters `differentiable`
    (those the caller's autograd may still differentiate) that would raises CannotBatch, unless
    the marker's rule is elementwise (then it stays, batched as it is)."""
    _detach_gradients(function)
    expand_gradients(function)
    active = active_values(function.instructions, differentiable)
    replacements: dict[int, Value] = {}
    for instruction in function.instructions:
        instruction.inputs = [replacements.get(id(v), v) for v in instruction.inputs]
        if instruction.primitive != "custom_vjp":
            continue
        if any(id(v) in active for v in instruction.outputs):
            if instruction.attributes["rule"].elementwise:
                continue  # batched as it is
            BATCHING_RULES["custom_vjp"](None, 0, [], [], instruction.attributes)
        count = instruction.attributes["num_outputs"]
        replacements.update(zip(map(id, instruction.outputs), instruction.inputs[:count]))
    function.outputs = [replacements.get(id(v), v) for v in function.outputs]
    return dce(function)
