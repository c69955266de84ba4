"""The recording side of `@trace`: one Trace collects a function's primitives into an ir.Function."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from tracer.ir.builder import GraphBuilder
from tracer.ir.graph import Function, Instruction, Value
from tracer.ir.types import TensorType
from tracer.context import is_grad_enabled, state
from tracer.errors import TracingError, user_line

if TYPE_CHECKING:
    from tracer.tensor import Tensor


class Trace:
    """The state of one function being traced."""

    def __init__(self, name: str):
        self.function = Function(name)
        self.labels: list[str] = []      # e.g. "MyReLU.forward" while a Function's forward runs
        self.builder = GraphBuilder(self.function, self.location)
        self.captured: list[tuple["Tensor", Value]] = []
        self._captured_ids: dict[int, Value] = {}
        self.leaves: list["Tensor"] = []  # traced leaf tensors that require grad
        # The proxies of the argument tensors, by id of the caller's tensor: the function may also
        # reach an argument through a global name.
        self.arguments: dict[int, "Tensor"] = {}
        # (ctx, output values) of every custom Function applied, for the checks of a backward.
        self.custom_calls: list[tuple] = []
        # An in-place change rebinds a tensor to a new value. The old values it leaves behind: by
        # id, where they were overwritten and the instruction of the change itself, which may
        # still read them (eager mode's version counters, as values); and every value a leaf has
        # held, whose gradients all go to the leaf (PyTorch's accumulator outlives the change).
        self.overwritten: dict[int, tuple[str, Instruction | None]] = {}
        self._leaf_history: dict[int, list[Value]] = {}

    def location(self) -> str:
        line = user_line()
        return f"{line} ({self.labels[-1]})" if self.labels else line

    @contextlib.contextmanager
    def label(self, text: str):
        self.labels.append(text)
        try:
            yield
        finally:
            self.labels.pop()

    @contextlib.contextmanager
    def emitting_into(self, builder: GraphBuilder):
        """Record into `builder`'s instruction list (the autodiff pass expanding a directive)."""
        previous = self.builder
        self.builder = GraphBuilder(builder.function, self.location, builder.instructions)
        try:
            yield
        finally:
            self.builder = previous

    def parameter(self, name: str, type: TensorType) -> Value:
        return self.function.add_parameter(name, type)

    def capture(self, tensor: "Tensor") -> Value:
        """A tensor from outside the traced function becomes an extra runtime input."""
        if id(tensor) in self._captured_ids:
            return self._captured_ids[id(tensor)]
        if tensor.requires_grad and is_grad_enabled():
            raise TracingError(
                f"the traced function uses a tensor of shape {list(tensor.shape)} that requires "
                f"grad but is not one of its arguments; pass it as an argument so that its "
                f"gradient can be computed")
        value = self.parameter(f"captured{len(self.captured)}", TensorType(tensor.shape, tensor.dtype))
        self.captured.append((tensor, value))
        self._captured_ids[id(tensor)] = value
        return value

    def rebind(self, tensor: "Tensor", value: Value, changing: Value) -> None:
        """`tensor` now holds `value`, computed in place from its old value by the instruction
        that produced `changing`."""
        old = tensor._handle
        self.overwritten[id(old)] = (user_line(), changing.producer)
        if tensor.is_leaf and tensor.requires_grad:
            self._leaf_history.setdefault(id(tensor), []).append(old)
        tensor._handle = value

    def leaf_values(self, tensor: "Tensor") -> list[Value]:
        """The values `tensor` has held while it was a leaf, the current one last."""
        tensor = self.arguments.get(id(tensor), tensor)
        return self._leaf_history.get(id(tensor), []) + [self.handle_of(tensor)]

    def handle_of(self, tensor: "Tensor") -> Value:
        if tensor._trace is self:
            if tensor._base is not None:
                tensor._follow_base(self)
            return tensor._handle
        if tensor._trace is not None:
            raise escaped_error()
        if id(tensor) in self.arguments:
            return self.arguments[id(tensor)]._handle
        return self.capture(tensor)


def escaped_error() -> TracingError:
    return TracingError(
        "this tensor was created inside a traced function that has finished (or another one); "
        "return it from the traced function instead of keeping it")


@contextlib.contextmanager
def tracing(trace: Trace):
    previous = state.trace
    state.trace = trace
    try:
        yield trace
    finally:
        state.trace = previous


def current_tensor(tensor: "Tensor") -> "Tensor":
    """The tensor that stands for `tensor` in the trace being recorded: the proxy of an argument
    (whose `.grad` the traced backward fills), else `tensor` itself. Code that holds the caller's
    tensors, as an optimizer does, reads `.grad` and writes through this."""
    trace = state.trace
    return tensor if trace is None else trace.arguments.get(id(tensor), tensor)
