"""A sum whose terms are scaled by a value computed from another sum is split into the sums of
its terms, each scaled after summing: sum(a + k * b) = sum(a) + k * sum(b), k constant along the
summed axes.

Layer norm's backward, as autodiff writes it from `x - mean` and `(centred ** 2).mean()`, sums
over each row `g / s + 2 * k * (x - mean)`, where k comes from another row sum (of the gradient
times the normalized row). That sum can start only once k is known: a pass over the row of its
own, between the pass that computes k and the one that writes the input's gradient. Split, sum(g
/ s) and sum(x - mean) need nothing from k and join earlier passes over the row (ir/rows.py,
ir/loop_fusion.py): the row kernel reads each row 4 times instead of 5.

The terms are found through add, sub, neg, and mul and div by a value constant along the summed
axes (a factor); a term that is a factor alone (sum(x - mean) would become sum(x) - n * mean,
which cancels) and any other operation are kept whole. Only sums with a term whose factor comes
from a reduction are split (the others can run as early as their terms anyway), into at most
MOST_SUMS sums. Each term is summed in float64 (a float32 sum accumulates in float64 anyway; a
sum the function already has, a softmax's of its exponentials, is reused) and the scaled sums are
added in float64 before the one rounding to the sum's dtype: no element is rounded to float32
after its scaling any more, so where the terms cancel the result is at least as accurate as the
sum of the rounded elements was.
"""
from __future__ import annotations

from tracer.ir.builder import GraphBuilder
from tracer.ir.graph import Graph, Instruction, Value
from tracer.ir.primitives import REDUCE, accumulator_dtype
from tracer.ir.types import is_float

# A term of a sum: (sign, factors multiplied, factors divided by, the summed value).
Term = tuple[float, list[Value], list[Value], Value]
# A sum is split into at most this many sums (each a reduction the row kernel computes).
MOST_SUMS = 4


def split_scaled_sums(function: Graph) -> Graph:
    """`function` with its sums of terms scaled by values from other reductions split (see the
    module's docstring)."""
    from_reduction: set[int] = set()  # values computed from the result of a reduction
    replacements: dict[int, Value] = {}
    existing: dict[tuple, Value] = {}  # the sums before, by what and over which axes they sum
    body: list[Instruction] = []
    builder = GraphBuilder(function, lambda: instruction.location, body)
    for instruction in function.instructions:
        instruction.inputs = [replacements.get(id(v), v) for v in instruction.inputs]
        if instruction.primitive in REDUCE or any(id(v) in from_reduction
                                                  for v in instruction.inputs):
            from_reduction.update(id(v) for v in instruction.outputs)
        if (instruction.primitive == "reduce_sum" and is_float(instruction.outputs[0].dtype)
                and instruction.attributes["axes"]):
            (operand,), axes = instruction.inputs, instruction.attributes["axes"]
            terms = _terms(operand, axes, 1.0)
            scaled = {id(term) for _, multiplied, divided, term in terms
                      if any(id(f) in from_reduction for f in multiplied + divided)}
            if scaled and len({id(term) for *_, term in terms}) <= MOST_SUMS:
                replacement = _summed_terms(builder, terms, instruction.outputs[0], axes,
                                            existing)
                replacements[id(instruction.outputs[0])] = replacement
                from_reduction.add(id(replacement))
        if instruction.primitive == "reduce_sum":
            existing[(id(instruction.inputs[0]), instruction.attributes["axes"])] = \
                instruction.outputs[0]
        body.append(instruction)
    function.instructions = body
    for index, value in enumerate(function.outputs):
        function.outputs[index] = replacements.get(id(value), value)
    return function


def _is_factor(value: Value, operand: Value, axes: tuple[int, ...]) -> bool:
    """Whether `value`, an operand of an elementwise instruction with the summed `operand`'s
    shape, is constant along the summed axes (broadcast along them, or of size 1 there)."""
    rank = operand.type.ndim
    aligned = (1,) * (rank - value.type.ndim) + tuple(value.shape)
    if all(aligned[a] == 1 for a in axes):
        return True
    producer = value.producer
    return (producer is not None and producer.primitive == "broadcast"
            and _is_factor(producer.inputs[0], operand, axes))


def _terms(value: Value, axes: tuple[int, ...], sign: float) -> list[Term]:
    """`value` as a sum of scaled terms (see the module's docstring), each of `value`'s shape."""
    producer = value.producer
    whole: list[Term] = [(sign, [], [], value)]
    if producer is None:
        return whole
    primitive, inputs = producer.primitive, producer.inputs
    if primitive in ("add", "sub") and all(v.shape == value.shape and not _is_factor(v, value, axes)
                                           for v in inputs):
        return (_terms(inputs[0], axes, sign)
                + _terms(inputs[1], axes, -sign if primitive == "sub" else sign))
    if primitive == "neg":
        return _terms(inputs[0], axes, -sign)
    if primitive in ("mul", "div"):
        first, second = (_is_factor(v, value, axes) for v in inputs)
        if primitive == "mul" and first != second:
            factor, other = (inputs[0], inputs[1]) if first else (inputs[1], inputs[0])
        elif primitive == "div" and second and not first:
            factor, other = inputs[1], inputs[0]
        else:
            return whole
        if other.shape != value.shape:
            return whole
        return [(s, [*multiplied, factor] if primitive == "mul" else multiplied,
                 [*divided, factor] if primitive == "div" else divided, term)
                for s, multiplied, divided, term in _terms(other, axes, sign)]
    return whole


def _summed_terms(builder: GraphBuilder, terms: list[Term], result: Value,
                  axes: tuple[int, ...], existing: dict[tuple, Value]) -> Value:
    """The sum of `terms` over `axes` as `result`'s type: each term summed in its accumulator's
    dtype (or the sum of it the function has already: a softmax's sum of exponentials), scaled,
    and the scaled sums added in that dtype, then rounded once."""
    wide = accumulator_dtype("reduce_sum", result.dtype)
    sums: dict[int, Value] = {}  # each distinct term summed once
    total = None
    for sign, multiplied, divided, term in terms:
        if id(term) not in sums:
            known = existing.get((id(term), axes))
            sums[id(term)] = builder.cast(
                builder.reduce_sum(builder.cast(term, wide), axes) if known is None else known,
                wide)
        scaled = sums[id(term)]
        for factor in multiplied:
            scaled = builder.mul(scaled, _reduced_factor(builder, factor, term, axes, result, wide))
        for factor in divided:
            scaled = builder.div(scaled, _reduced_factor(builder, factor, term, axes, result, wide))
        if total is None:
            total = scaled if sign > 0 else builder.neg(scaled)
        else:
            total = builder.add(total, scaled) if sign > 0 else builder.sub(total, scaled)
    return builder.cast(total, result.dtype)


def _reduced_factor(builder: GraphBuilder, factor: Value, term: Value, axes: tuple[int, ...],
                    result: Value, wide) -> Value:
    """`factor` (constant along `axes` of `term`'s shape) in the shape of the sum, in `wide`."""
    rank = term.type.ndim

    def aligned(value: Value) -> tuple[int, ...]:
        return (1,) * (rank - value.type.ndim) + tuple(value.shape)

    while not all(aligned(factor)[a] == 1 for a in axes):
        factor = factor.producer.inputs[0]  # a broadcast along the axes (see _is_factor)
    kept = tuple(d for a, d in enumerate(aligned(factor)) if a not in axes)
    return builder.cast(builder.broadcast(builder.reshape(factor, kept), result.shape), wide)
