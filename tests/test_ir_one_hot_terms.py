"""A one-hot term out of its loop (ir/one_hot.py): hand-made loop programs run in the loop
IR's interpreter store the same bits with and without the rewrite, the mark in or out of the
loop's range, -0.0 included; the loop that made the term's sum then merges with the loop that
stored it (ir/loop_fusion.py); loops that are not such stores stay. Softmax cross-entropy through
the API: tests/test_ir_rows.py and tests/test_ir_loop_fusion.py."""
from __future__ import annotations

import numpy as np
import pytest

from tracer.ir.graph import Value
from tracer.ir.loop_fusion import fuse_sibling_loops
from tracer.ir.loop_interpreter import run_program
from tracer.ir.loops import (Accumulate, Accumulator, Buffer, Compute, IndexOp, Load, Loop,
                             LoopKernel, LoopProgram, Store)
from tracer.ir.memory import Location
from tracer.ir.one_hot import move_one_hot_terms
from tracer.ir.types import TensorType
from tracer.ir.verify_loops import verify_loops

ROWS, COLUMNS = 4, 5
F64, I64, BOOL = np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.bool_)


def term_program(variant: str = "sum") -> LoopProgram:
    """Per row r: s = sum of x[r]; out[r, j] = 2 x[r, j] + select(j == k[r], term, 0) with term s,
    or (`variant` "loaded") v[r], loaded before the loop; "reads what it stores" loads out[r, j]
    back, "add used twice" also sums the stored values, "varying term" adds x[r, j] itself, "one
    element for all" stores every position into out[r, 0], "the counter as mark" compares j with
    itself."""
    x, k = Value("x", TensorType((ROWS, COLUMNS), "f64")), Value("k", TensorType((ROWS,), "i64"))
    v, out = Value("v", TensorType((ROWS,), "f64")), Value("o", TensorType((ROWS, COLUMNS), "f64"))
    term = {"loaded": "%v", "varying term": "%x2"}.get(variant, "%s")
    body = [IndexOp("%q", "add", ("%o", "%j")), Load("%x2", "in0", "%q", x),
            Compute("%p", "mul", ("%x2", 2.0), (F64, F64), F64),
            Compute("%jj", "cast", ("%j",), (I64,), I64, {"dtype": I64}),
            Compute("%hit", "eq", ("%jj", "%j" if variant == "the counter as mark" else "%k"),
                    (I64, I64), BOOL),
            Compute("%t", "select", ("%hit", term, 0.0), (BOOL, F64, F64), F64),
            Compute("%a", "add", ("%p", "%t"), (F64, F64), F64)]
    body.append(Store("out0", "%o" if variant == "one element for all" else "%q", "%a", out))
    if variant == "reads what it stores":
        body += [Load("%back", "out0", "%q", out), Accumulate("%u", "add", "%back", F64)]
    if variant == "add used twice":
        body.append(Accumulate("%u", "add", "%a", F64))
    rows = Loop("%r", "begin", "end", [
        IndexOp("%o", "mul", ("%r", COLUMNS)), Load("%k", "in1", "%r", k),
        Load("%v", "in2", "%r", v), Accumulator("%s", F64, 0.0), Accumulator("%u", F64, 0.0),
        Loop("%i", 0, COLUMNS, [IndexOp("%p0", "add", ("%o", "%i")), Load("%x", "in0", "%p0", x),
                                Accumulate("%s", "add", "%x", F64)]),
        Loop("%j", 0, COLUMNS, body)])
    kernel = LoopKernel("kernel_0", "loop", [
        Buffer("in0", x, Location("parameter", 0)), Buffer("in1", k, Location("parameter", 1)),
        Buffer("in2", v, Location("parameter", 2)), Buffer("out0", out, Location("output", 0))],
        [rows], ROWS)
    return LoopProgram("terms", [x, k, v], [out], [Location("output", 0)], 0, [kernel])


def arrays() -> list[np.ndarray]:
    """x with a -0.0 where row 1 is marked (2 * -0.0 + v's -0.0 is -0.0); marks in range, before
    it and past it."""
    x = np.random.default_rng(0).standard_normal((ROWS, COLUMNS))
    x[1, 3] = -0.0
    return [x, np.array([2, 3, -1, COLUMNS], np.int64), np.array([1.5, -0.0, 7.0, 9.0])]


def loops_in_rows(program: LoopProgram) -> int:
    return sum(isinstance(s, Loop) for s in program.kernels[0].body[0].body)


@pytest.mark.parametrize("variant", ["sum", "loaded"])
def test_the_marked_store_is_made_after_the_loop_to_the_same_bits(variant):
    inputs = arrays()
    (expected,) = run_program(term_program(variant), inputs)
    program = move_one_hot_terms(term_program(variant))
    verify_loops(program)
    (result,) = run_program(program, inputs)
    np.testing.assert_array_equal(result, expected)
    assert np.array_equal(np.signbit(result), np.signbit(expected))
    x, k, v = inputs
    by_hand = 2 * x
    term = x.sum(1) if variant == "sum" else v
    by_hand[[0, 1], [2, 3]] += term[[0, 1]]
    np.testing.assert_array_equal(result, by_hand)
    assert np.signbit(result[1, 3]) == (variant == "loaded")  # -0.0 + -0.0, or + 0.0
    # the loop no longer reads the sum: it merges with the loop that makes it
    merged = fuse_sibling_loops(move_one_hot_terms(term_program(variant)))
    verify_loops(merged)
    assert loops_in_rows(merged) == 1
    np.testing.assert_array_equal(run_program(merged, inputs)[0], expected)
    if variant == "sum":  # (v is loaded before both loops: they merge anyway)
        assert loops_in_rows(fuse_sibling_loops(term_program(variant))) == 2


@pytest.mark.parametrize("variant", ["reads what it stores", "add used twice", "varying term",
                                     "one element for all", "the counter as mark"])
def test_other_stores_stay_in_their_loop(variant):
    inputs = arrays()
    expected = run_program(term_program(variant), inputs)[0]
    program = move_one_hot_terms(term_program(variant))
    assert isinstance(program.kernels[0].body[0].body[-1], Loop)  # nothing stored after it
    result = run_program(program, inputs)[0]
    if variant == "one element for all":  # (the other elements are never written)
        result, expected = result[:, 0], expected[:, 0]
    np.testing.assert_array_equal(result, expected)
