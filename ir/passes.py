"""Optimization passes over a Function: simplify, constant folding, cse, dce.

Each pass rewrites the function it is given in place and returns it; `optimize` works on a copy.
"""
from __future__ import annotations

from ir.graph import Function, Instruction, Value
from ir.primitives import ELEMENTWISE
from ir.reference import evaluate_primitive
from ir.text import format_attribute


def _replace_uses(function: Function, replacements: dict[int, Value]) -> None:
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
    if primitive == "stop_gradient":
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


def simplify(function: Function) -> Function:
    """Drop gradient markers (needed only by autodiff) and layout changes that change nothing."""
    replacements: dict[int, Value] = {}
    for instruction in function.instructions:
        forwarded = _forwarded_operands(instruction)
        if forwarded is not None:
            replacements.update(zip(map(id, instruction.outputs), forwarded))
    _replace_uses(function, replacements)
    return function


def fold_constants(function: Function) -> Function:
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


def cse(function: Function) -> Function:
    """Reuse the first of several instructions that compute the same thing from the same values."""
    seen: dict[tuple, Instruction] = {}
    replacements: dict[int, Value] = {}
    for instruction in function.instructions:
        inputs = [replacements.get(id(v), v) for v in instruction.inputs]
        instruction.inputs = inputs
        key = (instruction.primitive, tuple(map(id, inputs)),
               tuple((k, format_attribute(v)) for k, v in instruction.attributes.items()))
        if key in seen:
            replacements.update(zip(map(id, instruction.outputs), seen[key].outputs))
        else:
            seen[key] = instruction
    _replace_uses(function, replacements)
    return function


def dce(function: Function) -> Function:
    """Remove instructions none of whose results are used (every primitive is pure)."""
    live = {id(v) for v in function.outputs}
    kept = []
    for instruction in reversed(function.instructions):
        if any(id(v) in live for v in instruction.outputs):
            kept.append(instruction)
            live.update(id(v) for v in instruction.inputs)
    function.instructions = kept[::-1]
    return function


PIPELINE = (simplify, fold_constants, cse, dce)


def optimize(function: Function) -> Function:
    """The `optimized` stage: the passes above on a copy of `function`, until nothing changes."""
    from ir.text import format_function

    result = function.copy()
    previous = None
    while (text := format_function(result)) != previous:
        previous = text
        for optimization in PIPELINE:
            optimization(result)
    return result
