"""Divisions by what an innermost loop does not change become multiplications by a reciprocal
computed once before it (ir/reciprocals.py): a row divided by its sum, layer norm's centred row
by its deviation. The results are numpy's float64 within float32's rounding (a multiplication by
the rounded reciprocal is within about one ulp of the division), with the same infinities and
NaNs; a division by what the loop computes, and an integer division, stay divisions."""
from __future__ import annotations

import numpy as np
import pytest

import tracer as tr
from tracer.ir.loop_interpreter import run_program
from tracer.ir.loops import Buffer, Compute, IndexOp, Load, Loop, LoopKernel, LoopProgram, Store
from tracer.ir.graph import Value
from tracer.ir.memory import Location
from tracer.ir.reciprocals import multiply_by_reciprocals
from tracer.ir.types import TensorType
from tracer.ir.verify_loops import verify_loops

F32 = np.dtype(np.float32)


def divided_rows(divisor_in_loop: bool) -> LoopProgram:
    """out[r, j] = x[r, j] / d, d = x[r, 0] + 1 read before the row's loop (or x[r, j] + 1,
    computed in it)."""
    x, result = Value("x", TensorType((3, 5), "f32")), Value("out", TensorType((3, 5), "f32"))
    divisor = [Load("%first", "in0", "%o", x), Compute("%d", "add", ("%first", 1.0), (F32, F32), F32)]
    row = Loop("%j", 0, 5, [
        IndexOp("%p", "add", ("%o", "%j")),
        Load("%v", "in0", "%p", x),
        *([Compute("%d", "add", ("%v", 1.0), (F32, F32), F32)] if divisor_in_loop else []),
        Compute("%q", "div", ("%v", "%d"), (F32, F32), F32),
        Store("out0", "%p", "%q", result)])
    rows = Loop("%r", "begin", "end", [IndexOp("%o", "mul", ("%r", 5)),
                                       *([] if divisor_in_loop else divisor), row])
    kernel = LoopKernel("kernel_0", "loop", [Buffer("in0", x, Location("parameter", 0)),
                                             Buffer("out0", result, Location("output", 0))],
                        [rows], 3)
    return LoopProgram("rows", [x], [result], [Location("output", 0)], 0, [kernel])


def computes(program: LoopProgram) -> list[tuple[str, tuple]]:
    """The (primitive, operands) of every computation of the program, in order."""
    found = []

    def walk(statements):
        for statement in statements:
            if isinstance(statement, Loop):
                walk(statement.body)
            elif isinstance(statement, Compute):
                found.append((statement.primitive, statement.operands))
    walk(program.kernels[0].body)
    return found


@pytest.mark.parametrize("divisor_in_loop", [False, True])
def test_a_division_by_what_the_loop_does_not_change_multiplies(divisor_in_loop):
    x = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    program = multiply_by_reciprocals(divided_rows(divisor_in_loop))
    verify_loops(program)
    if divisor_in_loop:
        assert computes(program) == [("add", ("%v", 1.0)), ("div", ("%v", "%d"))]
        expected = x / (x + 1)
    else:
        # the reciprocal once per row, before the row's loop; the loop multiplies
        assert computes(program) == [("add", ("%first", 1.0)),
                                     ("div", (1.0, "%d")), ("mul", ("%v", "%d.reciprocal.j"))]
        expected = x.astype(np.float64) / (x[:, :1].astype(np.float64) + 1)
    (actual,) = run_program(program, [x])
    np.testing.assert_allclose(actual, expected, rtol=3e-7)


def test_a_row_divided_by_its_sum_multiplies_with_numpys_values_and_special_values():
    """x / x.sum(dim=1): rows of ordinary values, a row summing to 0 (x / 0: +-inf, and 0 / 0:
    NaN), a row holding inf (its sum is inf: inf / inf is NaN, finite / inf is 0)."""
    @tr.trace
    def normalized(x):
        return x / x.sum(dim=1, keepdim=True)

    x = np.random.default_rng(1).uniform(0.5, 2.0, size=(4, 300)).astype(np.float32)
    x[1, :2], x[1, 2:] = (1.0, -1.0), 0.0
    x[2, 7] = np.inf
    loops = normalized.ir(x, stage="loops")
    assert ".reciprocal" in loops and " div %" not in loops.split(".reciprocal")[-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        exact = x.astype(np.float64) / x.astype(np.float64).sum(axis=1, keepdims=True)
        actual = normalized(x).numpy()
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(exact))
    finite = np.isfinite(exact)
    np.testing.assert_array_equal(actual[~finite & ~np.isnan(exact)],
                                  exact[~finite & ~np.isnan(exact)])
    np.testing.assert_allclose(actual[finite], exact[finite], rtol=3e-7, atol=0)


def test_an_integer_division_stays_a_division():
    @tr.trace
    def quotient(n, d):
        return n // d.sum(dim=1, keepdim=True)

    n = np.arange(-20, 20, dtype=np.int64).reshape(2, 20)
    d = np.array([[3, 4], [-5, 2]], dtype=np.int64)
    np.testing.assert_array_equal(quotient(n, d).numpy(), n // d.sum(axis=1, keepdims=True))
    assert ".reciprocal" not in quotient.ir(n, d, stage="loops")
