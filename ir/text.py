"""The textual form of a Function: printed one typed value per line, and parsed back.

    def step(%x: f32[8,4], %w: f32[4,2]):
      %0 : f32[8,2] = matmul %x, %w                     # step.py:12
      %1 : f32[] = reduce_sum %0 {axes=(0,1)}           # step.py:13 (MyLoss.forward)
      return %1
"""
from __future__ import annotations

import ast
import math
import re
from typing import Any

import numpy as np

from tracer.ir.graph import Graph, Instruction, Value
from tracer.ir.host import HostCallback
from tracer.ir.types import BY_SHORT_NAME, SHORT_NAMES, TensorType
from tracer.ir.vjp import CustomRule

COMMENT_COLUMN = 52


def format_attribute(value: Any) -> str:
    if isinstance(value, np.dtype):
        return SHORT_NAMES[value]
    if isinstance(value, tuple):
        return "(" + ",".join(map(str, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # inf, -inf, nan
    return repr(value)


def format_instruction(instruction: Instruction, locations: bool = True) -> str:
    names = ", ".join(f"%{v.name}" for v in instruction.outputs)
    types = ", ".join(str(v.type) for v in instruction.outputs)
    text = f"{names} : {types} = {instruction.primitive}"
    if instruction.inputs:
        text += " " + ", ".join(f"%{v.name}" for v in instruction.inputs)
    if instruction.attributes:
        text += " {" + ", ".join(f"{k}={format_attribute(v)}"
                                 for k, v in instruction.attributes.items()) + "}"
    if instruction.location and locations:
        text = f"{text:<{COMMENT_COLUMN}}  # {instruction.location}"
    return text


def format_function(function: Graph, locations: bool = True) -> str:
    """The text of `function`; `locations=False` leaves out the user's lines (the comments)."""
    parameters = ", ".join(f"%{p.name}: {p.type}" for p in function.parameters)
    lines = [f"def {function.name}({parameters}):"]
    lines += ["  " + format_instruction(i, locations) for i in function.instructions]
    lines.append("  return " + ", ".join(f"%{v.name}" for v in function.outputs))
    return "\n".join(lines) + "\n"


class ParseError(ValueError):
    pass


_TYPE = re.compile(r"(\w+)\[([\d,]*)\]")
_HEADER = re.compile(r"def (\w+)\((.*)\):$")
_INSTRUCTION = re.compile(r"(?P<outputs>%[^:]+?) : (?P<types>.+?) = (?P<primitive>\w+)"
                          r"(?: (?P<inputs>%[^{]*?))?(?: \{(?P<attributes>.*)\})?$")


def parse_type(text: str) -> TensorType:
    match = _TYPE.fullmatch(text.strip())
    if not match or match.group(1) not in BY_SHORT_NAME:
        raise ParseError(f"bad type {text!r}")
    shape = tuple(int(d) for d in match.group(2).split(",") if d)
    return TensorType(shape, BY_SHORT_NAME[match.group(1)])


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "(["
        depth -= char in ")]"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return [p.strip() for p in parts]


def parse_attribute(text: str) -> Any:
    if text in BY_SHORT_NAME:
        return BY_SHORT_NAME[text]
    if text in ("inf", "-inf", "nan"):
        return float(text)
    if text.startswith("@"):
        rule = (HostCallback.live if text.startswith("@host.") else CustomRule.live).get(text[1:])
        if rule is None:
            raise ParseError(f"custom rule or callback {text} is not alive in this process")
        return rule
    value = ast.literal_eval(text)
    return tuple(value) if isinstance(value, list) else value


def parse_function(text: str) -> Graph:
    lines = [line for line in text.splitlines() if line.strip()]
    header = _HEADER.match(lines[0].strip()) if lines else None
    if not header:
        raise ParseError("expected 'def name(...):' on the first line")
    function = Graph(header.group(1))
    scope: dict[str, Value] = {}
    for parameter in _split_top_level(header.group(2)):
        name, type_text = parameter.split(":", 1)
        value = Value(name.strip().lstrip("%"), parse_type(type_text))
        function.parameters.append(value)
        scope[value.name] = value

    def lookup(name: str) -> Value:
        name = name.strip().lstrip("%")
        if name not in scope:
            raise ParseError(f"%{name} is used before it is defined")
        return scope[name]

    numbered = [int(v.name) for v in function.parameters if v.name.isdigit()]
    for line in lines[1:-1]:
        body, _, location = line.strip().partition("  # ")
        match = _INSTRUCTION.match(body.strip())
        if not match:
            raise ParseError(f"cannot parse {line.strip()!r}")
        attributes = {}
        for item in _split_top_level(match.group("attributes") or ""):
            key, _, value = item.partition("=")
            attributes[key.strip()] = parse_attribute(value.strip())
        inputs = [lookup(n) for n in (match.group("inputs") or "").split(",") if n.strip()]
        instruction = Instruction(match.group("primitive"), inputs, attributes,
                                  location=location.strip())
        names = [n.strip().lstrip("%") for n in match.group("outputs").split(",")]
        types = [parse_type(t) for t in _split_top_level(match.group("types"))]
        if len(names) != len(types):
            raise ParseError(f"{len(names)} names but {len(types)} types in {line.strip()!r}")
        instruction.outputs = [Value(n, t, instruction) for n, t in zip(names, types)]
        for value in instruction.outputs:
            if value.name in scope:
                raise ParseError(f"%{value.name} is defined twice")
            scope[value.name] = value
            if value.name.isdigit():
                numbered.append(int(value.name))
        function.instructions.append(instruction)
    last = lines[-1].strip()
    if not last.startswith("return"):
        raise ParseError("expected 'return ...' on the last line")
    function.outputs = [lookup(n) for n in last[len("return"):].split(",") if n.strip()]
    function._counter = max(numbered, default=-1) + 1
    return function


def same_function(a: Graph, b: Graph) -> bool:
    """Structural equality: same names, types, primitives, attributes, locations and wiring."""
    def signature(function: Graph):
        def value(v: Value):
            return (v.name, v.type)
        return (function.name, [value(p) for p in function.parameters],
                [(i.primitive, [value(v) for v in i.inputs],
                  {k: format_attribute(v) for k, v in i.attributes.items()},
                  [value(v) for v in i.outputs], i.location) for i in function.instructions],
                [value(v) for v in function.outputs])
    return signature(a) == signature(b)

