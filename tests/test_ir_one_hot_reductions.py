"""A reduction of one marked element loses its loop (ir/one_hot.py): hand-made loop
programs run in the loop IR's interpreter give the same bits with and without the rewrite, the
mark in or out of the loop's range, nan and -0.0 included; loops that are not such reductions
stay; and max(dim)/min(dim) through the API give PyTorch's values and indices (conftest.py
checks their compiled code against the reference interpreter) with one loop fewer a row."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tracer as tr
from tracer.ir import one_hot
from tracer.ir.graph import Value
from tracer.ir.loop_interpreter import run_program
from tracer.ir.loops import (Accumulate, Accumulator, Buffer, Compute, IndexOp, Load, Loop,
                             LoopKernel, LoopProgram, Store)
from tracer.ir.memory import Location
from tracer.ir.one_hot import shortcut_one_hot_reductions
from tracer.ir.types import TensorType
from tracer.ir.verify_loops import verify_loops

ROWS, COLUMNS = 4, 5
F64, I64, BOOL = np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.bool_)


def marked_program(primitive: str = "maximum", identity: float = -np.inf,
                   variant: str = "marked") -> LoopProgram:
    """out[r] = the `primitive` reduction over j of select(eq(j, k[r]), x[r, j], identity), k[r]
    loaded before the loop; the `variant` "loaded inside" loads k[r] in the loop, "stores" also
    copies x's row, "varying mark" compares j with k[r] - j."""
    x, k = Value("x", TensorType((ROWS, COLUMNS), "f64")), Value("k", TensorType((ROWS,), "i64"))
    result, copy = Value("r", TensorType((ROWS,), "f64")), Value("c", TensorType((ROWS, COLUMNS), "f64"))
    mark = "%k"
    body = [IndexOp("%p", "add", ("%o", "%j")), Load("%x", "in0", "%p", x),
            Compute("%jj", "cast", ("%j",), (I64,), I64, {"dtype": I64})]
    if variant == "loaded inside":
        body.append(Load("%k2", "in1", "%r", k))
        mark = "%k2"
    if variant == "varying mark":
        body.append(Compute("%k2", "sub", ("%k", "%jj"), (I64, I64), I64))
        mark = "%k2"
    body += [Compute("%hit", "eq", ("%jj", mark), (I64, I64), BOOL),
             Compute("%s", "select", ("%hit", "%x", identity), (BOOL, F64, F64), F64),
             Accumulate("%m", primitive, "%s", F64)]
    if variant == "stores":
        body.append(Store("out1", "%p", "%x", copy))
    rows = Loop("%r", "begin", "end", [
        IndexOp("%o", "mul", ("%r", COLUMNS)), Load("%k", "in1", "%r", k),
        Accumulator("%m", F64, identity), Loop("%j", 0, COLUMNS, body),
        Store("out0", "%r", "%m", result)])
    kernel = LoopKernel("kernel_0", "loop", [
        Buffer("in0", x, Location("parameter", 0)), Buffer("in1", k, Location("parameter", 1)),
        Buffer("out0", result, Location("output", 0)), Buffer("out1", copy, Location("output", 1))],
        [rows], ROWS)
    return LoopProgram("marked", [x, k], [result, copy],
                       [Location("output", 0), Location("output", 1)], 0, [kernel])


def inner_loops(program: LoopProgram) -> int:
    return sum(isinstance(s, Loop) for s in program.kernels[0].body[0].body)


def rows_and_marks() -> tuple[np.ndarray, np.ndarray]:
    """Rows with a nan, a -0.0, infinities; marks in range, before it and past it."""
    x = np.random.default_rng(0).standard_normal((ROWS, COLUMNS))
    x[0, 2], x[1, 0], x[2, 4], x[3, 1] = np.nan, -0.0, -np.inf, np.inf
    return x, np.array([2, 0, -1, COLUMNS], np.int64)


@pytest.mark.parametrize("primitive, identity, variant", [
    ("maximum", -np.inf, "marked"), ("minimum", np.inf, "marked"), ("add", -0.0, "marked"),
    ("maximum", -np.inf, "loaded inside")])
def test_the_marked_element_is_read_without_the_loop_to_the_same_bits(primitive, identity,
                                                                       variant):
    x, k = rows_and_marks()
    expected = run_program(marked_program(primitive, identity, variant), [x, k])[0]
    program = shortcut_one_hot_reductions(marked_program(primitive, identity, variant))
    verify_loops(program)
    assert inner_loops(program) == 0
    result = run_program(program, [x, k])[0]
    np.testing.assert_array_equal(result, expected)
    # by hand: the marked element where the mark is in range, the identity's result elsewhere
    np.testing.assert_array_equal(result, [np.nan, -0.0, identity, identity])
    assert np.signbit(result[1])


@pytest.mark.parametrize("variant, primitive, identity", [
    ("stores", "maximum", -np.inf),  # another effect
    ("varying mark", "maximum", -np.inf),  # the mark changes with the position
    ("marked", "maximum", -1.0),  # not the identity: every other element adds -1
    ("marked", "add", 1.0),
    ("marked", "add", 0.0)])  # not the identity of -0.0 (0.0 + -0.0 is 0.0)
def test_other_loops_stay(variant, primitive, identity):
    x, k = rows_and_marks()
    expected = run_program(marked_program(primitive, identity, variant), [x, k])
    program = shortcut_one_hot_reductions(marked_program(primitive, identity, variant))
    assert inner_loops(program) == 1
    for result, wanted in zip(run_program(program, [x, k]), expected):
        np.testing.assert_array_equal(result, wanted)


def row_extrema(x):
    high, low = x.max(dim=1), x.min(dim=1)
    return high.values, high.indices, low.values, low.indices


def selections_in_loops(traced) -> int:
    """How many loads of _Selected.forward (max(dim)'s value) are in a loop along a row (an
    innermost loop)."""
    (entry,) = traced._signatures.entries.values()
    return sum(isinstance(s, Load) and "_Selected.forward" in s.line
               for kernel in entry.executable.loops.kernels for loop in _loops(kernel.body)
               if not any(isinstance(s, Loop) for s in loop.body) for s in loop.body)


def _loops(statements):
    for statement in statements:
        if isinstance(statement, Loop):
            yield statement
            yield from _loops(statement.body)


def test_max_and_min_along_a_dimension_read_their_element_at_its_index(monkeypatch, tmp_path):
    x = np.random.default_rng(1).standard_normal((6, 9)).astype(np.float32)
    x[0, 3], x[1, :] = np.nan, -np.inf
    x[2, 1], x[2, 5] = 0.0, -0.0  # a tie of zeros: the first is the one
    x[2] = np.minimum(x[2], 0.0)
    x[3, 2], x[3, 7] = np.inf, np.inf
    traced = tr.trace(row_extrema)
    results = [r.numpy() for r in traced(tr.tensor(x))]
    expected = [r.numpy() for r in row_extrema(torch.tensor(x))]
    for result, wanted in zip(results, expected):
        np.testing.assert_array_equal(result, wanted)
        assert np.array_equal(np.signbit(result), np.signbit(wanted))
    assert selections_in_loops(traced) == 0
    monkeypatch.setattr(one_hot, "shortcut_one_hot_reductions", lambda program: program)
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))  # (not the program compiled above)
    unrewritten = tr.trace(row_extrema)
    for result, wanted in zip(unrewritten(tr.tensor(x)), results):
        np.testing.assert_array_equal(result.numpy(), wanted)
    assert selections_in_loops(unrewritten) == 2  # max's and min's, read along the row


N = 40


def marked_by_a_reduction(module):
    """The mark is an int64 row maximum (an accumulator of the row kernel), compared with arange:
    the selected row maximum and a one-hot term added to each row."""
    def f(k_source, y):
        k = k_source.max(dim=1).values
        hit = module.arange(N) == k[:, None]
        s = y.sum(dim=1)
        return (module.where(hit, y, float("-inf")).max(dim=1).values,
                y * 3 + module.where(hit, s[:, None], 0.0))
    return f


def test_a_mark_made_by_a_reduction_compiles_and_matches_pytorch():
    """(An accumulator cannot be read by index arithmetic: those loops stay as they are.)"""
    rng = np.random.default_rng(0)
    marks = rng.integers(-3, N + 3, size=(6, 5)).astype(np.int64)
    y = rng.standard_normal((6, N)).astype(np.float32)
    results = tr.trace(marked_by_a_reduction(tr))(tr.tensor(marks), tr.tensor(y))
    expected = marked_by_a_reduction(torch)(torch.tensor(marks), torch.tensor(y))
    np.testing.assert_array_equal(results[0].numpy(), expected[0].numpy())
    np.testing.assert_allclose(results[1].numpy(), expected[1].numpy(), rtol=1e-6, atol=1e-5)
