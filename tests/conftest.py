"""Shared test set-up.

Every signature any test compiles through @trace is also checked here: each printed stage parses
back into a graph that prints the same and passes the verifier, and every call of the compiled code
is compared with the reference interpreter running the same optimized graph on the same inputs,
and the first call of a small one with the interpreter of its loop IR (the `loops` stage) too. A
call the interpreter refuses (an index out of range) the compiled code and the loop IR must
refuse too.
"""
import os
import sys
import weakref

import numpy as np
import pytest

from tracer import ir
from tracer.ir.text import ParseError
from tracer.ir.loop_interpreter import IndexCheckFailed, run_program
from tracer.ir.primitives import CHECKS
from tracer.codegen.module import executed_statements as kernel_statements
from tracer.ir.primitives import IndexRangeError
import tracer.runtime.entry
import tracer.runtime.traced_function
from collections import OrderedDict

from tracer.runtime import kernels, pipeline, pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

_compile = tracer.runtime.traced_function.TracedFunction._compile


def _checked_compile(self, *args, **kwargs):
    entry = _compile(self, *args, **kwargs)
    for stage in ("traced", "grad", "optimized"):
        text = entry.stages[stage]
        try:
            parsed = ir.parse_function(text)
        except ParseError as error:
            # an earlier stage may name a host callback that optimization removed, and nothing
            # keeps it alive then (the optimized stage's are kept by the compiled function)
            if stage == "optimized" or "is not alive in this process" not in str(error):
                raise
            continue
        assert ir.format_function(parsed) == text, f"stage {stage} does not print back the same"
        ir.verify(parsed)
    return entry


def roundtrip(function: ir.Graph) -> ir.Graph:
    """The graph verifies, prints, parses back equal (and printing that gives the same text) and
    the parsed graph verifies; returns it."""
    ir.verify(function)
    text = ir.format_function(function)
    parsed = ir.parse_function(text)
    assert ir.same_function(function, parsed), text
    assert ir.format_function(parsed) == text
    ir.verify(parsed)
    return parsed


def assert_matches_interpreter(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Compiled and interpreted results agree to the rounding of their dtype: float32 results may
    differ by a few ulp per operation and sums may add in another order, so the bound is relative
    to the largest magnitude in the result."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    if expected.dtype.kind != "f":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(actual), finite, err_msg=what)
    np.testing.assert_array_equal(actual[~finite], expected[~finite], err_msg=what)
    relative = 2e-5 if expected.dtype == np.float32 else 1e-12
    scale = max(1.0, float(np.abs(expected[finite]).max(initial=0.0)))
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=relative,
                               atol=relative * scale, err_msg=what)


# The loop IR interpreter takes some microseconds per statement: programs that run at most this
# many are checked (most of the suite's).
LOOPS_CHECKED = 3000


def executed_statements(program) -> int:
    """How many statements running `program` executes (see codegen.module.executed_statements)."""
    return sum(kernel_statements(kernel) for kernel in program.kernels)


def distance(values: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """How far `values` are from `exact`, elementwise, in float64: 0 where they are equal (equal
    infinities included, whose difference is NaN) or both NaN, infinite where only one is NaN."""
    values, exact = np.asarray(values, np.float64), np.asarray(exact, np.float64)
    with np.errstate(invalid="ignore"):
        gap = np.array(np.abs(values - exact))
    gap[np.isnan(values) != np.isnan(exact)] = np.inf
    gap[(values == exact) | (np.isnan(values) & np.isnan(exact))] = 0.0
    return gap


def beyond_float32(values: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Where the float64 evaluation `exact` lies beyond float32's range, a float32 evaluation's NaN
    and its infinity of the same sign are equally right: which one a float32 evaluation gives
    depends on its operations after the overflow (`inf - inf` in a sum that one evaluation rounds
    and another fuses; `inf * 0` where a factor such as `1 - tanh(x) ** 2` rounds to 0 in one and
    to 1 ulp in another). Elementwise, True where `values` is such a NaN or infinity."""
    values, exact = np.asarray(values, np.float64), np.asarray(exact, np.float64)
    with np.errstate(invalid="ignore"):
        overflowed = np.abs(exact) > np.finfo(np.float32).max
        return overflowed & (np.isnan(values) | (np.isinf(values)
                                                 & (np.sign(values) == np.sign(exact))))


def in_float64(function: ir.Graph) -> ir.Graph:
    """A copy of `function` computing in float64 wherever it computes in float32: a closer
    approximation of the exact result than either float32 evaluation."""
    result = function.copy()
    wide = ir.TensorType
    for value in result.values():
        if value.dtype == np.float32:
            value.type = wide(value.shape, np.float64)
    for instruction in result.instructions:
        if instruction.attributes.get("dtype") == np.float32:
            instruction.attributes["dtype"] = np.dtype(np.float64)
    return result


def stored_but_unread(fused) -> list[str]:
    """The kernel results that are neither returned nor read by another kernel: none should be
    (a row kernel's later parts read what its earlier parts stored, or kept as scratch rows; a
    check_index is kept, and stored, for its check alone; Python code called back returns all
    its results, read or not, as a pure_callback computing a gradient nobody needs does)."""
    read = {id(v) for kernel in fused.kernels for part in [kernel, *(kernel.parts or ())]
            for v in part.inputs}
    read.update(id(v) for v in fused.function.outputs)
    read.update(id(row) for kernel in fused.kernels for _, row in kernel.kept or ())
    return [f"%{v.name}" for kernel in fused.kernels for v in kernel.results
            if id(v) not in read and not (v.producer and v.producer.primitive in CHECKS)
            and kernel.kind != "host_callback" and v.type.size > 0]  # (an empty one stores nothing)


class CheckedFunction:
    """A CompiledFunction whose every call is checked against the interpreter; on the first call
    of a small program, its loop IR (run by ir/loop_interpreter.py, without LLVM) is too."""

    def __init__(self, compiled):
        self.compiled = compiled
        unread = stored_but_unread(compiled.fused)
        assert not unread, f"kernel results stored but never read: {unread}"
        self.stages = compiled.stages
        self.in_place = compiled.in_place
        self.duplicates = compiled.duplicates
        self.loops_checked = False

    def __call__(self, arguments, share=False):
        # copies: the compiled call may write outputs into the argument arrays (in place)
        inputs = [np.array(a, p.dtype, copy=True)
                  for a, p in zip(arguments, self.compiled.function.parameters)]
        # numpy's products with BLAS on one thread, as the compiled code runs them (a threaded
        # sgemm may round differently, and a loss that cancels amplifies that past the check)
        products = any(i.primitive == "matmul" for i in self.compiled.function.instructions)
        pool.hold_blas(products)
        try:
            expected = ir.interpret(self.compiled.function, inputs)
        except IndexRangeError:  # then the compiled call must refuse too (and raise its error)
            if executed_statements(self.compiled.loops) <= LOOPS_CHECKED:
                with pytest.raises(IndexCheckFailed):  # as must its loop IR
                    run_program(self.compiled.loops, inputs)
            self.compiled(arguments, share)
            raise AssertionError("the interpreter found an index out of range, the compiled "
                                 "code ran") from None
        finally:
            pool.release_blas(products)
        actual = self.compiled(arguments, share)
        self.check(actual, expected, inputs, "")
        if not self.loops_checked and executed_statements(self.compiled.loops) <= LOOPS_CHECKED:
            self.check(run_program(self.compiled.loops, inputs), expected, inputs, " (loop IR)")
            self.loops_checked = True
        return actual

    def check(self, actual, expected, inputs, source: str) -> None:
        for index, (a, e) in enumerate(zip(actual, expected)):
            what = f"output {index} of {self.compiled.function.name}{source}"
            try:
                assert_matches_interpreter(a, e, what)
            except AssertionError:
                # A float64 output of a function that computes in float32 somewhere (x_f32 * s_f64
                # for a 0-d s is float32, cast to float64 for s's gradient) has float32's rounding.
                if e.dtype != np.float32 and not (e.dtype == np.float64 and any(
                        v.dtype == np.float32 for v in self.compiled.function.values())):
                    raise
                if any(i.primitive == "host_callback" for i in self.compiled.function.instructions):
                    raise  # its Python code computes in the dtypes it was traced with
                # The interpreter's float32 (numpy's sgemm and sums) is not exact either: accept
                # a compiled result at least as close to a float64 evaluation as the interpreter.
                exact = ir.interpret(in_float64(self.compiled.function),
                                     [x.astype(np.float64) if x.dtype == np.float32 else x
                                      for x in inputs])[index]
                scale = max(1.0, float(np.abs(e[np.isfinite(e)]).max(initial=0.0)))
                within = np.isclose(a, e, rtol=2e-5, atol=2e-5 * scale)
                # (a float32 matmul may overflow differently: its multiply-adds are fused, and
                # numpy's small ones are not, so inf - inf can be NaN in one and not the other)
                closer = distance(a, exact) <= distance(e, exact) * (1 + 1e-6)
                assert (within | closer | beyond_float32(a, exact)).all(), what

    def stage_text(self, stage):
        return self.compiled.stage_text(stage)

    def __getattr__(self, name):  # what the compile report reads: fused, timings, kernel_times...
        return getattr(self.compiled, name)


@pytest.fixture(autouse=True)
def check_every_compiled_stage(monkeypatch):
    monkeypatch.setattr(tracer.runtime.traced_function.TracedFunction, "_compile", _checked_compile)
    compile_function = tracer.runtime.pipeline.compile_function

    def checked_compile_function(function, **options):
        # one checker per compiled function, so that code shared in memory stays one object
        compiled = compile_function(function, **options)
        if not hasattr(compiled, "checked_by_the_tests"):
            compiled.checked_by_the_tests = CheckedFunction(compiled)
        return compiled.checked_by_the_tests
    monkeypatch.setattr(tracer.runtime.pipeline, "compile_function", checked_compile_function)
    compile_warm = tracer.runtime.pipeline.compile_warm

    def checked_compile_warm(function, write_into):
        # a warm hit (runtime/warm_cache.py) is checked too: its optimized graph made again
        compiled = compile_warm(function, write_into)
        if compiled is not None and not hasattr(compiled, "checked_by_the_tests"):
            compiled.checked_by_the_tests = CheckedFunction(compiled)
        return None if compiled is None else compiled.checked_by_the_tests
    monkeypatch.setattr(tracer.runtime.pipeline, "compile_warm", checked_compile_warm)
    yield


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """What a fresh process has with an empty disk cache (in tmp_path, returned): no program nor
    kernel object compiled in memory."""
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACER_DISABLE_CACHE", raising=False)
    monkeypatch.setattr(pipeline, "_compiled", weakref.WeakValueDictionary())
    monkeypatch.setattr(kernels, "_objects", OrderedDict())
    return tmp_path
