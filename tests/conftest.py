"""Shared test set-up.

Every signature any test compiles through @trace is also checked here: each printed stage parses
back into a graph that prints the same and passes the verifier, and every call of the compiled code
is compared with the reference interpreter running the same optimized graph on the same inputs.
"""
import os
import sys

import numpy as np
import pytest

import ir
import runtime.trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

_compile = runtime.trace.TracedFunction._compile


def _checked_compile(self, *args, **kwargs):
    entry = _compile(self, *args, **kwargs)
    for stage in ("traced", "grad", "optimized"):
        text = entry.stages[stage]
        parsed = ir.parse_function(text)
        assert ir.format_function(parsed) == text, f"stage {stage} does not print back the same"
        ir.verify(parsed)
    return entry


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


class CheckedFunction:
    """A CompiledFunction whose every call is checked against the interpreter."""

    def __init__(self, compiled):
        self.compiled = compiled
        self.stages = compiled.stages
        self.in_place = compiled.in_place

    def __call__(self, arguments):
        # copies: the compiled call may write outputs into the argument arrays (in place)
        expected = ir.interpret(self.compiled.function,
                                [np.array(a, p.dtype, copy=True) for a, p in
                                 zip(arguments, self.compiled.function.parameters)])
        actual = self.compiled(arguments)
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_matches_interpreter(a, e, f"output {index} of {self.compiled.function.name}")
        return actual

    def stage_text(self, stage):
        return self.compiled.stage_text(stage)


@pytest.fixture(autouse=True)
def check_every_compiled_stage(monkeypatch):
    monkeypatch.setattr(runtime.trace.TracedFunction, "_compile", _checked_compile)
    compile_function = runtime.trace.compile_function
    monkeypatch.setattr(runtime.trace, "compile_function",
                        lambda function, **options: CheckedFunction(
                            compile_function(function, **options)))
    yield
