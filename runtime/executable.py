"""What a compiled signature runs. Until the LLVM back end takes over, the reference interpreter
executes the optimized graph."""
from __future__ import annotations

from typing import Sequence

import numpy as np

import ir


class InterpretedFunction:
    stages: tuple[str, ...] = ()  # the back-end stages it can print: none

    def __init__(self, function: ir.Function):
        self.function = function

    def __call__(self, arguments: Sequence[np.ndarray]) -> list[np.ndarray]:
        return ir.interpret(self.function, arguments)

    def stage_text(self, stage: str) -> str:
        raise ValueError(f"stage {stage!r} needs the compiled back end")


def build_executable(function: ir.Function):
    return InterpretedFunction(function)
