"""Logging under the `tracer` logger: what compiles, why it compiles again, how long each stage
took, and the disk and memory caches; TRACER_LOG turns it on without code."""
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import tracer as tr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _compile_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tracer.trace" and ": compiling (" in r.getMessage()]


@pytest.fixture
def log(caplog):
    caplog.set_level(logging.DEBUG, logger="tracer")
    return caplog


def test_each_recompile_names_its_reason(log):
    @tr.trace
    def scale(x, factor):
        return x * factor

    scale(tr.ones(3), 2.0)
    scale(tr.ones(4), 2.0)                                   # new shape
    scale(tr.ones(4, dtype=tr.float64), 2.0)                 # new dtype
    scale(tr.ones(4, dtype=tr.float64, requires_grad=True), 2.0)  # requires_grad
    scale(tr.ones(4), 2)                                     # float -> int runtime input
    messages = _compile_messages(log)
    assert len(messages) == 5 == scale.cache_info().misses
    assert "first call" in messages[0]
    assert "shape of x: (3,) -> (4,)" in messages[1]
    assert "dtype of x: float32 -> float64" in messages[2]
    assert "requires_grad of x: False -> True" in messages[3]
    assert "type of factor: float -> int" in messages[4]


def test_static_value_and_grad_mode_reasons(log):
    def power(x, n):
        return x ** n

    traced = tr.trace(power, static_argnums=1)
    traced(tr.ones(2), 2)
    traced(tr.ones(2), 3)
    with tr.no_grad():
        traced(tr.ones(2), 3)
    messages = _compile_messages(log)
    assert "static value of argument 1: 2 -> 3" in messages[1]
    assert "grad mode: enabled -> disabled" in messages[2]


OFFSET = tr.ones(2)


def test_rebound_global_is_named(log):
    global OFFSET

    @tr.trace
    def shift(x):
        return x + OFFSET

    np.testing.assert_array_equal(shift(tr.zeros(2)).numpy(), [1, 1])
    OFFSET = tr.full(2, fill_value=5.0)
    np.testing.assert_array_equal(shift(tr.zeros(2)).numpy(), [5, 5])
    assert "global OFFSET: rebound" in _compile_messages(log)[1]


def test_compile_times_and_cache_messages(log, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))

    def body(x):
        return (x * 3.5).exp().sum()

    first = tr.trace(body)
    first(tr.ones(7))
    # another traced function, the same optimized graph, while the first still holds its code
    tr.trace(body)(tr.ones(7))
    messages = [r.getMessage() for r in log.records]
    compiled = [m for m in messages if ": compiled in " in m]
    assert len(compiled) == 2
    for stage in ("trace", "grad", "optimize", "backend", "fuse", "render", "llvm", "load"):
        assert f"{stage} " in compiled[0]
    stored = [m for m in messages if m.startswith("disk cache miss")]
    assert len(stored) == 1 and str(tmp_path) in stored[0]
    assert os.path.exists(stored[0].rsplit(" ", 1)[1])  # the file it names was written
    assert any("in-memory hit" in m for m in messages)


def test_disk_hit_is_logged_in_a_fresh_process(tmp_path):
    script = ("import tracer as tr\n"
              "print(tr.trace(lambda x: (x * 1.25 + 4).sum())(tr.ones(5)).item())\n")
    environment = dict(os.environ, PYTHONPATH=ROOT, TRACER_CACHE_DIR=str(tmp_path),
                       TRACER_LOG="debug")
    runs = [subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True,
                           text=True, timeout=120) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "26.25"
    assert "tracer.cache DEBUG: disk cache miss" in runs[0].stderr
    assert "tracer.cache DEBUG: disk cache hit" in runs[1].stderr
    assert "tracer.trace INFO: <lambda>: compiling (first call)" in runs[1].stderr


def test_no_output_without_tracer_log(tmp_path):
    script = "import tracer as tr\ntr.trace(lambda x: x + 1)(tr.ones(2))\n"
    environment = {k: v for k, v in os.environ.items() if k != "TRACER_LOG"}
    environment.update(PYTHONPATH=ROOT, TRACER_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stderr == ""
    bad = dict(environment, TRACER_LOG="loud")
    run = subprocess.run([sys.executable, "-c", script], env=bad, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "TRACER_LOG='loud' is not one of" in run.stderr
