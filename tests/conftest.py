"""Shared test set-up.

Every signature any test compiles is also checked here: each printed stage parses back into a graph
that prints the same and passes the verifier.
"""
import os
import sys

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


@pytest.fixture(autouse=True)
def check_every_compiled_stage(monkeypatch):
    monkeypatch.setattr(runtime.trace.TracedFunction, "_compile", _checked_compile)
    yield
