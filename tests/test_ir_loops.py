"""The loop IR (the `loops` stage): its printed form, the scheduling decisions it shows, its numpy
interpreter against the reference interpreter and against the compiled code, and a load at a
computed index (a gather) through both the interpreter and LLVM. (Every primitive test and random
program of test_codegen_primitives.py and test_codegen_property.py runs its loop IR too.)"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import tracer as tr
from tracer import ir
from tracer.codegen.module import generate_module
from tracer.ir.fusion import fuse
from tracer.ir.graph import Value
from tracer.ir.loop_interpreter import IndexCheckFailed, run_program
from tracer.ir.loop_printing import format_program
from tracer.ir.loops import (Buffer, CheckIndex, Compute, Load, Loop, LoopKernel,
                             LoopProgram, Store, nested_statements)
from tracer.ir.memory import Location, MemoryPlan, plan_memory
from tracer.ir.schedule import schedule
from tracer.ir.types import TensorType
from tracer.ir.verify import VerificationError
from tracer.ir.verify_loops import verify_loops
from tracer.runtime import jit, object_code
from tracer.runtime.pipeline import compile_graph


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))


def scheduled(function: ir.Graph, write_into=None, threads: int = 1) -> LoopProgram:
    fused = fuse(ir.optimize(function))
    return schedule(fused, plan_memory(fused, write_into), threads)


def scale() -> ir.Graph:
    f = ir.Graph("scale")
    x = f.add_parameter("x", TensorType((6,), "f32"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.add(b.mul(x, 2.0), 1.0)]
    return f


def test_an_in_place_update_is_one_flat_loop_over_the_parameter():
    assert format_program(scheduled(scale(), write_into={0: 0})) == """\
def scale(%x: f32[6]):  # arena 0 bytes
  kernel_0 loop, range [0, 6):
    in0 = %x: f32[6] (parameter 0)
    for %i1 in [begin, end):
      %v2 : f32 = load in0[%i1]
      %v3 : f32 = mul %v2, 2.0
      %v4 : f32 = add %v3, 1.0
      store in0[%i1] = %v4
  return parameter 0
"""


def test_reductions_row_sums_inline_and_column_max_in_memory_order():
    f = ir.Graph("rows")
    x = f.add_parameter("x", TensorType((3, 4), "f32"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.reduce_sum(x, (1,)), b.op("reduce_max", x, axes=(0,))]
    text = format_program(scheduled(f))
    # the row sum: a float64 accumulator per row, rounded to float32 once
    assert """\
    for %i1 in [begin, end):
      %acc2 : f64 = accumulator 0.0
      for %i3 in [0, 4):
        %o4 : index = mul %i1, 4
        %o5 : index = add %o4, %i3
        %v6 : f32 = load in0[%o5]
        %v7 : f64 = cast %v6
        %acc2 = add %acc2, %v7
      %v8 : f32 = cast %acc2
      store out0[%i1] = %v8
""" in text
    # the column max: the result starts at -inf, then x is read once, row by row
    assert """\
  kernel_1 accumulate, range [0, 4):
    in0 = %x: f32[3,4] (parameter 0)
    out0 = %1: f32[4] (output 1)
    for %i1 in [0, 4):
      store out0[%i1] = -inf
    for %i2 in [0, 3):
      for %i3 in [0, 4):
""" in text


def test_a_transposed_read_and_a_constant_power():
    f = ir.Graph("t")
    x = f.add_parameter("x", TensorType((2, 3), "f64"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.pow(b.op("transpose", x, permutation=(1, 0)), 3.0)]
    text = format_program(scheduled(f))
    # out[i, j] = x[j, i] ** 3: x is read at j * 3 + i, the cube is two multiplications
    assert """\
    for %i1 in [begin, end):
      for %i2 in [0, 2):
        %o3 : index = mul %i2, 3
        %o4 : index = add %o3, %i1
        %v5 : f64 = load in0[%o4]
        %v6 : f64 = mul %v5, %v5
        %v7 : f64 = mul %v6, %v5
        %o8 : index = mul %i1, 2
        %o9 : index = add %o8, %i2
        store out0[%o9] = %v7
""" in text
    argument = np.arange(6.0).reshape(2, 3)
    (result,) = run_program(scheduled(f), [argument])
    np.testing.assert_array_equal(result, argument.T ** 3)


def test_the_interpreter_follows_the_memory_plan_and_in_place_writes():
    """Temporaries share the arena (which starts as NaN bytes): reading one before it is written,
    or after another overwrote it, would show in the result."""
    f = ir.Graph("chain")
    x = f.add_parameter("x", TensorType((4, 4), "f64"))
    w = f.add_parameter("w", TensorType((4, 4), "f64"))
    v = f.add_parameter("v", TensorType((4, 4), "f64"))
    b = ir.GraphBuilder(f)
    h = b.op("matmul", b.op("matmul", b.op("tanh", x), w), w)
    f.outputs = [b.op("reduce_sum", h, axes=(0,)), b.sub(v, b.mul(b.op("exp", x), 0.5))]
    program = scheduled(f, write_into={1: 2})
    assert program.arena_size > 0 and program.returns[1] == Location("parameter", 2)
    rng = np.random.default_rng(1)
    arguments = [rng.normal(size=(4, 4)) for _ in range(3)]
    original = [a.copy() for a in arguments]
    for actual, expected in zip(run_program(program, arguments), ir.interpret(f, arguments)):
        np.testing.assert_allclose(actual, expected, rtol=1e-13, atol=1e-13)
    for argument, before in zip(arguments, original):  # the interpreter worked on copies
        np.testing.assert_array_equal(argument, before)


def test_the_interpreter_refuses_an_access_outside_a_buffer():
    program = scheduled(scale(), write_into={0: 0})
    program.kernels[0].extent += 1  # the loop runs one element past x
    with pytest.raises(IndexError, match="element 6 of in0, which has 6 elements"):
        run_program(program, [np.zeros(6, np.float32)])


def test_a_large_kernel_is_split_across_threads(monkeypatch):
    monkeypatch.setenv("TRACER_NUM_THREADS", "2")
    monkeypatch.setattr("tracer.ir.schedule_threads.PARALLEL_WORK_PER_THREAD", 4)
    f = ir.Graph("wide")
    x = f.add_parameter("x", TensorType((64, 3), "f32"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.op("exp", x)]
    compiled = compile_graph(ir.optimize(f))
    text = compiled.stage_text("loops")
    assert "kernel_0 loop, range [0, 192), 8 chunks, 2 threads:" in text
    assert "@split.0.parallel(ptr %param.0, ptr %output.0, i64 192)" in compiled.back_end.code.entry
    argument = np.linspace(-3, 3, 192, dtype=np.float32).reshape(64, 3)
    (native,) = compiled([argument])
    for splits in (1, 2, 5):  # as the chunks of 2 threads (or 5) would run, one after the other
        (interpreted,) = run_program(compiled.loops, [argument], splits=splits)
        np.testing.assert_allclose(native, interpreted, rtol=2e-7)
        np.testing.assert_allclose(interpreted, np.exp(argument), rtol=1e-7)


def gather_program(table: Value, positions: Value, result: Value) -> LoopProgram:
    """out[i] = table[positions[i]] * 2: a load at an offset that is itself loaded."""
    body = [Loop("%i", "begin", "end", [
        Load("%p", "in1", "%i", positions),
        Load("%t", "in0", "%p", table),
        Compute("%y", "mul", ("%t", 2.0), (table.dtype, table.dtype), table.dtype),
        Store("out0", "%i", "%y", result)])]
    kernel = LoopKernel("kernel_0", "loop", [
        Buffer("in0", table, Location("parameter", 0)),
        Buffer("in1", positions, Location("parameter", 1)),
        Buffer("out0", result, Location("output", 0))], body, result.type.size)
    return LoopProgram("gather", [table, positions], [result], [Location("output", 0)], 0,
                       [kernel])


def test_a_load_at_a_computed_index_runs_in_the_interpreter_and_in_llvm():
    table = Value("table", TensorType((5,), "f64"))
    positions = Value("positions", TensorType((7,), "i64"))
    result = Value("result", TensorType((7,), "f64"))
    program = gather_program(table, positions, result)
    assert "%t : f64 = load in0[%p]" in format_program(program)
    values = np.array([1.5, -2.0, 3.25, 0.0, 10.0])
    indices = np.array([4, 0, 0, 2, 3, 1, 4])
    (interpreted,) = run_program(program, [values, indices])
    np.testing.assert_array_equal(interpreted, values[indices] * 2)
    code = generate_module(program, MemoryPlan(output_slots=[result]), jit.host().triple,
                           blas=False)
    module = jit.JitModule.link([object_code.compile_object(text) for text in
                                 [code.entry, *(kernel.text for kernel in code.kernels)]])
    native = np.zeros(7)
    pointers = (ctypes.c_void_p * 3)(values.ctypes.data, indices.ctypes.data, native.ctypes.data)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(module.address("tracer_entry"))(
        ctypes.addressof(pointers))
    np.testing.assert_array_equal(native, values[indices] * 2)


def gather_then_scatter() -> ir.Graph:
    """rows = table[index] summed per row (a loop kernel), and table with 2 * rows added at index
    (a scatter kernel): both check the index."""
    f = ir.Graph("pick")
    table = f.add_parameter("table", TensorType((5, 3), "f32"))
    index = f.add_parameter("index", TensorType((4,), "i64"))
    b = ir.GraphBuilder(f)
    rows = b.op("gather", table, index, axes=(0,))
    f.outputs = [b.reduce_sum(rows, (1,)),
                 b.op("scatter", table, b.mul(rows, 2.0), index, axes=(0,), accumulate=True)]
    return f


def test_an_index_out_of_range_stops_the_loop_ir_as_it_stops_the_native_code():
    function = gather_then_scatter()
    compiled = compile_graph(ir.optimize(function))
    text = format_program(compiled.loops)
    assert text.count("= checked_index ") == 2 and "{dimension 0, %index}" in text
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    good = np.array([4, -5, 1, 4])  # -5 is row 0, counted from the end
    expected_sums = table[good].sum(1)
    expected_table = table.copy()
    np.add.at(expected_table, good, 2 * table[good])
    for outputs in (compiled([table, good]), run_program(compiled.loops, [table, good])):
        np.testing.assert_array_equal(outputs[0], expected_sums)
        np.testing.assert_array_equal(outputs[1], expected_table)
    for bad in (5, -6):
        index = np.array([0, 2, bad, 1])
        before = [table.copy(), index.copy()]
        with pytest.raises(IndexCheckFailed) as interpreted:
            run_program(compiled.loops, [table, index])
        with pytest.raises(tr.IndexOutOfRangeError) as native:
            compiled([table, index])
        failure = interpreted.value
        assert (failure.index, failure.kernel, failure.check.size) == (bad, "kernel_0", 5)
        assert (f"index {bad} is out of bounds for dimension 0 (index operand %index: i64[4]) "
                f"with size 5, in {failure.kernel};") in str(native.value)
        for old, new in zip(before, [table, index]):
            np.testing.assert_array_equal(new, old)


def test_the_loops_stage_through_the_api_and_tracer_dump(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACER_DUMP", str(tmp_path))

    @tr.trace
    def step(x, w):
        loss = (x @ w).relu().sum()
        loss.backward()
        return loss

    x, w = tr.randn(8, 4), tr.randn(4, 3, requires_grad=True)
    text = step.ir(x, w, stage="loops")  # compiles the signature, which TRACER_DUMP writes
    assert text.startswith("def step(%x: f32[8,4], %w: f32[4,3]):  # arena")
    assert "gemm out0[batch] = in0[batch] @ in1[batch] [8x4] @ [4x3]" in text
    # the gradient x^T @ g reads x transposed, without a transpose kernel
    assert "= in0^T[batch] @ " in text
    (dumped,) = tmp_path.glob("step.*.loops.txt")
    assert dumped.read_text() == text
    # the listing names the user's line of each computation
    line = step.python_function.__code__.co_firstlineno + 2
    assert f"# test_ir_loops.py:{line}" in text


def test_the_verifier_refuses_a_register_used_outside_its_loop_and_an_unknown_buffer():
    f = ir.Graph("rows")
    x = f.add_parameter("x", TensorType((3, 4), "f32"))
    f.outputs = [ir.GraphBuilder(f).reduce_sum(x, (1,))]
    program = scheduled(f)
    verify_loops(program)  # as scheduled (the pipeline checks every program so)
    (kernel,) = program.kernels
    (outer,) = kernel.body
    # %v6 is one element of x, loaded inside the reduction loop (see the test above)
    kernel.body.append(Store("out0", 0, "%v6", f.outputs[0]))
    with pytest.raises(VerificationError, match="kernel_0: %v6 is used where it is not defined"):
        verify_loops(program)
    kernel.body[-1] = Store("out9", 0, 1.0, f.outputs[0])
    with pytest.raises(VerificationError, match="out9 is not a buffer of the kernel"):
        verify_loops(program)
    outer.body.insert(0, Compute("%i1", "neg", ("%i1",), (np.dtype(np.int64),),
                                 np.dtype(np.int64)))
    with pytest.raises(VerificationError, match="%i1 is defined twice"):
        verify_loops(program)


def test_the_verifier_checks_a_checked_index():
    program = scheduled(gather_then_scatter())
    verify_loops(program)
    check = next(s for s in nested_statements(program.kernels[0].body)
                 if isinstance(s, CheckIndex))
    check.size = -1
    with pytest.raises(VerificationError, match="dimension of size -1"):
        verify_loops(program)
    check.size, check.position = 5, "%nowhere"
    with pytest.raises(VerificationError, match="%nowhere is used where it is not defined"):
        verify_loops(program)


def test_a_concatenation_backward_writes_each_part_with_its_own_loop():
    """The gradient of q, k, v split from one tensor (pads of each part, added) is three loops
    over the parts of the last axis, with no select: each element is written once."""
    def f(x):
        q, k, v = x.split(4, dim=1)
        return (q * 2 + k * 3 + v.transpose(0, 1).reshape(4, 5).transpose(0, 1) * 4).sum()

    x = tr.tensor(np.random.default_rng(1).standard_normal((5, 12)).astype(np.float32),
                  requires_grad=True)
    traced = tr.trace(tr.grad(f))
    loops = traced.ir(x, stage="loops")
    (kernel,) = [text for text in loops.split("\n  kernel_") if ": f32[5,12] (output" in text]
    assert "in [0, 4)" in kernel and "in [4, 8)" in kernel and "in [8, 12)" in kernel
    assert " select " not in kernel
    expected = np.concatenate([np.full((5, 4), 2.0), np.full((5, 4), 3.0),
                               np.full((5, 4), 4.0)], axis=1)
    np.testing.assert_array_equal(traced(x).numpy(), expected)


def test_a_flat_concatenation_writes_each_part_of_each_chunk_with_its_own_loop(monkeypatch):
    """DDP's gradients in one buffer: a cat of flat tensors is one loop per part over the part's
    share of the kernel's range (whose chunks split the parts on threads), with no select per
    element: a loop over the whole range would read every part at every element."""
    monkeypatch.setenv("TRACER_NUM_THREADS", "2")
    monkeypatch.setattr("tracer.ir.schedule_threads.PARALLEL_WORK_PER_THREAD", 4)
    f = ir.Graph("flat_cat")
    parts = [f.add_parameter(f"p{i}", TensorType(shape, "f32"))
             for i, shape in enumerate([(5, 3), (7,), (2, 2, 2)])]
    b = ir.GraphBuilder(f)
    total, pieces, offset = 30, [], 0
    for part in parts:
        flat = b.op("reshape", part, shape=(part.type.size,))
        pieces.append(b.op("pad", flat, low=(offset,), high=(total - offset - part.type.size,),
                           interior=(0,)))
        offset += part.type.size
    f.outputs = [b.op("mul", b.op("add", b.op("add", pieces[0], pieces[1]), pieces[2]),
                      b.constant(2.0, "f32"))]
    compiled = compile_graph(ir.optimize(f))
    text = compiled.stage_text("loops")
    assert "kernel_0 loop, range [0, 30), 8 chunks, 2 threads:" in text
    assert text.count("    for %i") == 3 and "f32 = select" not in text
    rng = np.random.default_rng(2)
    arguments = [rng.standard_normal(p.shape).astype(np.float32) for p in parts]
    expected = np.concatenate([a.reshape(-1) for a in arguments]) * 2
    (native,) = compiled(arguments)
    np.testing.assert_array_equal(native, expected)
    for splits in (1, 4, 7):  # chunks that begin and end inside the parts and across them
        (interpreted,) = run_program(compiled.loops, arguments, splits=splits)
        np.testing.assert_array_equal(interpreted, expected)
