"""A function's forward and backward as two programs (AOTAutograd's scheme): the forward computes
the function's outputs and keeps what its backward reads (the residuals); the backward computes the
gradients from the cotangents, the residuals and the parameters, without running the forward again.

`split` differentiates the grad stage of a function (its gradient markers in place: a custom
Function's backward is traced from its `custom_vjp` here), optimizes forward and backward as one
program (so the backward reuses what the forward computed), then cuts it where values stop
depending on what the function's outputs need: the forward is exactly the function, saving what
the backward reads of it.
"""
from __future__ import annotations

from typing import Callable, Sequence

from tracer.ir.autodiff import vector_jacobian_product
from tracer.ir.builder import GraphBuilder
from tracer.ir.graph import Graph, Instruction, Value
from tracer.ir.primitives import CHECKS, LAYOUT, SOURCES


class Split:
    """The two programs of one function and how the backward's parameters are found.
    (A plain class: @dataclass generating its methods took ~1 ms of every fresh process's
    tr.trace.)"""

    def __init__(self, forward: Graph, backward: Graph, sources: list[tuple[str, int]],
                 gradients: list[int | None]):
        self.forward = forward  # the function's parameters; its outputs, then the residuals
        self.backward = backward  # its parameters are `sources`; its outputs the gradients that flow
        # Where each parameter of `backward` comes from: ("cotangent", k), the cotangent of the
        # k-th differentiated output; ("output", i), the forward's output i (a residual, or an
        # output of the function itself); ("parameter", p), the function's parameter p.
        self.sources = sources
        # per `wrt`: the backward's output that is its gradient, or None
        self.gradients = gradients


class Unsplittable(Exception):
    """The function's backward cannot be a program of its own (the message says why)."""


# What the backward computes again rather than reads from the forward: constants, index ramps
# and layout changes (cheap, and a layout change fuses into its reader where saved data would be
# read whole).
_RECOMPUTED = SOURCES | LAYOUT


def split(function: Graph, outputs: Sequence[int], wrt: Sequence[tuple[str, int]],
          optimize: Callable[[Graph], Graph], shared: int) -> Split:
    """The forward and backward of `function` (its grad stage, left as it is): the gradients of
    its `outputs` (positions), each seeded by a cotangent the backward takes, with respect to
    `wrt`: ("parameter", p), its parameter p, or ("output", i), the value of its output i (an
    argument's data as the function leaves it, when it changes it in place). The backward may read the first `shared` outputs (the
    function's results) as they are; another output it reads (a value also written back into an
    argument, which the next call overwrites) is returned again, as a residual of its own.
    `optimize` is ir.optimize."""
    joint, forward_count, flowing = _joint(function, outputs, wrt)
    # (the function's index checks stay in the forward, whose call raises, as eagerly, where an
    # index is out of range that nothing reads; the copies keep their names)
    checks = {v.name for i in function.instructions if i.primitive in CHECKS for v in i.outputs}
    return _cut(optimize(joint), len(function.parameters), forward_count, shared,
                len(outputs), flowing, checks)


def _joint(function: Graph, outputs: Sequence[int], wrt: Sequence[tuple[str, int]]
           ) -> tuple[Graph, int, list[bool]]:
    """A copy of `function` that also takes a cotangent per output in `outputs` (parameters after
    its own) and also returns the gradients that flow (outputs after its own); its own output
    count; whether each gradient flows."""
    joint = function.copy()
    parameters = len(function.parameters)
    cotangents = [joint.add_parameter(f"cotangent_{k}", joint.outputs[i].type)
                  for k, i in enumerate(outputs)]
    emitted: list[Instruction] = []
    builder = GraphBuilder(joint, instructions=emitted)
    try:
        gradients = vector_jacobian_product(builder, list(joint.instructions),
                                            [joint.outputs[i] for i in outputs], cotangents,
                                            [(joint.parameters if kind == "parameter" else
                                              joint.outputs)[index] for kind, index in wrt])
    except Exception as error:  # a custom backward's (raise NotImplementedError): PyTorch raises
        # it at backward(), where the function run again raises it, not at the call
        raise Unsplittable(f"a custom backward raised {error!r}") from error
    if len(function.parameters) != parameters:
        raise Unsplittable("a custom backward reads a tensor the forward did not")
    # A custom Function's backward reads the values its ctx saved: those of `function`, whose
    # copies in `joint` have the same names.
    own = {id(v) for v in joint.values()}
    named = {v.name: v for v in joint.values()}
    for instruction in emitted:
        if any(id(v) not in own and v.name not in named for v in instruction.inputs):
            # (a gradient the Function's forward took: the autodiff pass replaced its value)
            raise Unsplittable("a custom backward reads a value the function no longer has")
        instruction.inputs = [v if id(v) in own else named[v.name] for v in instruction.inputs]
        own.update(id(v) for v in instruction.outputs)
    joint.instructions += emitted
    forward_count = len(joint.outputs)
    joint.outputs += [g for g in gradients if g is not None]
    return joint, forward_count, [g is not None for g in gradients]


def _cut(joint: Graph, parameters: int, forward_count: int, shared: int, cotangent_count: int,
         flowing: Sequence[bool], checks: set[str]) -> Split:
    """`joint` (optimized) cut in two. The forward is what the function's own outputs and its
    index `checks` (by name) need: it computes nothing more, and saves those of its values the
    backward reads. The backward is all
    the rest, and computes again what is cheaper to compute than to save: constants, and layout
    changes (a transposed weight, a broadcast) of what it has anyway."""
    present = iter(range(len(flowing)))
    gradients = [next(present) if flows else None for flows in flowing]
    cotangents = joint.parameters[parameters:]
    producer = {id(v): i for i in joint.instructions for v in i.outputs}
    forward_instructions = _live(joint.instructions, joint.outputs[:forward_count], checks)
    in_forward = {id(i) for i in forward_instructions}
    backward_outputs = joint.outputs[forward_count:]
    if any(id(v) in {id(c) for c in cotangents} for i in forward_instructions for v in i.inputs):
        raise Unsplittable("an output of the function depends on a cotangent")

    position = {id(p): index for index, p in enumerate(joint.parameters[:parameters])}
    forward_outputs = list(joint.outputs[:forward_count])
    output_index: dict[int, int] = {}
    for index, value in enumerate(forward_outputs[:shared]):
        output_index.setdefault(id(value), index)
    sources: list[tuple[str, int]] = [("cotangent", k) for k in range(cotangent_count)]
    read: dict[int, Value] = {id(c): c for c in cotangents}  # backward parameters, by value
    in_backward = {id(i) for i in joint.instructions if id(i) not in in_forward}
    pending = [v for i in joint.instructions if id(i) in in_backward for v in i.inputs]
    pending += backward_outputs
    while pending:
        value = pending.pop()
        if id(value) in read:
            continue
        if id(value) in position:
            sources.append(("parameter", position[id(value)]))
            read[id(value)] = value
            continue
        instruction = producer[id(value)]
        if id(instruction) in in_backward:
            continue
        if instruction.primitive in _RECOMPUTED:  # (its operands are read instead)
            in_backward.add(id(instruction))
            pending += instruction.inputs
            continue
        if id(value) not in output_index:  # a residual
            output_index[id(value)] = len(forward_outputs)
            forward_outputs.append(value)
        sources.append(("output", output_index[id(value)]))
        read[id(value)] = value
    forward = Graph(joint.name, list(joint.parameters[:parameters]), forward_instructions,
                    forward_outputs, _counter=joint._counter)
    backward = _copy(f"{joint.name}_backward", list(read.values()),
                     [i for i in joint.instructions if id(i) in in_backward], backward_outputs)
    return Split(forward, backward, sources, gradients)


def _live(instructions: list[Instruction], outputs: Sequence[Value], checks: set[str]
          ) -> list[Instruction]:
    """The instructions some output or one of the `checks` (by name) needs, in order."""
    needed = {id(v) for v in outputs}
    kept = []
    for instruction in reversed(instructions):
        if any(id(v) in needed or (instruction.primitive in CHECKS and v.name in checks)
               for v in instruction.outputs):
            kept.append(instruction)
            needed.update(id(v) for v in instruction.inputs)
    return kept[::-1]


def _copy(name: str, parameters: list[Value], instructions: list[Instruction],
          outputs: Sequence[Value]) -> Graph:
    """A new graph of `instructions` (fresh values) taking `parameters`, returning `outputs`."""
    graph = Graph(name)
    mapping = {id(p): graph.add_parameter(p.name, p.type) for p in parameters}
    for instruction in instructions:
        new = Instruction(instruction.primitive, [mapping[id(v)] for v in instruction.inputs],
                          dict(instruction.attributes), location=instruction.location)
        new.outputs = [Value(graph.new_name(), v.type, new) for v in instruction.outputs]
        mapping.update({id(old): fresh for old, fresh in zip(instruction.outputs, new.outputs)})
        graph.instructions.append(new)
    graph.outputs = [mapping[id(v)] for v in outputs]
    return graph
