"""Optimization passes over a Function: simplify, constant folding, cse, dce, and the fusion of
independent all_reduces into one (ir/collectives.py).

Each pass rewrites the function it is given in place and returns it; `optimize` works on a copy.
"""
from __future__ import annotations

from collections import Counter

from tracer.ir.builder import GraphBuilder
from tracer.ir.collectives import fuse_all_reduces
from tracer.ir.graph import Graph, Instruction, Value, gc_paused
from tracer.ir.index_checks import check_is_needed
from tracer.ir.primitives import CHECKS, ELEMENTWISE
from tracer.ir.reference import evaluate_primitive
from tracer.ir.text import format_attribute
from tracer.ir.types import int64, is_float


def _replace_uses(function: Graph, replacements: dict[int, Value]) -> None:
    if not replacements:  # (the last rounds of `optimize` mostly)
        return

    def resolve(value: Value) -> Value:
        while id(value) in replacements:
            value = replacements[id(value)]
        return value

    for instruction in function.instructions:
        instruction.inputs = [resolve(v) for v in instruction.inputs]
    function.outputs = [resolve(v) for v in function.outputs]


def _forwarded_operands(instruction: Instruction) -> list[Value] | None:
    """The operands an instruction merely passes through, or None if it computes something."""
    primitive, (x, *_) = instruction.primitive, instruction.inputs or [None]
    if primitive == "stop_gradient" or (primitive in CHECKS and not check_is_needed(instruction)):
        return [x]
    if primitive == "custom_vjp":
        return instruction.inputs[:instruction.attributes["num_outputs"]]
    if primitive in ("broadcast", "reshape", "transpose", "cast", "slice", "pad"):
        if instruction.outputs[0].type == x.type and (
                primitive != "transpose" or instruction.attributes["permutation"] == tuple(
                    range(x.type.ndim))) and (
                primitive != "slice" or set(instruction.attributes["steps"]) <= {1}):
            return [x]
    return None


def simplify(function: Graph) -> Graph:
    """Drop gradient markers (needed only by autodiff), layout changes that change nothing and
    index checks that cannot fail."""
    replacements: dict[int, Value] = {}
    for instruction in function.instructions:
        forwarded = _forwarded_operands(instruction)
        if forwarded is not None:
            replacements.update(zip(map(id, instruction.outputs), forwarded))
    _replace_uses(function, replacements)
    return function


def scalar_constant(value: Value) -> float | int | bool | None:
    """The number every element of `value` equals, when it is a constant seen through reshapes and
    broadcasts; else None."""
    while value.producer is not None and value.producer.primitive in ("reshape", "broadcast"):
        value = value.producer.inputs[0]
    if value.producer is not None and value.producer.primitive == "constant":
        return value.producer.attributes["value"]
    return None


def _rewrite(instruction: Instruction, primitive: str, inputs: list[Value], **attributes) -> None:
    instruction.primitive, instruction.inputs, instruction.attributes = primitive, inputs, attributes


def constant_power(builder: GraphBuilder, x: Value, exponent: float | int,
                   shape: tuple[int, ...]) -> Value | None:
    """`x ** exponent` broadcast to `shape` without pow, for the exponents 0, 1 to 4 and, for
    float x, -1 to -4, 0.5 and -0.5; None (adding nothing) for any other. Each is a few
    multiplications, a division or a square root where pow is exp(exponent * log x); the values
    are numpy's (the reference semantics) at 0, -0, inf and nan, and within the ulps that
    tests/test_codegen_constant_pow.py documents elsewhere."""
    floating = is_float(x.dtype)
    small_integer = float(exponent).is_integer() and abs(exponent) <= 4  # False for inf and nan
    if not (floating and (small_integer or abs(exponent) == 0.5)
            or x.dtype == int64 and small_integer and exponent >= 0):
        return None
    x = builder.broadcast(x, shape)
    if exponent == 0:
        return builder.full(shape, 1, x.dtype)  # even for nan, as numpy and PyTorch
    if exponent == 0.5:
        return builder.op("sqrt", x)  # as numpy's and PyTorch's x ** 0.5: (-0) ** 0.5 = -0
    if exponent == -0.5:
        # numpy's power (C99): (-0) ** -0.5 = +inf and (-inf) ** -0.5 = 0, where 1/sqrt gives
        # -inf and nan (PyTorch's rsqrt does).
        root = builder.op("abs", builder.op("sqrt", x))
        return builder.div(1.0, builder.select(builder.eq(x, float("-inf")), float("inf"), root))
    # x ** -n = (1/x) ** n: the reciprocal is rounded once and overflows or underflows only where
    # the result does, unlike 1 / x ** n (x ** n overflows for |x| > 2^32 in float32 when n = 4).
    base = builder.div(1.0, x) if exponent < 0 else x
    n = abs(int(exponent))
    if n == 1:
        return base
    square = builder.mul(base, base)
    if n == 2:
        return square
    return builder.mul(square, base if n == 3 else square)


def _swaps_last_axes(permutation: tuple[int, ...]) -> bool:
    rank = len(permutation)
    return rank >= 2 and permutation == (*range(rank - 2), rank - 1, rank - 2)


def _algebraic_replacement(instruction: Instruction, builder: GraphBuilder,
                           uses: Counter) -> Value | None:
    """A value `instruction`'s result equals, or None; may instead rewrite it into a cheaper form,
    adding the instructions that form needs through `builder` (`uses`: how many times each value
    is read)."""
    primitive, inputs, out = instruction.primitive, instruction.inputs, instruction.outputs[0]
    constants = [scalar_constant(v) for v in inputs]

    def same_type(value: Value) -> Value | None:
        return value if value.type == out.type else None

    if primitive == "select" and constants[0] is not None:
        chosen = inputs[1] if constants[0] else inputs[2]
        if chosen.type == out.type:
            return chosen
        _rewrite(instruction, "broadcast", [chosen], shape=out.shape)
    elif primitive == "mul" and 1 in constants:
        return same_type(inputs[1 - constants.index(1)])
    elif primitive in ("add", "sub") and constants[1] == 0:
        return same_type(inputs[0])
    elif primitive == "add" and constants[0] == 0:
        return same_type(inputs[1])
    elif primitive == "div" and constants[1] == 1:
        return same_type(inputs[0])
    elif primitive == "pow" and constants[1] is not None and inputs[0].dtype == out.dtype:
        return constant_power(builder, inputs[0], constants[1], out.shape)
    elif (primitive == "neg" and inputs[0].producer is not None
          and inputs[0].producer.primitive == "neg"):
        return inputs[0].producer.inputs[0]
    elif primitive in ("reshape", "broadcast") and inputs[0].producer is not None:
        inner = inputs[0].producer
        if inner.primitive == primitive or (
                primitive == "broadcast" and inner.primitive == "reshape"
                and inner.inputs[0].type.ndim == 0):
            # reshape(reshape(x)) and broadcast(broadcast(x)) are one step; so is broadcast of a
            # reshaped scalar.
            _rewrite(instruction, primitive, [inner.inputs[0]], **instruction.attributes)
    elif (primitive == "transpose" and inputs[0].producer is not None
          and inputs[0].producer.primitive == "matmul" and uses[id(inputs[0])] == 1
          and _swaps_last_axes(instruction.attributes["permutation"])
          and all(v.type.ndim == out.type.ndim for v in inputs[0].producer.inputs)):
        # (a @ b)^T = b^T @ a^T, a gemm that writes the layout its reader wants (a weight's
        # gradient x^T @ g read transposed by the update of a (out, in) weight): the operands'
        # transposes are the gemm's flags, and the update may then accumulate into the weight
        a, b = inputs[0].producer.inputs
        _rewrite(instruction, "matmul", [builder.swap_last_axes(b), builder.swap_last_axes(a)])
    elif primitive == "transpose" and inputs[0].producer is not None and \
            inputs[0].producer.primitive == "transpose":
        inner = inputs[0].producer
        first, second = inner.attributes["permutation"], instruction.attributes["permutation"]
        _rewrite(instruction, "transpose", [inner.inputs[0]],
                 permutation=tuple(first[p] for p in second))
    return None


def simplify_algebra(function: Graph) -> Graph:
    """x*1, x+0, x/1 -> x; x ** c for a constant c -> multiplications, sqrt or a reciprocal
    (`constant_power`); select on a constant condition -> one branch; chains of reshapes, of
    broadcasts and of transposes -> one step; -(-x) -> x; (a @ b)^T -> b^T @ a^T when the
    product is read only there."""
    replacements: dict[int, Value] = {}
    body: list[Instruction] = []  # the instructions, with those the rewrites add before their use
    # what a rewrite adds comes from the line of the instruction it replaces (the loop variable)
    builder = GraphBuilder(function, lambda: instruction.location, body)
    uses = Counter(id(v) for i in function.instructions for v in i.inputs)
    uses.update(id(v) for v in function.outputs)
    for instruction in function.instructions:
        instruction.inputs = [replacements.get(id(v), v) for v in instruction.inputs]
        if len(instruction.outputs) == 1:
            replacement = _algebraic_replacement(instruction, builder, uses)
            if replacement is not None:
                replacements[id(instruction.outputs[0])] = replacement
        body.append(instruction)
    function.instructions = body
    _replace_uses(function, replacements)
    return function


def fold_constants(function: Graph) -> Graph:
    """Evaluate elementwise instructions on scalar constants at compile time."""
    constants: dict[int, object] = {}
    for instruction in function.instructions:
        if instruction.primitive == "constant":
            constants[id(instruction.outputs[0])] = instruction.attributes["value"]
        elif (instruction.primitive in ELEMENTWISE and instruction.outputs[0].type.ndim == 0
              and all(id(v) in constants for v in instruction.inputs)):
            inputs = [evaluate_primitive("constant", [], {"value": constants[id(v)], "dtype": v.dtype})[0]
                      for v in instruction.inputs]
            (result,) = evaluate_primitive(instruction.primitive, inputs, instruction.attributes)
            instruction.primitive, instruction.inputs = "constant", []
            instruction.attributes = {"value": result.item(), "dtype": result.dtype}
            constants[id(instruction.outputs[0])] = result.item()
    return function


# Attribute values compared as themselves (with their types: 1 and True differ) by `cse`; the
# others by their printed form (a float's tells -0.0 from 0.0, which compare equal).
_PLAIN_ATTRIBUTES = frozenset({int, bool, str, type(None)})


def cse(function: Graph) -> Graph:
    """Reuse the first of several instructions that compute the same thing from the same values."""
    seen: dict[tuple, Instruction] = {}
    replacements: dict[int, Value] = {}
    for instruction in function.instructions:
        inputs = [replacements.get(id(v), v) for v in instruction.inputs]
        instruction.inputs = inputs
        key = (instruction.primitive, tuple(map(id, inputs)),
               tuple((k, type(v), v) if type(v) in _PLAIN_ATTRIBUTES else (k, format_attribute(v))
                     for k, v in instruction.attributes.items()))
        if key in seen:
            replacements.update(zip(map(id, instruction.outputs), seen[key].outputs))
        else:
            seen[key] = instruction
    _replace_uses(function, replacements)
    return function


def dce(function: Graph) -> Graph:
    """Remove instructions none of whose results are used: every primitive is pure except the
    checks, which can fail and so stay (PyTorch raises for an index it never reads)."""
    live = {id(v) for v in function.outputs}
    kept = []
    for instruction in reversed(function.instructions):
        if ((instruction.primitive in CHECKS and check_is_needed(instruction))
                or any(id(v) in live for v in instruction.outputs)):
            kept.append(instruction)
            live.update(id(v) for v in instruction.inputs)
    function.instructions = kept[::-1]
    return function


# simplify runs again after simplify_algebra, which leaves layout changes that change nothing
# (a reshape of a reshape back to the first shape): the GPT step's graph then reached its fixed
# point in 3 rounds of `optimize` instead of 4 (each ~20 ms of CPU), with the same result.
PIPELINE = (simplify, simplify_algebra, simplify, fold_constants, cse, dce, fuse_all_reduces)


def _fingerprint(function: Graph) -> tuple:
    """What the passes can change: they rewrite instructions in place (primitive, operands), drop
    some and create new ones only in place of a pow they remove, so equal fingerprints mean an
    unchanged function (the fusion of all_reduces creates instructions too, once: after it no
    two all_reduces of a kind are independent)."""
    return (tuple((id(i), i.primitive, *map(id, i.inputs)) for i in function.instructions),
            tuple(map(id, function.outputs)))


def optimize(function: Graph) -> Graph:
    """The `optimized` stage: the passes above on a copy of `function`, until nothing changes."""
    with gc_paused():
        result = function.copy()
        previous = None
        while (fingerprint := _fingerprint(result)) != previous:
            previous = fingerprint
            for optimization in PIPELINE:
                optimization(result)
        return result
