"""Evaluate any Function on numpy arrays with the reference semantics: the test oracle."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tracer.ir.graph import Graph
from tracer.ir.reference import evaluate_primitive


def interpret(function: Graph, arguments: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(arguments) != len(function.parameters):
        raise ValueError(f"{function.name} takes {len(function.parameters)} arguments, "
                         f"got {len(arguments)}")
    environment: dict[int, np.ndarray] = {}
    for parameter, argument in zip(function.parameters, arguments):
        argument = np.asarray(argument)
        if argument.shape != parameter.shape or argument.dtype != parameter.dtype:
            raise ValueError(f"argument %{parameter.name} should be {parameter.type}, got "
                             f"{argument.dtype}{list(argument.shape)}")
        environment[id(parameter)] = argument
    for instruction in function.instructions:
        inputs = [environment[id(v)] for v in instruction.inputs]
        results = evaluate_primitive(instruction.primitive, inputs, instruction.attributes)
        for value, result in zip(instruction.outputs, results):
            environment[id(value)] = result
    return [environment[id(v)] for v in function.outputs]
