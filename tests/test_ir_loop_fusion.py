"""Sibling loops merged (ir/loop_fusion.py): loops over the same bounds, neither reading what the
other writes (but the second what the first stores at the same element), become one; every other
pair stays as it is. Each program runs in the loop IR's
interpreter against numpy, merged or not; the row kernels of layer norm and cross-entropy through
the API (conftest.py checks their compiled code against the reference interpreter)."""
from __future__ import annotations

import numpy as np
import pytest

from tracer.ir.loop_fusion import fuse_sibling_loops
from tracer.ir.loop_interpreter import run_program
from tracer.ir.loops import (Accumulate, Accumulator, Buffer, Compute, IndexOp, Load, Loop,
                             LoopKernel, LoopProgram, Store)
from tracer.ir.graph import Value
from tracer.ir.memory import Location
from tracer.ir.types import TensorType
from tracer.ir.verify_loops import verify_loops
from tracer.ir import loop_fusion

from test_ir_rows import (assert_close_to_torch, compiled, cross_entropy_arrays,
                          cross_entropy_step, layer_norm_arrays, layer_norm_step, torch_results)

ROWS, COLUMNS = 3, 4
F64 = np.dtype(np.float64)


def row_program(second: str) -> LoopProgram:
    """For each row r of a and b (3x4): s = sum(a[r]); m = max over j of b[r, j] (or of
    b[r, j] - s, or over 3 elements, or of out1 read backwards, as `second` says); out0[r] =
    s + m. The first loop also copies a's row into out1."""
    a, b, copy = (Value(name, TensorType((ROWS, COLUMNS), "f64")) for name in ("a", "b", "copy"))
    result = Value("r", TensorType((ROWS,), "f64"))
    reads_maximum = second == "the first reads the maximum"
    first = Loop("%i", 0, COLUMNS, [
        IndexOp("%p", "add", ("%o", "%i")),
        Load("%x", "in0", "%p", a),
        # x + m, m still 0 (its initial value) while the first loop runs
        *([Compute("%c", "add", ("%x", "%m"), (F64, F64), F64)] if reads_maximum else []),
        Store("out1", "%p", "%c" if reads_maximum else "%x", copy),
        Accumulate("%s", "add", "%x", F64)])
    end = COLUMNS - 1 if second == "fewer elements" else COLUMNS
    body = [IndexOp("%q", "add", ("%o", "%j"))]
    if second == "reads the copy backwards":  # out1[r, 3 - j]: stored at another iteration
        body += [IndexOp("%back", "sub", ("%o2", "%j")), Load("%y", "out1", "%back", copy)]
    elif second == "reads the copy where stored":  # out1[r, j], as the first loop stores it
        body += [Load("%y", "out1", "%q", copy)]
    else:
        body += [Load("%y", "in1", "%q", b)]
    if second == "reads the sum":
        body += [Compute("%z", "sub", ("%y", "%s"), (F64, F64), F64)]
    elif second == "reads a computation between":
        body += [Compute("%z", "add", ("%y", "%t"), (F64, F64), F64)]
    else:
        body += [Compute("%z", "add", ("%y", 0.0), (F64, F64), F64)]
    body += [Accumulate("%m", "maximum", "%z", F64)]
    between = ([Compute("%t", "mul", ("%s", 1.0), (F64, F64), F64)]
               if second in ("a computation between", "reads a computation between") else [])
    maximum = Accumulator("%m", F64, {"starts from the sum": "%s",
                                      "the first reads the maximum": 0.0}.get(second, -np.inf))
    if second == "a computation between reads the maximum":  # its start, before the second loop
        between = [maximum, Compute("%t", "mul", ("%m", 1.0), (F64, F64), F64)]
    rows = Loop("%r", "begin", "end", [
        IndexOp("%o", "mul", ("%r", COLUMNS)),
        IndexOp("%o2", "add", ("%o", COLUMNS - 1)),
        Accumulator("%s", F64, 0.0),
        *([maximum] if reads_maximum else []),
        first,
        *between,
        *([] if reads_maximum or maximum in between else [maximum]),
        Loop("%j", 0, end, body),
        Compute("%total", "add", ("%s", "%m"), (F64, F64), F64),
        Store("out0", "%r", "%total", result)])
    kernel = LoopKernel("kernel_0", "loop", [
        Buffer("in0", a, Location("parameter", 0)), Buffer("in1", b, Location("parameter", 1)),
        Buffer("out0", result, Location("output", 0)), Buffer("out1", copy, Location("output", 1))],
        [rows], ROWS)
    return LoopProgram("rows", [a, b], [result, copy], [Location("output", 0),
                                                         Location("output", 1)], 0, [kernel])


def expected(second: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    sums = a.sum(1)
    if second in ("reads the copy backwards", "reads the copy where stored"):
        return sums + a.max(1)
    if second == "reads the sum":
        return sums + (b - sums[:, None]).max(1)
    if second == "reads a computation between":
        return sums + (b + sums[:, None]).max(1)
    if second == "fewer elements":
        return sums + b[:, :COLUMNS - 1].max(1)
    if second == "starts from the sum":
        return sums + np.maximum(sums, b.max(1))
    if second == "the first reads the maximum":
        return sums + np.maximum(0.0, b.max(1))
    return sums + b.max(1)


def loops_in_rows(program: LoopProgram) -> int:
    return sum(isinstance(s, Loop) for s in program.kernels[0].body[0].body)


@pytest.mark.parametrize("second, merged", [
    ("independent", True),
    ("reads the sum", False),  # final only after the first loop
    ("reads the copy backwards", False),  # the first loop stores what it loads
    ("reads the copy where stored", True),  # each iteration reads what it has just stored
    ("fewer elements", False),
    ("a computation between", True),  # not read by the second loop: it waits for it
    ("reads a computation between", False),
    ("a computation between reads the maximum", False),  # which the second loop updates
    ("starts from the sum", False),  # declared between: it cannot move before the first loop
    ("the first reads the maximum", False),  # which the second updates
])
def test_sibling_loops_merge_only_when_neither_reads_what_the_other_writes(second, merged):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((ROWS, COLUMNS)), rng.standard_normal((ROWS, COLUMNS))
    program = fuse_sibling_loops(row_program(second))
    verify_loops(program)
    assert loops_in_rows(program) == (1 if merged else 2)
    for result in (run_program(program, [a, b]), run_program(row_program(second), [a, b])):
        np.testing.assert_allclose(result[0], expected(second, a, b), rtol=1e-12)
        np.testing.assert_array_equal(result[1], a)
    if merged:  # the second accumulator is declared before the merged loop, a computation after
        rows = program.kernels[0].body[0].body
        assert [type(s).__name__ for s in rows[:5]] == [
            "IndexOp", "IndexOp", "Accumulator", "Accumulator", "Loop"]
        assert [s.target for s in rows[5:-2]] == (["%t"] if "between" in second else [])


def loops_per_depth(program: LoopProgram) -> list[int]:
    """How many loops the first kernel has at each depth of nesting."""
    counts: list[int] = []

    def walk(statements: list, depth: int) -> None:
        for statement in statements:
            if isinstance(statement, Loop):
                counts.extend([0] * (depth + 1 - len(counts)))
                counts[depth] += 1
                walk(statement.body, depth + 1)
    walk(program.kernels[0].body, 0)
    return counts


@pytest.mark.parametrize("step, arrays, separate, merged", [
    # the chunk's two zero fills; per row, the mean, the variance, the output with the bias's
    # sum, the weight's sum (which reads the normalized row the output's loop stores, at the
    # same element) and the backward's first row sum, its second (which needs the first, and
    # keeps the row it sums), the gradient
    (layer_norm_step, layer_norm_arrays((37, 24), np.float32), [1, 3, 8], [1, 2, 5]),
    # per row, the maximum with the targets' sum, the loss and the gradient's row sum with the
    # gradient (max(dim)'s value read at its index, its gradient stored there after the loop:
    # ir/one_hot.py)
    (cross_entropy_step, cross_entropy_arrays((37, 24), np.float32), [1, 1, 7], [1, 1, 4]),
])
def test_row_kernels_merge_their_independent_passes(monkeypatch, step, arrays, separate, merged):
    assert loops_per_depth(compiled(step, arrays).loops) == merged
    assert_close_to_torch(compiled(step, arrays)(arrays), torch_results(step, arrays), np.float32)
    monkeypatch.setattr(loop_fusion, "fuse_sibling_loops", lambda program: program)
    assert loops_per_depth(compiled(step, arrays).loops) == separate


def test_a_loop_holding_a_loop_and_an_innermost_loop_stay_apart():
    """Merged, the innermost loop's body would sit beside a loop, and LLVM vectorizes only
    innermost loops: the two stay as they are (and compute what they computed)."""
    program = row_program("independent")
    # a sibling of the rows loop over the same range, independent of it: out2[r] = 2 * a[r, 0]
    doubled = Value("d", TensorType((ROWS,), "f64"))
    program.kernels[0].buffers.append(Buffer("out2", doubled, Location("output", 2)))
    program.output_slots.append(doubled)
    program.returns.append(Location("output", 2))
    program.kernels[0].body.append(Loop("%r2", "begin", "end", [
        IndexOp("%first", "mul", ("%r2", COLUMNS)),
        Load("%head", "in0", "%first", program.parameters[0]),
        Compute("%twice", "mul", ("%head", 2.0), (F64, F64), F64),
        Store("out2", "%r2", "%twice", doubled)]))
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((ROWS, COLUMNS)), rng.standard_normal((ROWS, COLUMNS))
    fuse_sibling_loops(program)
    verify_loops(program)
    assert sum(isinstance(s, Loop) for s in program.kernels[0].body) == 2
    results = run_program(program, [a, b])
    np.testing.assert_allclose(results[0], expected("independent", a, b), rtol=1e-12)
    np.testing.assert_array_equal(results[2], 2 * a[:, 0])
