"""The textual IR: golden printer output, parse round trips, parse errors and verifier errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tracer import ir
from conftest import roundtrip
from tracer.ir.builder import GraphBuilder
from tracer.ir.graph import Graph, Instruction, Value
from tracer.ir.text import ParseError
from tracer.ir.types import TensorType
from tracer.ir.verify import VerificationError
from tracer.ir.vjp import CustomRule


def step_function() -> Graph:
    function = Graph("step")
    x = function.add_parameter("x", TensorType((8, 4), "f32"))
    w = function.add_parameter("w", TensorType((4, 2), "f32"))
    locations = iter(["step.py:12", "step.py:13 (MyLoss.forward)", "", "step.py:14", "step.py:14",
                      "step.py:15"])
    b = GraphBuilder(function, lambda: next(locations))
    h = b.op("matmul", x, w)
    total = b.op("reduce_sum", h, axes=(0, 1))
    half = b.constant(0.5, np.float32)
    loss = b.op("mul", total, half)
    column = b.op("slice", h, starts=(0, 1), stops=(8, 2), steps=(2, 1))
    wide = b.cast(column, np.float64)
    function.outputs = [loss, wide]
    return function


STEP_TEXT = """\
def step(%x: f32[8,4], %w: f32[4,2]):
  %0 : f32[8,2] = matmul %x, %w                         # step.py:12
  %1 : f32[] = reduce_sum %0 {axes=(0,1)}               # step.py:13 (MyLoss.forward)
  %2 : f32[] = constant {value=0.5, dtype=f32}
  %3 : f32[] = mul %1, %2                               # step.py:14
  %4 : f32[4,1] = slice %0 {starts=(0,1), stops=(8,2), steps=(2,1)}  # step.py:14
  %5 : f64[4,1] = cast %4 {dtype=f64}                   # step.py:15
  return %3, %5
"""


def test_golden_printer():
    assert ir.format_function(step_function()) == STEP_TEXT


def test_golden_parses_back_equal_and_runs_the_same():
    function = step_function()
    parsed = ir.parse_function(STEP_TEXT)
    assert ir.same_function(function, parsed)
    ir.verify(parsed)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    loss, wide = ir.interpret(parsed, [x, w])
    h = x @ w
    np.testing.assert_allclose(loss, 0.5 * h.sum(), rtol=1e-5)
    assert loss.dtype == np.float32 and loss.shape == ()
    np.testing.assert_array_equal(wide, h[0:8:2, 1:2].astype(np.float64))
    assert wide.dtype == np.float64


def test_golden_gradient_directive_and_scalar_function():
    function = Graph("g")
    x = function.add_parameter("x", TensorType((3,), "f64"))
    b = GraphBuilder(function)
    y = b.op("reduce_sum", b.op("sin", x), axes=(0,))
    (dx,) = b.emit("gradient", [y, b.constant(1.0, np.float64), x], {})
    function.outputs = [dx]
    assert ir.format_function(function) == (
        "def g(%x: f64[3]):\n"
        "  %0 : f64[3] = sin %x\n"
        "  %1 : f64[] = reduce_sum %0 {axes=(0,)}\n"
        "  %2 : f64[] = constant {value=1.0, dtype=f64}\n"
        "  %3 : f64[3] = gradient %1, %2, %x\n"
        "  return %3\n")
    roundtrip(function)
    ir.expand_gradients(function)
    roundtrip(function)
    np.testing.assert_allclose(ir.interpret(function, [np.array([0.1, 0.2, 0.3])])[0],
                               np.cos([0.1, 0.2, 0.3]), rtol=1e-15)


def test_roundtrip_of_every_attribute_kind():
    function = Graph("kinds")
    x = function.add_parameter("x", TensorType((2, 3), "f64"))
    flags = function.add_parameter("flags", TensorType((2, 3), "bool"))
    count = function.add_parameter("count", TensorType((0, 3), "i64"))
    b = GraphBuilder(function, lambda: "weird name.py:7 (A.forward) (backward)")
    values = [
        b.constant(float("inf"), np.float64), b.constant(float("-inf"), np.float64),
        b.constant(float("nan"), np.float64), b.constant(-0.0, np.float64),
        b.constant(1e-300, np.float64), b.constant(True, np.bool_), b.constant(-7, np.int64),
        b.constant(0.1, np.float32),
        b.op("iota", shape=(2, 3), dimension=1, dtype=np.int64),
        b.op("transpose", x, permutation=(1, 0)),
        b.op("reduce_max", x, axes=(1,)),
        b.op("pad", x, low=(0, 1), high=(2, 0), interior=(1, 0)),
        b.op("select", flags, x, b.full((2, 3), 2.5, np.float64)),
        b.op("logical_not", flags),
        b.op("reduce_sum", count, axes=(0, 1)),
        b.op("reshape", count, shape=(3, 0)),
    ]
    rule = CustomRule("My Fn", lambda builder, cotangents, needs: [None])
    pair = b.emit("custom_vjp", [x, x, x], {"num_outputs": 2, "rule": rule})
    function.outputs = values + pair
    parsed = roundtrip(function)
    # The custom rule is the same live object after parsing.
    custom = next(i for i in parsed.instructions if i.primitive == "custom_vjp")
    assert custom.attributes["rule"] is rule
    assert len(custom.outputs) == 2
    # The parsed graph computes the same values.
    arguments = [np.arange(6.0).reshape(2, 3), np.array([[True, False, True]] * 2),
                 np.zeros((0, 3), np.int64)]
    for a, c in zip(ir.interpret(function, arguments), ir.interpret(parsed, arguments)):
        assert a.dtype == c.dtype
        np.testing.assert_array_equal(a, c)
    results = ir.interpret(parsed, arguments)
    assert math.isinf(results[0]) and results[0] > 0
    assert math.isinf(results[1]) and results[1] < 0
    assert math.isnan(results[2])
    assert math.copysign(1.0, results[3]) == -1.0
    assert results[4] == 1e-300
    assert results[7].dtype == np.float32 and results[7] == np.float32(0.1)
    np.testing.assert_array_equal(results[8], [[0, 1, 2], [0, 1, 2]])


def test_parsed_function_names_new_values_after_the_last_number():
    parsed = ir.parse_function(STEP_TEXT)
    b = GraphBuilder(parsed)
    extra = b.op("neg", parsed.outputs[0])
    assert extra.name == "6"
    parsed.outputs.append(extra)
    roundtrip(parsed)


@pytest.mark.parametrize("text,message", [
    ("", "def"),
    ("step(%x: f32[2]):\n  return %x\n", "def"),
    ("def f(%x: f32[2]):\n  %0 : f32[2] = neg %x\n", "return"),
    ("def f(%x: f16[2]):\n  return %x\n", "type"),
    ("def f(%x: f32[2]):\n  %0 : f32[2] neg %x\n  return %0\n", "parse"),
    ("def f(%x: f32[2]):\n  %0 : f32[2] = neg %y\n  return %0\n", "before it is defined"),
    ("def f(%x: f32[2]):\n  %0 : f32[2] = neg %1\n  %1 : f32[2] = neg %x\n  return %0\n",
     "before it is defined"),
    ("def f(%x: f32[2]):\n  %0 : f32[2] = neg %x\n  %0 : f32[2] = neg %x\n  return %0\n",
     "defined twice"),
    ("def f(%x: f32[2]):\n  %x : f32[2] = neg %x\n  return %x\n", "defined twice"),
    ("def f(%x: f32[2]):\n  %0, %1 : f32[2] = neg %x\n  return %0\n", "names but"),
    ("def f(%x: f32[2]):\n  return %3\n", "before it is defined"),
    ("def f(%x: f32[2]):\n  %0 : f32[2] = custom_vjp %x {num_outputs=1, rule=@Gone.999999}\n"
     "  return %0\n", "not alive"),
    ("def f(%x: f32[2]):\n  %0 : f32[2 = neg %x\n  return %0\n", "bad type"),
])
def test_parse_errors(text, message):
    with pytest.raises(ParseError, match=message):
        ir.parse_function(text)


def test_parse_error_is_a_value_error():
    assert issubclass(ParseError, ValueError)


# ---------------------------------------------------------------------------------------------
# The verifier.

def parsed(text: str) -> Graph:
    return ir.parse_function(text)


def test_verifier_accepts_good_text():
    ir.verify(parsed("def f(%x: f32[2,3], %y: f32[3]):\n  %0 : f32[2,3] = add %x, %y\n"
                     "  %1 : bool[2,3] = lt %0, %x\n  return %0, %1\n"))


@pytest.mark.parametrize("text,message", [
    # a wrong result type
    ("def f(%x: f32[2,3]):\n  %0 : f32[3,2] = neg %x\n  return %0\n", "should be"),
    ("def f(%x: f32[2,3]):\n  %0 : f64[2,3] = neg %x\n  return %0\n", "should be"),
    ("def f(%x: f32[2,3]):\n  %0 : f32[2] = reduce_sum %x {axes=(0,)}\n  return %0\n", "should be"),
    ("def f(%x: f32[2,3]):\n  %0 : f32[2,3] = lt %x, %x\n  return %0\n", "should be"),
    # operands the shape rules reject
    ("def f(%x: f32[2,3], %y: f32[2]):\n  %0 : f32[2,3] = add %x, %y\n  return %0\n", "broadcast"),
    ("def f(%x: f32[2,3], %y: f64[2,3]):\n  %0 : f32[2,3] = add %x, %y\n  return %0\n", "one dtype"),
    ("def f(%x: i64[2]):\n  %0 : i64[2] = exp %x\n  return %0\n", "float"),
    ("def f(%x: f32[2,3]):\n  %0 : f32[2,3] = neg %x, %x\n  return %0\n", "operands"),
    ("def f(%x: f32[2,3]):\n  %0 : f32[3] = reduce_sum %x {axes=(2,)}\n  return %0\n", "axes"),
    ("def f(%x: f32[2,3]):\n  %0 : f32[2,3] = frobnicate %x\n  return %0\n", "unknown"),
    ("def f(%x: f32[2,3]):\n  %0 : f32[2,3] = neg %x {bogus=1}\n  return %0\n", "bogus"),
    ("def f(%x: f32[2,3]):\n  %0 : f32[2,2] = slice %x {starts=(0,0), stops=(2,4), steps=(1,1)}\n"
     "  return %0\n", "out of range"),
])
def test_verifier_rejects_text(text, message):
    function = parsed(text)
    with pytest.raises(VerificationError, match=message):
        ir.verify(function)


def small_function() -> tuple[Graph, list[Instruction]]:
    function = Graph("f")
    x = function.add_parameter("x", TensorType((2,), "f64"))
    b = GraphBuilder(function)
    y = b.op("exp", x)
    z = b.op("neg", y)
    function.outputs = [z]
    ir.verify(function)
    return function, function.instructions


def test_verifier_use_before_def():
    function, (first, second) = small_function()
    function.instructions = [second, first]
    with pytest.raises(VerificationError, match="used before it is defined"):
        ir.verify(function)


def test_verifier_use_of_a_foreign_value():
    function, (first, second) = small_function()
    second.inputs = [Value("0", first.outputs[0].type)]  # same name, but not the defined value
    with pytest.raises(VerificationError, match="used before it is defined"):
        ir.verify(function)


def test_verifier_duplicate_definition_by_name():
    function, (first, second) = small_function()
    second.outputs[0].name = first.outputs[0].name
    with pytest.raises(VerificationError, match="defined twice"):
        ir.verify(function)


def test_verifier_duplicate_definition_of_a_parameter_name():
    function, (first, second) = small_function()
    first.outputs[0].name = "x"
    with pytest.raises(VerificationError, match="defined twice"):
        ir.verify(function)


def test_verifier_same_instruction_twice():
    function, (first, second) = small_function()
    function.instructions = [first, first, second]
    with pytest.raises(VerificationError, match="defined twice"):
        ir.verify(function)


def test_verifier_wrong_type():
    function, (first, second) = small_function()
    second.outputs[0].type = TensorType((2,), "f32")
    with pytest.raises(VerificationError, match="should be"):
        ir.verify(function)


def test_verifier_producer_mismatch():
    function, (first, second) = small_function()
    second.outputs[0].producer = first
    with pytest.raises(VerificationError, match="producer"):
        ir.verify(function)


def test_verifier_parameter_with_producer():
    function, (first, second) = small_function()
    function.parameters[0].producer = first
    with pytest.raises(VerificationError, match="producer"):
        ir.verify(function)


def test_verifier_undefined_output():
    function, (first, second) = small_function()
    function.instructions = [first]
    with pytest.raises(VerificationError, match="not defined"):
        ir.verify(function)


def test_verifier_gradient_directive_seed_type():
    function = parsed("def f(%x: f64[2], %s: f64[3]):\n  %0 : f64[2] = exp %x\n"
                      "  %1 : f64[2] = gradient %0, %s, %x\n  return %1\n")
    with pytest.raises(VerificationError, match="seed"):
        ir.verify(function)


def test_copy_is_deep_and_equal():
    function = step_function()
    clone = function.copy()
    assert ir.same_function(function, clone)
    assert all(a is not c for a, c in zip(function.values(), clone.values()))
    ir.verify(clone)
    clone.instructions[0].attributes["bogus"] = 1
    assert "bogus" not in function.instructions[0].attributes
