"""Floats a traced function reads from outside its arguments -- an optimizer's `param_groups`
(lr, betas, eps, weight_decay, momentum), a module's or object's attributes, a closure's or a
global's value -- are runtime inputs, as float arguments are: a scheduler's new learning rate
reaches the compiled code on the next call, with no new trace.

While the function is traced, each float the guards' walk reached (runtime/reach.py) is replaced
where it lives by a proxy, a 0-d float64 parameter of the trace (a "weak" number, as a float
argument's proxy is: it does not widen float32 tensors), and put back afterwards. Proxies the
trace used stay parameters, read from their paths on every call; the others are dropped and their
values put back before the autodiff pass runs (guarded by value, as before). A float whose value
the trace needed in Python (`if weight_decay != 0`, `int(p * n)`) is decided at trace time: a
comparison with a constant is guarded by its outcome (see `decide`), anything else makes that
float static, guarded by its value, from then on (`Specialize`, as for int arguments).
"""
from __future__ import annotations

import contextlib
import operator
import re
import types
from typing import Any, Iterator, Sequence

import numpy as np

from tracer import ir
from tracer.tensor import Tensor

# The comparisons whose outcome a trace may take from a runtime float (see `decide`).
_COMPARISONS = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
                "gt": operator.gt, "ge": operator.ge}
_MIRRORED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


class FloatInput:
    """A float read from `root` by `steps` (as a guard's path), a runtime input of the trace. (A
    plain class: @dataclass generating its methods took ~1 ms of a fresh process's tr.trace.)"""

    def __init__(self, name: str, root: Any, steps: tuple, value: float,
                 parameter: ir.Value | None = None, proxy: Tensor | None = None):
        self.name = name  # the path as messages show it: "global opt.param_groups[0]['lr']"
        self.root = root
        self.steps = steps
        self.value = value  # when traced
        self.parameter = parameter
        self.proxy = proxy  # what stands for it where it lives while tracing
        # (comparison, constant, outcome) the trace decided on this float's value (see `decide`)
        self.decisions: list[tuple[str, float, bool]] = []


class RuntimeFloats:
    """The floats of one trace: `substitute` puts proxies in their places, `settle` keeps those the
    trace used, `restore` puts every value back (always, also when tracing fails)."""

    def __init__(self, trace, candidates: Sequence[tuple[tuple, float]], static: frozenset[str]):
        self.trace = trace
        self.inputs: list[FloatInput] = []
        self._undo: list[tuple[Any, str, Any, Any]] = []  # (container, kind, key, old) in order
        self._candidates = [(path, value) for path, value in candidates
                            if path[0] not in static and path[2]]

    def substitute(self) -> None:
        for (name, root, steps), value in self._candidates:
            proxy = self.trace.add_number(_parameter_name(name), integral=False)
            parameter = self.trace.handle_of(proxy)
            if not self._write(root, steps, proxy):
                self.trace.function.parameters.remove(parameter)
                continue
            self.inputs.append(FloatInput(name, root, steps, value, parameter, proxy))
        self.trace.float_inputs = {id(i.parameter): i for i in self.inputs}

    def rebound(self) -> frozenset[str]:
        """The floats the traced function itself rebound (`self.total += 1.0`): Python state
        that changes while tracing, which compiled code cannot change on later calls."""
        changed = set()
        for float_input in self.inputs:
            try:
                current = _get(float_input.root, float_input.steps)
            except Exception:
                current = None
            if (current is not float_input.proxy  # rebound, or changed in place (+=)
                    or self.trace.handle_of(current) is not float_input.parameter):
                changed.add(float_input.name)
        return frozenset(changed)

    def exponents(self, function: ir.Graph) -> frozenset[str]:
        """The floats `function` raises to (`x ** self.p`): compiled in, a constant power
        becomes multiplications and square roots, faster and rounded as PyTorch's."""
        inputs = {id(i.parameter): i.name for i in self.inputs}
        found: set[str] = set()
        for instruction in function.instructions:
            if instruction.primitive != "pow":
                continue
            names, stack = set(), [instruction.inputs[1]]
            while stack:  # what the exponent is computed from (a cast of the float, say)
                value = stack.pop()
                if id(value) in inputs:
                    names.add(inputs[id(value)])
                elif value.producer is None:  # another parameter: not a constant exponent
                    names = set()
                    break
                else:
                    stack += value.producer.inputs
            found |= names
        return frozenset(found)

    def settle(self, function: ir.Graph) -> None:
        """Drop the proxies `function` does not read (putting their floats back)."""
        read = {id(value) for instruction in function.instructions for value in instruction.inputs}
        read |= {id(value) for value in function.outputs}
        unused = [i for i in self.inputs if id(i.parameter) not in read and not i.decisions]
        if not unused:
            return
        dropped = {id(i.parameter) for i in unused}
        function.parameters = [p for p in function.parameters if id(p) not in dropped]
        self.inputs = [i for i in self.inputs if id(i.parameter) not in dropped]
        for i in unused:
            self._write(i.root, i.steps, i.value, record=False)

    def order(self, function: ir.Graph) -> None:
        """Move the kept proxies' parameters last, in order (see Recording.sources)."""
        kept = {id(i.parameter) for i in self.inputs}
        function.parameters = ([p for p in function.parameters if id(p) not in kept]
                               + [i.parameter for i in self.inputs])

    def restore(self) -> None:
        for container, kind, key, old in reversed(self._undo):
            _set(container, kind, key, old)
        self._undo.clear()
        self.trace.float_inputs = {}

    def _write(self, root, steps: tuple, value, record: bool = True) -> bool:
        """Put `value` at the end of the path; a tuple on the way is rebuilt (betas)."""
        *parents, (kind, key) = steps
        try:
            container = _get(root, parents)
            if isinstance(container, tuple):
                items = list(container)
                items[key] = value
                rebuilt = type(container)(*items) if hasattr(container, "_fields") else (
                    type(container)(items))
                return self._write(root, tuple(parents), rebuilt, record)
            if record:
                self._undo.append((container, kind, key, _get(container, [(kind, key)])))
            _set(container, kind, key, value)
            return True
        except Exception:  # a container that cannot be written: the float stays a constant
            return False


def _get(root, steps) -> Any:
    value = root
    for kind, key in steps:
        value = (value.cell_contents if isinstance(value, types.CellType) else vars(value)[key]
                 ) if kind == "attr" else value[key]
    return value


def _set(container, kind: str, key, value) -> None:
    """Write without running the container's own hooks (a Module's __setattr__, a property)."""
    if kind == "attr":
        if isinstance(container, types.CellType):
            container.cell_contents = value
        elif isinstance(container, type):  # (a class's namespace is read-only as a mapping)
            type.__setattr__(container, key, value)
        else:
            vars(container)[key] = value
    elif isinstance(container, dict):
        dict.__setitem__(container, key, value)
    elif isinstance(container, list):
        list.__setitem__(container, key, value)
    else:
        raise TypeError(f"cannot write into a {type(container).__name__}")


def _parameter_name(name: str) -> str:
    name = re.sub(r"\W+", "_", name.removeprefix("global ").removeprefix("closure variable "))
    return name.strip("_") or "number"


def decide(trace, value: ir.Value) -> bool | None:
    """The outcome of `value`, a comparison of a runtime float with a constant that the trace needs
    in Python (`if weight_decay != 0:`), taken from the float's value when traced and kept as a
    guard on the outcome (the code stays right while the comparison comes out the same); None if
    `value` is anything else."""
    producer = value.producer
    inputs = getattr(trace, "float_inputs", None)
    if not inputs or producer is None or producer.primitive not in _COMPARISONS:
        return None
    comparison = producer.primitive
    (left, right), floats = producer.inputs, inputs
    if id(right) in floats and id(left) not in floats:
        left, right, comparison = right, left, _MIRRORED[comparison]
    constant = right.producer
    if (id(left) not in floats or constant is None or constant.primitive != "constant"
            or np.ndim(constant.attributes["value"]) != 0):
        return None
    float_input = floats[id(left)]
    bound = float(constant.attributes["value"])
    outcome = decides(comparison, float_input.value, bound)
    float_input.decisions.append((comparison, bound, outcome))
    return outcome


def decides(comparison: str, value: float, bound: float) -> bool:
    return bool(_COMPARISONS[comparison](value, bound))


def decided(inputs: Sequence[FloatInput], current: bool) -> tuple | None:
    """How the comparisons the trace decided on float inputs come out now (`current`) or came
    out when traced; None if one of them is no longer a float."""
    outcomes = []
    for float_input in inputs:
        value = float_input.value
        if current:
            try:
                value = _read(float_input.root, float_input.steps)
            except Exception:
                return None
            if not isinstance(value, float):
                return None
        outcomes += [decides(comparison, value, bound) if current else outcome
                     for comparison, bound, outcome in float_input.decisions]
    return tuple(outcomes)


def _read(root, steps: tuple) -> Any:
    """The value at the end of a path, as the generated guards read it."""
    value = root
    for kind, key in steps:
        value = getattr(value, key) if kind == "attr" else value[key]
    return value


def read_source(inputs: Sequence[FloatInput], namespace: dict) -> tuple[list[str], list[str]]:
    """Python lines for a generated guard (see guards.compile_check): each float input is still a
    float and every decision on it comes out as traced; and the expressions that read them."""
    lines, expressions = [], []
    for number, float_input in enumerate(inputs):
        namespace[f"float_root{number}"] = float_input.root
        expression = f"float_root{number}"
        for step, (kind, key) in enumerate(float_input.steps):
            namespace[f"float_key{number}_{step}"] = key
            expression = (f"getattr({expression}, float_key{number}_{step})" if kind == "attr"
                          else f"{expression}[float_key{number}_{step}]")
        lines.append(f"number = {expression}")
        lines.append("if not isinstance(number, float): return False")
        for comparison, bound, outcome in dict.fromkeys(float_input.decisions):
            symbol = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
            lines.append(f"if (number {symbol[comparison]} {bound!r}) is not {outcome}: "
                         f"return False")
        expressions.append(expression)
    return lines, expressions


def compile_reader(inputs: Sequence[FloatInput]):
    """A function returning the current values of the float inputs (their arrays for the call)."""
    if not inputs:
        return None
    namespace: dict[str, Any] = {"array": np.array, "float64": np.float64}
    _, expressions = read_source(inputs, namespace)
    source = ("def read():\n    return [" +
              ", ".join(f"array({e}, float64)" for e in expressions) + "]\n")
    exec(compile(source, "<tracer float inputs>", "exec"), namespace)
    return namespace["read"]


@contextlib.contextmanager
def runtime_floats(trace, candidates, static: frozenset[str]) -> Iterator[RuntimeFloats]:
    floats = RuntimeFloats(trace, candidates, static)
    try:
        floats.substitute()
        yield floats
    finally:
        floats.restore()
