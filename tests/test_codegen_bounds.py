"""The bounds-checked mode (TRACER_CHECK_BOUNDS=1), by fault injection: the code generator is made
to produce code that would access memory outside a buffer (a loop running past the end, wrong
strides, a batch too many for a matmul, a memory plan whose arena is too small), and the checked
code raises tr.BoundsError instead -- naming the kernel, the buffer, the element and the user's
line -- without writing outside the buffer. (The whole suite also runs with the setting on: no
check fails on correct code.)"""
import numpy as np
import pytest

import tracer as tr
from tracer import ir
from tracer.ir import schedule, schedule_index, schedule_threads
from tracer.ir.types import TensorType
from tracer.runtime import back_end, native, pipeline
from tracer.runtime.compiled import CompiledFunction
from tracer.runtime.pipeline import compile_graph

N = 1000


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    """Corrupted code must reach neither the disk cache nor the in-memory one other tests use."""
    monkeypatch.setenv("TRACER_DISABLE_CACHE", "1")
    monkeypatch.setenv("TRACER_NUM_THREADS", "1")
    monkeypatch.setattr(pipeline, "_compiled", {})


def scale_in_place(n: int = N) -> ir.Graph:
    """x <- x * 2 + 1 (the output is written into x's buffer)."""
    f = ir.Graph("scale")
    x = f.add_parameter("x", TensorType((n,), "f32"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.add(b.mul(x, 2.0), 1.0)]
    return ir.optimize(f)


def compile_checked(monkeypatch, function, checked=True, **options) -> CompiledFunction:
    monkeypatch.setenv("TRACER_CHECK_BOUNDS", "1" if checked else "0")
    return compile_graph(function, **options)


def guarded(n: int, guard: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """An array of n float32 followed, in the same allocation, by `guard` sentinels."""
    storage = np.full(n + guard, 12345.0, np.float32)
    storage[:n] = np.arange(n)
    return storage[:n], storage


def loop_runs_past_the_end(monkeypatch, extra: int = 3):
    """Loop kernels get an outer loop `extra` iterations longer than their results."""
    split_extent = schedule.split_extent
    monkeypatch.setattr(schedule, "split_extent", lambda kernel, flat: split_extent(kernel, flat)
                        + (extra if kernel.kind == "loop" else 0))


def test_unchecked_code_has_no_checks_and_checked_code_checks_every_buffer(monkeypatch):
    function = scale_in_place()
    plain = compile_checked(monkeypatch, function, checked=False)
    assert "tracer.bounds" not in plain.llvm_ir
    assert "tracer.bounds" not in plain.stage_text("llvm")
    checked = compile_checked(monkeypatch, function)
    # one read of x and one write of the result, each preceded by its check
    assert checked.llvm_ir.count("call void @tracer.bounds.fail(") == 2
    assert [(s.kernel, s.access, s.count) for s in checked.sites.sites] == [
        ("kernel_0", "read", N), ("kernel_0", "write", N)]
    x = np.arange(N, dtype=np.float32)
    np.testing.assert_array_equal(checked([x])[0], plain([x])[0])


def test_a_loop_past_the_end_stops_at_the_first_element_outside(monkeypatch):
    loop_runs_past_the_end(monkeypatch)
    function = scale_in_place()
    # Unchecked, the corrupted loop would run unguarded (it is not run: it would write outside x).
    unchecked = compile_checked(monkeypatch, function, checked=False, write_into={0: 0})
    assert f"i64 0, i64 {N + 3})" in unchecked.llvm_ir
    assert "tracer.bounds" not in unchecked.stage_text("llvm")
    compiled = compile_checked(monkeypatch, function, write_into={0: 0})
    # The checks survive optimization: LLVM sees they fail for the last iterations.
    assert "tracer.bounds.fail" in compiled.stage_text("llvm")
    x, storage = guarded(N)
    with pytest.raises(tr.BoundsError) as caught:
        compiled([x])
    message = str(caught.value)
    assert f"kernel_0: read of element {N} of %x (f32[{N}], parameter 0), which has {N} " \
           "elements" in message
    np.testing.assert_array_equal(storage[N:], 12345.0)  # nothing written after x
    # x itself was updated in place up to the failure (documented: no rollback)
    np.testing.assert_array_equal(x, np.arange(N, dtype=np.float32) * 2 + 1)


def test_wrong_strides_are_caught_and_name_the_users_line(monkeypatch):
    strides = schedule_index.contiguous_strides
    monkeypatch.setattr(schedule_index, "contiguous_strides", lambda shape: tuple(
        2 * s for s in strides(shape)))

    @tr.trace
    def shift(x):
        x.add_(1)  # the line the error names

    line = shift.python_function.__code__.co_firstlineno + 2
    monkeypatch.setenv("TRACER_CHECK_BOUNDS", "1")
    x, storage = guarded(N)
    with pytest.raises(tr.BoundsError) as caught:
        shift(tr.from_numpy(x))
    assert caught.value.line == f"test_codegen_bounds.py:{line}"
    assert f"of element {N} of %x" in str(caught.value)
    np.testing.assert_array_equal(storage[N:], 12345.0)
    expected = np.arange(N, dtype=np.float32)
    expected[0:N:2] += 1  # the even elements were written (strides doubled) before the failure
    np.testing.assert_array_equal(x, expected)


def test_a_failure_on_one_thread_stops_the_kernel_and_later_kernels(monkeypatch):
    monkeypatch.setenv("TRACER_NUM_THREADS", "2")
    monkeypatch.setattr(schedule_threads, "PARALLEL_WORK_PER_THREAD", 1)
    loop_runs_past_the_end(monkeypatch, extra=10)
    f = ir.Graph("two")
    x = f.add_parameter("x", TensorType((N,), "f32"))
    b = ir.GraphBuilder(f)
    total = b.op("reduce_sum", b.op("exp", x), axes=(0,))  # a second kernel, after the loop
    f.outputs = [b.op("exp", x), total]
    compiled = compile_checked(monkeypatch, ir.optimize(f))
    assert "@split.0.parallel(ptr %bounds, ptr %param.0" in compiled.back_end.code.entry
    with pytest.raises(tr.BoundsError, match=r"kernel_0: read of element 10\d\d of %x"):
        compiled([np.zeros(N, np.float32)])


@pytest.mark.parametrize("blas", [True, False], ids=["blas", "fallback"])
def test_a_matmul_batch_too_many_is_caught_before_the_gemm(monkeypatch, blas):
    if blas and not native.blas_available():
        pytest.skip("no BLAS")
    monkeypatch.setattr(native, "blas_available", lambda: blas)
    split_extent = schedule.split_extent
    monkeypatch.setattr(schedule, "split_extent", lambda kernel, flat: split_extent(kernel, flat)
                        + (kernel.kind == "matmul"))
    f = ir.Graph("batched")
    a = f.add_parameter("a", TensorType((2, 3, 4), "f32"))
    c = f.add_parameter("c", TensorType((2, 4, 5), "f32"))
    f.outputs = [ir.GraphBuilder(f).op("matmul", a, c)]
    compiled = compile_checked(monkeypatch, ir.optimize(f))
    assert ("@tracer_sgemm" in compiled.llvm_ir) == blas
    with pytest.raises(tr.BoundsError) as caught:
        compiled([np.ones((2, 3, 4), np.float32), np.ones((2, 4, 5), np.float32)])
    # batch 2 starts at element 2 * 3 * 4 of a: its first access (or the gemm's extent) fails
    assert "kernel_0: read of element 24 of %a (f32[2,3,4], parameter 0), which has 24" \
        in str(caught.value)


def test_a_matmul_update_checks_its_product_operands(monkeypatch):
    if not native.blas_available():
        pytest.skip("no BLAS: no fused matmul update")
    split_extent = schedule.split_extent
    monkeypatch.setattr(schedule, "split_extent", lambda kernel, flat: split_extent(kernel, flat)
                        + (kernel.update is not None))
    f = ir.Graph("sgd")
    w = f.add_parameter("w", TensorType((1, 4, 5), "f32"))
    x = f.add_parameter("x", TensorType((1, 4, 3), "f32"))
    g = f.add_parameter("g", TensorType((1, 3, 5), "f32"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.sub(w, b.mul(b.op("matmul", x, g), 0.1))]
    compiled = compile_checked(monkeypatch, ir.optimize(f), write_into={0: 0})
    assert compiled.fused.kernels[0].update is not None
    w_value = np.ones((1, 4, 5), np.float32)
    with pytest.raises(tr.BoundsError, match=r"kernel_0.gemm: read of element 12 of %x"):
        compiled([w_value, np.ones((1, 4, 3), np.float32), np.ones((1, 3, 5), np.float32)])


def test_a_memory_plan_that_overflows_the_arena_is_refused_at_compile_time(monkeypatch):
    plan_memory = back_end.plan_memory

    def short_arena(fused, write_into):
        plan = plan_memory(fused, write_into)
        plan.arena_size -= 64
        return plan

    monkeypatch.setattr(back_end, "plan_memory", short_arena)
    f = ir.Graph("temporaries")
    x = f.add_parameter("x", TensorType((4, 4), "f32"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.op("matmul", b.op("matmul", x, x), x)]
    with pytest.raises(tr.BoundsError, match=r"the memory plan puts %\d+ \(f32\[4,4\]\) at bytes "
                                             r"\[0, 64\) of an arena of 0 bytes"):
        compile_checked(monkeypatch, ir.optimize(f))


def test_checked_and_unchecked_code_never_share_a_cache_entry(monkeypatch, tmp_path):
    monkeypatch.delenv("TRACER_DISABLE_CACHE")
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    function = scale_in_place()
    monkeypatch.setenv("TRACER_CHECK_BOUNDS", "0")
    plain = pipeline.compile_function(function)
    monkeypatch.setenv("TRACER_CHECK_BOUNDS", "1")
    checked = pipeline.compile_function(function)
    assert plain is not checked and checked.sites is not None and plain.sites is None
    assert len(list(tmp_path.glob("*.o"))) == 2
    assert pipeline.compile_function(function) is checked
