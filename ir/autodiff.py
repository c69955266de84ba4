"""Reverse-mode autodiff as an IR -> IR transform.

The tracer records `.backward()` and `grad` as `gradient` directives; `expand_gradients` replaces each
directive, in place, by the backward instructions that compute it from the instructions before it.
That is also when the backward of a custom Function is traced, so it runs only where needed.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

from tracer.ir.builder import GraphBuilder
from tracer.ir.graph import Graph, Instruction, Value
from tracer.ir.primitives import DIRECTIVES, NON_DIFFERENTIABLE
from tracer.ir.types import is_float
from tracer.ir.vjp import accumulate, apply_vjp, materialize, through_hooks


def active_values(instructions: Sequence[Instruction], wrt: Sequence[Value]) -> set[int]:
    """Ids of the values through which a gradient can flow from `wrt`."""
    active = {id(v) for v in wrt}
    for instruction in instructions:
        # (a `gradient` directive still in the graph was taken without create_graph: its results
        # are constants, as PyTorch's are)
        if instruction.primitive in NON_DIFFERENTIABLE or instruction.primitive in DIRECTIVES:
            continue
        if any(id(x) in active for x in instruction.inputs):
            active.update(id(v) for v in instruction.outputs if is_float(v.dtype))
    return active


def gradient_path(instructions: Sequence[Instruction], outputs: Sequence[Value],
                  wrt: Sequence[Value]) -> set[int]:
    """Ids of the values on some gradient path from `wrt` to one of `outputs`."""
    active = active_values(instructions, wrt)
    needed = {id(output) for output in outputs if id(output) in active}
    for instruction in reversed(instructions):
        if instruction.primitive in NON_DIFFERENTIABLE or instruction.primitive in DIRECTIVES:
            continue
        if any(id(v) in needed for v in instruction.outputs):
            needed.update(id(x) for x in instruction.inputs if id(x) in active)
    return needed


def reaches(instructions: Sequence[Instruction], output: Value, wrt: Sequence[Value]) -> list[bool]:
    """For each of `wrt`, whether a gradient path leads from it to `output`."""
    needed = gradient_path(instructions, [output], wrt)
    return [id(v) in needed for v in wrt]


def backward(builder: GraphBuilder, forward: Sequence[Instruction], output: Value, seed: Value,
             wrt: Sequence[Value], hooks: dict[int, Callable] | None = None,
             through: Sequence[int] = ()) -> list[Value | None]:
    """Emit through `builder` the gradients of `output` with respect to `wrt`, seeded by `seed`,
    through the instructions `forward`. None where no gradient flows. `hooks[id(value)]`, if
    any, is called as hook(builder, cotangent) with the whole cotangent of that value and
    returns the one that goes on (the tracer's Tensor.register_hook). `through`: see
    `vector_jacobian_product`."""
    return vector_jacobian_product(builder, forward, [output], [seed], wrt, hooks, through)


def vector_jacobian_product(builder: GraphBuilder, forward: Sequence[Instruction],
                            outputs: Sequence[Value], seeds: Sequence[Value],
                            wrt: Sequence[Value], hooks: dict[int, Callable] | None = None,
                            through: Sequence[int] = ()) -> list[Value | None]:
    """`backward` of several outputs at once, each seeded by its own cotangent (an output given
    twice gets their sum). The gradient stops at each of `wrt`, a leaf's value (the instruction
    that computed it, an in-place change under no_grad, is no part of the leaf's graph), but at
    the positions `through`: values of tensors that are no leaves, whose gradient goes on to what
    they were computed from (PyTorch's gradient with respect to x of a loss of y and x, y = 2 x,
    takes in the path through y)."""
    hooks = hooks or {}
    active = active_values(forward, wrt)
    on_path = gradient_path(forward, outputs, wrt)
    cotangents: dict[int, Value] = {}
    for output, seed in zip(outputs, seeds):
        cotangents[id(output)] = accumulate(builder, cotangents.get(id(output)), seed)
    targets = {id(v) for position, v in enumerate(wrt) if position not in through}
    for instruction in reversed(forward):
        outgoing = [cotangents.get(id(v)) for v in instruction.outputs]
        if all(id(v) in targets for v in instruction.outputs):
            continue
        for index, (value, g) in enumerate(zip(instruction.outputs, outgoing)):
            if g is not None and id(value) in hooks:
                outgoing[index] = through_hooks(builder, g, value.type,
                                                functools.partial(hooks[id(value)], builder))
        if all(g is None for g in outgoing) and not (
                instruction.primitive == "custom_vjp"
                and instruction.attributes["rule"].runs_without_cotangents
                and any(id(v) in on_path for v in instruction.outputs)):
            continue
        needs = [id(x) in active for x in instruction.inputs]
        suffix = " (backward)" if instruction.location and not instruction.location.endswith(")") else ""
        builder.location = lambda where=instruction.location + suffix: where
        incoming = apply_vjp(builder, instruction.primitive, instruction.attributes,
                             instruction.inputs, instruction.outputs, outgoing, needs)
        for x, g in zip(instruction.inputs, incoming):
            if g is not None:
                cotangents[id(x)] = accumulate(builder, cotangents.get(id(x)), g)
    gradients = [materialize(builder, cotangents.get(id(v)), v.type) for v in wrt]
    return [hooks[id(v)](builder, g) if g is not None and id(v) in hooks else g
            for v, g in zip(wrt, gradients)]


def trace_directive(function: Graph, directive: Instruction) -> list[Value | None]:
    """Trace now the backward instructions of `directive`, the `gradient` instruction just
    recorded last in `function`, and keep them for `expand_gradients`; return the gradients,
    None where none flows (PyTorch then leaves `.grad` None). Tracing them when the user calls
    `.backward()` runs each custom backward once, and shows whether it returns None."""
    output, seed, *wrt = directive.inputs
    emitted: list[Instruction] = []
    # Named in a scratch function, renamed when spliced in: the traced stage stays densely named.
    builder = GraphBuilder(Graph(function.name), instructions=emitted)
    gradients = backward(builder, function.instructions[:-1], output, seed, wrt,
                         through=directive.attributes.get("through", ()))
    function.expansions[id(directive)] = (emitted, gradients)
    return gradients


def expand_gradients(function: Graph) -> Graph:
    """The `grad` stage: replace every `gradient` directive of `function` (in place) by the
    instructions that compute it (traced when it was recorded, or now for a function that was
    parsed from text). A gradient that turns out to be absent is zeros."""
    index = 0
    while index < len(function.instructions):
        directive = function.instructions[index]
        if directive.primitive != "gradient":
            index += 1
            continue
        output, seed, *wrt = directive.inputs
        emitted, results = function.expansions.pop(id(directive), (None, None))
        if emitted is not None:
            for value in (v for instruction in emitted for v in instruction.outputs):
                value.name = function.new_name()
        else:
            emitted = []
            builder = GraphBuilder(function, instructions=emitted)
            results = backward(builder, function.instructions[:index], output, seed, wrt,
                               through=directive.attributes.get("through", ()))
        builder = GraphBuilder(function, instructions=emitted)
        builder.location = lambda where=directive.location: where
        results = [g if g is not None else builder.zeros_like(x) for g, x in zip(results, wrt)]
        function.instructions[index:index + 1] = emitted
        replacements = {id(old): new for old, new in zip(directive.outputs, results)}
        # (also in the backwards of later directives, traced already, which may read these
        # results as constants)
        pending = [i for emitted_later, _ in function.expansions.values() for i in emitted_later]
        for instruction in function.instructions[index + len(emitted):] + pending:
            instruction.inputs = [replacements.get(id(v), v) for v in instruction.inputs]
        for key, (emitted_later, gradients) in function.expansions.items():
            function.expansions[key] = (emitted_later, [replacements.get(id(g), g)
                                                        for g in gradients])
        function.outputs = [replacements.get(id(v), v) for v in function.outputs]
        index += len(emitted)
    return function
