"""`tr.trace(f, check_grads=True)`: when a signature compiles, check the hand-written backward of
every custom Function it applies against central finite differences of that Function's forward,
run eagerly in float64 (tr.gradcheck's comparison).

The Function's inputs are the values it saw: the traced graph is evaluated with the reference
interpreter's semantics on the call's arguments. Inputs the interpreter cannot reach (computed
from a gradient, whose directive has no reference semantics before the autodiff pass) are drawn
from a seeded standard normal instead.
"""
from __future__ import annotations

import inspect
import logging
from typing import Sequence

import numpy as np

from tracer.errors import GradcheckError
from tracer.errors import definition_line
from tracer.function import apply_function
from tracer.gradcheck import first_mismatch
from tracer.host_function import evaluate_call_values
from tracer.ir.graph import Graph, Instruction
from tracer.ir.reference import REFERENCE
from tracer.creation import tensor
from tracer.tensor import Tensor

LOG = logging.getLogger("tracer.trace")


def _reachable_values(function: Graph, arguments: Sequence[np.ndarray]) -> dict[int, np.ndarray]:
    """The value (by id) of every instruction output computable from the arguments alone
    (IndexOutOfRangeError at the user's line for an index outside its dimension)."""
    values = {id(p): np.asarray(a) for p, a in zip(function.parameters, arguments)}
    for instruction in function.instructions:
        if instruction.primitive not in REFERENCE or any(id(v) not in values
                                                         for v in instruction.inputs):
            continue
        results = evaluate_call_values(instruction, [values[id(v)] for v in instruction.inputs])
        values.update((id(v), r) for v, r in zip(instruction.outputs, results))
    return values


def _call_arguments(forward, arguments: list) -> tuple[list, dict]:
    """Positional and keyword arguments that bind to `forward(ctx, ...)` as `arguments` (the
    bound values after ctx, in parameter order) did."""
    positional, keywords = [], {}
    parameters = list(inspect.signature(forward).parameters.values())[1:]
    for parameter, value in zip(parameters, arguments):
        if parameter.kind == parameter.VAR_POSITIONAL:
            positional.extend(value)
        elif parameter.kind == parameter.VAR_KEYWORD:
            keywords.update(value)
        elif parameter.kind == parameter.KEYWORD_ONLY:
            keywords[parameter.name] = value
        else:
            positional.append(value)
    return positional, keywords


def _check_call(instruction: Instruction, values: dict[int, np.ndarray],
                random: np.random.Generator) -> None:
    rule = instruction.attributes["rule"].backward
    if getattr(rule, "forward", None) is None:
        return  # not a custom Function (e.g. the backward of a nested traced function)
    count = instruction.attributes["num_outputs"]
    tensor_positions = [i for i, a in enumerate(rule.arguments) if isinstance(a, Tensor)]
    inputs = []
    for operand in instruction.inputs[count:]:  # the Function's tensor inputs, in order
        array = values.get(id(operand))
        floating = operand.dtype.kind == "f"
        if array is None and not floating:
            LOG.warning("check_grads: skipped %s: its input %%%s is not known before autodiff",
                        rule.name, operand.name)
            return
        if array is None:
            array = random.standard_normal(operand.shape)
        inputs.append(tensor(np.asarray(array, np.float64 if floating else array.dtype),
                             requires_grad=floating))
    if not any(t.requires_grad for t in inputs):
        return

    def call(*tensors):
        arguments = list(rule.arguments)
        for position, value in zip(tensor_positions, tensors):
            arguments[position] = value
        positional, keywords = _call_arguments(rule.forward, arguments)
        return apply_function(rule.name, rule.forward, rule.user_backward, positional, keywords)

    mismatch = first_mismatch(call, inputs)
    if mismatch is None:
        LOG.info("check_grads: %s.backward agrees with finite differences of its forward",
                 rule.name)
        return
    name = rule.argument_names[tensor_positions[mismatch.input]]
    # an R-style autograd_function wraps the user's backward in a bound method of its own
    backward = getattr(getattr(rule.user_backward, "__self__", None), "user_backward",
                       rule.user_backward)
    raise GradcheckError(
        f"check_grads: {rule.name}.backward disagrees with finite differences of "
        f"{rule.name}.forward (in float64): the gradient of output {mismatch.output} element "
        f"{mismatch.output_element} with respect to input '{name}' element {mismatch.element} is "
        f"{mismatch.analytic!r} by backward, {mismatch.numerical!r} numerically",
        definition_line(backward))


def check_custom_backwards(function: Graph, arguments: Sequence[np.ndarray]) -> None:
    """Check every custom Function applied in `function` (the traced graph, before autodiff, on
    the call's parameter arrays); raise GradcheckError naming the Function, input and element."""
    calls = [i for i in function.instructions if i.primitive == "custom_vjp"]
    if not calls:
        return
    values = _reachable_values(function, arguments)
    random = np.random.default_rng(0)
    for instruction in calls:
        _check_call(instruction, values, random)
