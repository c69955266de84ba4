"""The IR verifier: every value defined once before use, and every type re-derived by the shape rules
(the loop IR's verifier is ir/verify_loops.py, apart so that tracing never imports the loop IR)."""
from __future__ import annotations

import functools
from typing import Callable

from tracer.ir.graph import Graph
from tracer.ir.primitives import ShapeError, infer_types
from tracer.ir.text import format_instruction


class VerificationError(ValueError):
    pass


def verify(function: Graph) -> None:
    """Raise VerificationError naming the first ill-formed instruction of `function`."""
    defined: set[int] = set()
    names: set[str] = set()

    def define(value, where: Callable[[], str]) -> None:
        if id(value) in defined or value.name in names:
            raise VerificationError(f"%{value.name} is defined twice ({where()})")
        defined.add(id(value))
        names.add(value.name)

    for parameter in function.parameters:
        if parameter.producer is not None:
            raise VerificationError(f"parameter %{parameter.name} has a producer")
        define(parameter, lambda: "parameter")
    for instruction in function.instructions:
        # printed only for a message: printing every instruction took as long as the checks
        text = functools.partial(format_instruction, instruction)
        for value in instruction.inputs:
            if id(value) not in defined:
                raise VerificationError(f"%{value.name} is used before it is defined: {text()}")
        try:
            expected = infer_types(instruction.primitive, [v.type for v in instruction.inputs],
                                   instruction.attributes)
        except (ShapeError, TypeError) as error:
            raise VerificationError(f"{error}: {text()}") from None
        actual = [v.type for v in instruction.outputs]
        if expected != actual:
            raise VerificationError(f"types {[str(t) for t in actual]} should be "
                                    f"{[str(t) for t in expected]}: {text()}")
        for value in instruction.outputs:
            if value.producer is not instruction:
                raise VerificationError(f"%{value.name} does not point at its producer: {text()}")
            define(value, text)
    for value in function.outputs:
        if id(value) not in defined:
            raise VerificationError(f"returned %{value.name} is not defined")
