"""Host callbacks: Python code a compiled program calls back into (JAX's `pure_callback`).

`host_callback %a, %b {callback=@host.BadFFTFunction.forward.0}` runs `callback(a, b)` -- numpy
arrays in, a tuple of numpy arrays of `callback.result_types` out -- wherever the program reaches
it: the reference interpreter calls it directly, compiled code through the runtime's dispatcher
(runtime/callbacks.py), which finds it by `number`. The tracer makes one for a custom Function
whose forward or backward reads the values of its tensors (`.numpy()`), so the rest of the step
stays compiled. A callback is pure as far as the passes know: one whose results are unused is
removed, and none is merged with another (each has its own label).

Printed IR names a callback by its label; `HostCallback.live` finds it again when the text is
parsed, and `HostCallback.numbered` when compiled code calls it. Both hold it weakly: the
instruction that has it as its attribute (and so the compiled function) keeps it alive.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Callable, Sequence

import numpy as np

from tracer.ir.types import TensorType


class HostCallback:
    """`run(*arrays) -> tuple of arrays` of `result_types`, called by a program on the host with
    arrays of `operand_types`; `run` checks what the Python code returned (the tracer's does, with
    an error naming the user's line).
    `gradient_error()` is the exception to raise when a gradient is asked of the callback itself
    (the tracer differentiates a Function's callbacks through its backward, never directly)."""

    live: "weakref.WeakValueDictionary[str, HostCallback]" = weakref.WeakValueDictionary()
    numbered: "weakref.WeakValueDictionary[int, HostCallback]" = weakref.WeakValueDictionary()
    _counter = itertools.count()

    def __init__(self, name: str, run: Callable[..., tuple], operand_types: Sequence[TensorType],
                 result_types: Sequence[TensorType], gradient_error: Callable[[], Exception]):
        self.number = next(self._counter)
        self.label = f"host.{name}.{self.number}"
        self.run = run
        self.operand_types = list(operand_types)
        self.result_types = list(result_types)
        self.gradient_error = gradient_error
        HostCallback.live[self.label] = self
        HostCallback.numbered[self.number] = self

    def __call__(self, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(self.run(*arrays))

    def __repr__(self) -> str:
        return f"@{self.label}"
