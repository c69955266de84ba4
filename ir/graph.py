"""The SSA graph: values defined once, instructions in order, functions with parameters and outputs."""
from __future__ import annotations

import contextlib
import gc
import sys
import threading
from typing import Any, Iterator

from tracer.ir.types import TensorType


# Value, Instruction and Graph are plain classes, not dataclasses: generating their methods took
# ~3-6 ms of every `import tracer`.
class Value:
    """One SSA value: defined once, by a parameter or by exactly one instruction."""

    def __init__(self, name: str, type: TensorType, producer: Instruction | None = None):
        self.name, self.type, self.producer = name, type, producer

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self):
        return self.type.dtype

    def __repr__(self) -> str:
        return f"%{self.name}"


class Instruction:
    """`outputs = primitive(inputs) {attributes}`, recorded at the user's `location` ('file.py:12')."""

    def __init__(self, primitive: str, inputs: list[Value], attributes: dict[str, Any],
                 outputs: list[Value] | None = None, location: str = ""):
        self.primitive, self.inputs, self.attributes = primitive, inputs, attributes
        self.outputs = [] if outputs is None else outputs
        self.location = location

    def __repr__(self) -> str:
        return (f"Instruction(primitive={self.primitive!r}, inputs={self.inputs!r}, "
                f"attributes={self.attributes!r}, outputs={self.outputs!r}, "
                f"location={self.location!r})")


class Graph:
    def __init__(self, name: str, parameters: list[Value] | None = None,
                 instructions: list[Instruction] | None = None,
                 outputs: list[Value] | None = None, _counter: int = 0):
        self.name = name
        self.parameters = [] if parameters is None else parameters
        self.instructions = [] if instructions is None else instructions
        self.outputs = [] if outputs is None else outputs
        self._counter = _counter
        # Backward instructions already traced for a `gradient` directive (by id of the
        # directive): the autodiff pass splices them in (see ir/autodiff.py). Not part of the
        # printed graph.
        self.expansions: dict[int, tuple[list[Instruction], list[Value | None]]] = {}

    def __repr__(self) -> str:
        return (f"Graph(name={self.name!r}, parameters={self.parameters!r}, "
                f"instructions={self.instructions!r}, outputs={self.outputs!r}, "
                f"_counter={self._counter!r})")

    def new_name(self) -> str:
        # No parameter has a number for a name unless parse_function made it, and it starts the
        # counter after every number it read (a clash would fail ir.verify: defined twice).
        name = str(self._counter)
        self._counter += 1
        return name

    def add_parameter(self, name: str, type: TensorType) -> Value:
        used = {v.name for v in self.parameters}
        unique, suffix = name, 1
        while unique in used or unique.isdigit():
            unique, suffix = f"{name}_{suffix}", suffix + 1
        value = Value(unique, type)
        self.parameters.append(value)
        return value

    def values(self) -> Iterator[Value]:
        yield from self.parameters
        for instruction in self.instructions:
            yield from instruction.outputs

    def users(self) -> dict[int, list[Instruction]]:
        """For each value (by id), the instructions that read it."""
        result: dict[int, list[Instruction]] = {}
        for instruction in self.instructions:
            for value in instruction.inputs:
                result.setdefault(id(value), []).append(instruction)
        return result

    def copy(self) -> "Graph":
        """A deep copy with fresh Value objects (same names), so passes can rewrite it freely."""
        mapping: dict[int, Value] = {}

        def clone(value: Value, producer: Instruction | None = None) -> Value:
            mapping[id(value)] = Value(value.name, value.type, producer)
            return mapping[id(value)]

        result = Graph(self.name, [clone(p) for p in self.parameters], _counter=self._counter)
        for instruction in self.instructions:
            new = Instruction(instruction.primitive, [mapping[id(v)] for v in instruction.inputs],
                              dict(instruction.attributes), location=instruction.location)
            new.outputs = [clone(v, new) for v in instruction.outputs]
            result.instructions.append(new)
        result.outputs = [mapping[id(v)] for v in self.outputs]
        return result


_gc_lock = threading.Lock()
_gc_pauses = 0  # how many gc_paused blocks are running (in any thread)
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Run a block with Python's cyclic garbage collector off (as it was before once every such
    block has ended). Passes over large graphs allocate many objects that all stay alive, so each
    automatic collection walks the whole graph for nothing: compile time becomes superlinear."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


_recursion_lock = threading.Lock()
_recursion_blocks = 0  # how many deep_recursion blocks are running (in any thread)
_recursion_limit = 0  # Python's limit before the first of them


@contextlib.contextmanager
def deep_recursion(frames: int) -> Iterator[None]:
    """Run a block with room for `frames` more Python frames than Python's limit allows (as it was
    before once every such block has ended). Passes that evaluate an expression by recursing into
    its operands go as deep as its longest chain: a fused chain of 400 elementwise operations
    took ~2,000 frames to schedule, and Python's default limit of 1,000 raised RecursionError.
    (Calls between Python functions take no C stack since Python 3.11.)"""
    global _recursion_blocks, _recursion_limit
    with _recursion_lock:
        if _recursion_blocks == 0:
            _recursion_limit = sys.getrecursionlimit()
        _recursion_blocks += 1
        sys.setrecursionlimit(max(sys.getrecursionlimit(), _recursion_limit + frames))
    try:
        yield
    finally:
        with _recursion_lock:
            _recursion_blocks -= 1
            if _recursion_blocks == 0:
                sys.setrecursionlimit(_recursion_limit)
